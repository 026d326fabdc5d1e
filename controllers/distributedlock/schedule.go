package distributedlock

import (
	"context"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Status writes are scheduled by deadline: a reconcile that must refresh
// the validity a held lock shows goes before every other reconcile (new
// locks, spec changes, pods), and among those the lock whose shown
// validity passes first goes first. When the API server is slow, the locks
// closest to showing a lapse get its writes; new grants wait.

// deadlinePriority is the work queue priority of a reconcile that must
// write before deadline: above every ordinary reconcile (priority 0), and
// higher the nearer the deadline (the zero time, nothing shown yet, is the
// most urgent). Priorities are ints: this assumes a 64-bit platform, as
// the operator's images are.
func deadlinePriority(deadline time.Time) int {
	return int(math.MaxInt64/2 - deadline.UnixMilli())
}

// wakeup asks for a reconcile of a held lock before the validity it shows
// passes.
type wakeup struct {
	name     types.NamespacedName
	deadline time.Time
}

// wakeups is the source of the renewal sessions' wake-ups: each is added to
// the controller's priority queue at its deadline's priority.
type wakeups chan wakeup

// Start implements source.TypedSource.
func (w wakeups) Start(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case u := <-w:
				req := reconcile.Request{NamespacedName: u.name}
				if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
					pq.AddWithOpts(priorityqueue.AddOpts{Priority: new(deadlinePriority(u.deadline))}, req)
					continue
				}
				q.Add(req)
			}
		}
	}()
	return nil
}
