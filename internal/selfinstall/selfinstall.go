// Package selfinstall copies the running executable somewhere else: the
// operator's image carries the gate and the agent, and an init container
// of a pod that runs another image copies them into a shared volume.
package selfinstall

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Install copies the running executable to dest: an init container puts
// it into a volume that another container runs it from.
func Install(dest string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	in, err := os.Open(self) //nolint:gosec // this very executable
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil { //nolint:gosec // a binary others execute
		return fmt.Errorf("install: %w", err)
	}
	out, err := os.OpenFile(dest, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755) //nolint:gosec // an executable
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return fmt.Errorf("install: %w", err)
	}
	return out.Close()
}
