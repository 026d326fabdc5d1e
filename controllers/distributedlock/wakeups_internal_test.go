package distributedlock

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// woken records the locks a wakeups enqueued.
type woken struct {
	mu    sync.Mutex
	locks []types.NamespacedName
}

func (w *woken) add(l types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.locks = append(w.locks, l)
}

func (w *woken) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.locks)
}

// until polls cond for up to the notices' own bounds (a subscription
// confirmed within its timeout, a notice within a node timeout).
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * watchTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// subscribed is how many masters have a listener on key's notices.
func subscribed(t *testing.T, servers []*redistest.Server, key string) int {
	t.Helper()
	n := 0
	for _, l := range listeners(t, servers, key) {
		if l > 0 {
			n++
		}
	}
	return n
}

// listeners is how many listeners each master has on key's notices.
func listeners(t *testing.T, servers []*redistest.Server, key string) []int64 {
	t.Helper()
	out, err := redistest.Subscribers(context.Background(), servers, redlock.NoticeChannel(key))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestWakeups: a lock that waits for a key listens for its release on the
// set's masters, is woken once subscribed and on each release, stops
// listening when granted or when its wait lapses, and listens again with a
// rebuilt client.
func TestWakeups(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	newClient := func() *redlock.Client {
		c, err := redlock.New(redistest.Addrs(servers), redlock.WithReleaseNotices(), redlock.WithTries(1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	c := newClient()
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	got := &woken{}
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "woken"}, []string{"cause"})
	byCause := func(cause string) float64 { return testutil.ToFloat64(counter.WithLabelValues(cause)) }
	w := newWakeups(got.add, func() time.Time { mu.Lock(); defer mu.Unlock(); return now }, counter)
	set := types.NamespacedName{Namespace: "ns", Name: "masters"}
	lock, other := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	ctx := context.Background()

	held, err := c.Acquire(ctx, "k", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w.wait(lock, set, "k", time.Second, c)
	until(t, "the waiting lock to be woken once subscribed on a quorum", func() bool { return got.count() == 1 })
	if n := subscribed(t, servers, "k"); n < 2 {
		t.Fatalf("subscribed on %d masters, want a quorum", n)
	}
	if byCause("release") != 0 || byCause("subscribed") != 1 {
		t.Errorf("wake-ups counted: %v by release, %v by subscribing; want 0 and 1", byCause("release"), byCause("subscribed"))
	}

	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	until(t, "the waiting lock to be woken by the release", func() bool { return got.count() == 2 })
	if byCause("release") != 1 {
		t.Errorf("wake-ups counted by release: %v, want 1", byCause("release"))
	}

	w.forget(lock)
	until(t, "the listener to unsubscribe once no lock waits", func() bool { return subscribed(t, servers, "k") == 0 })

	// A wait lapses when no attempt renews it.
	w.wait(other, set, "k2", time.Second, c)
	until(t, "the other lock to be subscribed", func() bool { return subscribed(t, servers, "k2") == 3 })
	mu.Lock()
	now = now.Add(waitLease(time.Second) + time.Second)
	mu.Unlock()
	w.wait(lock, set, "k3", time.Second, c)
	until(t, "the lapsed wait to unsubscribe", func() bool { return subscribed(t, servers, "k2") == 0 })

	// A client rebuilt: the next wait listens with it, for every key
	// waited for, and the old client's listener ends.
	c2 := newClient()
	w.wait(other, set, "k4", time.Second, c2)
	until(t, "the rebuilt client to listen for both keys, and the old one to stop", func() bool {
		return slices.Equal(listeners(t, servers, "k3"), []int64{1, 1, 1}) && slices.Equal(listeners(t, servers, "k4"), []int64{1, 1, 1})
	})
	_ = c.Close()
	before := got.count()
	held, err = c2.Acquire(ctx, "k3", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	until(t, "the lock waiting since the old client to be woken through the rebuilt one", func() bool {
		got.mu.Lock()
		defer got.mu.Unlock()
		return len(got.locks) > before && got.locks[len(got.locks)-1] == lock
	})
}
