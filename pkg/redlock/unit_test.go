package redlock

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseServerInfo(t *testing.T) {
	tests := []struct {
		name    string
		info    string
		runID   string
		uptime  time.Duration
		wantErr bool
	}{
		{"redis 7", "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n", "abc123", 42 * time.Second, false},
		{"redis 6", "# Server\r\nredis_version:6.2.14\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n", "", 0, true},
		{"redis 10", "# Server\r\nredis_version:10.0.0\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n", "abc123", 42 * time.Second, false},
		{"no run_id", "# Server\r\nuptime_in_seconds:42\r\n", "", 0, true},
		{"no uptime", "run_id:abc\r\n", "", 0, true},
		{"bad uptime", "run_id:abc\r\nuptime_in_seconds:x\r\n", "", 0, true},
		{"negative uptime", "run_id:abc\r\nuptime_in_seconds:-1\r\n", "", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runID, uptime, err := parseServerInfo(tc.info)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if runID != tc.runID || uptime != tc.uptime {
				t.Fatalf("got (%q, %v), want (%q, %v)", runID, uptime, tc.runID, tc.uptime)
			}
		})
	}
}

func TestDecisionAndFailureKind(t *testing.T) {
	tests := []struct {
		n       int
		t       Tally
		decided bool
		kind    error // failure kind when decided without a quorum
	}{
		{5, Tally{Granted: 3, Pending: 2}, true, nil},
		{5, Tally{Granted: 2, Pending: 3}, false, nil},
		{5, Tally{Granted: 2, Held: 1, Pending: 2}, false, nil},
		{5, Tally{Granted: 2, Held: 3}, true, ErrLockHeld},
		{5, Tally{Granted: 2, Error: 3}, true, ErrQuorumUnavailable},
		{5, Tally{Held: 1, Error: 1, Pending: 3}, false, nil},
		{5, Tally{Held: 1, Error: 2, Pending: 2}, true, ErrLockHeld}, // the pending two could grant: contention
		{5, Tally{Held: 1, Error: 2, Granted: 2}, true, ErrLockHeld}, // 3 answered usably: contention
		{5, Tally{Quarantined: 2, Error: 1, Granted: 2}, true, ErrQuorumUnavailable},
		{1, Tally{Granted: 1}, true, nil},
		{1, Tally{Held: 1}, true, ErrLockHeld},
		{3, Tally{Absent: 2, Granted: 1}, true, ErrNotHeld},
		{7, Tally{Granted: 3, Error: 3, Pending: 1}, false, nil},
		{7, Tally{Granted: 3, Error: 4}, true, ErrQuorumUnavailable},
	}
	for _, tc := range tests {
		c := &Client{nodes: make([]*node, tc.n), quorum: tc.n/2 + 1, lists: []list{{members: make([]int, tc.n), quorum: tc.n/2 + 1}}}
		if got := c.decidedForQuorum([]Tally{tc.t}); got != tc.decided {
			t.Errorf("n=%d %+v: decided = %v, want %v", tc.n, tc.t, got, tc.decided)
		}
		if !tc.decided || tc.t.Granted >= c.quorum {
			continue
		}
		contention := ErrLockHeld
		if tc.t.Absent > 0 {
			contention = ErrNotHeld
		}
		if got := c.failureKind([]Tally{tc.t}, contention); !errors.Is(got, tc.kind) {
			t.Errorf("n=%d %+v: failure kind = %v, want %v", tc.n, tc.t, got, tc.kind)
		}
	}
}

// TestJointQuorum checks the decisions of a joint client (WithJoint) over
// the tallies of its two lists: one member of five replaced (four shared),
// the new one not voting yet.
func TestJointQuorum(t *testing.T) {
	tests := []struct {
		name              string
		current, previous Tally
		decided, granted  bool
		unreachable       bool
	}{
		{"a quorum of the previous list only", Tally{Granted: 2, Quarantined: 1, Pending: 2}, Tally{Granted: 3, Pending: 2}, false, false, false},
		{"a quorum of each", Tally{Granted: 3, Quarantined: 1, Pending: 1}, Tally{Granted: 3, Pending: 2}, true, true, false},
		{"the previous list held elsewhere", Tally{Granted: 3, Quarantined: 1, Pending: 1}, Tally{Granted: 2, Held: 3}, true, false, false},
		{"the new list short of voters", Tally{Granted: 2, Quarantined: 1, Error: 2}, Tally{Granted: 2, Error: 2, Pending: 1}, true, false, true},
		{"the previous list short of voters", Tally{Granted: 3, Quarantined: 1, Pending: 1}, Tally{Granted: 2, Error: 3}, true, false, true},
	}
	c := &Client{nodes: make([]*node, 6), quorum: 3, lists: []list{{members: []int{0, 1, 2, 3, 4}, quorum: 3}, {members: []int{0, 1, 2, 3, 5}, quorum: 3}}}
	for _, tc := range tests {
		ts := []Tally{tc.current, tc.previous}
		if got := c.decidedForQuorum(ts); got != tc.decided {
			t.Errorf("%s: decided = %v, want %v", tc.name, got, tc.decided)
		}
		if got := c.granted(ts); got != tc.granted {
			t.Errorf("%s: granted = %v, want %v", tc.name, got, tc.granted)
		}
		if got := c.unreachable(ts); got != tc.unreachable {
			t.Errorf("%s: unreachable = %v, want %v", tc.name, got, tc.unreachable)
		}
	}
}

func TestNodeTimeoutAndDrift(t *testing.T) {
	c := &Client{}
	for _, tc := range []struct{ ttl, want time.Duration }{
		{time.Second, MinNodeTimeout},
		{10 * time.Second, 100 * time.Millisecond},
		{time.Minute, MaxNodeTimeout},
	} {
		if got := c.nodeTimeout(tc.ttl); got != tc.want {
			t.Errorf("nodeTimeout(%v) = %v, want %v", tc.ttl, got, tc.want)
		}
	}
	c.cfg.nodeTimeout = 7 * time.Millisecond
	if got := c.nodeTimeout(time.Minute); got != 7*time.Millisecond {
		t.Errorf("configured nodeTimeout ignored: %v", got)
	}
	if got, want := Drift(10*time.Second), 102*time.Millisecond; got != want {
		t.Errorf("Drift(10s) = %v, want %v", got, want)
	}
}

func TestErrorMessageAndMatching(t *testing.T) {
	e := &Error{Op: OpAcquire, Key: "k", Quorum: 2, Votes: []Vote{
		{Addr: "a:1", Outcome: OutcomeGranted},
		{Addr: "b:1", Outcome: OutcomeError, Err: errors.New("OOM command not allowed")},
		{Addr: "c:1", Outcome: OutcomePending},
	}, kind: ErrCancelled, cause: context.Canceled}
	msg := e.Error()
	for _, want := range []string{`acquire "k"`, "cancelled", "1 granted", "1 errors", "1 pending", "b:1: OOM"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if !errors.Is(e, ErrCancelled) || !errors.Is(e, context.Canceled) || errors.Is(e, ErrLockHeld) {
		t.Errorf("errors.Is matching wrong for %v", e)
	}
	var target *Error
	if !errors.As(error(e), &target) || target.Key != "k" {
		t.Errorf("errors.As failed")
	}
}

// TestQuarantineClock checks the window arithmetic against an injected clock:
// a master up for 2s under a 10s window is quarantined for 9s more (its
// uptime is counted in whole seconds of two clocks: one may be missing).
func TestQuarantineClock(t *testing.T) {
	now := time.Unix(5000, 0)
	var events []QuarantineEvent
	cfg := clockedConfig(10*time.Second, &now, &events)
	n := &node{addr: "x:1", cfg: &cfg}
	n.apply("run1", 2*time.Second)
	if q, until := n.quarantined(); !q || !until.Equal(now.Add(9*time.Second)) {
		t.Fatalf("quarantined = %v until %v, want true until +9s", q, until)
	}
	if len(events) != 1 || events[0].RunID != "run1" {
		t.Fatalf("events = %+v, want one for run1", events)
	}
	n.apply("run1", 2*time.Second) // another new connection, same incarnation
	if len(events) != 1 {
		t.Fatalf("a second connection to the same incarnation re-reported the quarantine")
	}
	now = now.Add(9 * time.Second)
	if q, _ := n.quarantined(); q {
		t.Fatalf("still quarantined after the window")
	}
	n.apply("run1", 20*time.Second) // long-running master: no quarantine
	if q, _ := n.quarantined(); q {
		t.Fatalf("quarantined a master up for longer than the window")
	}
	n.apply("run2", 0) // restarted
	if q, until := n.quarantined(); !q || !until.Equal(now.Add(10*time.Second)) || len(events) != 2 {
		t.Fatalf("restart not quarantined for the full window: %v %v %d", q, until, len(events))
	}
	now = now.Add(10 * time.Second)
	// Another server, up for an hour, answers at the address: it lacks the
	// keys the previous one held.
	n.apply("run3", time.Hour)
	if q, until := n.quarantined(); !q || !until.Equal(now.Add(10*time.Second)) || len(events) != 3 || events[2].RunID != "run3" {
		t.Fatalf("run_id change with a long uptime: quarantined = %v until %v, %d events; want the full window", q, until, len(events))
	}
	// The first connection to an address has nothing to compare with: its
	// uptime decides.
	fresh := &node{addr: "y:1", cfg: &cfg}
	fresh.apply("other", time.Hour)
	if q, _ := fresh.quarantined(); q {
		t.Fatalf("first connection to a long-running master quarantined")
	}
	// A master that reports exactly the window may have been up for
	// almost a second less.
	edge := &node{addr: "z:1", cfg: &cfg}
	edge.apply("edge", 10*time.Second)
	if q, until := edge.quarantined(); !q || !until.Equal(now.Add(time.Second)) {
		t.Fatalf("a master reporting an uptime of the window: quarantined = %v until %v, want until +1s", q, until)
	}
	// A longer window another client registered on the master governs
	// while it stands, and is carried over the master's restart although
	// the new run forgot it.
	now = now.Add(time.Hour)
	n.learn(time.Minute, 2*time.Minute, now)
	n.apply("run3", 15*time.Second)
	if q, until := n.quarantined(); !q || !until.Equal(now.Add(46*time.Second)) {
		t.Fatalf("a master up 15s with a 1m window registered on it: quarantined = %v until %v, want until +46s", q, until)
	}
	now = now.Add(time.Minute)
	n.apply("run4", 0)
	if q, until := n.quarantined(); !q || !until.Equal(now.Add(time.Minute)) {
		t.Fatalf("restart a minute after a 1m window was learned: quarantined = %v until %v, want the 1m window", q, until)
	}
	// Once nobody registered it for its whole life, it lapses.
	now = now.Add(2 * time.Minute)
	n.apply("run5", 0)
	if q, until := n.quarantined(); !q || !until.Equal(now.Add(10*time.Second)) {
		t.Fatalf("restart after the 1m window lapsed: quarantined = %v until %v, want the own 10s window", q, until)
	}
	// A window over MaxWindow is not learned.
	n.learn(MaxWindow+time.Hour, time.Hour, now)
	if w := n.windowLocked(now); w != 10*time.Second {
		t.Fatalf("a window over MaxWindow was learned: %v", w)
	}
}

// TestLongerWindowLearnedLater: a master judged by the client's own window
// (up long enough for it) is kept out when a longer window another client
// registered is learned later, until that window has passed since the
// master started; one up for longer than that still votes.
func TestLongerWindowLearnedLater(t *testing.T) {
	now := time.Unix(5000, 0)
	var events []QuarantineEvent
	cfg := clockedConfig(10*time.Second, &now, &events)
	young, old := &node{addr: "x:1", cfg: &cfg}, &node{addr: "y:1", cfg: &cfg}
	young.apply("young", 13*time.Second) // up 12 to 13s: votes under 10s
	old.apply("old", time.Hour)
	if q, _ := young.quarantined(); q || len(events) != 0 {
		t.Fatalf("a master up 12s under a 10s window: quarantined %v, events %+v", q, events)
	}
	now = now.Add(time.Second)
	young.learn(20*time.Second, time.Minute, now)
	old.learn(20*time.Second, time.Minute, now)
	// Started at most 12s before the first connection, 13s before now.
	if q, until := young.quarantined(); !q || !until.Equal(now.Add(7*time.Second)) {
		t.Fatalf("after a 20s window was learned: quarantined = %v until %v, want until +7s", q, until)
	}
	if len(events) != 1 || events[0].Addr != "x:1" {
		t.Fatalf("events %+v, want one for the young master", events)
	}
	if q, _ := old.quarantined(); q {
		t.Fatalf("a master up for an hour was quarantined by a 20s window")
	}
}

// clockedConfig is a config with the given quarantine window, reading the
// time from *now and recording quarantine events in *events.
func clockedConfig(window time.Duration, now *time.Time, events *[]QuarantineEvent) config {
	cfg := defaultConfig()
	cfg.quarantine, cfg.now = window, func() time.Time { return *now }
	cfg.observer = &recordingObserver{onQuarantine: func(e QuarantineEvent) { *events = append(*events, e) }}
	return cfg
}

type recordingObserver struct {
	nopObserver
	onQuarantine func(QuarantineEvent)
}

func (o *recordingObserver) ObserveQuarantine(e QuarantineEvent) { o.onQuarantine(e) }

func TestOptionsRejectBadValues(t *testing.T) {
	for name, opt := range map[string]Option{
		"node timeout":   WithNodeTimeout(0),
		"tries":          WithTries(0),
		"retry delay":    WithRetryDelay(time.Second, time.Millisecond),
		"quarantine":     WithQuarantine(-time.Second),
		"max extensions": WithMaxExtensions(-1),
		"observer":       WithObserver(nil),
		"tls":            WithTLS(nil),
		"pool size":      WithPoolSize(0),
		"redis options":  WithRedisOptions(nil),
		"nil option":     nil,
	} {
		if _, err := New([]string{"127.0.0.1:1"}, opt); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
}

// TestExtendRefusesTTLBeyondQuarantineWindow: Extend checks the TTL against
// the window like Acquire and Restore do, before sending anything (the
// master address here accepts no connection).
func TestExtendRefusesTTLBeyondQuarantineWindow(t *testing.T) {
	c, err := New([]string{"127.0.0.1:1"}, WithQuarantine(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l := &Lock{c: c, key: "k", value: "v", ttl: 10 * time.Second, validUntil: time.Now().Add(time.Second)}
	if err := l.Extend(context.Background()); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("err = %v, want ErrInvalidArgument", err)
	}
	if !l.Valid() {
		t.Fatal("a refused extension changed the lock's validity")
	}
}

// TestTurnSettled: a line's round that stops at a settled quorum of
// answers gives the turn every completion would (each pending master
// answering anything, or not at all), and a paused master of five does
// not keep a clear line's check waiting.
func TestTurnSettled(t *testing.T) {
	kinds := []lineAnswer{}
	for _, ahead := range []int64{0, 1, 2} {
		for _, pttl := range []int64{-2, 500} {
			for _, reg := range []int64{1, 0, -1} {
				kinds = append(kinds, lineAnswer{ahead: ahead, pttl: pttl, reg: reg})
			}
		}
	}
	rng := rand.New(rand.NewPCG(42, 42))
	settled := 0
	for range 20000 {
		masters := 1 + 2*rng.IntN(4) // 1, 3, 5, 7
		quorum := masters/2 + 1
		heads := 1 + rng.IntN(2)
		ticket := int64(rng.IntN(2)) * 7
		answered := quorum + rng.IntN(masters-quorum+1)
		var answers []lineAnswer
		for range answered {
			answers = append(answers, kinds[rng.IntN(len(kinds))])
		}
		pending := masters - answered
		if !turnSettled(answers, pending, heads, ticket, quorum) {
			continue
		}
		settled++
		want := turnOf(answers, heads, ticket, quorum)
		if !want.Go {
			t.Fatalf("settled on %v (%d pending) without a turn: a waiter's Ahead would come from the first answers", answers, pending)
		}
		for range 20 {
			final := slices.Clone(answers)
			for range pending {
				if k := rng.IntN(len(kinds) + 1); k < len(kinds) {
					final = append(final, kinds[k])
				}
			}
			got := turnOf(final, heads, ticket, quorum)
			if got.Go != want.Go || got.Free != want.Free || got.Registered != want.Registered || got.Ticket != want.Ticket {
				t.Fatalf("settled on %v (%d pending, heads %d, ticket %d): turn %+v, but with %v it is %+v", answers, pending, heads, ticket, want, final, got)
			}
		}
	}
	if settled < 1000 {
		t.Fatalf("only %d of 20000 rounds settled early", settled)
	}
	clear := lineAnswer{ahead: 0, pttl: -2, reg: 1}
	four := []lineAnswer{clear, clear, clear, clear}
	if !turnSettled(four, 1, 1, 0, 3) || !turnSettled(four, 1, 1, 9, 3) {
		t.Fatal("a clear line's peek and check wait for a fifth master")
	}
	if turnSettled(four[:2], 3, 1, 0, 3) {
		t.Fatal("settled on fewer than a quorum of answers")
	}
}
