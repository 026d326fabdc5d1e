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
//   - first run in a new pod: for the operator's admission, the pod
//     annotation redlock.dev/serve-delay read through a downward-API file.
//
// A death whose moment was not recorded (the whole container was killed)
// counts from the start of the next gate: the heartbeat the gate records
// while Redis runs says it was alive then, not that it died soon after.
//
// Every wait is a duration measured on one clock, never an instant of one
// clock compared on another: the gate measures the time since a death on
// the node's boot clock (see Clock), which no wall-clock step moves, and
// the operator's admission is a duration the gate counts from when it first
// reads it. The only assumption on clocks is the one Redlock makes anyway:
// they run at about the same rate. A node whose wall clock is off or steps
// neither shortens a restart delay nor lengthens it.
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

// AdmissionDelayAnnotation is the pod annotation holding how long (a Go
// duration) a new pod's Redis stays out of service, counted from when the
// gate first reads it. The operator measured it on its own clock; the gate
// measures it on its own: no two clocks are compared.
const AdmissionDelayAnnotation = "redlock.dev/serve-delay"

// AdmissionAnnotation is the pod annotation holding the instant (RFC 3339,
// on the operator's clock) from which a new pod's Redis may serve. It is
// there for people, and for a pod an operator older than serve-delay
// admitted: only then does the gate compare it with its own wall clock.
const AdmissionAnnotation = "redlock.dev/serve-after"

// stateFile is the name of the record in the state directory.
const stateFile = "gate-state.json"

// State is what the gate records about the latest Redis run in this pod.
type State struct {
	// Runs counts the Redis runs started in this pod.
	Runs int `json:"runs"`
	// StartedAt is when the latest run started.
	StartedAt time.Time `json:"startedAt"`
	// AliveAt is the latest heartbeat while the run was alive (for people:
	// it does not bound when an unrecorded run ended).
	AliveAt time.Time `json:"aliveAt"`
	// EndedAt is when the run ended; zero when its end was not recorded.
	EndedAt time.Time `json:"endedAt,omitzero"`
	// BootID is the node's boot the boot-clock readings below belong to;
	// empty in a record of a gate older than them.
	BootID string `json:"bootID,omitempty"`
	// StartedBoot, AliveBoot and EndedBoot are StartedAt, AliveAt and
	// EndedAt on the boot clock: what the gate's waits are measured on.
	StartedBoot time.Duration `json:"startedBoot,omitempty"`
	AliveBoot   time.Duration `json:"aliveBoot,omitempty"`
	EndedBoot   time.Duration `json:"endedBoot,omitempty"`
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
	return writeAtomic(dir, stateFile, b)
}

// writeAtomic writes name in dir atomically (write, fsync, rename).
func writeAtomic(dir, name string, b []byte) error {
	tmp, err := os.CreateTemp(dir, name+".*")
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
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("write gate state: %w", err)
	}
	return nil
}

// Decision is what the gate waits for before starting Redis.
type Decision struct {
	// Wait is how long from now Redis stays out of service; 0: start at once.
	Wait time.Duration
	// NeedAdmission: wait for the operator's admission (a new pod); Wait is
	// then unknown until the annotation appears.
	NeedAdmission bool
	// Reason explains the decision for the log.
	Reason string
}

// Decide returns what to wait for, given the record of the previous run in
// this pod (nil: none), the persistence mode, the restart delay and the time
// now.
func Decide(prev *State, persistence string, restartDelay time.Duration, now Instant) Decision {
	switch {
	case prev == nil:
		return Decision{NeedAdmission: true, Reason: "first run in this pod: waiting for the operator's admission (" + AdmissionDelayAnnotation + ")"}
	case persistence == AOFAlways:
		return Decision{Reason: "persistence AOFAlways: every acknowledged write is on disk"}
	case !prev.EndedAt.IsZero() && prev.Clean && persistence != PersistenceNone:
		return Decision{Reason: "the previous run shut down cleanly and persisted its keys"}
	case !prev.EndedAt.IsZero():
		what := fmt.Sprintf("the previous run crashed at %s (%s)", stamp(prev.EndedAt), prev.Exit)
		if prev.Clean {
			what = fmt.Sprintf("the previous run shut down cleanly at %s but persistence is None: its keys are gone", stamp(prev.EndedAt))
		}
		wait, how := restAfter(prev, prev.EndedAt, prev.EndedBoot, restartDelay, now)
		return Decision{Wait: wait, Reason: what + how}
	default:
		// The whole container died with Redis and nothing recorded when. It
		// was before this gate started (the kubelet starts a container once
		// the previous one is gone), and that is the only bound: the last
		// heartbeat is not one, since a heartbeat can come late (a stalled
		// disk, a starved process) while Redis goes on serving.
		return Decision{Wait: restartDelay, Reason: fmt.Sprintf("the previous run ended unrecorded after its last heartbeat at %s: the delay counts from now", stamp(latest(prev.AliveAt, prev.StartedAt)))}
	}
}

// restAfter is how long from now a master that died at deathWall (wall
// clock) and deathBoot (boot clock) stays out: restartDelay after its death
// on the boot clock; the whole delay from now when the node rebooted since
// (boot-clock readings of two boots do not compare, and the death was
// before now); on the wall clock only for a record of an older gate, which
// has no boot-clock readings. The text says which clock measured it.
func restAfter(prev *State, deathWall time.Time, deathBoot, restartDelay time.Duration, now Instant) (time.Duration, string) {
	switch {
	case prev.BootID != "" && prev.BootID == now.BootID:
		return max(restartDelay-(now.Boot-deathBoot), 0), ""
	case prev.BootID != "":
		return restartDelay, "; the node rebooted since: the delay counts from now"
	default:
		return max(deathWall.Add(restartDelay).Sub(now.Wall), 0), "; a record of an older gate: measured on the wall clock"
	}
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
