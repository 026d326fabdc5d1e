package gate

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Admission is the operator's admission of a new pod, as its annotations
// carry it.
type Admission struct {
	// Delay is how long Redis stays out of service, counted from when the
	// gate first reads it (redlock.dev/serve-delay); HasDelay says it was
	// there.
	Delay    time.Duration
	HasDelay bool
	// After is the instant on the operator's clock (redlock.dev/serve-after).
	After time.Time
}

// Wait is how long Redis stays out of service from now, the moment the gate
// read the admission: its delay. Only an admission an older operator wrote
// (an instant and no delay) is compared with the gate's wall clock.
func (a Admission) Wait(wall time.Time) time.Duration {
	if a.HasDelay {
		return a.Delay
	}
	return max(a.After.Sub(wall), 0)
}

// ReadAdmission reads the admission from a downward-API annotations file
// (lines of key="quoted value"). It returns false when the file or the
// annotations do not exist yet.
func ReadAdmission(path string) (Admission, bool, error) {
	var a Admission
	f, err := os.Open(path) //nolint:gosec // the downward-API file named by the gate's flags
	if errors.Is(err, fs.ErrNotExist) {
		return a, false, nil
	}
	if err != nil {
		return a, false, fmt.Errorf("read admission: %w", err)
	}
	defer f.Close()
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok || (k != AdmissionAnnotation && k != AdmissionDelayAnnotation) {
			continue
		}
		uq, err := strconv.Unquote(v)
		if err != nil {
			return Admission{}, false, fmt.Errorf("annotation %s: %q is not quoted: %w", k, v, err)
		}
		if k == AdmissionDelayAnnotation {
			d, err := time.ParseDuration(uq)
			if err != nil || d < 0 {
				return Admission{}, false, fmt.Errorf("annotation %s: %q is not a duration of at least 0", k, uq)
			}
			a.Delay, a.HasDelay = d, true
		} else {
			t, err := time.Parse(time.RFC3339Nano, uq)
			if err != nil {
				return Admission{}, false, fmt.Errorf("annotation %s: %w", k, err)
			}
			a.After = t
		}
		found = true
	}
	if err := sc.Err(); err != nil {
		return Admission{}, false, fmt.Errorf("read admission: %w", err)
	}
	return a, found, nil
}

// admittedFile records, in the state directory, when the admission a gate
// read ends: a gate restarted while it waits (a startup probe, an eviction
// of the container) goes on waiting for the same end instead of counting
// the whole delay again from its own start, so a member always comes back.
const admittedFile = "gate-admitted.json"

// Admitted is the end of an admission's wait on the boot clock.
type Admitted struct {
	BootID    string        `json:"bootID"`
	UntilBoot time.Duration `json:"untilBoot"`
}

// loadAdmitted returns the recorded end of the admission's wait, when it
// belongs to the current boot (boot-clock readings of another boot do not
// compare: the annotation is read again and its whole delay waited).
func loadAdmitted(dir string, now Instant) (time.Duration, bool) {
	b, err := os.ReadFile(filepath.Join(dir, admittedFile)) //nolint:gosec // the gate's own state directory
	if err != nil {
		return 0, false
	}
	var a Admitted
	if json.Unmarshal(b, &a) != nil || a.BootID == "" || a.BootID != now.BootID {
		return 0, false
	}
	return max(a.UntilBoot-now.Boot, 0), true
}

// saveAdmitted records the end of the admission's wait; a failure only
// costs a restarted gate the whole delay again.
func saveAdmitted(dir string, now Instant, wait time.Duration) error {
	b, err := json.Marshal(Admitted{BootID: now.BootID, UntilBoot: now.Boot + wait})
	if err != nil {
		return err
	}
	return writeAtomic(dir, admittedFile, b)
}
