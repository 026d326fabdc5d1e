package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlock-operator/redlock-operator/internal/harness/history"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// TestMain silences go-redis's own logging of refused dials: the tests
// refuse many on purpose.
func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

// newClient returns a client for addrs that is closed (and its clean-ups
// awaited) when the test ends.
func newClient(t *testing.T, addrs []string, opts ...redlock.Option) *redlock.Client {
	t.Helper()
	c, err := redlock.New(addrs, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// value reads key on one server ("" when absent).
func value(t *testing.T, s *redistest.Server, key string) string {
	t.Helper()
	c := s.Client()
	defer c.Close()
	v, err := c.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		t.Fatalf("GET %s on %s: %v", key, s.Addr(), err)
	}
	return v
}

func set(t *testing.T, s *redistest.Server, key, val string, ttl time.Duration) {
	t.Helper()
	c := s.Client()
	defer c.Close()
	if err := c.Set(context.Background(), key, val, ttl).Err(); err != nil {
		t.Fatalf("SET %s on %s: %v", key, s.Addr(), err)
	}
}

func pttl(t *testing.T, s *redistest.Server, key string) time.Duration {
	t.Helper()
	c := s.Client()
	defer c.Close()
	d, err := c.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("PTTL %s on %s: %v", key, s.Addr(), err)
	}
	return d
}

func flushAll(t *testing.T, servers []*redistest.Server) {
	t.Helper()
	for _, s := range servers {
		c := s.Client()
		if err := c.FlushAll(context.Background()).Err(); err != nil {
			t.Fatalf("FLUSHALL on %s: %v", s.Addr(), err)
		}
		c.Close()
	}
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func countOutcome(votes []redlock.Vote, o redlock.Outcome) int {
	n := 0
	for _, v := range votes {
		if v.Outcome == o {
			n++
		}
	}
	return n
}

// complete reports whether every master's vote was in when err was decided.
func complete(err error) bool {
	var e *redlock.Error
	return errors.As(err, &e) && countOutcome(e.Votes, redlock.OutcomePending) == 0
}

func votesOf(t *testing.T, err error) []redlock.Vote {
	t.Helper()
	var e *redlock.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not a *redlock.Error", err)
	}
	return e.Votes
}

// TestQuorumTable acquires with N = 1, 3, 5, 7 masters while d of them are
// down (SIGKILLed) and f hold another client's value, for every d+f <= N.
func TestQuorumTable(t *testing.T) {
	all := redistest.StartN(t, 7, redistest.Options{})
	for _, n := range []int{1, 3, 5, 7} {
		servers := all[:n]
		quorum := n/2 + 1
		for down := 0; down <= n; down++ {
			for foreign := 0; down+foreign <= n; foreign++ {
				t.Run(fmt.Sprintf("N=%d/down=%d/foreign=%d", n, down, foreign), func(t *testing.T) {
					key := fmt.Sprintf("quorum-%d-%d-%d", n, down, foreign)
					for _, s := range servers[:down] {
						if err := s.Kill(); err != nil {
							t.Fatal(err)
						}
					}
					defer func() {
						for _, s := range servers[:down] {
							if err := s.Restart(false); err != nil {
								t.Fatal(err)
							}
						}
						flushAll(t, servers)
					}()
					for _, s := range servers[down : down+foreign] {
						set(t, s, key, "foreign", time.Minute)
					}
					c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(2*time.Second))
					lock, err := c.Acquire(context.Background(), key, 10*time.Second)
					free := n - down - foreign
					switch {
					case free >= quorum:
						if err != nil {
							t.Fatalf("Acquire with %d free masters of %d: %v", free, n, err)
						}
						if !lock.Valid() || time.Until(lock.ValidUntil()) > 10*time.Second {
							t.Fatalf("validity %v out of range", time.Until(lock.ValidUntil()))
						}
						// A quorum holds the value when Acquire returns; the
						// other free masters get it when their SET lands.
						holding := 0
						for _, s := range servers[down:] {
							if value(t, s, key) == lock.Value() {
								holding++
							}
						}
						if holding < quorum {
							t.Errorf("%d masters hold the lock's value, want a quorum (%d)", holding, quorum)
						}
						waitFor(t, 2*time.Second, "every free master to hold the value", func() bool {
							for _, s := range servers[down+foreign:] {
								if value(t, s, key) != lock.Value() {
									return false
								}
							}
							return true
						})
					case n-down < quorum && complete(err):
						if !errors.Is(err, redlock.ErrQuorumUnavailable) {
							t.Fatalf("Acquire with %d of %d down: err = %v, want ErrQuorumUnavailable", down, n, err)
						}
					case complete(err):
						if !errors.Is(err, redlock.ErrLockHeld) {
							t.Fatalf("Acquire with %d foreign of %d: err = %v, want ErrLockHeld", foreign, n, err)
						}
					default:
						// Decided before every master answered: the reason is
						// read from the votes received (see TestDecisionAndFailureKind).
						if !errors.Is(err, redlock.ErrQuorumUnavailable) && !errors.Is(err, redlock.ErrLockHeld) {
							t.Fatalf("err = %v, want ErrQuorumUnavailable or ErrLockHeld", err)
						}
					}
					if err != nil {
						// Votes decided early may still be pending; none
						// contradicts the master's role.
						for i, v := range votesOf(t, err) {
							allowed := map[redlock.Outcome]bool{redlock.OutcomePending: true}
							switch {
							case i < down:
								allowed[redlock.OutcomeError] = true
							case i < down+foreign:
								allowed[redlock.OutcomeHeld] = true
							default:
								allowed[redlock.OutcomeGranted] = true
							}
							if !allowed[v.Outcome] {
								t.Errorf("master %d (%s) voted %v", i, v.Addr, v.Outcome)
							}
						}
						// A failed acquisition leaves nothing on reachable
						// masters (stragglers are cleaned in the background).
						waitFor(t, 2*time.Second, "clean-up of the free masters", func() bool {
							for _, s := range servers[down+foreign:] {
								if value(t, s, key) != "" {
									return false
								}
							}
							return true
						})
					}
					// Another holder's value is never touched.
					for _, s := range servers[down : down+foreign] {
						if got := value(t, s, key); got != "foreign" {
							t.Errorf("foreign value on %s became %q", s.Addr(), got)
						}
					}
				})
			}
		}
	}
}

func TestBadInputSendsNothing(t *testing.T) {
	servers := redistest.StartN(t, 1, redistest.Options{})
	admin := servers[0].Client()
	defer admin.Close()
	connections := func() string {
		info, err := admin.Info(context.Background(), "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(info) {
			if strings.HasPrefix(line, "total_connections_received:") {
				return strings.TrimSpace(line)
			}
		}
		t.Fatal("no total_connections_received")
		return ""
	}
	before := connections()
	c := newClient(t, redistest.Addrs(servers))
	ctx := context.Background()
	huge := strings.Repeat("k", 512<<20+1)
	for name, ttl := range map[string]time.Duration{
		"zero ttl": 0, "negative ttl": -time.Second, "fractional ms": 1500 * time.Microsecond, "ttl eaten by drift": 2 * time.Millisecond,
	} {
		if _, err := c.Acquire(ctx, "k", ttl); !errors.Is(err, redlock.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := c.Acquire(ctx, "", time.Second); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("empty key: err = %v", err)
	}
	if _, err := c.Acquire(ctx, huge, time.Second); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("oversized key: err = %v", err)
	}
	// Another lock's fencing counter (issue 18, case 8).
	if _, err := c.Acquire(ctx, redlock.FenceKey("k"), time.Second); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("a fence key as the key: err = %v", err)
	}
	if _, err := c.Restore(redlock.FenceKey("k"), "v", time.Second, time.Now()); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("Restore of a fence key: err = %v", err)
	}
	if _, err := c.Acquire(ctx, redlock.WindowKey, time.Second); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("the masters' quarantine window as the key: err = %v", err)
	}
	if _, err := c.Restore("k", huge, time.Second, time.Now()); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("oversized value: err = %v", err)
	}
	if _, err := c.Restore("k", "", time.Second, time.Now()); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("empty value: err = %v", err)
	}
	if _, err := c.Acquire(ctx, "k", time.Second, redlock.WithValue(huge)); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("oversized WithValue: err = %v", err)
	}
	if _, err := c.Acquire(ctx, "k", time.Second, nil); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("nil acquire option: err = %v", err)
	}
	for name, addrs := range map[string][]string{
		"no masters": nil, "malformed": {"localhost"}, "duplicate": {servers[0].Addr(), servers[0].Addr()},
	} {
		if _, err := redlock.New(addrs); !errors.Is(err, redlock.ErrInvalidArgument) {
			t.Errorf("New %s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
	if after := connections(); after != before {
		t.Fatalf("bad input reached the master: %s, then %s", before, after)
	}
}

// TestMutualExclusionUnderContention runs many contending clients on a few
// keys and checks the recorded history: no two validity windows of one key
// overlap. Some holders release early, some let the lock expire.
func TestMutualExclusionUnderContention(t *testing.T) {
	servers := redistest.StartN(t, 5, redistest.Options{})
	addrs := redistest.Addrs(servers)
	keys := []string{"mx-a", "mx-b", "mx-c"}
	const workers, rounds = 12, 12
	var rec historyRecorder
	var wg sync.WaitGroup
	for w := range workers {
		// Each worker is its own client, like separate processes.
		c := newClient(t, addrs, redlock.WithTries(20), redlock.WithRetryDelay(time.Millisecond, 15*time.Millisecond),
			redlock.WithNodeTimeout(100*time.Millisecond))
		wg.Go(func() {
			for r := range rounds {
				key := keys[(w+r)%len(keys)]
				lock, err := c.Acquire(context.Background(), key, 200*time.Millisecond)
				if err != nil {
					// Contention, a master too slow on this loaded
					// machine, or a quorum reached too late: none may
					// break mutual exclusion.
					if !errors.Is(err, redlock.ErrLockHeld) && !errors.Is(err, redlock.ErrQuorumUnavailable) && !errors.Is(err, redlock.ErrExpired) {
						t.Errorf("worker %d: %v", w, err)
					}
					continue
				}
				start := time.Now()
				holder := fmt.Sprintf("w%d-r%d", w, r)
				if r%4 == 3 {
					// Walk away: the lock must expire before anyone else gets it.
					rec.add(key, holder, start, lock.ValidUntil())
					continue
				}
				time.Sleep(time.Duration(r%3) * 5 * time.Millisecond) // the critical section
				end := time.Now()
				if vu := lock.ValidUntil(); vu.Before(end) {
					end = vu
				}
				rec.add(key, holder, start, end)
				// A release that reaches no quorum on a loaded machine leaves
				// copies that expire with the TTL: it cannot break exclusion
				// either, and the history check below still covers it.
				if err := lock.Release(context.Background()); err != nil && !errors.Is(err, redlock.ErrNotHeld) && !errors.Is(err, redlock.ErrQuorumUnavailable) {
					t.Errorf("release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	rec.check(t, len(keys))
}

func TestMinorityDownStillWorks(t *testing.T) {
	servers := redistest.StartN(t, 5, redistest.Options{})
	for _, s := range servers[:2] {
		if err := s.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	// The dead masters refuse at once; the live ones get a node timeout a
	// loaded machine does not exceed (the default, ttl/100, is 50ms: a CPU
	// hog on each core once made one live master miss it, and the single
	// try failed).
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(2*time.Second))
	ctx := context.Background()
	lock, err := c.Acquire(ctx, "minority", 5*time.Second)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	first := lock.ValidUntil()
	if err := lock.Extend(ctx); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if !lock.ValidUntil().After(first) {
		t.Fatalf("Extend did not move the validity forward")
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	for _, s := range servers[2:] {
		if v := value(t, s, "minority"); v != "" {
			t.Fatalf("released key still on %s", s.Addr())
		}
	}
}

func TestMajorityDownFailsFast(t *testing.T) {
	servers := redistest.StartN(t, 5, redistest.Options{})
	for _, s := range servers[:3] {
		if err := s.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	const nodeTimeout = 30 * time.Second
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout))
	start := time.Now()
	_, err := c.Acquire(context.Background(), "majority", 5*time.Second)
	if !errors.Is(err, redlock.ErrQuorumUnavailable) {
		t.Fatalf("err = %v, want ErrQuorumUnavailable", err)
	}
	// Refused connections decide the outcome; nothing waits for a timeout.
	if took := time.Since(start); took >= nodeTimeout {
		t.Fatalf("Acquire took %v, as long as the node timeout", took)
	}
	if got := countOutcome(votesOf(t, err), redlock.OutcomeError); got != 3 {
		t.Fatalf("error votes = %d, want 3", got)
	}
	waitFor(t, 2*time.Second, "clean-up of the live masters", func() bool {
		return value(t, servers[3], "majority") == "" && value(t, servers[4], "majority") == ""
	})
}

// TestStoppedMastersDoNotDelayAcquire freezes two of five masters: the
// other three decide, long before the frozen ones' timeout.
func TestStoppedMastersDoNotDelayAcquire(t *testing.T) {
	servers := redistest.StartN(t, 5, redistest.Options{})
	for _, s := range servers[:2] {
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, s := range servers[:2] {
			_ = s.Cont()
		}
	})
	const nodeTimeout = 30 * time.Second
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout))
	for _, key := range []string{"stopped-1", "stopped-2"} {
		start := time.Now()
		lock, err := c.Acquire(context.Background(), key, 10*time.Second)
		if err != nil {
			t.Fatalf("Acquire %s: %v", key, err)
		}
		if took := time.Since(start); took >= nodeTimeout {
			t.Fatalf("Acquire waited %v for the stopped masters", took)
		}
		if !lock.Valid() {
			t.Fatalf("lock not valid")
		}
		start = time.Now()
		if err := lock.Extend(context.Background()); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		if took := time.Since(start); took >= nodeTimeout {
			t.Fatalf("Extend waited %v for the stopped masters", took)
		}
	}
	for _, s := range servers[:2] {
		if err := s.Cont(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFailedAttemptOnStoppedMastersExpires: an attempt fails while two
// masters are frozen; their buffered SETs run after SIGCONT, and the keys
// they create are gone within the TTL.
func TestFailedAttemptOnStoppedMastersExpires(t *testing.T) {
	servers := redistest.StartN(t, 5, redistest.Options{})
	const key, ttl = "stale", 1500 * time.Millisecond
	set(t, servers[2], key, "foreign", time.Minute)
	for _, s := range servers[:2] {
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(200*time.Millisecond))
	_, err := c.Acquire(context.Background(), key, ttl)
	if !errors.Is(err, redlock.ErrLockHeld) {
		t.Fatalf("err = %v, want ErrLockHeld", err)
	}
	for _, s := range servers[3:] {
		if v := value(t, s, key); v != "" {
			t.Fatalf("failed Acquire left %q on reachable %s", v, s.Addr())
		}
	}
	for _, s := range servers[:2] {
		if err := s.Cont(); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range servers[:2] {
		if d := pttl(t, s, key); d > ttl {
			t.Fatalf("stale key on %s lives %v, longer than the TTL %v", s.Addr(), d, ttl)
		}
	}
	waitFor(t, ttl+time.Second, "stale keys to expire", func() bool {
		return value(t, servers[0], key) == "" && value(t, servers[1], key) == ""
	})
	if v := value(t, servers[2], key); v != "foreign" {
		t.Fatalf("foreign value became %q", v)
	}
}

// TestCancelledAcquireCleansUp cancels an acquisition that cannot decide
// (three of five masters frozen): it returns at once, and the two masters
// that granted are cleaned although the caller's context is gone.
func TestCancelledAcquireCleansUp(t *testing.T) {
	servers := redistest.StartN(t, 5, redistest.Options{})
	for _, s := range servers[:3] {
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, s := range servers[:3] {
			_ = s.Cont()
		}
	})
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	granted := make(chan bool, 1)
	go func() {
		// Cancel once both live masters have stored the value (polled with
		// plain clients: t.Fatal is not for this goroutine).
		defer cancel()
		a, b := servers[3].Client(), servers[4].Client()
		defer a.Close()
		defer b.Close()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if a.Exists(context.Background(), "cancel").Val() == 1 && b.Exists(context.Background(), "cancel").Val() == 1 {
				granted <- true
				return
			}
		}
		granted <- false
	}()
	_, err := c.Acquire(ctx, "cancel", time.Minute)
	if !<-granted {
		t.Fatal("the live masters never stored the value")
	}
	if !errors.Is(err, redlock.ErrCancelled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want ErrCancelled and context.Canceled", err)
	}
	waitFor(t, 5*time.Second, "clean-up of the granted masters", func() bool {
		return value(t, servers[3], "cancel") == "" && value(t, servers[4], "cancel") == ""
	})
}

func TestReleaseNeverDeletesAnotherHoldersKey(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	// Retries: a 100ms grant takes more than one try on a loaded machine
	// (its node timeout is 50ms), and the test is about the release.
	c := newClient(t, redistest.Addrs(servers))
	ctx := context.Background()
	if _, err := c.Probe(ctx); err != nil { // connects first
		t.Fatal(err)
	}
	old, err := c.Acquire(ctx, "handover", 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the first lock to expire", func() bool {
		return value(t, servers[0], "handover") == "" && value(t, servers[1], "handover") == "" && value(t, servers[2], "handover") == ""
	})
	current, err := c.Acquire(ctx, "handover", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Release(ctx); !errors.Is(err, redlock.ErrNotHeld) {
		t.Fatalf("releasing the expired lock: err = %v, want ErrNotHeld", err)
	}
	waitFor(t, 2*time.Second, "the current holder's value on every master", func() bool {
		for _, s := range servers {
			if value(t, s, "handover") != current.Value() {
				return false
			}
		}
		return true
	})
}

func TestExtendAfterExpiryDoesNotResurrect(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	// A few tries: at ttl 100ms a node's timeout is 50ms, which a first
	// connection (dial and handshake) can miss on a loaded machine; what
	// is tested comes after the grant.
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(5))
	ctx := context.Background()
	lock, err := c.Acquire(ctx, "lapsed", 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	gone := func() bool {
		for _, s := range servers {
			if value(t, s, "lapsed") != "" {
				return false
			}
		}
		return true
	}
	waitFor(t, 2*time.Second, "keys to expire", gone)
	if err := lock.Extend(ctx); !errors.Is(err, redlock.ErrExpired) {
		t.Fatalf("Extend after expiry: err = %v, want ErrExpired", err)
	}
	// A restored lock that claims more validity than it has: the scripts see
	// the keys gone and do not re-create them.
	liar, err := c.Restore("lapsed", lock.Value(), time.Minute, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	err = liar.Extend(ctx)
	if !errors.Is(err, redlock.ErrNotHeld) {
		t.Fatalf("Extend of vanished keys: err = %v, want ErrNotHeld", err)
	}
	if got := countOutcome(votesOf(t, err), redlock.OutcomeAbsent); got < 2 {
		t.Fatalf("absent votes = %d, want a quorum (2)", got)
	}
	if !gone() {
		t.Fatal("Extend re-created an expired key")
	}
	if liar.Valid() {
		t.Fatal("a lock whose value a quorum lost still reports itself valid")
	}
}

func TestExtendRespectsMaxExtensions(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	c := newClient(t, redistest.Addrs(servers), redlock.WithMaxExtensions(2))
	ctx := context.Background()
	lock, err := c.Acquire(ctx, "bounded", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := lock.Extend(ctx); err != nil {
			t.Fatalf("extension %d: %v", i+1, err)
		}
	}
	if err := lock.Extend(ctx); !errors.Is(err, redlock.ErrExtensionLimit) {
		t.Fatalf("third extension: err = %v, want ErrExtensionLimit", err)
	}
	if lock.Extensions() != 2 {
		t.Fatalf("Extensions() = %d", lock.Extensions())
	}
}

// TestWithValue: a caller-chosen value is what the masters store. Values must
// be unique per acquisition: a failed acquisition cleans its value from every
// master, so reusing a held lock's value releases that lock.
func TestWithValue(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1))
	ctx := context.Background()
	lock, err := c.Acquire(ctx, "derived", time.Minute, redlock.WithValue("token-7"))
	if err != nil {
		t.Fatal(err)
	}
	if v := lock.Votes(); len(v) != 3 || countOutcome(v, redlock.OutcomeGranted) < 2 {
		t.Fatalf("Votes() = %+v", v)
	}
	stored := 0
	for _, s := range servers {
		if value(t, s, "derived") == "token-7" {
			stored++
		}
	}
	if lock.Value() != "token-7" || stored < 2 {
		t.Fatalf("value = %q, stored on %d masters", lock.Value(), stored)
	}
	// The same value again: SET NX refuses, and the failed attempt's
	// clean-up removes "token-7" everywhere.
	if _, err := c.Acquire(ctx, "derived", time.Minute, redlock.WithValue("token-7")); !errors.Is(err, redlock.ErrLockHeld) {
		t.Fatalf("second acquisition: err = %v, want ErrLockHeld", err)
	}
	resumed, err := c.Restore("derived", "token-7", time.Minute, time.Now().Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := resumed.Extend(ctx); !errors.Is(err, redlock.ErrNotHeld) {
		t.Fatalf("Extend after the duplicate's clean-up: err = %v, want ErrNotHeld", err)
	}
}

// TestRestoreHandsOverToAnotherClient: a second client (a new operator
// leader) rebuilds the lock from its persisted fields, extends and releases
// it without waiting for expiry.
func TestRestoreHandsOverToAnotherClient(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	first := newClient(t, redistest.Addrs(servers))
	lock, err := first.Acquire(ctx, "handover", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	key, val, ttl, until := lock.Key(), lock.Value(), lock.TTL(), lock.ValidUntil()
	_ = first.Close()

	second := newClient(t, redistest.Addrs(servers))
	if capped, err := second.Restore(key, val, ttl, time.Now().Add(time.Hour)); err != nil || time.Until(capped.ValidUntil()) > ttl {
		t.Fatalf("Restore did not cap a claimed validity of an hour: %v, %v", capped.ValidUntil(), err)
	}
	restored, err := second.Restore(key, val, ttl, until)
	if err != nil {
		t.Fatal(err)
	}
	if err := restored.Extend(ctx); err != nil {
		t.Fatalf("Extend of a restored lock: %v", err)
	}
	if !restored.ValidUntil().After(until) {
		t.Fatal("the restored lock's validity did not move forward")
	}
	if d := pttl(t, servers[0], key); d <= 0 || d > ttl {
		t.Fatalf("PTTL after extension = %v", d)
	}
	if err := restored.Release(ctx); err != nil {
		t.Fatalf("Release of a restored lock: %v", err)
	}
	// Release returns once a quorum answered; Close waits for the rest.
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		if v := value(t, s, key); v != "" {
			t.Fatalf("key left on %s", s.Addr())
		}
	}
}

// TestRestartedMasterIsQuarantined restarts a master without its data: it
// does not vote until the window has passed, then it counts again.
func TestRestartedMasterIsQuarantined(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	const window = 2 * time.Second
	obs := &observer{}
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithQuarantine(window), redlock.WithObserver(obs))
	ctx := context.Background()
	// Freshly started masters are inside the window too: wait it out.
	waitFor(t, 2*window, "fresh masters to leave quarantine", func() bool {
		l, err := c.Acquire(ctx, "warmup", time.Second)
		if err != nil {
			return false
		}
		_ = l.Release(ctx)
		for _, m := range c.Masters() {
			if m.RunID == "" || m.QuarantinedUntil.After(time.Now()) {
				return false
			}
		}
		return true
	})

	// Master 0 loses its keys in a restart; master 1 goes down.
	if err := servers[0].Restart(false); err != nil {
		t.Fatal(err)
	}
	if err := servers[1].Kill(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	_, err := c.Acquire(ctx, "q", time.Second)
	if !errors.Is(err, redlock.ErrQuorumUnavailable) {
		t.Fatalf("with the restarted master quarantined: err = %v, want ErrQuorumUnavailable", err)
	}
	// The first request after the restart may fail on the broken pooled
	// connection; the next one reconnects and finds the restart.
	waitFor(t, window, "the restart to be detected", func() bool {
		_, err := c.Acquire(ctx, "q", time.Second)
		return err != nil && votesOf(t, err)[0].Outcome == redlock.OutcomeQuarantined
	})
	_, err = c.Acquire(ctx, "q", time.Second)
	var qe *redlock.QuarantinedError
	if v := votesOf(t, err)[0]; !errors.As(v.Err, &qe) || qe.Addr != servers[0].Addr() {
		t.Fatalf("vote of the quarantined master = %v %v, want a *QuarantinedError", v.Outcome, v.Err)
	}
	if ev := obs.quarantines(); len(ev) == 0 || ev[len(ev)-1].Addr != servers[0].Addr() {
		t.Fatalf("no quarantine event for %s: %+v", servers[0].Addr(), ev)
	}
	if st := c.Masters()[0]; !st.QuarantinedUntil.After(time.Now()) || st.RunID == "" {
		t.Fatalf("Masters()[0] = %+v", st)
	}
	// After the window the restarted master votes again.
	var lock *redlock.Lock
	waitFor(t, 2*window, "the restarted master to vote again", func() bool {
		lock, err = c.Acquire(ctx, "q", time.Second)
		return err == nil
	})
	if since := time.Since(restarted); since < window {
		// A run_id change keeps the master out for the whole window from
		// when the client saw it, after restarted.
		t.Fatalf("the restarted master voted again after %v, window %v", since, window)
	}
	if v := value(t, servers[0], "q"); v != lock.Value() {
		t.Fatalf("restarted master does not hold the new lock")
	}
}

// TestQuarantineWindowMustCoverTTL: a TTL the window does not cover is
// refused by Acquire, Restore and Extend before anything is sent; a lock
// restored only to be released is not refused.
func TestQuarantineWindowMustCoverTTL(t *testing.T) {
	servers := redistest.StartN(t, 1, redistest.Options{})
	c := newClient(t, redistest.Addrs(servers), redlock.WithQuarantine(10*time.Second))
	if _, err := c.Acquire(context.Background(), "k", 10*time.Second); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Fatalf("ttl 10s with a 10s window: err = %v, want ErrInvalidArgument", err)
	}
	// A lock persisted by a client without a window (or a larger one) cannot
	// be restored, and so not extended, on this one.
	wide := newClient(t, redistest.Addrs(servers))
	lock, err := wide.Acquire(context.Background(), "k", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Restore(lock.Key(), lock.Value(), lock.TTL(), lock.ValidUntil()); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Fatalf("Restore of a 10s lock with a 10s window: err = %v, want ErrInvalidArgument", err)
	}
	if _, err := c.Restore(lock.Key(), lock.Value(), 9*time.Second, lock.ValidUntil()); err != nil {
		t.Fatalf("Restore of a TTL the window covers: %v", err)
	}
	// Releasing is always safe: a lock restored only to be released (no
	// validity left) is accepted, and its release deletes the value.
	gone, err := c.Restore(lock.Key(), lock.Value(), lock.TTL(), time.Time{})
	if err != nil {
		t.Fatalf("Restore for release of a 10s lock with a 10s window: %v", err)
	}
	if err := gone.Extend(context.Background()); err == nil {
		t.Fatalf("Extend of a lock restored for release: err = %v, want it refused", err)
	}
	if err := gone.Release(context.Background()); err != nil {
		t.Fatalf("Release of a lock restored for release: %v", err)
	}
}

// TestSameServerTwiceDoesNotVote lists one server under two addresses: with
// the quarantine check on, the run_id gives it away and neither address votes.
func TestSameServerTwiceDoesNotVote(t *testing.T) {
	servers := redistest.StartN(t, 2, redistest.Options{})
	const window = 1500 * time.Millisecond
	alias := fmt.Sprintf("localhost:%d", servers[0].Port())
	c := newClient(t, []string{servers[0].Addr(), alias, servers[1].Addr()}, redlock.WithTries(1), redlock.WithQuarantine(window))
	ctx := context.Background()
	var err error
	waitFor(t, 3*window, "the duplicate to be detected", func() bool {
		_, err = c.Acquire(ctx, "dup", time.Second)
		return err != nil && strings.Contains(err.Error(), "same server")
	})
	if !errors.Is(err, redlock.ErrQuorumUnavailable) {
		t.Fatalf("err = %v, want ErrQuorumUnavailable", err)
	}
}

// TestExtendKeepsValidityWhenOnlyUnavailable: one master lost the key, one is
// down — no quorum says the value is gone, so the lock keeps its validity.
func TestExtendKeepsValidityWhenOnlyUnavailable(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	// A node timeout no loaded machine misses: every SET lands.
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(2*time.Second))
	ctx := context.Background()
	lock, err := c.Acquire(ctx, "partial", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	before := lock.ValidUntil()
	admin := servers[0].Client()
	defer admin.Close()
	// The acquisition returned on a quorum; a straggling SET to master 0
	// could land after the DEL below and put the value back. Wait for it.
	for deadline := time.Now().Add(5 * time.Second); admin.Get(ctx, "partial").Val() != lock.Value(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("master 0 never got the acquisition's SET")
		}
	}
	if err := admin.Del(ctx, "partial").Err(); err != nil {
		t.Fatal(err)
	}
	if err := servers[1].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := lock.Extend(ctx); !errors.Is(err, redlock.ErrQuorumUnavailable) {
		t.Fatalf("err = %v, want ErrQuorumUnavailable", err)
	}
	if !lock.ValidUntil().Equal(before) || !lock.Valid() {
		t.Fatalf("validity changed to %v (was %v)", lock.ValidUntil(), before)
	}
}

// TestErrorRepliesAreNoVotes: -OOM, -NOAUTH and -READONLY masters vote no,
// with their errors kept.
func TestErrorRepliesAreNoVotes(t *testing.T) {
	healthy := redistest.StartN(t, 2, redistest.Options{})
	oom := redistest.StartN(t, 1, redistest.Options{MaxMemory: "1"})
	auth := redistest.StartN(t, 1, redistest.Options{Password: "s3cret"})
	primary := redistest.StartN(t, 1, redistest.Options{})
	replica := redistest.StartN(t, 1, redistest.Options{Args: []string{"--replicaof", "127.0.0.1", fmt.Sprint(primary[0].Port())}})
	addrs := []string{oom[0].Addr(), auth[0].Addr(), replica[0].Addr(), healthy[0].Addr(), healthy[1].Addr()}
	// Error replies must not turn into timeouts on a loaded machine: the
	// node timeout is far above any scheduling delay (every master answers,
	// so nothing waits for it).
	const nodeTimeout = 5 * time.Second
	c := newClient(t, addrs, redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout))
	_, err := c.Acquire(context.Background(), "replies", time.Second)
	if !errors.Is(err, redlock.ErrQuorumUnavailable) {
		t.Fatalf("err = %v, want ErrQuorumUnavailable", err)
	}
	votes := votesOf(t, err)
	for i, want := range []string{"OOM", "NOAUTH", "READONLY"} {
		if votes[i].Outcome != redlock.OutcomeError || votes[i].Err == nil || !strings.Contains(votes[i].Err.Error(), want) {
			t.Errorf("vote of %s = %v %v, want an error with %s", votes[i].Addr, votes[i].Outcome, votes[i].Err, want)
		}
	}
	if !strings.Contains(err.Error(), "OOM") {
		t.Errorf("the error message hides the per-node errors: %v", err)
	}

	// A wrong password on every master: the quorum is unavailable.
	authed := redistest.StartN(t, 3, redistest.Options{Password: "right"})
	c = newClient(t, redistest.Addrs(authed), redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout), redlock.WithAuth("", "wrong"))
	if _, err := c.Acquire(context.Background(), "replies", time.Second); !errors.Is(err, redlock.ErrQuorumUnavailable) || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("wrong password: err = %v", err)
	}
	c = newClient(t, redistest.Addrs(authed), redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout), redlock.WithAuth("", "right"))
	if _, err := c.Acquire(context.Background(), "replies", time.Second); err != nil {
		t.Fatalf("right password: %v", err)
	}
}

func TestRetriesUntilReleased(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	holder := newClient(t, redistest.Addrs(servers))
	lock, err := holder.Acquire(ctx, "retry", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	waiter := newClient(t, redistest.Addrs(servers), redlock.WithTries(1000), redlock.WithRetryDelay(time.Millisecond, 5*time.Millisecond))
	got := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(ctx, "retry", time.Second)
		got <- err
	}()
	if err := lock.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter did not get the lock after release: %v", err)
	}

	// Bounded: with the lock held, a waiter gives up after its tries.
	if _, err := holder.Acquire(ctx, "retry-bounded", time.Minute); err != nil {
		t.Fatal(err)
	}
	bounded := newClient(t, redistest.Addrs(servers), redlock.WithTries(3), redlock.WithRetryDelay(time.Millisecond, 2*time.Millisecond), redlock.WithObserver(&observer{}))
	if _, err := bounded.Acquire(ctx, "retry-bounded", time.Second); !errors.Is(err, redlock.ErrLockHeld) {
		t.Fatalf("err = %v, want ErrLockHeld", err)
	}
	// Cancelled while waiting between tries.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	slow := newClient(t, redistest.Addrs(servers), redlock.WithTries(1000), redlock.WithRetryDelay(20*time.Millisecond, 30*time.Millisecond))
	if _, err := slow.Acquire(cctx, "retry-bounded", time.Second); !errors.Is(err, redlock.ErrCancelled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrCancelled and DeadlineExceeded", err)
	}
}

func TestObserverSeesOperations(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	obs := &observer{}
	c := newClient(t, redistest.Addrs(servers), redlock.WithObserver(obs))
	ctx := context.Background()
	lock, err := c.Acquire(ctx, "obs", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.Extend(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Every attempt is an event: on a loaded machine a master may miss
	// the node timeout and the operation is tried again, the failed
	// attempt observed with its error and the next one numbered after it.
	ops := obs.operations()
	var done []redlock.Op
	for i, e := range ops {
		if e.Key != "obs" || len(e.Votes) != 3 || e.Latency <= 0 {
			t.Fatalf("event %+v", e)
		}
		if e.Err == nil {
			done = append(done, e.Op)
			continue
		}
		if i+1 == len(ops) || ops[i+1].Op != e.Op || ops[i+1].Attempt != e.Attempt+1 {
			t.Fatalf("failed attempt %+v is not followed by the next attempt of the same operation: events %+v", e, ops)
		}
	}
	if want := []redlock.Op{redlock.OpAcquire, redlock.OpExtend, redlock.OpRelease}; !slices.Equal(done, want) {
		t.Fatalf("operations that succeeded %v, want %v: events %+v", done, want, ops)
	}
}

func TestClosedClient(t *testing.T) {
	servers := redistest.StartN(t, 1, redistest.Options{})
	c, err := redlock.New(redistest.Addrs(servers))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(context.Background(), "k", time.Second); !errors.Is(err, redlock.ErrClosed) {
		t.Fatalf("err = %v, want ErrClosed", err)
	}
}

// observer records events for assertions.
type observer struct {
	mu    sync.Mutex
	ops   []redlock.OpEvent
	quars []redlock.QuarantineEvent
}

func (o *observer) ObserveOp(e redlock.OpEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ops = append(o.ops, e)
}

func (o *observer) ObserveQuarantine(e redlock.QuarantineEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.quars = append(o.quars, e)
}

func (o *observer) operations() []redlock.OpEvent {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]redlock.OpEvent(nil), o.ops...)
}

func (o *observer) quarantines() []redlock.QuarantineEvent {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]redlock.QuarantineEvent(nil), o.quars...)
}

// historyRecorder wraps history.Recorder for the contention test.
type historyRecorder struct{ history.Recorder }

func (r *historyRecorder) add(key, holder string, start, end time.Time) {
	r.Record(history.Grant{Key: key, Holder: holder, Start: start, End: end})
}

// check fails the test on a violation, or when some key was never granted.
func (r *historyRecorder) check(t *testing.T, keys int) {
	t.Helper()
	grants := r.Grants()
	perKey := map[string]int{}
	for _, g := range grants {
		perKey[g.Key]++
	}
	if len(perKey) != keys {
		t.Fatalf("only %d of %d keys were ever granted: %v", len(perKey), keys, perKey)
	}
	if err := history.Check(grants); err != nil {
		t.Fatalf("mutual exclusion violated: %v", err)
	}
	t.Logf("%d grants checked: %v", len(grants), perKey)
}

// TestReleaseIsOrderedAfterStragglingSets: Acquire returns at a quorum while
// SETs to the slower masters are in flight; the following Release must not
// overtake them, or those masters would keep the value for a whole TTL and
// the holder's next acquisition of the same key would find it held.
func TestReleaseIsOrderedAfterStragglingSets(t *testing.T) {
	servers := redistest.StartN(t, 5, redistest.Options{})
	// A node timeout no loaded machine reaches: the subject is ordering
	// (a re-acquisition finding its own value), not availability.
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(5*time.Second))
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			key := fmt.Sprint("reacquire-", w)
			for i := range 50 {
				l, err := c.Acquire(ctx, key, time.Minute)
				if err != nil {
					t.Errorf("worker %d, round %d: re-acquiring its own released key: %v", w, i, err)
					return
				}
				if err := l.Release(ctx); err != nil {
					t.Errorf("worker %d, round %d: release: %v", w, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestProbe(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	const window = time.Minute
	c := newClient(t, redistest.Addrs(servers), redlock.WithQuarantine(window))
	if err := servers[2].Kill(); err != nil {
		t.Fatal(err)
	}
	res, err := c.Probe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, r := range res[:2] {
		// Freshly started: answering, but quarantined.
		if r.Err != nil || r.RunID == "" || r.Serving(now) || !r.QuarantinedUntil.After(now.Add(window-5*time.Second)) {
			t.Errorf("master %d: %+v", i, r)
		}
	}
	if res[2].Err == nil || res[2].Serving(now) {
		t.Errorf("killed master: %+v", res[2])
	}
	if !res[0].Serving(now.Add(window + time.Second)) {
		t.Errorf("master 0 still not serving after its window")
	}
}

// TestReleaseAfterLateExtendRemovesCopies: an extension that reaches its
// quorum only after the new validity has passed fails with ErrExpired and
// leaves the copies (another process may renew the value); the caller's
// Release then removes them, so the next grant is not kept waiting.
func TestReleaseAfterLateExtendRemovesCopies(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	const key, ttl = "late-extend", 3 * time.Second
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(stallTimeout))
	ctx := context.Background()
	lock, err := c.Acquire(ctx, key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	// Acquire returns on a quorum: the third master's copy may still be on
	// its way (a loaded machine).
	waitHeldEverywhere(t, servers, key, lock.Value(), stallTimeout)
	// The masters hold the value for long enough to outlive the stall below.
	for i, s := range servers {
		a := s.Client()
		ok, err := a.PExpire(ctx, key, time.Minute).Result()
		_ = a.Close()
		if err != nil || !ok {
			t.Fatalf("lengthening master %d's copy: %v, %v", i, ok, err)
		}
	}
	err = extendLate(t, servers, lock)
	if !errors.Is(err, redlock.ErrExpired) {
		t.Fatalf("err = %v, want ErrExpired", err)
	}
	votes := votesOf(t, err)
	if got := countOutcome(votes, redlock.OutcomeGranted); got < 2 {
		t.Fatalf("granted votes = %d, want a (late) quorum", got)
	}
	if lock.Valid() {
		t.Fatal("the lock is still valid after a late extension")
	}
	for i, v := range votes {
		if v.Outcome == redlock.OutcomeGranted && value(t, servers[i], key) != lock.Value() {
			t.Errorf("master %d granted the late extension, and its copy is gone before any release", i)
		}
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatalf("release after the late extension: %v", err)
	}
	expectCopiesRemoved(t, servers, key, stallTimeout)
}

// TestLateExtendLeavesASharedValue: a deposed operator leader, paused in
// the middle of an extension, wakes up after its validity has passed while
// a new leader renews the same grant (same value, restored). Its late
// extension fails with ErrExpired and must leave the copies alone — nor
// shorten them to its own TTL — or the key is free while the new leader's
// validity stands (make soak-controller seed 404: a grant replaced while
// its status showed it valid for another second). Fails where a late
// extension removed the copies.
func TestLateExtendLeavesASharedValue(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	const key, val, ttl = "late-shared", "grant-1", 2 * time.Second
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(stallTimeout))
	ctx := context.Background()
	adopter, err := c.Acquire(ctx, key, time.Minute, redlock.WithValue(val))
	if err != nil {
		t.Fatal(err)
	}
	waitHeldEverywhere(t, servers, key, val, stallTimeout)
	deposed, err := c.Restore(key, val, ttl, time.Now().Add(ttl))
	if err != nil {
		t.Fatal(err)
	}
	err = extendLate(t, servers, deposed)
	if !errors.Is(err, redlock.ErrExpired) {
		t.Fatalf("the deposed copy's extension: %v, want ErrExpired", err)
	}
	for i, s := range servers {
		if got, left := value(t, s, key), pttl(t, s, key); got != val || left < 30*time.Second {
			t.Errorf("master %d after the late extension: value %q with %v left, want %q with the adopter's minute", i, got, left, val)
		}
	}
	if err := adopter.Extend(ctx); err != nil {
		t.Fatalf("the adopter's next extension: %v", err)
	}
}

// TestLostExtendLeavesTheCopies: an extension that finds the value gone
// from a quorum loses the lock but removes none of the minority's copies:
// another process may renew that value (TestReleaseAfterLostExtendRemovesCopies
// has its caller release them).
func TestLostExtendLeavesTheCopies(t *testing.T) {
	servers := redistest.StartN(t, 5, redistest.Options{})
	const key = "lost-shared"
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), patient)
	lock := loseToAMajority(t, servers, c, key)
	// Close waits for everything the client started, clean-ups included.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for i, s := range servers[3:] {
		if got := value(t, s, key); got != lock.Value() {
			t.Errorf("master %d: value %q after the lost extension, want %q left for its owner", i+3, got, lock.Value())
		}
	}
}

// loseToAMajority acquires key for a minute on the five servers with c,
// removes its value from three of them, and returns the lock once an
// extension has found it lost (ErrNotHeld); the other two still hold it.
func loseToAMajority(t *testing.T, servers []*redistest.Server, c *redlock.Client, key string) *redlock.Lock {
	t.Helper()
	ctx := context.Background()
	lock, err := c.Acquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	waitHeldEverywhere(t, servers, key, lock.Value(), nodeTimeout)
	for _, s := range servers[:3] {
		a := s.Client()
		if err := a.Del(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
		_ = a.Close()
	}
	if err := lock.Extend(ctx); !errors.Is(err, redlock.ErrNotHeld) {
		t.Fatalf("extend with the value gone from three of five: %v, want ErrNotHeld", err)
	}
	return lock
}

// extendLate extends lock while servers[1:] are frozen, and lets them
// answer only once the extension's new validity has passed; it returns
// Extend's error. The round started before master 0 saw its request, so
// its validity (start + ttl − drift) has passed one ttl after that.
//
// The lock's client needs a node timeout longer than the stall
// (stallTimeout).
func extendLate(t *testing.T, servers []*redistest.Server, lock *redlock.Lock) error {
	t.Helper()
	t.Cleanup(func() {
		for _, s := range servers[1:] {
			_ = s.Cont()
		}
	})
	before := scriptCalls(t, servers[0])
	for _, s := range servers[1:] {
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	extended := make(chan error, 1)
	go func() { extended <- lock.Extend(context.Background()) }()
	waitFor(t, stallTimeout, "the extension to reach master 0 (sent at once, answered within the node timeout)", func() bool {
		return scriptCalls(t, servers[0]) > before
	})
	// Waiting for the instant itself: nothing else marks it.
	time.Sleep(lock.TTL())
	for _, s := range servers[1:] {
		if err := s.Cont(); err != nil {
			t.Fatal(err)
		}
	}
	return <-extended
}

// scriptCalls is how many scripts (EVALSHA and EVAL) s has run.
func scriptCalls(t *testing.T, s *redistest.Server) int64 {
	t.Helper()
	calls := commandCalls(t, s)
	return calls["evalsha"] + calls["eval"]
}

// stallTimeout is the node timeout of the clients whose extension outlives
// a stall of the lock's TTL (extendLate).
const stallTimeout = 10 * time.Second

// waitHeldEverywhere waits until every master holds value at key: an
// acquisition returns once a quorum has it, and a straggler's write lands,
// or is given up, within the client's node timeout (within).
func waitHeldEverywhere(t *testing.T, servers []*redistest.Server, key, val string, within time.Duration) {
	t.Helper()
	waitFor(t, within, "every master to hold the value (a straggler's write lands within the node timeout)", func() bool {
		for _, s := range servers {
			if value(t, s, key) != val {
				return false
			}
		}
		return true
	})
}

// expectCopiesRemoved waits for every master to be clean of key: a
// release returns once a quorum answered, and a straggler's deletion
// lands, or is given up, within the client's node timeout (within).
func expectCopiesRemoved(t *testing.T, servers []*redistest.Server, key string, within time.Duration) {
	t.Helper()
	waitFor(t, within, "every copy to be removed (a straggler's release lands within the node timeout)", func() bool {
		for _, s := range servers {
			if value(t, s, key) != "" {
				return false
			}
		}
		return true
	})
}

// TestReleaseAfterLostExtendRemovesCopies: an extension that finds the
// value gone from a quorum loses the lock; the copies the minority still
// held (just refreshed for a whole TTL) stay until the caller releases
// them, and then the key is free at once (issue 18, case 5).
func TestReleaseAfterLostExtendRemovesCopies(t *testing.T) {
	servers := redistest.StartN(t, 5, redistest.Options{})
	const key = "lost-extend"
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), patient)
	ctx := context.Background()
	lock := loseToAMajority(t, servers, c, key)
	// A quorum answers "no key" first (ErrNotHeld); the minority's
	// deletions follow.
	if err := lock.Release(ctx); err != nil && !errors.Is(err, redlock.ErrNotHeld) {
		t.Fatalf("release after the loss: %v", err)
	}
	expectCopiesRemoved(t, servers, key, nodeTimeout)
	// The key is free on the two that held the orphan: a client of those
	// two alone (quorum 2) is granted it.
	minority := newClient(t, redistest.Addrs(servers[3:]), redlock.WithTries(1))
	if _, err := minority.Acquire(ctx, key, time.Second); err != nil {
		t.Fatalf("acquire on the former minority after the loss: %v", err)
	}
}

// aclServers starts n masters whose only users are a disabled default user
// and "locker" with rules.
func aclServers(t *testing.T, n int, rules string) []*redistest.Server {
	t.Helper()
	return redistest.StartN(t, n, redistest.Options{
		ACL:      []string{"user default off", "user locker on >pw ~* resetchannels " + rules},
		Username: "locker", Password: "pw",
	})
}

// TestACLRulesSuffice: a user allowed exactly ACLRules can do everything a
// Client does — acquire with and without a token, extend, release, probe.
func TestACLRulesSuffice(t *testing.T) {
	servers := aclServers(t, 3, redlock.ACLRules)
	ctx := context.Background()
	c := newClient(t, redistest.Addrs(servers), redlock.WithAuth("locker", "pw"))
	res, err := c.Probe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.RunID == "" {
			t.Fatalf("probe of master %d: %+v", i, r)
		}
	}
	for _, opts := range [][]redlock.AcquireOption{nil, {redlock.WithFencing()}} {
		l, err := c.Acquire(ctx, "acl", time.Second, opts...)
		if err != nil {
			t.Fatalf("acquire %v: %v", opts, err)
		}
		if err := l.Extend(ctx); err != nil {
			t.Fatalf("extend: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("release: %v", err)
		}
	}
	// A semaphore's slot: its scripts call nothing more.
	l, err := c.AcquireSemaphore(ctx, "acl-sem", 2, time.Second, redlock.WithFencing())
	if err != nil {
		t.Fatalf("acquire a slot: %v", err)
	}
	if err := l.Extend(ctx); err != nil {
		t.Fatalf("extend a slot: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release a slot: %v", err)
	}
}

// without returns the ACL rules without the given ones.
func without(rules string, drop ...string) string {
	return strings.Join(slices.DeleteFunc(strings.Fields(rules), func(r string) bool { return slices.Contains(drop, r) }), " ")
}

// TestDeniedCommandIsANoVote: a master whose ACL user misses a command the
// client needs answers NOPERM; that is a "no" vote, and the lock is
// granted or refused by the quorum as with any other error reply.
func TestDeniedCommandIsANoVote(t *testing.T) {
	full := aclServers(t, 2, redlock.ACLRules)
	noScripts := aclServers(t, 1, without(redlock.ACLRules, "+eval", "+evalsha"))
	noTime := aclServers(t, 1, without(redlock.ACLRules, "+time"))
	ctx := context.Background()
	const nodeTimeout = 5 * time.Second // error replies, never timeouts

	By := func(name string, servers []*redistest.Server, wantErr bool) {
		t.Helper()
		c := newClient(t, redistest.Addrs(servers), redlock.WithAuth("locker", "pw"), redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout))
		l, err := c.Acquire(ctx, "acl-"+name, time.Second, redlock.WithFencing())
		if wantErr {
			if !errors.Is(err, redlock.ErrQuorumUnavailable) || !strings.Contains(err.Error(), "NOPERM") {
				t.Fatalf("%s: err = %v, want ErrQuorumUnavailable with NOPERM", name, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// The quorum may be reached before the refusing master answers;
		// whenever it does, its refusal wrote nothing.
		if v := value(t, noScripts[0], "acl-"+name); v != "" {
			t.Fatalf("%s: the master that refused the script holds %q", name, v)
		}
		if len(l.Votes()) != 3 {
			t.Fatalf("%s: votes %+v", name, l.Votes())
		}
		_ = l.Release(ctx)
	}
	// Two allowed of three: granted, the denied master voting no.
	By("quorum", []*redistest.Server{full[0], full[1], noScripts[0]}, false)
	// One allowed of three: refused.
	By("minority", []*redistest.Server{full[0], noScripts[0], noTime[0]}, true)
}

// impostor listens on a loopback port and, for each connection, either
// answers every read with reply (a server that is not Redis) or reads and
// never answers (a server that hangs). It stops with the test.
func impostor(t *testing.T, reply string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = conn.Close() })
			go func() {
				buf := make([]byte, 4096)
				for {
					if _, err := conn.Read(buf); err != nil {
						return
					}
					if reply != "" {
						_, _ = conn.Write([]byte(reply))
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

// TestNonRedisAndHangingAddressesAreNoVotes: an address that is a TCP
// server but not Redis answers garbage, one that hangs never answers; both
// are "no" votes (an error, a timeout) and the lock is decided by the real
// masters, without a crash.
func TestNonRedisAndHangingAddressesAreNoVotes(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	const garbage = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
	http, http2 := impostor(t, garbage), impostor(t, garbage)
	hang := impostor(t, "")
	ctx := context.Background()
	// A node timeout no loaded machine misses: the real masters always
	// answer in time, and the hanging one costs at most this.
	const nodeTimeout = 2 * time.Second

	// Three real masters of five: granted.
	c := newClient(t, []string{servers[0].Addr(), http, servers[1].Addr(), hang, servers[2].Addr()},
		redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout))
	l, err := c.Acquire(ctx, "impostors", 10*time.Second, redlock.WithFencing())
	if err != nil {
		t.Fatalf("three real masters of five: %v", err)
	}
	_ = l.Release(ctx)

	// Two real masters of five: refused, and the error says why.
	c = newClient(t, []string{servers[0].Addr(), http, servers[1].Addr(), hang, http2},
		redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout))
	_, err = c.Acquire(ctx, "impostors-2", 10*time.Second)
	if !errors.Is(err, redlock.ErrQuorumUnavailable) {
		t.Fatalf("two real masters of five: err = %v, want ErrQuorumUnavailable", err)
	}
	votes := votesOf(t, err)
	for _, i := range []int{1, 3, 4} {
		if votes[i].Outcome == redlock.OutcomeGranted {
			t.Fatalf("impostor %s voted yes: %+v", votes[i].Addr, votes)
		}
	}
}

// TestSlowMasterVotesOnlyInTime: a master whose answers are late (a
// toxiproxy latency in front of it) votes when they arrive within the node
// timeout; beyond it, it is a "no" vote — the lock is decided by the others
// at once — and the key its late SET left is deleted by the release.
func TestSlowMasterVotesOnlyInTime(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	// The real masters answer within this on any machine; the late one's
	// answers come a multiple of it later.
	const nodeTimeout = 500 * time.Millisecond
	votes := func(l *redlock.Lock, late string) (granted int, slow redlock.Vote) {
		for _, v := range l.Votes() {
			if v.Outcome == redlock.OutcomeGranted {
				granted++
			}
			if v.Addr == late {
				slow = v
			}
		}
		return granted, slow
	}

	t.Run("late within the node timeout: a vote", func(t *testing.T) {
		// The quorum needs the late master: the third address refuses.
		proxy := redistest.NewProxy(t, servers[2].Addr())
		if err := proxy.Delay(50 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
		late, refused := proxy.Addr(), impostorClosed(t)
		c := newClient(t, []string{servers[0].Addr(), refused, late}, redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout))
		l, err := c.Acquire(ctx, "slow-in-time", 10*time.Second)
		if err != nil {
			t.Fatalf("a prompt and a late master of three: %v", err)
		}
		defer func() { _ = l.Release(ctx) }()
		if granted, slow := votes(l, late); granted != 2 || slow.Outcome != redlock.OutcomeGranted {
			t.Fatalf("%d granted, the late master %+v: want it counted", granted, slow)
		}
	})

	t.Run("later than the node timeout: no vote, and no key left", func(t *testing.T) {
		proxy := redistest.NewProxy(t, servers[2].Addr())
		late := proxy.Addr()
		c := newClient(t, []string{servers[0].Addr(), servers[1].Addr(), late}, redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout))
		// Connect while it is prompt: its later requests go out on an open
		// connection at once.
		warm, err := c.Acquire(ctx, "slow-warm-up", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = warm.Release(ctx)
		if err := proxy.Delay(6 * nodeTimeout); err != nil {
			t.Fatal(err)
		}
		const ttl = 2 * time.Second
		l, err := c.Acquire(ctx, "slow-too-late", ttl)
		if err != nil {
			t.Fatalf("two prompt masters of three: %v", err)
		}
		if granted, slow := votes(l, late); granted != 2 || slow.Addr != late || slow.Outcome == redlock.OutcomeGranted {
			t.Fatalf("%d granted, the late master %+v: want its vote lost", granted, slow)
		}
		// Requests reach it at once (on a connection it already had): its SET
		// may take effect, unanswered in time.
		// The release's request reaches it at once too (or, on a new
		// connection whose handshake is late, the key expires with its ttl).
		released := time.Now()
		if err := l.Release(ctx); err != nil {
			t.Logf("release (the late master times out again): %v", err)
		}
		for value(t, servers[2], "slow-too-late") != "" {
			if time.Since(released) > ttl+3*time.Second {
				t.Fatal("the late master still holds the key its late SET wrote, past its ttl")
			}
			time.Sleep(50 * time.Millisecond) // poll interval
		}
	})
}

// impostorClosed is a loopback address nothing listens on (connections are
// refused).
func impostorClosed(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestExtendRestoresRestartedMasters: masters restarted one after another
// without their data (a rolling update of persistence None) each get the
// lock's value back after the next successful extension, so the lock
// outlives restarting every master in turn; a restored copy is no vote for
// the extension before it, and an extension that fails restores nothing.
func TestExtendRestoresRestartedMasters(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(2*time.Second))
	l, err := c.Acquire(ctx, "rolled", time.Minute, redlock.WithFencing())
	if err != nil {
		t.Fatal(err)
	}
	for i := len(servers) - 1; i >= 0; i-- {
		if err := servers[i].Restart(false); err != nil {
			t.Fatal(err)
		}
		if err := l.Extend(ctx); err != nil {
			t.Fatalf("extend after restarting master %d (the others hold the value): %v", i, err)
		}
		for _, v := range l.Votes() {
			if v.Addr == servers[i].Addr() && v.Outcome == redlock.OutcomeGranted {
				t.Fatalf("the restarted master %d voted for the extension: %+v", i, l.Votes())
			}
		}
		// The restore follows the extension, in the background.
		waitFor(t, 5*time.Second, fmt.Sprintf("restarted master %d to get the lock's value back", i), func() bool { return value(t, servers[i], "rolled") == l.Value() })
	}

	// An extension a quorum refuses restores nothing: with the value gone
	// from two masters of three, the lock is lost and stays gone there.
	for _, s := range servers[:2] {
		a := s.Client()
		if err := a.Del(ctx, "rolled").Err(); err != nil {
			t.Fatal(err)
		}
		_ = a.Close()
	}
	if err := l.Extend(ctx); !errors.Is(err, redlock.ErrNotHeld) {
		t.Fatalf("extend with the value gone from two of three: %v, want ErrNotHeld", err)
	}
	if err := l.Release(ctx); err != nil && !errors.Is(err, redlock.ErrNotHeld) {
		t.Fatalf("release: %v", err)
	}
	for _, s := range servers[:2] {
		if v := value(t, s, "rolled"); v != "" {
			t.Fatalf("master %s got the lost lock's value back: %q", s.Addr(), v)
		}
	}
}

// TestExtendRestoresQuarantinedMasters: a master restarted without its data
// sits out the client's quarantine, and gets the value back meanwhile, so
// that it holds the lock by the time it votes again.
func TestExtendRestoresQuarantinedMasters(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	const ttl = time.Second
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(2*time.Second), redlock.WithQuarantine(2*time.Second))
	// Fresh masters sit out the window too, each from its own start: wait
	// until all three vote, not a quorum of them, or the restart below
	// may leave one granting master.
	waitFor(t, 10*time.Second, "every fresh master to vote", func() bool {
		if _, err := c.Probe(ctx); err != nil {
			return false
		}
		now := time.Now()
		return !slices.ContainsFunc(c.Masters(), func(m redlock.MasterStatus) bool { return m.RunID == "" || now.Before(m.QuarantinedUntil) })
	})
	l, err := c.Acquire(ctx, "quarantined", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := servers[2].Restart(false); err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx); err != nil {
		t.Fatalf("extend after restarting master 2: %v", err)
	}
	waitFor(t, 5*time.Second, "the quarantined master to get the value back", func() bool { return value(t, servers[2], "quarantined") == l.Value() })
	if err := l.Extend(ctx); err != nil {
		t.Fatal(err)
	}
	for _, v := range l.Votes() {
		if v.Addr == servers[2].Addr() && v.Outcome != redlock.OutcomeQuarantined && v.Outcome != redlock.OutcomePending {
			t.Fatalf("the restarted master voted %v within its quarantine", v.Outcome)
		}
	}
}

// TestExpiresByCountsEveryRoundSent: a lock's ExpiresBy follows the latest
// round it sent, answered or not (a failed extension may still have reached
// some masters), and a restored lock counts from the round that gave its
// validity.
func TestExpiresByCountsEveryRoundSent(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	const ttl = 2 * time.Second
	nodeTimeout := 50 * time.Millisecond
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout))
	ctx := context.Background()
	if _, err := c.Probe(ctx); err != nil { // connects first
		t.Fatal(err)
	}
	sent := time.Now()
	lk, err := c.Acquire(ctx, "expires", ttl)
	if err != nil {
		t.Fatal(err)
	}
	slack := ttl + 2*nodeTimeout + redlock.Drift(ttl)
	if by := lk.ExpiresBy(); by.Before(sent.Add(slack)) || by.After(time.Now().Add(slack)) {
		t.Fatalf("after the acquisition sent at %v: ExpiresBy = %v, want the round's start + %v", sent, by, slack)
	}
	acquired := lk.ExpiresBy()

	// Two masters stopped: the extension fails, but it was sent.
	for _, s := range servers[:2] {
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, s := range servers[:2] {
			_ = s.Cont()
		}
	})
	sent = time.Now() // after the acquisition's round started

	if err := lk.Extend(ctx); err == nil {
		t.Fatal("Extend with two of three masters stopped succeeded")
	}
	if by := lk.ExpiresBy(); by.Before(sent.Add(slack)) {
		t.Fatalf("after a failed extension sent at %v: ExpiresBy = %v (was %v), want at least %v", sent, by, acquired, sent.Add(slack))
	}

	// Restored: counted from the validity it was restored with.
	validUntil := time.Now().Add(time.Second)
	restored, err := c.Restore("expires", lk.Value(), ttl, validUntil)
	if err != nil {
		t.Fatal(err)
	}
	if by, want := restored.ExpiresBy(), validUntil.Add(2*nodeTimeout+2*redlock.Drift(ttl)); !by.Equal(want) {
		t.Fatalf("restored with validity %v: ExpiresBy = %v, want %v", validUntil, by, want)
	}
	unknown, err := c.Restore("expires", lk.Value(), ttl, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if by := unknown.ExpiresBy(); !by.IsZero() {
		t.Fatalf("restored without a validity: ExpiresBy = %v, want zero (nothing known)", by)
	}
}
