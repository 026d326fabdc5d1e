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

// ReadAdmission reads the admission instant from a downward-API annotations
// file (lines of key="quoted value"). It returns false when the file or the
// annotation does not exist yet.
func ReadAdmission(path string) (time.Time, bool, error) {
	f, err := os.Open(path) //nolint:gosec // the downward-API file named by the gate's flags
	if errors.Is(err, fs.ErrNotExist) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read admission: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok || k != AdmissionAnnotation {
			continue
		}
		uq, err := strconv.Unquote(v)
		if err != nil {
			return time.Time{}, false, fmt.Errorf("annotation %s: %q is not quoted: %w", AdmissionAnnotation, v, err)
		}
		t, err := time.Parse(time.RFC3339Nano, uq)
		if err != nil {
			return time.Time{}, false, fmt.Errorf("annotation %s: %w", AdmissionAnnotation, err)
		}
		return t, true, nil
	}
	return time.Time{}, false, sc.Err()
}
