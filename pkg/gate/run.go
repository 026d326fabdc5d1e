package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Config configures Run.
type Config struct {
	// StateDir holds the record of runs; it must outlive container restarts
	// (an emptyDir of the pod).
	StateDir string
	// Persistence is None, AOFEverySec or AOFAlways.
	Persistence string
	// RestartDelay is how long a master stays out of service after losing
	// its keys: longer than the longest lock TTL plus drift.
	RestartDelay time.Duration
	// Heartbeat is how often the record is refreshed while Redis runs
	// (default 1s), for people reading it.
	Heartbeat time.Duration
	// AdmissionFile is the downward-API annotations file. Empty: a first run
	// waits RestartDelay from now, since nothing is known of earlier ones.
	AdmissionFile string
	// Poll is how often the admission file is read (default 1s).
	Poll time.Duration
	// Command is the program to run (redis-server and its arguments).
	Command []string
	// Clock tells the time (the real clocks when zero).
	Clock Clock
	// Log receives what the gate waits for and why.
	Log *slog.Logger
}

// Run waits as Decide says, then runs the command, forwarding the signals
// received on sigs, and returns the command's exit code (128+signal when a
// signal ended it). A termination signal while waiting ends Run with code 0
// without starting the command.
func Run(ctx context.Context, cfg Config, sigs <-chan os.Signal) (int, error) {
	if len(cfg.Command) == 0 {
		return 2, errors.New("no command to run")
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = time.Second
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		return 2, fmt.Errorf("state dir: %w", err)
	}
	prev, err := LoadState(cfg.StateDir)
	if err != nil {
		return 2, err
	}
	stop, err := wait(ctx, cfg, prev, sigs)
	if err != nil {
		return 2, err
	}
	if stop {
		return 0, nil
	}
	return supervise(ctx, cfg, prev, sigs)
}

// wait blocks until Redis may serve. It reports true when a termination
// signal or ctx ended the wait.
func wait(ctx context.Context, cfg Config, prev *State, sigs <-chan os.Signal) (bool, error) {
	now, err := cfg.Clock.Now()
	if err != nil {
		return false, err
	}
	d := Decide(prev, cfg.Persistence, cfg.RestartDelay, now)
	if d.NeedAdmission && cfg.AdmissionFile == "" {
		d = Decision{Wait: cfg.RestartDelay, Reason: "first run in this pod and no admission file: nothing is known of earlier runs"}
	}
	if d.NeedAdmission {
		if wait, ok := loadAdmitted(cfg.StateDir, now); ok {
			d = Decision{Wait: wait, Reason: "admitted before this gate restarted: the rest of that admission's delay"}
		}
	}
	if d.NeedAdmission {
		cfg.Log.Info("waiting for admission", "reason", d.Reason, "file", cfg.AdmissionFile)
		for {
			a, ok, err := ReadAdmission(cfg.AdmissionFile)
			if err != nil {
				cfg.Log.Info("unreadable admission, waiting", "error", err.Error())
			}
			if ok {
				now, err := cfg.Clock.Now()
				if err != nil {
					return false, err
				}
				d.Wait = a.Wait(now.Wall)
				if err := saveAdmitted(cfg.StateDir, now, d.Wait); err != nil {
					cfg.Log.Info("admission not recorded: a restarted gate waits its whole delay again", "error", err.Error())
				}
				if a.HasDelay {
					cfg.Log.Info("admitted", "serveDelay", a.Delay.String(), "serveAfter", stamp(a.After))
				} else {
					cfg.Log.Info("admitted by an operator that sent no delay: its instant is compared with this node's wall clock", "serveAfter", stamp(a.After))
				}
				break
			}
			if stop := sleep(ctx, cfg.Poll, sigs); stop {
				return true, nil
			}
		}
	}
	if d.Wait > 0 {
		cfg.Log.Info("holding redis back", "reason", d.Reason, "for", d.Wait.Round(time.Millisecond).String())
		return sleep(ctx, d.Wait, sigs), nil
	}
	cfg.Log.Info("starting redis at once", "reason", d.Reason)
	return false, nil
}

// sleep waits d; true when a termination signal or ctx came first. Other
// signals are ignored while nothing runs.
func sleep(ctx context.Context, d time.Duration, sigs <-chan os.Signal) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return false
		case <-ctx.Done():
			return true
		case s := <-sigs:
			if s == syscall.SIGTERM || s == syscall.SIGINT || s == syscall.SIGQUIT {
				return true
			}
		}
	}
}

// supervise runs the command, keeps the record's heartbeat fresh, forwards
// signals, and records how the run ended.
func supervise(ctx context.Context, cfg Config, prev *State, sigs <-chan os.Signal) (int, error) {
	now, err := cfg.Clock.Now()
	if err != nil {
		return 2, err
	}
	st := State{StartedAt: now.Wall, StartedBoot: now.Boot, BootID: now.BootID}
	if prev != nil {
		st.Runs = prev.Runs
	}
	st.Runs++
	st.AliveAt, st.AliveBoot = st.StartedAt, st.StartedBoot
	if err := SaveState(cfg.StateDir, &st); err != nil {
		return 2, err
	}
	cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...) //nolint:gosec // the gate runs what it is told to
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Redis dies with the gate, as it does with its container.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		st.end(cfg.Clock)
		st.Exit = "failed to start: " + err.Error()
		_ = SaveState(cfg.StateDir, &st)
		return 127, fmt.Errorf("start %s: %w", cfg.Command[0], err)
	}
	cfg.Log.Info("redis started", "pid", cmd.Process.Pid, "run", st.Runs)

	var mu sync.Mutex // guards st between heartbeat and exit
	done := make(chan struct{})
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	go func() {
		t := time.NewTicker(cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				now, err := cfg.Clock.Now()
				if err != nil {
					cfg.Log.Info("heartbeat not recorded", "error", err.Error())
					continue
				}
				mu.Lock()
				st.AliveAt, st.AliveBoot = now.Wall, now.Boot
				if err := SaveState(cfg.StateDir, &st); err != nil {
					cfg.Log.Info("heartbeat not recorded", "error", err.Error())
				}
				mu.Unlock()
			}
		}
	}()
	for {
		select {
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGTERM)
			ctx = context.Background() // forward once, then wait for the exit
		case err := <-exited:
			close(done)
			mu.Lock()
			defer mu.Unlock()
			st.end(cfg.Clock)
			st.Exit = cmd.ProcessState.String()
			st.Clean = err == nil && cmd.ProcessState.ExitCode() == 0
			if serr := SaveState(cfg.StateDir, &st); serr != nil {
				return 2, serr
			}
			cfg.Log.Info("redis ended", "exit", st.Exit, "clean", st.Clean)
			return exitCode(cmd.ProcessState), nil
		}
	}
}

// end records the end of the run. Should the clocks fail to answer now, the
// end stays unrecorded: the next gate then waits the whole delay from its
// start.
func (st *State) end(c Clock) {
	if now, err := c.Now(); err == nil {
		st.EndedAt, st.EndedBoot = now.Wall, now.Boot
	}
}

// exitCode maps a process state to a shell-style exit code.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
