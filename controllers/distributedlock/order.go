package distributedlock

import (
	"context"
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
			addAt(q, lock, p)
			return
		}
	}
	a.TypedEnqueueRequestForObject.Create(ctx, evt, q)
}

// wakeFirst enqueues the locks of the wake channel (Reconciler.enqueue) at
// wakePriority when the queue is a priority queue.
type wakeFirst struct {
	handler.TypedFuncs[*v1alpha1.DistributedLock, reconcile.Request]
}

// Generic implements handler.TypedEventHandler.
func (wakeFirst) Generic(_ context.Context, evt event.TypedGenericEvent[*v1alpha1.DistributedLock], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	addAt(q, evt.Object, wakePriority)
}

// addAt enqueues lock at priority when q is a priority queue, plainly
// otherwise.
func addAt(q workqueue.TypedRateLimitingInterface[reconcile.Request], lock *v1alpha1.DistributedLock, priority int) {
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: lock.Namespace, Name: lock.Name}}
	if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
		pq.AddWithOpts(priorityqueue.AddOpts{Priority: &priority}, req)
		return
	}
	q.Add(req)
}
