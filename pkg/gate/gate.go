// Package gate enforces the delayed restart of a Redis master inside its pod.
// The gate runs as the Redis container's entrypoint ("gate -- redis-server
// ..."), supervises redis-server, forwards signals to it and records in a
// state directory that outlives container restarts (an emptyDir) how and
// when each run ended. Before it starts Redis it decides, from that record,
// how long the master must stay out of service:
//
//   - the previous run in this pod crashed, or ended without a clean
//     shutdown: until its death + restartDelay (its keys may be lost, and
//     locks granted on them are valid until then);
//   - the previous run shut down cleanly: no wait, unless persistence is
//     None (the keys are gone either way);
//   - persistence AOFAlways: no wait (every write was fsynced);
//   - first run in a new pod: until the operator's admission, the pod
//     annotation redlock.dev/serve-after read through a downward-API file.
//
// A death whose moment was not recorded (the whole container was killed) is
// bounded by the last heartbeat the gate wrote while Redis ran.
package gate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Persistence modes, as in the RedisMasterSet API.
const (
	PersistenceNone = "None"
	AOFEverySec     = "AOFEverySec"
	AOFAlways       = "AOFAlways"
)

// AdmissionAnnotation is the pod annotation holding the instant (RFC 3339)
// from which a new pod's Redis may serve.
const AdmissionAnnotation = "redlock.dev/serve-after"

// stateFile is the name of the record in the state directory.
const stateFile = "gate-state.json"

// State is what the gate records about the latest Redis run in this pod.
type State struct {
	// Runs counts the Redis runs started in this pod.
	Runs int `json:"runs"`
	// StartedAt is when the latest run started.
	StartedAt time.Time `json:"startedAt"`
	// AliveAt is the latest heartbeat while the run was alive.
	AliveAt time.Time `json:"aliveAt"`
	// EndedAt is when the run ended; zero when its end was not recorded.
	EndedAt time.Time `json:"endedAt,omitzero"`
	// Clean is true when Redis exited with status 0 (a clean shutdown).
	Clean bool `json:"clean"`
	// Exit describes how the run ended ("exit status 0", "signal: killed").
	Exit string `json:"exit,omitempty"`
}

// LoadState reads the record in dir; it returns nil (and no error) when
// there is none: no Redis has run in this pod yet.
func LoadState(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFile)) //nolint:gosec // the gate's own state directory, from its flags
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil //nolint:nilnil // no record is not an error
	}
	if err != nil {
		return nil, fmt.Errorf("read gate state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parse gate state %s: %w", filepath.Join(dir, stateFile), err)
	}
	return &s, nil
}

// SaveState writes the record atomically (write, fsync, rename).
func SaveState(dir string, s *State) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, stateFile+".*")
	if err != nil {
		return fmt.Errorf("write gate state: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write gate state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write gate state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write gate state: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, stateFile)); err != nil {
		return fmt.Errorf("write gate state: %w", err)
	}
	return nil
}

// Decision is what the gate waits for before starting Redis.
type Decision struct {
	// Until is the instant from which Redis may serve; zero: at once.
	Until time.Time
	// NeedAdmission: wait for the admission annotation (a new pod); Until
	// is then unknown until the annotation appears.
	NeedAdmission bool
	// Reason explains the decision for the log.
	Reason string
}

// Decide returns what to wait for, given the record of the previous run in
// this pod (nil: none), the persistence mode, the restart delay and the
// heartbeat interval that bounds an unrecorded death.
func Decide(prev *State, persistence string, restartDelay, heartbeat time.Duration) Decision {
	switch {
	case prev == nil:
		return Decision{NeedAdmission: true, Reason: "first run in this pod: waiting for the operator's admission (" + AdmissionAnnotation + ")"}
	case persistence == AOFAlways:
		return Decision{Reason: "persistence AOFAlways: every acknowledged write is on disk"}
	case !prev.EndedAt.IsZero() && prev.Clean && persistence != PersistenceNone:
		return Decision{Reason: "the previous run shut down cleanly and persisted its keys"}
	case !prev.EndedAt.IsZero() && prev.Clean:
		return Decision{Until: prev.EndedAt.Add(restartDelay),
			Reason: fmt.Sprintf("the previous run shut down cleanly at %s but persistence is None: its keys are gone", stamp(prev.EndedAt))}
	case !prev.EndedAt.IsZero():
		return Decision{Until: prev.EndedAt.Add(restartDelay),
			Reason: fmt.Sprintf("the previous run crashed at %s (%s)", stamp(prev.EndedAt), prev.Exit)}
	default:
		// The whole container died with Redis: the death was after the last
		// heartbeat and before the next one.
		death := latest(prev.AliveAt, prev.StartedAt).Add(heartbeat)
		return Decision{Until: death.Add(restartDelay),
			Reason: fmt.Sprintf("the previous run ended unrecorded after its last heartbeat at %s", stamp(latest(prev.AliveAt, prev.StartedAt)))}
	}
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
