package distributedlock

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// Adoption order. A manager that starts leading sees every lock at once,
// in the initial list of its cache, and adopts each held one in a reconcile
// of its own before the validity status shows passes (a lock adopted too
// late is granted again with a new token). Its queue (controller-runtime's
// priority queue) serves the held locks of that list first, nearest shown
// validity first, then the locks whose shown validity already passed, then
// everything else — the rest of the initial list at the queue's low
// priority, as controller-runtime enqueues it.
const (
	// adoptBand is the priority of a held lock whose shown validity
	// passes now; each adoptStep further ahead is one less.
	adoptBand = 1 << 20
	adoptStep = 100 * time.Millisecond
	// lapsedPriority is the priority of a lock whose status shows a
	// holder whose validity passed: after every lock that can still be
	// adopted, ahead of the rest.
	lapsedPriority = 1
	// wakePriority is the priority of a wake-up from this manager's own
	// Sessions and status writer (a grant lost, shed, or no longer shown;
	// a waiting grant that now fits): ahead of requeues, which may be
	// thousands when the writer is overloaded.
	wakePriority = 1
)

// adoptionPriority is the queue priority of a lock that status shows as
// st, seen in the initial list at now; ok is false when status shows no
// holder (the queue's default applies).
func adoptionPriority(st v1alpha1.DistributedLockStatus, now time.Time) (priority int, ok bool) {
	if st.Holder == nil || st.ValidUntil == nil {
		return 0, false
	}
	ahead := st.ValidUntil.Sub(now)
	if ahead <= 0 {
		return lapsedPriority, true
	}
	steps := int64(ahead / adoptStep)
	return int(max(adoptBand-steps, lapsedPriority+1)), true
}

// adoptFirst enqueues DistributedLocks as handler.EnqueueRequestForObject
// does, but a held lock in the initial list goes first, in adoption order
// (adoptionPriority), when the queue is a priority queue.
type adoptFirst struct {
	handler.TypedEnqueueRequestForObject[client.Object]
	now func() time.Time
}

// Create implements handler.EventHandler.
func (a *adoptFirst) Create(ctx context.Context, evt event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if lock, isLock := evt.Object.(*v1alpha1.DistributedLock); isLock && evt.IsInInitialList {
		if p, ok := adoptionPriority(lock.Status, a.now()); ok {
			addAt(q, client.ObjectKeyFromObject(lock), p)
			return
		}
	}
	a.TypedEnqueueRequestForObject.Create(ctx, evt, q)
}

// wakeQueue is the source of the wake-ups of this manager's own Sessions
// and status writer (Reconciler.enqueue): it adds them straight to the
// controller's queue at wakePriority. The queue merges a lock asked for
// twice and never blocks, so thousands of wake-ups at once (a wave of
// sheds, the waiting grants that fit after one) cost neither a goroutine
// nor a channel's room each. Wake-ups before the controller starts are
// kept until it does.
type wakeQueue struct {
	mu      sync.Mutex
	q       workqueue.TypedRateLimitingInterface[reconcile.Request]
	pending map[types.NamespacedName]struct{}
}

// add asks for a reconcile of lock name.
func (w *wakeQueue) add(name types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.q == nil {
		if w.pending == nil {
			w.pending = map[types.NamespacedName]struct{}{}
		}
		w.pending[name] = struct{}{}
		return
	}
	addAt(w.q, name, wakePriority)
}

// Start implements source.Source.
func (w *wakeQueue) Start(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.q = q
	for name := range w.pending {
		addAt(q, name, wakePriority)
	}
	w.pending = nil
	return nil
}

// String implements fmt.Stringer, for the controller's logs.
func (w *wakeQueue) String() string { return "wake-ups" }

// addAt enqueues lock name at priority when q is a priority queue,
// plainly otherwise.
func addAt(q workqueue.TypedRateLimitingInterface[reconcile.Request], name types.NamespacedName, priority int) {
	req := reconcile.Request{NamespacedName: name}
	if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
		pq.AddWithOpts(priorityqueue.AddOpts{Priority: &priority}, req)
		return
	}
	q.Add(req)
}
