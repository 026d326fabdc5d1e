package redlock

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlock-operator/redlock-operator/pkg/redistest"
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
				out, err := n.set(ctx, setArgs(key, val, 10000))
				if out != OutcomeGranted || err != nil {
					t.Errorf("set %s: %v %v", key, out, err)
				}
				cmd := redis.NewStringCmd(ctx, "get", key)
				n.process(ctx, cmd)
				if got, err := cmd.Result(); got != val || err != nil {
					t.Errorf("get %s = %q %v, want %q", key, got, err, val)
				}
				out, err = n.release(ctx, releaseArgs(key, val))
				if out != OutcomeGranted || err != nil {
					t.Errorf("release %s: %v %v", key, out, err)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	n.batch.mu.Lock()
	defer n.batch.mu.Unlock()
	if n.batch.inflight != 0 || len(n.batch.queue) != 0 {
		t.Fatalf("after the load: %d in flight, %d queued", n.batch.inflight, len(n.batch.queue))
	}
	if n.batch.led == 0 {
		t.Fatal("no request was queued: the load did not exercise batching")
	}
}

// TestBatcherStoppedMaster queues requests behind a master that does not
// answer: each ends by its own deadline, sent or not, and the slots are
// free once the master answers again.
func TestBatcherStoppedMaster(t *testing.T) {
	servers := redistest.StartN(t, 1, redistest.Options{})
	c, err := New(redistest.Addrs(servers), WithTries(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	n := c.nodes[0]
	ctx := context.Background()
	if out, err := n.set(ctx, setArgs("warm", "v", 10000)); out != OutcomeGranted {
		t.Fatal(out, err)
	}
	if err := servers[0].Stop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = servers[0].Cont() })
	const timeout = 150 * time.Millisecond
	var wg sync.WaitGroup
	for i := range 4 * maxInflight {
		time.Sleep(5 * time.Millisecond)
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			t0 := time.Now()
			out, err := n.set(rctx, setArgs(fmt.Sprint("stopped-", i), "v", 10000))
			if out != OutcomeError || err == nil {
				t.Errorf("request %d to a stopped master: %v %v", i, out, err)
			}
			// Its own deadline, plus scheduling on a loaded machine under
			// the race detector; waiting for other requests' timeouts
			// would take several.
			if d := time.Since(t0); d > 2*timeout+100*time.Millisecond {
				t.Errorf("request %d ended %v after it started, timeout %v", i, d, timeout)
			}
		})
	}
	wg.Wait()
	if err := servers[0].Cont(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if out, err := n.set(rctx, setArgs("after", "v", 10000)); out != OutcomeGranted {
		t.Fatal(out, err)
	}
	n.batch.mu.Lock()
	defer n.batch.mu.Unlock()
	if n.batch.inflight != 0 || len(n.batch.queue) != 0 {
		t.Fatalf("%d in flight, %d queued", n.batch.inflight, len(n.batch.queue))
	}
}
