package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/utils/clock"

	"github.com/redlock-operator/redlock-operator/pkg/holding"
)

// supervisor runs the app's process only while the pod holds a current
// grant: it starts it once the pod holds the lock, and stops it (SIGTERM,
// then SIGKILL) so that it is gone by the grant's fencing deadline, or at
// once when status shows the grant ended.
type supervisor struct {
	w     *holding.Watcher
	clock clock.Clock
	// grace is how long the app has between SIGTERM and SIGKILL; when the
	// grant runs out unrefreshed, SIGTERM comes grace before the deadline.
	grace   time.Duration
	command []string
	publish func(*holding.Grant)
	// signals are the agent's own termination signals (the pod is being
	// deleted): passed on to the app, whose exit then ends the agent.
	signals <-chan os.Signal
	// forward are the other signals sent to the agent (SIGHUP to reload,
	// SIGUSR1 and SIGUSR2, SIGQUIT, SIGWINCH): passed on to a running app,
	// dropped while none runs.
	forward <-chan os.Signal
	// beat renews the grant's heartbeat (holding.Heartbeat) until its ctx
	// ends: it runs while the app runs under the grant, and only then.
	beat func(ctx context.Context, g *holding.Grant)
	// say gives the agent's word that nothing acts on g any more
	// (holding.SayStopped); nil: never given.
	say func(g *holding.Grant)
	// wordWait bounds how long an agent signalled while its app ran
	// waits for status to stop showing the grant, before it exits.
	wordWait time.Duration
	// firstProcess: the agent is its container's first process (PID 1),
	// so that every other process there is what the app left.
	firstProcess bool
	log          func(msg string, kv ...any)
}

// errSignalled: the agent was asked to stop and the app has exited.
var errSignalled = errors.New("stopped by a signal")

// run waits for a grant, runs the app under it, and again, until ctx ends,
// the agent is signalled, or the app exits on its own: then it returns the
// app's exit code (the container's restart policy decides what follows; a
// restarted agent waits for a grant again).
func (s *supervisor) run(ctx context.Context) (int, error) {
	for {
		s.publish(nil)
		g, err := s.next(ctx)
		if err != nil {
			return 1, err
		}
		code, exited, err := s.hold(ctx, g)
		if err != nil || exited {
			s.publish(nil)
			if errors.Is(err, errSignalled) && s.say != nil && s.firstProcess {
				// The pod is most likely being deleted, and the kubelet's
				// SIGTERM came before the operator's hiding of the grant:
				// wait a little for it, so that the word is not lost.
				s.awaitHidden(g, s.wordWait)
				s.giveWord(g)
			}
			return code, err
		}
		s.giveWord(g)
	}
}

// awaitHidden waits until status no longer shows g, for at most within.
func (s *supervisor) awaitHidden(g *holding.Grant, within time.Duration) {
	timer := s.clock.NewTimer(within)
	defer timer.Stop()
	for {
		changed := s.w.Changed()
		if s.w.Hidden(g.GrantID) {
			return
		}
		select {
		case <-changed:
		case <-timer.C():
			return
		}
	}
}

// giveWord tells the operator that nothing acts on g any more, once the
// app it ran under g was stopped because status no longer shows g (not
// for a deadline: status may still show it): only as the container's
// first process, and only once every other process in the container is
// gone (stop killed them all; reaped here). For a pod being deleted,
// whose containers the kubelet never restarts, the lock then passes on
// without waiting for the kubelet to report the container's end. When
// something is not gone in time, no word is given: the lock waits for the
// kubelet.
func (s *supervisor) giveWord(g *holding.Grant) {
	if s.say == nil || !s.firstProcess || !s.w.Hidden(g.GrantID) {
		return
	}
	if !reapAll(reapWait) {
		s.log("processes outlived the app; no word given", "grantID", g.GrantID)
		return
	}
	s.say(g)
}

// alone reports whether /proc (the agent's PID namespace's, as its first
// process) lists no process but the agent; false when it cannot tell.
func alone() bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	self := strconv.Itoa(os.Getpid())
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err == nil && e.Name() != self {
			return false
		}
	}
	return true
}

// reapWait bounds how long the agent waits for the processes it killed to
// end before it gives its word.
const reapWait = 5 * time.Second

// reapAll kills (SIGKILL) and reaps every other process in the agent's
// PID namespace, again and again (a process forked while the kill went
// round escapes one), until none is left or within is over: whether none
// is left. Only for the namespace's first process, to which every orphan
// there comes; a process that is no child of it (one that entered the
// namespace from outside, as kubectl exec does) counts until /proc no
// longer lists it.
func reapAll(within time.Duration) bool {
	for deadline := time.Now().Add(within); ; {
		_ = syscall.Kill(-1, syscall.SIGKILL)
		if reapOrphans() && alone() {
			return true // nothing else runs here
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond) // polling the kernel for exits: no event to wait on
	}
}

// next waits for a grant with more than twice the grace left before its
// deadline: one the app could not even be stopped within is not started,
// nor one that would be stopped again as soon as it started (a refresh that
// came late, just after the app was stopped for its deadline). A signal
// already received wins over a grant.
func (s *supervisor) next(ctx context.Context) (*holding.Grant, error) {
	for {
		select {
		case sig := <-s.signals:
			return nil, fmt.Errorf("%w (%v) while waiting for the lock", errSignalled, sig)
		default:
		}
		changed := s.w.Changed()
		g := s.w.Current()
		if g != nil && g.Deadline.Sub(s.clock.Now()) > 2*s.grace {
			return g, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case sig := <-s.signals:
			return nil, fmt.Errorf("%w (%v) while waiting for the lock", errSignalled, sig)
		case <-changed:
		case <-s.clock.After(time.Second): // a grant whose deadline came closer than the grace
		}
	}
}

// hold runs the app under g until g ends (the app is stopped: exited
// false), or the app exits by itself (exited true, its code), or the agent
// is signalled (the signal is passed on and the app's exit awaited, while
// the grant's end and deadline still stop it: exited true).
//
// The app runs in a process group of its own, and every signal goes to the
// group: a shell entrypoint's children stop with it.
func (s *supervisor) hold(ctx context.Context, g *holding.Grant) (code int, exited bool, err error) {
	cmd := exec.Command(s.command[0], s.command[1:]...) //nolint:gosec // the app's own command, from its pod spec
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(),
		"REDLOCK_FENCING_TOKEN="+strconv.FormatInt(g.Token, 10),
		"REDLOCK_GRANT_ID="+g.GrantID,
		"REDLOCK_LOCK_KEY="+g.Key,
		"REDLOCK_VALID_UNTIL="+g.ValidUntil.UTC().Format(time.RFC3339Nano),
	)
	s.publish(g)
	if err := cmd.Start(); err != nil {
		s.publish(nil)
		return 1, true, fmt.Errorf("start the app: %w", err)
	}
	s.log("app started", "token", g.Token, "grantID", g.GrantID, "pid", cmd.Process.Pid)
	if s.beat != nil {
		// The heartbeat says the app runs: it stops when hold returns
		// (the app exited or was stopped), before the agent does anything
		// else.
		bctx, stopBeat := context.WithCancel(ctx)
		defer stopBeat()
		go s.beat(bctx, g)
	}
	exit := make(chan error, 1)
	go func() { exit <- cmd.Wait() }()
	defer reapOrphans()
	if s.firstProcess {
		// The container's first process: orphans of a long-running app
		// (a daemon it started and left) come to the agent, and would
		// stay zombies until the app ends.
		stopReaping := reapWhileRunning(cmd.Process.Pid)
		defer stopReaping()
	}
	var signalled error
	for {
		changed := s.w.Changed()
		cur := s.w.Current()
		deadline := s.w.Deadline(g.GrantID)
		now := s.clock.Now()
		if cur == nil || cur.GrantID != g.GrantID || !now.Before(deadline.Add(-s.grace)) {
			reason := "the grant ended"
			if !deadline.IsZero() {
				reason = "the grant's fencing deadline is near, unrefreshed"
			}
			s.publish(nil)
			s.stop(cmd, exit, deadline, reason)
			if signalled != nil {
				return 0, true, signalled
			}
			return 0, false, nil
		}
		s.publish(cur) // the refreshed validity
		timer := s.clock.NewTimer(deadline.Add(-s.grace).Sub(now))
		select {
		case err := <-exit:
			timer.Stop()
			s.publish(nil)
			s.log("app exited", "error", errString(err))
			return exitCode(err), true, signalled
		case sig := <-s.signals:
			timer.Stop()
			s.log("signalled: passing it on to the app", "signal", sig.String())
			signalGroup(cmd, sig.(syscall.Signal)) //nolint:forcetypeassert // only syscall signals are subscribed
			signalled = errSignalled
		case sig := <-s.forward:
			timer.Stop()
			signalGroup(cmd, sig.(syscall.Signal)) //nolint:forcetypeassert // only syscall signals are subscribed
		case <-ctx.Done():
			timer.Stop()
			s.publish(nil)
			s.stop(cmd, exit, deadline, "the agent stops")
			return 1, true, ctx.Err()
		case <-changed:
			timer.Stop()
		case <-timer.C():
		}
	}
}

// stop ends the app's process group: SIGTERM, then SIGKILL after the grace
// or at the deadline (when one is known), whichever comes first.
func (s *supervisor) stop(cmd *exec.Cmd, exit <-chan error, deadline time.Time, reason string) {
	s.log("stopping the app", "reason", reason)
	signalGroup(cmd, syscall.SIGTERM)
	wait := s.grace
	if !deadline.IsZero() {
		wait = min(wait, deadline.Sub(s.clock.Now()))
	}
	timer := s.clock.NewTimer(max(wait, 0))
	defer timer.Stop()
	select {
	case err := <-exit:
		s.log("app stopped", "error", errString(err))
		signalGroup(cmd, syscall.SIGKILL) // what the app left behind in its group
	case <-timer.C():
		signalGroup(cmd, syscall.SIGKILL)
		err := <-exit
		s.log("app killed", "error", errString(err))
	}
	if s.firstProcess {
		// The container's first process: every other process in it is
		// what the app left, in its group or not (a daemon that called
		// setsid). None may run on without the grant.
		_ = syscall.Kill(-1, syscall.SIGKILL)
	}
}

// signalGroup sends sig to the app's process group.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	_ = syscall.Kill(-cmd.Process.Pid, sig)
}

// reapWhileRunning reaps, at each SIGCHLD, the agent's ended children but
// the app (whose exit cmd.Wait collects), until the returned function is
// called; that function returns once no scan runs or will: a scan after
// it could take the exit of the next app, whose pid it does not skip.
func reapWhileRunning(app int) (stop func()) {
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			case <-chld:
				select {
				case <-done: // a SIGCHLD and the stop at once: the stop wins
					return
				default:
				}
				reapZombies(app)
			}
		}
	}()
	return func() { signal.Stop(chld); close(done); <-finished }
}

// reapZombies waits for every zombie child of the agent but app, found in
// /proc (wait4(-1) could take the app's exit from cmd.Wait).
func reapZombies(app int) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == app {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if state, ppid := stateOf(stat); state != "Z" || ppid != strconv.Itoa(self) {
			continue
		}
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	}
}

// stateOf reads the state and the parent's pid from a /proc/PID/stat:
// "pid (comm) state ppid ...", where comm may hold spaces and parentheses.
func stateOf(stat []byte) (state, ppid string) {
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 2 {
		return "", ""
	}
	return f[0], f[1]
}

// reapOrphans collects processes that ended and were handed to the agent
// (it is the container's first process): an app's children that outlived
// it would otherwise stay zombies. It reports whether the agent has no
// child left.
func reapOrphans() (none bool) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return errors.Is(err, syscall.ECHILD)
		}
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return ee.ExitCode()
	default:
		return 1
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
