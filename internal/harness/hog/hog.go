// Package hog burns CPU beside a benchmark: a copy of the running program
// spinning on every core, so that a benchmark can be measured on a busy
// machine. It depends on the standard library only, so that benchmarks in
// modules of their own (hack/bench) can use it.
package hog

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// env marks a process started by Start.
const env = "REDLOCK_BENCH_HOG"

// IfAsked spins for ever when this process was started by Start; call it
// first thing in main.
func IfAsked() {
	if os.Getenv(env) == "1" {
		for { //nolint:staticcheck // SA5002: spinning is the point of a CPU hog
		}
	}
}

// Describe is how a benchmark's table heading says whether hogs ran beside
// it: "" when on is false.
func Describe(on bool) string {
	if !on {
		return ""
	}
	return fmt.Sprintf(", a CPU hog on each of the %d cores", runtime.NumCPU())
}

// Start runs a CPU-burning copy of this program (see IfAsked) on every
// core, killed by the returned stop (or with this process).
func Start() (stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	for range runtime.NumCPU() {
		c := exec.Command(self)
		c.Env = append(os.Environ(), env+"=1")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("start CPU hog: %w", err)
		}
		cmds = append(cmds, c)
	}
	return stop, nil
}
