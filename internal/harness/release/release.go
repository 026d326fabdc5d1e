// Package release reads hack/previous-release: the release that upgrade
// tests start from (make test upgrades the Helm chart from it, make e2e the
// operator).
package release

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Previous is the version and commit hack/previous-release under root names
// (one line VERSION COMMIT; # starts a comment).
func Previous(root string) (version, commit string, err error) {
	data, err := os.ReadFile(filepath.Join(root, "hack", "previous-release")) //nolint:gosec // a file of this repository
	if err != nil {
		return "", "", fmt.Errorf("read the previous release: %w", err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			return f[0], f[1], nil
		}
	}
	return "", "", fmt.Errorf("hack/previous-release names no VERSION COMMIT")
}
