package distributedlock

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// wakeups (nil: off) wakes the locks that lost their key to another
// holder when the masters tell of that key's release (redlock.Notices): a
// grant ended in another cluster is tried for at once, not after a retry
// delay. A wake-up only asks for a reconcile, which runs every gate of
// this cluster before any attempt; a lost notice costs the retry delay,
// which stays scheduled.
type wakeups struct {
	enqueue func(types.NamespacedName)
	now     func() time.Time
	// woken counts the locks woken, by cause: a release notice, or the
	// check after a key's subscription.
	woken *prometheus.CounterVec

	mu sync.Mutex
	// sets are the notices listened to, by master set.
	sets map[types.NamespacedName]*ears
	// waiting is what each lock waits for, until a time: its wait is
	// renewed by every attempt that finds the key held, and lapses when
	// none comes (the lock was granted, deleted or stopped waiting).
	waiting map[types.NamespacedName]waitingFor
	pruned  time.Time
}

type waitingFor struct {
	set   types.NamespacedName
	key   string
	until time.Time
}

// ears are one master set's notices, from one client: a client rebuilt (a
// new Secret, a membership change) listens anew. They stay open while the
// client does, waiters or not: a set whose locks wait now and then does
// not connect to every master each time.
type ears struct {
	client  *redlock.Client
	notices *redlock.Notices
	// keys are the locks waiting for each key.
	keys map[string]map[types.NamespacedName]bool
	// watched is closed once each key's Watch returned: its Unwatch comes
	// after (a key's Watch and Unwatch are counted in their order).
	watched map[string]chan struct{}
}

// watchTimeout bounds the wait for a quorum of masters to confirm a
// subscription; one that did not is confirmed later, or the retry delay
// serves.
const watchTimeout = 2 * time.Second

// waitLease is how long a lock stays waiting for a notice after an
// attempt found its key held and retries after delay: two delays and a
// second, so that a lock trying again keeps its subscription.
func waitLease(delay time.Duration) time.Duration {
	return 2*delay + time.Second
}

func newWakeups(enqueue func(types.NamespacedName), now func() time.Time, woken *prometheus.CounterVec) *wakeups {
	return &wakeups{
		enqueue: enqueue, now: now, woken: woken,
		sets: map[types.NamespacedName]*ears{}, waiting: map[types.NamespacedName]waitingFor{},
	}
}

// wait makes lock, whose key on set's masters another holder has, wait for
// a notice of that key's release, listening with c; it tries again after
// delay in any case.
func (w *wakeups) wait(lock, set types.NamespacedName, key string, delay time.Duration, c *redlock.Client) {
	if w == nil {
		return
	}
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prune(now)
	if cur, ok := w.waiting[lock]; ok && (cur.set != set || cur.key != key) {
		w.drop(lock, cur)
	}
	w.waiting[lock] = waitingFor{set: set, key: key, until: now.Add(waitLease(delay))}
	e := w.sets[set]
	if e == nil || e.client != c {
		// New, or the set's client was rebuilt: its notices end with it.
		var keys map[string]map[types.NamespacedName]bool
		if e != nil {
			keys = e.keys
		}
		ne := w.listen(set, c, keys)
		if ne == nil {
			return // c is closed: the next attempt brings its successor
		}
		if e != nil {
			go e.notices.Close()
		}
		e = ne
	}
	if e.keys[key] == nil {
		e.keys[key] = map[types.NamespacedName]bool{}
		e.watch(w, set, key)
	}
	e.keys[key][lock] = true
}

// listen starts a set's notices with c, watching keys again, and makes
// them the set's; nil when c is closed.
func (w *wakeups) listen(set types.NamespacedName, c *redlock.Client, keys map[string]map[types.NamespacedName]bool) *ears {
	e := &ears{client: c, keys: map[string]map[types.NamespacedName]bool{}, watched: map[string]chan struct{}{}}
	n, err := c.Notices(func(key string) { w.woken.WithLabelValues("release").Add(float64(w.released(set, e, key))) })
	if err != nil {
		return nil
	}
	e.notices = n
	w.sets[set] = e
	for key, locks := range keys {
		e.keys[key] = locks
		e.watch(w, set, key)
	}
	return e
}

// watch subscribes to key's notices, in the background, with w.mu held;
// once a quorum of masters confirmed it, the key's waiting locks are woken
// once: a release between their attempt and the subscription was not
// told.
func (e *ears) watch(w *wakeups, set types.NamespacedName, key string) {
	done := make(chan struct{})
	e.watched[key] = done
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), watchTimeout)
		defer cancel()
		if err := e.notices.Watch(ctx, key); err != nil {
			logf.Log.WithName("wakeups").V(1).Info("release notices not confirmed", "masterSet", set, "key", key, "error", err.Error())
			return
		}
		w.woken.WithLabelValues("subscribed").Add(float64(w.released(set, e, key)))
	}()
}

// unwatch ends key's subscription once its Watch returned, with w.mu held.
func (e *ears) unwatch(key string) {
	done := e.watched[key]
	delete(e.watched, key)
	go func() {
		<-done
		e.notices.Unwatch(key)
	}()
}

// released wakes the locks waiting for key on set, and returns how many.
func (w *wakeups) released(set types.NamespacedName, e *ears, key string) int {
	w.mu.Lock()
	w.prune(w.now())
	var wake []types.NamespacedName
	if w.sets[set] == e {
		for lock := range e.keys[key] {
			wake = append(wake, lock)
		}
	}
	w.mu.Unlock()
	for _, lock := range wake {
		w.enqueue(lock)
	}
	return len(wake)
}

// forget ends lock's wait: it was granted, or is gone.
func (w *wakeups) forget(lock types.NamespacedName) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if cur, ok := w.waiting[lock]; ok {
		w.drop(lock, cur)
	}
}

// prune drops the waits that lapsed, at most once a second.
func (w *wakeups) prune(now time.Time) {
	if now.Sub(w.pruned) < time.Second {
		return
	}
	w.pruned = now
	for lock, cur := range w.waiting {
		if now.After(cur.until) {
			w.drop(lock, cur)
		}
	}
}

// drop removes lock's wait, with w.mu held: the last lock of a key
// unsubscribes it.
func (w *wakeups) drop(lock types.NamespacedName, cur waitingFor) {
	delete(w.waiting, lock)
	e := w.sets[cur.set]
	if e == nil || !e.keys[cur.key][lock] {
		return
	}
	delete(e.keys[cur.key], lock)
	if len(e.keys[cur.key]) > 0 {
		return
	}
	delete(e.keys, cur.key)
	e.unwatch(cur.key)
}
