package gate

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
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
