package main

import (
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestReapZombiesTakesEveryEndedChildButTheApp makes two children that end
// unwaited for (zombies of the test process, as a daemon an app left would
// be of the agent): reapZombies collects the one that is not the app.
func TestReapZombiesTakesEveryEndedChildButTheApp(t *testing.T) {
	start := func() int {
		pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{})
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	zombie := func(pid int) bool {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		state, _ := stateOf(stat)
		return err == nil && state == "Z"
	}
	orphan, app := start(), start()
	defer func() {
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(app, &ws, 0, nil)
	}()
	for deadline := time.Now().Add(10 * time.Second); !zombie(orphan) || !zombie(app); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the children did not end")
		}
	}
	reapZombies(app)
	if _, err := os.Stat("/proc/" + strconv.Itoa(orphan)); !os.IsNotExist(err) {
		t.Errorf("the ended child %d is still there (%v)", orphan, err)
	}
	if !zombie(app) {
		t.Error("the app's exit was collected: cmd.Wait would never see it")
	}
}
