package gate_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/gate"
)

// These tests run the gate binary as a real process in front of a real
// redis-server, the way the container runs it, and stand in for the kubelet
// by starting it again after it exits.

var gateBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gate-bin-")
	if err != nil {
		panic(err)
	}
	gateBin = filepath.Join(dir, "gate")
	// The tag gateclocktest lets a test shift the gate's wall clock.
	out, err := exec.Command("go", "build", "-tags", "gateclocktest", "-o", gateBin, "github.com/redlock-operator/redlock-operator/cmd/gate").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build gate: %v\n%s", err, out)
		os.Exit(1)
	}
	redis.SetLogger(quiet{})
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// pod is one Redis "pod": its emptyDir state, its data dir, its port.
type pod struct {
	t           *testing.T
	stateDir    string
	dataDir     string
	admission   string
	port        int
	persistence string
	delay       time.Duration
	// wallOffset shifts the wall clock of the gates started from now on:
	// a node whose clock is off, or stepped between two runs.
	wallOffset time.Duration
}

// clockOffsetEnv is cmd/gate's ClockOffsetEnv (a gate built with the tag
// gateclocktest).
const clockOffsetEnv = "GATE_TEST_WALL_CLOCK_OFFSET"

func newPod(t *testing.T, persistence string, delay time.Duration) *pod {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	p := &pod{t: t, stateDir: filepath.Join(dir, "state"), dataDir: filepath.Join(dir, "data"),
		admission: filepath.Join(dir, "annotations"), port: port, persistence: persistence, delay: delay}
	if err := os.MkdirAll(p.dataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	return p
}

// admit writes the operator's admission annotations as the operator does:
// the delay, and the instant it ends on the operator's (the test's) clock.
// It returns when the delay was written.
func (p *pod) admit(delay time.Duration) time.Time {
	now := time.Now()
	text := fmt.Sprintf("%s=%q\n%s=%q\n", gate.AdmissionAnnotation, now.Add(delay).UTC().Format(time.RFC3339Nano), gate.AdmissionDelayAnnotation, delay.String())
	if err := os.WriteFile(p.admission, []byte(text), 0o600); err != nil {
		p.t.Fatal(err)
	}
	return now
}

// container is one run of the gate.
type container struct {
	cmd    *exec.Cmd
	exited chan struct{}
	code   int
	logs   chan string // the gate's log lines
}

// waitLog waits for a log line of the gate containing s and returns it.
func (c *container) waitLog(t *testing.T, s string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case line := <-c.logs:
			if strings.Contains(line, s) {
				return line
			}
		case <-timeout:
			t.Fatalf("the gate never logged %q", s)
			return ""
		}
	}
}

// start runs the gate as the container entrypoint would.
func (p *pod) start() *container {
	bin, err := redistest.Binary()
	if err != nil {
		p.t.Fatal(err)
	}
	appendonly := "no"
	fsync := "everysec"
	switch p.persistence {
	case gate.AOFEverySec:
		appendonly = "yes"
	case gate.AOFAlways:
		appendonly, fsync = "yes", "always"
	}
	cmd := exec.Command(gateBin,
		"--state-dir", p.stateDir, "--restart-delay", p.delay.String(), "--persistence", p.persistence,
		"--admission-file", p.admission, "--heartbeat", "200ms", "--poll", "50ms",
		"--", bin, "--port", strconv.Itoa(p.port), "--bind", "127.0.0.1", "--dir", p.dataDir,
		"--save", "", "--appendonly", appendonly, "--appendfsync", fsync, "--loglevel", "warning")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Env = append(os.Environ(), clockOffsetEnv+"="+p.wallOffset.String())
	stderr, err := cmd.StderrPipe()
	if err != nil {
		p.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	c := &container{cmd: cmd, exited: make(chan struct{}), logs: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if testing.Verbose() {
				fmt.Fprintln(os.Stderr, sc.Text())
			}
			select {
			case c.logs <- sc.Text():
			default:
			}
		}
	}()
	go func() {
		_ = cmd.Wait()
		c.code = cmd.ProcessState.ExitCode()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			c.code = 128 + int(ws.Signal())
		}
		close(c.exited)
	}()
	p.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exited
	})
	return c
}

// wait waits for the container to exit and returns its exit code.
func (c *container) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-c.exited:
		return c.code
	case <-time.After(15 * time.Second):
		t.Fatal("the gate did not exit")
		return -1
	}
}

// redisPID returns the PID of the gate's redis-server child (any of the
// gate's threads may have forked it).
func (c *container) redisPID(t *testing.T) int {
	t.Helper()
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", c.cmd.Process.Pid))
	for _, f := range files {
		b, _ := os.ReadFile(f) //nolint:gosec // a file of the test's own temporary directory
		if fields := strings.Fields(string(b)); len(fields) > 0 {
			pid, err := strconv.Atoi(fields[0])
			if err == nil {
				return pid
			}
		}
	}
	t.Fatal("the gate has no child process")
	return 0
}

func (p *pod) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", p.port), DisableIdentity: true, MaxRetries: -1, DialerRetries: 1})
}

// serving reports whether Redis accepts a connection and answers PING.
func (p *pod) serving() bool {
	c := p.client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	return c.Ping(ctx).Err() == nil
}

// firstServing polls until Redis serves and returns when it first did.
func (p *pod) firstServing(timeout time.Duration) time.Time {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for !p.serving() {
		if time.Now().After(deadline) {
			p.t.Fatalf("redis did not serve within %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Now()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *pod) set(key string) {
	c := p.client()
	defer c.Close()
	if err := c.Set(context.Background(), key, "v", 0).Err(); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pod) has(key string) bool {
	c := p.client()
	defer c.Close()
	err := c.Get(context.Background(), key).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		p.t.Fatal(err)
	}
	return err == nil
}

// A crash keeps Redis out for the restart delay, and a wall-clock step
// between the crash and the restart (NTP correcting a node, a VM resumed)
// does not shorten it: the gate measures the time since the crash on the
// boot clock.
func TestCrashKeepsRedisOutForTheRestartDelay(t *testing.T) {
	for _, step := range []time.Duration{0, time.Hour} {
		t.Run("wall clock stepped "+step.String(), func(t *testing.T) {
			const delay = 1500 * time.Millisecond
			p := newPod(t, gate.PersistenceNone, delay)
			p.admit(0)
			c := p.start()
			p.firstServing(10 * time.Second)

			crashed := time.Now() // before the kill: the gap measured is never shorter than the real one
			if err := syscall.Kill(c.redisPID(t), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if code := c.wait(t); code != 128+int(syscall.SIGKILL) {
				t.Fatalf("gate exit code %d, want 137 (the crash propagated)", code)
			}
			p.wallOffset = step
			p.start() // the kubelet restarts the container
			served := p.firstServing(delay + 10*time.Second)
			if gap := served.Sub(crashed); gap < delay {
				t.Fatalf("with the wall clock stepped %v, redis served %v after the crash, before the restart delay %v", step, gap, delay)
			} else {
				t.Logf("crash → first accepted connection: %v (restart delay %v)", gap.Round(time.Millisecond), delay)
			}
		})
	}
}

// A death nothing recorded counts from the next gate's start, not from the
// last heartbeat: a heartbeat says Redis was alive then, not that it died
// soon after (a late heartbeat, a stalled disk). The kubelet here restarts
// the container a second (five heartbeats) after the kill.
func TestUnrecordedDeathCountsFromTheRestart(t *testing.T) {
	const delay = 1500 * time.Millisecond
	p := newPod(t, gate.AOFEverySec, delay)
	p.admit(0)
	c := p.start()
	p.firstServing(10 * time.Second)
	waitFor(t, "a heartbeat", func() bool {
		st, err := gate.LoadState(p.stateDir)
		return err == nil && st != nil && st.AliveAt.After(st.StartedAt)
	})
	// The whole container dies at once: nothing records the end.
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c.wait(t)
	st, err := gate.LoadState(p.stateDir)
	if err != nil || st == nil || !st.EndedAt.IsZero() || st.AliveAt.IsZero() {
		t.Fatalf("record after an unrecorded death: %+v, %v", st, err)
	}
	restart := time.NewTimer(time.Second) // the kubelet's restart, later than a heartbeat
	<-restart.C
	restarted := time.Now()
	p.start()
	if gap := p.firstServing(delay + 10*time.Second).Sub(restarted); gap < delay {
		t.Fatalf("redis served %v after the container restarted, before the restart delay %v: an unrecorded death was bounded by a heartbeat", gap, delay)
	}
}

func TestCleanShutdownWithAOFRestartsAtOnce(t *testing.T) {
	const delay = time.Minute
	p := newPod(t, gate.AOFEverySec, delay)
	p.admit(0)
	c := p.start()
	p.firstServing(10 * time.Second)
	p.set("kept")
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil { // forwarded to redis
		t.Fatal(err)
	}
	if code := c.wait(t); code != 0 {
		t.Fatalf("gate exit code %d after SIGTERM, want 0 (redis shut down cleanly)", code)
	}
	st, _ := gate.LoadState(p.stateDir)
	if st == nil || !st.Clean {
		t.Fatalf("record: %+v, want a clean end", st)
	}
	p.start()
	p.firstServing(10 * time.Second) // far less than the one-minute delay
	if !p.has("kept") {
		t.Fatal("the AOF did not bring the key back")
	}
}

func TestAOFAlwaysRestartsAtOnceAfterACrash(t *testing.T) {
	p := newPod(t, gate.AOFAlways, time.Minute)
	p.admit(0)
	c := p.start()
	p.firstServing(10 * time.Second)
	p.set("fsynced")
	if err := syscall.Kill(c.redisPID(t), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.wait(t)
	p.start()
	p.firstServing(10 * time.Second)
	if !p.has("fsynced") {
		t.Fatal("an fsynced key was lost")
	}
}

func TestPersistenceNoneWaitsEvenAfterACleanShutdown(t *testing.T) {
	const delay = 1500 * time.Millisecond
	p := newPod(t, gate.PersistenceNone, delay)
	p.admit(0)
	c := p.start()
	p.firstServing(10 * time.Second)
	// The delay counts from when the gate recorded its stop, which comes
	// after the signal and before the process is reaped: measuring from
	// the signal is the bound the gate must keep (from the reaping, a
	// loaded machine makes the gap look short).
	stopping := time.Now()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if code := c.wait(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	p.start()
	if gap := p.firstServing(delay + 10*time.Second).Sub(stopping); gap < delay {
		t.Fatalf("served %v after the stop signal without persistence, before the delay %v", gap, delay)
	}
}

func TestNewPodWaitsForAdmission(t *testing.T) {
	p := newPod(t, gate.PersistenceNone, time.Minute)
	c := p.start()
	// No annotation yet: nothing serves.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if p.serving() {
			t.Fatal("redis served before admission")
		}
		time.Sleep(50 * time.Millisecond)
	}
	const delay = 800 * time.Millisecond
	admitted := p.admit(delay)
	if gap := p.firstServing(10 * time.Second).Sub(admitted); gap < delay {
		t.Fatalf("served %v after the admission, before its delay %v", gap, delay)
	}
	// SIGTERM while waiting for nothing more: the gate exits 0.
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if code := c.wait(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

func TestTerminationWhileWaitingStartsNothing(t *testing.T) {
	p := newPod(t, gate.PersistenceNone, time.Minute)
	c := p.start()
	c.waitLog(t, "waiting for admission")
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if code := c.wait(t); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if st, _ := gate.LoadState(p.stateDir); st != nil {
		t.Fatalf("a run was recorded although none started: %+v", st)
	}
}

// The operator's clock and the member's node's clock never meet: the
// admission is a delay the gate counts on its own clock, so a gate whose
// wall clock is an hour ahead of the operator's waits the whole delay, and
// one an hour behind does not wait an hour more.
func TestAdmissionDoesNotDependOnTheNodesWallClock(t *testing.T) {
	for _, offset := range []time.Duration{time.Hour, -time.Hour} {
		t.Run("gate clock "+offset.String(), func(t *testing.T) {
			const delay = 1500 * time.Millisecond
			p := newPod(t, gate.PersistenceNone, time.Minute)
			p.wallOffset = offset
			c := p.start()
			c.waitLog(t, "waiting for admission")
			admitted := p.admit(delay)
			gap := p.firstServing(delay + 10*time.Second).Sub(admitted)
			// The test-only hook shifted the gate's wall clock (else this
			// test would prove nothing): its record shows the shifted time.
			if st, err := gate.LoadState(p.stateDir); err != nil || st == nil || time.Since(st.StartedAt).Abs() < offset.Abs()/2 {
				t.Fatalf("the gate's record %+v (%v) does not show its wall clock %v off: was it built with the tag gateclocktest?", st, err, offset)
			}
			if gap < delay {
				t.Fatalf("with its wall clock %v off the operator's, the gate served %v after an admission of %v", offset, gap, delay)
			}
			t.Logf("admission (delay %v) → first accepted connection: %v", delay, gap.Round(time.Millisecond))
		})
	}
}

// A gate restarted while it waits out its admission (a startup probe, an
// eviction of the container) waits only the rest of that admission's delay:
// counting the whole delay again from every start could keep a member out
// for good.
func TestRestartedGateWaitsTheRestOfItsAdmission(t *testing.T) {
	const delay = 3 * time.Second
	p := newPod(t, gate.PersistenceNone, time.Minute)
	c := p.start()
	c.waitLog(t, "waiting for admission")
	admitted := p.admit(delay)
	c.waitLog(t, "holding redis back")
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if code := c.wait(t); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	c = p.start()
	line := c.waitLog(t, "holding redis back")
	if !strings.Contains(line, "admitted before this gate restarted") {
		t.Fatalf("the restarted gate did not resume its admission: %s", line)
	}
	_, rest, _ := strings.Cut(line, " for=")
	left, err := time.ParseDuration(strings.Fields(rest + " ")[0])
	if err != nil || left <= 0 || left >= delay {
		t.Fatalf("the restarted gate waits %q (%v), want the rest of the %v delay", rest, err, delay)
	}
	if gap := p.firstServing(delay + 10*time.Second).Sub(admitted); gap < delay {
		t.Fatalf("served %v after the admission, before its delay %v", gap, delay)
	}
}
