package grants

import (
	"cmp"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Grants that wait for room. A grant the writer cannot keep refreshed
// waits (StatusWritesBehind). When room appears, the writer asks for a
// reconcile of the waiting locks that now fit, first come first served;
// otherwise a waiting lock is reconciled every GrantRecheck. A lock is
// admitted only when no lock waiting longer still waits. A woken lock's
// room is kept for promiseHold, an admitted lock's until its grant is
// tracked (at most promiseHold). A woken lock whose reconcile does not
// decide by then loses its place.
// The reasoning: docs/design/status-writer.md#grants-that-wait-for-room.

// GrantRecheck is how long a waiting grant's lock waits, plus jitter, for a
// reconcile when the writer does not ask for one sooner.
const GrantRecheck = 10 * time.Second

// promiseHold is how long a woken lock's room is kept for its reconcile.
const promiseHold = 5 * time.Second

// waiter is a lock whose grant waits for room.
type waiter struct {
	name  types.NamespacedName
	ttl   time.Duration // its lock's: the refreshes its grant will need follow from it (at the leads of the moment)
	since time.Time     // when it began waiting
}

// promise is room kept for a woken lock until its reconcile decides.
type promise struct {
	waiter
	until time.Time
}

// admit reports whether a new grant of lock name, of ttl, may be made now:
// refreshes are not behind, no lock waiting longer still waits, and the
// writer admits the demand it adds (loadState.admits). Otherwise the lock
// waits, and is reconciled when its grant fits (wakeWaiters).
func (w *statusWriter) admit(name types.NamespacedName, ttl time.Duration) bool {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	x := waiter{name: name, ttl: ttl, since: now}
	if p, ok := w.promised[name]; ok {
		if now.Before(p.until) {
			x.since = p.since // woken: it decides now
		}
		delete(w.promised, name)
	}
	if prev, ok := w.waiters.byName[name]; ok && prev.since.Before(x.since) {
		x.since = prev.since
	}
	if !w.behind(now) && !w.waiters.behind(x) && w.load.admits(w.demand+w.promisedDemand(now), w.sched.perSecond(x.ttl), float64(w.budget.Limit())) {
		w.notWaiting(name)
		// Its room is kept until its grant is tracked (or it asks for
		// none, or promiseHold passes): a grant takes round trips to
		// make, and other locks woken or admitted meanwhile would count
		// the same room.
		w.promised[name] = promise{waiter: x, until: now.Add(promiseHold)}
		return true
	}
	w.waiters.put(x)
	w.metrics.GrantsWaiting.Set(float64(w.waiters.len()))
	return false
}

// waitQueue is the waiting locks by name, with the one waiting longest
// kept at hand: every waiting lock's reconcile asks whether another waited
// longer, and scanning thousands of waiters for each would cost more than
// the reconcile.
type waitQueue struct {
	byName map[types.NamespacedName]waiter
	head   waiter
	known  bool // head is the first waiter (or there is none)
}

func (q *waitQueue) len() int { return len(q.byName) }

// first is the lock waiting longest.
func (q *waitQueue) first() (waiter, bool) {
	if !q.known {
		q.head = waiter{}
		for _, x := range q.byName {
			if q.head.name.Name == "" || before(x, q.head) {
				q.head = x
			}
		}
		q.known = true
	}
	return q.head, q.head.name.Name != ""
}

// behind reports whether another lock has waited longer than x.
func (q *waitQueue) behind(x waiter) bool {
	h, ok := q.first()
	return ok && h.name != x.name && before(h, x)
}

func (q *waitQueue) put(x waiter) {
	q.byName[x.name] = x
	switch {
	case !q.known:
	case q.head.name.Name == "" || before(x, q.head):
		q.head = x
	case q.head.name == x.name:
		q.known = false // it waits from later now: another may be first
	}
}

func (q *waitQueue) del(name types.NamespacedName) {
	delete(q.byName, name)
	if q.head.name == name {
		q.known = false
	}
}

// before is the waiters' order: longest waiting first, then by name.
func before(a, b waiter) bool { return compareWaiters(a, b) < 0 }

func compareWaiters(a, b waiter) int {
	return cmp.Or(a.since.Compare(b.since), cmp.Compare(a.name.Namespace, b.name.Namespace), cmp.Compare(a.name.Name, b.name.Name))
}

// wakeWaiters returns the waiting locks whose grants fit now, longest
// waiting first, stopping at the first that does not fit, and no more than
// the writes left beside the refreshes make (wakeLimit, once capacity is
// measured); their room is kept
// until their reconciles decide (admit).
func (w *statusWriter) wakeWaiters(now time.Time) []types.NamespacedName {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiters.len() == 0 || w.load.overloaded || w.behind(now) {
		return nil
	}
	budget := float64(w.budget.Limit())
	demand := w.demand + w.promisedDemand(now)
	if head, _ := w.waiters.first(); !w.load.admits(demand, w.sched.perSecond(head.ttl), budget) {
		return nil // no room yet: the common case, without sorting
	}
	waiting := make([]waiter, 0, w.waiters.len())
	for _, x := range w.waiters.byName {
		waiting = append(waiting, x)
	}
	slices.SortFunc(waiting, compareWaiters)
	var out []types.NamespacedName
	limit := len(waiting)
	if w.load.measured {
		// The budget unmeasured is the writer's own pace, not the API
		// server's: it says nothing of the room for grants' writes.
		limit = wakeLimit(w.load.capacity, demand)
	}
	for _, x := range waiting {
		need := w.sched.perSecond(x.ttl)
		if len(out) >= limit || !w.load.admits(demand, need, budget) {
			break
		}
		demand += need
		out = append(out, x.name)
		w.waiters.del(x.name)
		w.promised[x.name] = promise{waiter: x, until: now.Add(promiseHold)}
	}
	w.metrics.GrantsWaiting.Set(float64(w.waiters.len()))
	return out
}

// grantWrites is about how many API writes making a grant takes: its
// status, its Event, the pod's mark or gate.
const grantWrites = 3

// wakeLimit is how many waiting locks to wake at once when the API server
// takes capacity writes a second and the grants held and promised need
// demand of them: the writes a loadTick leaves beside the refreshes, a
// grant's worth of writes each, at least one. Woken all at once, grants
// that fit took the API server for a second and the refreshes queued
// behind them landed late (a capacity of 10 writes/s, ten grants woken).
func wakeLimit(capacity, demand float64) int {
	return max(1, int((capacity-demand)*loadTick.Seconds()/grantWrites))
}

// promisedDemand is the refreshes per second whose room is kept for woken
// locks; it forgets promises past their time. Callers hold w.mu.
func (w *statusWriter) promisedDemand(now time.Time) float64 {
	var sum float64
	for name, p := range w.promised {
		if now.After(p.until) {
			delete(w.promised, name)
			continue
		}
		sum += w.sched.perSecond(p.ttl)
	}
	return sum
}

// notWaiting stops counting lock name as waiting, or as woken: it was
// granted, or it no longer asks for a grant. Callers hold w.mu.
func (w *statusWriter) notWaiting(name types.NamespacedName) {
	delete(w.promised, name)
	if _, ok := w.waiters.byName[name]; ok {
		w.waiters.del(name)
		w.metrics.GrantsWaiting.Set(float64(w.waiters.len()))
		w.roomMade() // a lock behind it may be first now
	}
}

// stopWaiting is notWaiting for callers that do not hold w.mu.
func (w *statusWriter) stopWaiting(name types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.notWaiting(name)
}

// roomMade wakes the waiters' check: a grant stopped being refreshed, or
// the first waiting lock left. Callers hold w.mu.
func (w *statusWriter) roomMade() {
	if w.waiters.len() > 0 {
		kick(w.kickWaiters)
	}
}

// wakeLocks asks for reconciles of the locks named.
func (w *statusWriter) wakeLocks(names []types.NamespacedName) {
	if w.reconcile == nil {
		return
	}
	for _, n := range names {
		w.reconcile(n)
	}
}
