package distributedlock

import (
	"cmp"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Grants that wait for room. A grant the writer cannot keep refreshed waits
// (StatusWritesBehind); the writer remembers its lock and, when room
// appears (a grant released or shed, refreshes caught up, capacity
// recovered), asks for a reconcile of the locks that now fit, first come
// first served. A waiting lock is otherwise reconciled only every
// grantRecheck: a thousand waiting locks polled every few hundred
// milliseconds cost thousands of reconciles a second, and a grant still
// came up to that poll late.
//
// The order is strict: a lock is admitted only when no lock waiting longer
// is still waiting, and the wake-up stops at the first lock that does not
// fit, so a grant that needs more (a shorter ttl) is not passed over for
// ever by smaller ones. A woken lock's room is kept for promiseHold, until
// its reconcile decides; refused then (the room went to a refresh
// meanwhile), it keeps its place. A woken lock whose reconcile does not
// decide within promiseHold (it stops before the grant, or asks for none)
// loses its place: it waits again, from then, if it asks again.

// grantRecheck is how long a waiting grant's lock waits, plus jitter, for a
// reconcile when the writer does not ask for one sooner.
const grantRecheck = 10 * time.Second

// promiseHold is how long a woken lock's room is kept for its reconcile.
const promiseHold = 5 * time.Second

// waiter is a lock whose grant waits for room.
type waiter struct {
	name      types.NamespacedName
	perSecond float64   // refreshes per second its grant will need
	since     time.Time // when it began waiting
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
	x := waiter{name: name, perSecond: w.sched.perSecond(ttl), since: now}
	if p, ok := w.promised[name]; ok {
		x.since = p.since // woken: it decides now
		delete(w.promised, name)
	}
	if prev, ok := w.waiters[name]; ok && prev.since.Before(x.since) {
		x.since = prev.since
	}
	if !w.behind() && !w.waitsBehind(x) && w.load.admits(w.demand+w.promisedDemand(now), x.perSecond, float64(w.budget.Limit())) {
		w.notWaiting(name)
		return true
	}
	w.waiters[name] = x
	w.metrics.GrantsWaiting.Set(float64(len(w.waiters)))
	return false
}

// waitsBehind reports whether another lock has waited longer than x.
// Callers hold w.mu.
func (w *statusWriter) waitsBehind(x waiter) bool {
	for _, o := range w.waiters {
		if o.name != x.name && before(o, x) {
			return true
		}
	}
	return false
}

// before is the waiters' order: longest waiting first, then by name.
func before(a, b waiter) bool { return compareWaiters(a, b) < 0 }

func compareWaiters(a, b waiter) int {
	return cmp.Or(a.since.Compare(b.since), cmp.Compare(a.name.Namespace, b.name.Namespace), cmp.Compare(a.name.Name, b.name.Name))
}

// wakeWaiters returns the waiting locks whose grants fit now, longest
// waiting first, stopping at the first that does not fit; their room is
// kept until their reconciles decide (admit).
func (w *statusWriter) wakeWaiters(now time.Time) []types.NamespacedName {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.waiters) == 0 || w.load.overloaded || w.behind() {
		return nil
	}
	budget := float64(w.budget.Limit())
	demand := w.demand + w.promisedDemand(now)
	var head waiter
	for _, x := range w.waiters {
		if head.name.Name == "" || before(x, head) {
			head = x
		}
	}
	if !w.load.admits(demand, head.perSecond, budget) {
		return nil // no room yet: the common case, without sorting
	}
	waiting := make([]waiter, 0, len(w.waiters))
	for _, x := range w.waiters {
		waiting = append(waiting, x)
	}
	slices.SortFunc(waiting, compareWaiters)
	var out []types.NamespacedName
	for _, x := range waiting {
		if !w.load.admits(demand, x.perSecond, budget) {
			break
		}
		demand += x.perSecond
		out = append(out, x.name)
		delete(w.waiters, x.name)
		w.promised[x.name] = promise{waiter: x, until: now.Add(promiseHold)}
	}
	w.metrics.GrantsWaiting.Set(float64(len(w.waiters)))
	return out
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
		sum += p.perSecond
	}
	return sum
}

// notWaiting stops counting lock name as waiting, or as woken: it was
// granted, or it no longer asks for a grant. Callers hold w.mu.
func (w *statusWriter) notWaiting(name types.NamespacedName) {
	delete(w.promised, name)
	if _, ok := w.waiters[name]; ok {
		delete(w.waiters, name)
		w.metrics.GrantsWaiting.Set(float64(len(w.waiters)))
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
	if len(w.waiters) > 0 {
		kick(w.kickWaiters)
	}
}

// wakeLocks asks for reconciles of the locks named.
func (w *statusWriter) wakeLocks(names []types.NamespacedName) {
	if w.wakeLock == nil {
		return
	}
	for _, n := range names {
		w.wakeLock(n)
	}
}
