package selfinstall_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/redlock-operator/redlock-operator/internal/selfinstall"
)

func TestInstall(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "bin", "gate")
	if err := selfinstall.Install(dest); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dest)
	if err != nil || fi.Mode()&0o111 == 0 || fi.Size() == 0 {
		t.Fatalf("installed binary: %v %v", fi, err)
	}
}
