package redlock

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
)

// TestBatcherUnderLoad sends many more concurrent requests than maxInflight
// to one master: every one gets its own answer, and the master's slots are
// all free afterwards.
func TestBatcherUnderLoad(t *testing.T) {
	servers := redistest.StartN(t, 1, redistest.Options{})
	c, err := New(redistest.Addrs(servers), WithTries(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	n := c.nodes[0]
	const workers, each = 64, 20
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				key, val := fmt.Sprintf("k-%d-%d", w, i), fmt.Sprint(w*each+i)
				out, err := setPlain(ctx, n, key, val)
				if out != OutcomeGranted || err != nil {
					t.Errorf("set %s: %v %v", key, out, err)
				}
				cmd := redis.NewStringCmd(ctx, "get", key)
				n.process(ctx, cmd)
				if got, err := cmd.Result(); got != val || err != nil {
					t.Errorf("get %s = %q %v, want %q", key, got, err, val)
				}
				out, err = n.run(ctx, releaseCall(key, val, nil))
				if out != OutcomeGranted || err != nil {
					t.Errorf("release %s: %v %v", key, out, err)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	// A batch's goroutine owns its slot and frees it once the whole batch
	// ended, which may be after every caller returned: the slots must come
	// free soon, and stay free.
	var inflight, queued int
	for deadline := time.Now().Add(5 * time.Second); ; {
		n.batch.mu.Lock()
		inflight, queued = n.batch.inflight, len(n.batch.queue)
		n.batch.mu.Unlock()
		if (inflight == 0 && queued == 0) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond) // polling, as Eventually does
	}
	if inflight != 0 || queued != 0 {
		t.Fatalf("after the load: %d in flight, %d queued", inflight, queued)
	}
	n.batch.mu.Lock()
	defer n.batch.mu.Unlock()
	if n.batch.led == 0 {
		t.Fatal("no request was queued: the load did not exercise batching")
	}
}

// stoppedMaster returns the node of a client on one master, with a
// connection made, and the master, SIGSTOPped (SIGCONT at the test's end).
func stoppedMaster(t *testing.T) (*node, *redistest.Server) {
	t.Helper()
	servers := redistest.StartN(t, 1, redistest.Options{})
	c, err := New(redistest.Addrs(servers), WithTries(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	n := c.nodes[0]
	if out, err := setPlain(context.Background(), n, "warm", "v"); out != OutcomeGranted {
		t.Fatal(out, err)
	}
	if err := servers[0].Stop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = servers[0].Cont() })
	return n, servers[0]
}

// TestBatcherStoppedMaster queues requests behind a master that does not
// answer: each ends by its own deadline, sent or not, and the slots are
// free once the master answers again.
func TestBatcherStoppedMaster(t *testing.T) {
	n, server := stoppedMaster(t)
	ctx := context.Background()
	const timeout = 150 * time.Millisecond
	var wg sync.WaitGroup
	for i := range 4 * maxInflight {
		time.Sleep(5 * time.Millisecond)
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			out, err := setPlain(rctx, n, fmt.Sprint("stopped-", i), "v")
			if out != OutcomeError || err == nil {
				t.Errorf("request %d to a stopped master: %v %v", i, out, err)
			}
		})
	}
	wg.Wait()
	if err := server.Cont(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if out, err := setPlain(rctx, n, "after", "v"); out != OutcomeGranted {
		t.Fatal(out, err)
	}
	n.batch.mu.Lock()
	defer n.batch.mu.Unlock()
	if n.batch.inflight != 0 || len(n.batch.queue) != 0 {
		t.Fatalf("%d in flight, %d queued", n.batch.inflight, len(n.batch.queue))
	}
}

// TestBatchLeaderEndsWithItsOwnRequest: a queued request that becomes the
// leader of a batch with little time left goes out on its own, and returns
// when its own request ended, not when the batch's pipeline (here: to a
// stopped master, with a long deadline) has.
func TestBatchLeaderEndsWithItsOwnRequest(t *testing.T) {
	n, _ := stoppedMaster(t)
	ctx := context.Background()
	send := func(name string, timeout time.Duration, done chan<- string) {
		go func() {
			rctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			_, _ = setPlain(rctx, n, name, "v")
			done <- name
		}()
	}
	waitFor := func(what string, cond func(b *batcher) bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			n.batch.mu.Lock()
			ok := cond(&n.batch)
			n.batch.mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
		}
	}
	done := make(chan string, 4)
	// Two requests hold the slots for 300ms; a request with 400ms queues
	// behind them, then one with 3s. When the slots free, the first has
	// about 100ms left: it leads, goes out alone, and must end by then,
	// long before the 3s request in the pipeline.
	send("slot-1", 300*time.Millisecond, done)
	send("slot-2", 300*time.Millisecond, done)
	waitFor("both slots are taken", func(b *batcher) bool { return b.inflight == maxInflight })
	send("leader", 400*time.Millisecond, done)
	waitFor("the leader queued", func(b *batcher) bool { return len(b.queue) == 1 })
	send("follower", 3*time.Second, done)
	waitFor("the follower queued", func(b *batcher) bool { return len(b.queue) == 2 })
	var order []string
	for range 4 {
		order = append(order, <-done)
	}
	if i, j := slices.Index(order, "leader"), slices.Index(order, "follower"); i > j {
		t.Fatalf("the leader ended after the batch's pipeline: %v", order)
	}
}

// TestStragglersOfDecidedRoundsHoldNoSlot: a sequential client whose
// operations each leave a straggler on a stopped master (the other masters
// decide) does not queue its next requests to that master behind them — a
// queued request would wait for a straggler's deadline and sit in the
// client's latency tail — up to maxDetached stragglers; beyond that, a
// master that does not answer gets at most maxDetached more requests in
// flight than before.
func TestStragglersOfDecidedRoundsHoldNoSlot(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	// Stragglers on the stopped master must outlive the test's checks.
	c, err := New(redistest.Addrs(servers), WithTries(1), WithNodeTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	if _, err := c.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	if err := servers[0].Stop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = servers[0].Cont() })
	stopped := c.nodes[0]
	state := func() (inflight, queued, detached int) {
		stopped.batch.mu.Lock()
		defer stopped.batch.mu.Unlock()
		return stopped.batch.inflight, len(stopped.batch.queue), stopped.batch.detached
	}
	op := func(i int) {
		t.Helper()
		l, err := c.Acquire(ctx, fmt.Sprint("seq-", i), 10*time.Second)
		if err != nil {
			t.Fatalf("acquire %d with 2 of 3 masters up: %v", i, err)
		}
		// The release's request to the stopped master waits for the
		// acquire's to end: one straggler per operation.
		if err := l.Release(ctx); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	for i := range maxDetached {
		op(i)
	}
	if inflight, queued, detached := state(); inflight != 0 || queued != 0 || detached != maxDetached {
		t.Fatalf("after %d operations: %d in flight, %d queued, %d detached; want 0, 0, %d", maxDetached, inflight, queued, detached, maxDetached)
	}
	for i := maxDetached; i < maxDetached+maxInflight+1; i++ {
		op(i)
	}
	if inflight, _, detached := state(); inflight != maxInflight || detached != maxDetached {
		t.Fatalf("after more operations: %d in flight, %d detached; want both bounded at %d", inflight, detached, maxInflight)
	}
}

// setPlain acquires key with val on one master for 10s, as a plain lock
// without a token.
func setPlain(ctx context.Context, n *node, key, val string) (Outcome, error) {
	out, _, err := n.setNX(ctx, newSetCall(key, nil, val, 10000, false))
	return out, err
}
