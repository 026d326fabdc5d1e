package redlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// counter reads key's fencing counter on one server (0 when absent).
func counter(t *testing.T, s *redistest.Server, key string) int64 {
	t.Helper()
	v := value(t, s, redlock.FenceKey(key))
	if v == "" {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("counter %s on %s = %q: %v", redlock.FenceKey(key), s.Addr(), v, err)
	}
	return n
}

// serverMicros reads a server's clock in microseconds.
func serverMicros(t *testing.T, s *redistest.Server) int64 {
	t.Helper()
	c := s.Client()
	defer c.Close()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME on %s: %v", s.Addr(), err)
	}
	return now.UnixMicro()
}

// TestFencingTokensIncreaseAcrossClients: two independent clients (separate
// connection pools, like two processes) contend for one key; the tokens, in
// the order the grants happened, strictly increase.
func TestFencingTokensIncreaseAcrossClients(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	addrs := redistest.Addrs(servers)
	const key = "fenced"
	var (
		mu     sync.Mutex
		tokens []int64 // appended while the lock is held: grant order
	)
	var wg sync.WaitGroup
	for range 2 {
		c := newClient(t, addrs, redlock.WithTries(200), redlock.WithRetryDelay(time.Millisecond, 10*time.Millisecond),
			redlock.WithNodeTimeout(200*time.Millisecond))
		for w := range 2 {
			wg.Go(func() {
				for i := range 10 {
					lock, err := c.Acquire(context.Background(), key, 5*time.Second, redlock.WithFencing())
					if err != nil {
						// A master too slow on this loaded machine cannot
						// break the order; anything else is a failure.
						if !errors.Is(err, redlock.ErrQuorumUnavailable) && !errors.Is(err, redlock.ErrLockHeld) {
							t.Errorf("worker %d, round %d: %v", w, i, err)
						}
						continue
					}
					mu.Lock()
					tokens = append(tokens, lock.Token())
					mu.Unlock()
					if err := lock.Release(context.Background()); err != nil {
						t.Errorf("release: %v", err)
					}
				}
			})
		}
	}
	wg.Wait()
	if len(tokens) < 20 {
		t.Fatalf("only %d of 40 acquisitions succeeded", len(tokens))
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("grant %d got token %d after %d: tokens %v", i, tokens[i], tokens[i-1], tokens)
		}
	}
	if tokens[0] <= 0 {
		t.Fatalf("first token %d is not positive", tokens[0])
	}
}

// TestFencingTokenFollowsCounter: a counter ahead of the clock is counted
// up by one per grant; Extend, Release and token-less acquisitions leave it
// alone, and locks without a fenced acquisition have token 0.
func TestFencingTokenFollowsCounter(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	const key = "counted"
	ahead := serverMicros(t, servers[0]) + 1e12 // ~11 days ahead of every clock
	for _, s := range servers {
		set(t, s, redlock.FenceKey(key), strconv.FormatInt(ahead, 10), 0)
	}
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(time.Second))
	ctx := context.Background()
	for i := int64(1); i <= 2; i++ {
		lock, err := c.Acquire(ctx, key, 10*time.Second, redlock.WithFencing())
		if err != nil {
			t.Fatal(err)
		}
		if lock.Token() != ahead+i {
			t.Fatalf("grant %d: token %d, want %d", i, lock.Token(), ahead+i)
		}
		if err := lock.Extend(ctx); err != nil {
			t.Fatal(err)
		}
		if err := lock.Release(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Second, "the write-back on every master", func() bool {
			for _, s := range servers {
				if counter(t, s, key) != ahead+i {
					return false
				}
			}
			return true
		})
	}
	plain, err := c.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if plain.Token() != 0 {
		t.Fatalf("token without WithFencing = %d, want 0", plain.Token())
	}
	restored, err := c.Restore(key, plain.Value(), plain.TTL(), plain.ValidUntil())
	if err != nil {
		t.Fatal(err)
	}
	if restored.Token() != 0 {
		t.Fatalf("restored token = %d, want 0", restored.Token())
	}
	if err := restored.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		if got := counter(t, s, key); got != ahead+2 {
			t.Fatalf("counter on %s = %d after token-less operations, want %d", s.Addr(), got, ahead+2)
		}
	}
}

// TestFencingAfterMajorityRestartWithoutPersistence: the masters that
// granted the next lock lost every key, counter included, in a restart; they
// count on from their clocks, ahead of the earlier token.
func TestFencingAfterMajorityRestartWithoutPersistence(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	const key = "restarts"
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(20), redlock.WithRetryDelay(time.Millisecond, 5*time.Millisecond),
		redlock.WithNodeTimeout(time.Second))
	ctx := context.Background()
	acquire := func() int64 {
		t.Helper()
		lock, err := c.Acquire(ctx, key, 5*time.Second, redlock.WithFencing())
		if err != nil {
			t.Fatal(err)
		}
		if err := lock.Release(ctx); err != nil && !errors.Is(err, redlock.ErrQuorumUnavailable) {
			t.Fatal(err)
		}
		return lock.Token()
	}
	first := acquire()
	for _, s := range servers[:2] {
		if err := s.Restart(false); err != nil {
			t.Fatal(err)
		}
	}
	// The one master that kept its counter is down: the grant comes from
	// the two that lost theirs.
	if err := servers[2].Kill(); err != nil {
		t.Fatal(err)
	}
	if counter(t, servers[0], key) != 0 || counter(t, servers[1], key) != 0 {
		t.Fatal("a restart without persistence kept the counter")
	}
	second := acquire()
	if second <= first {
		t.Fatalf("token after the restart %d, not above %d", second, first)
	}
	for _, s := range servers {
		if err := s.Restart(false); err != nil {
			t.Fatal(err)
		}
	}
	if third := acquire(); third <= second {
		t.Fatalf("token after every master restarted %d, not above %d", third, second)
	}
}

// TestFencingWriteBackReachesLaterQuorum: a grant on A and B takes A's
// higher token; the write-back raises B's counter to it, so a later grant on
// B and C, without A, still gets a higher token.
func TestFencingWriteBackReachesLaterQuorum(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	a, b, cc := servers[0], servers[1], servers[2]
	const key = "writeback"
	ahead := serverMicros(t, a) + 1e12
	set(t, a, redlock.FenceKey(key), strconv.FormatInt(ahead, 10), 0)
	if err := cc.Kill(); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(20), redlock.WithRetryDelay(time.Millisecond, 5*time.Millisecond),
		redlock.WithNodeTimeout(time.Second))
	ctx := context.Background()
	first, err := c.Acquire(ctx, key, 5*time.Second, redlock.WithFencing())
	if err != nil {
		t.Fatal(err)
	}
	if first.Token() != ahead+1 {
		t.Fatalf("grant on A and B: token %d, want A's %d", first.Token(), ahead+1)
	}
	if got := counter(t, b, key); got != first.Token() {
		t.Fatalf("B's counter after the write-back = %d, want %d", got, first.Token())
	}
	if err := first.Release(ctx); err != nil && !errors.Is(err, redlock.ErrQuorumUnavailable) {
		t.Fatal(err)
	}
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := cc.Restart(false); err != nil {
		t.Fatal(err)
	}
	second, err := c.Acquire(ctx, key, 5*time.Second, redlock.WithFencing())
	if err != nil {
		t.Fatal(err)
	}
	if second.Token() <= first.Token() {
		t.Fatalf("grant on B and C: token %d, not above %d", second.Token(), first.Token())
	}
}

// TestFencingMalformedCounterGrantsNothing: a counter that is not an integer
// is an error vote, and the SET is not made.
func TestFencingMalformedCounterGrantsNothing(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	const key = "malformed"
	for _, s := range servers[:2] {
		set(t, s, redlock.FenceKey(key), "not-a-number", 0)
	}
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(time.Second))
	_, err := c.Acquire(context.Background(), key, 5*time.Second, redlock.WithFencing())
	if !errors.Is(err, redlock.ErrQuorumUnavailable) || !strings.Contains(err.Error(), "fence counter") {
		t.Fatalf("err = %v, want ErrQuorumUnavailable naming the fence counter", err)
	}
	waitFor(t, 2*time.Second, "no lock key on any master", func() bool {
		for _, s := range servers {
			if value(t, s, key) != "" {
				return false
			}
		}
		return true
	})
}

// commandCalls reads the calls of each command from INFO commandstats.
func commandCalls(t *testing.T, s *redistest.Server) map[string]int64 {
	t.Helper()
	c := s.Client()
	defer c.Close()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// TestAcquireWithoutFencingIsOneRound: a token-less acquisition is one
// plain SET per master, no script, and leaves the fencing counter alone;
// a fenced one runs two scripts per master.
func TestAcquireWithoutFencingIsOneRound(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(time.Second))
	ctx := context.Background()
	// answered waits until every master has received the acquisition.
	answered := func(key string) {
		waitFor(t, 2*time.Second, "every master to hold "+key, func() bool {
			for _, s := range servers {
				if value(t, s, key) == "" {
					return false
				}
			}
			return true
		})
	}
	before := make([]map[string]int64, len(servers))
	for i, s := range servers {
		before[i] = commandCalls(t, s)
	}
	if _, err := c.Acquire(ctx, "plain", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	answered("plain")
	for i, s := range servers {
		after := commandCalls(t, s)
		if got := after["set"] - before[i]["set"]; got != 1 {
			t.Errorf("%s: %d SET calls, want 1", s.Addr(), got)
		}
		if got := (after["evalsha"] + after["eval"]) - (before[i]["evalsha"] + before[i]["eval"]); got != 0 {
			t.Errorf("%s: %d scripts run without fencing, want none", s.Addr(), got)
		}
		if v := value(t, s, redlock.FenceKey("plain")); v != "" {
			t.Errorf("%s: a token-less acquisition wrote the counter %q", s.Addr(), v)
		}
		before[i] = commandCalls(t, s)
	}
	lock, err := c.Acquire(ctx, "fenced", 10*time.Second, redlock.WithFencing())
	if err != nil {
		t.Fatal(err)
	}
	answered("fenced")
	// A master that answered after the decision took a later token of its own.
	waitFor(t, 2*time.Second, "the write-back on every master", func() bool {
		for _, s := range servers {
			if counter(t, s, "fenced") < lock.Token() {
				return false
			}
		}
		return true
	})
	for i, s := range servers {
		// EVALSHA, plus EVAL where the script was not cached yet.
		if got := commandCalls(t, s)["evalsha"] - before[i]["evalsha"]; got != 2 {
			t.Errorf("%s: %d EVALSHA calls with fencing, want 2", s.Addr(), got)
		}
	}
}
