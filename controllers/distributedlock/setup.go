package distributedlock

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/writegate"
)

// SetupWithManager registers the controller and its renewal sessions.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	// The Set has a client of its own, limited only by its budget, so
	// that refreshes never queue behind grants in the client's limiter,
	// nor at the manager's write gate.
	wcfg := writegate.Exempt(mgr.GetConfig())
	wcfg.QPS, wcfg.Burst, wcfg.RateLimiter = -1, 0, nil
	wc, err := client.New(wcfg, client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return fmt.Errorf("status writer client: %w", err)
	}
	gcfg := grants.Config{
		Client: wc, Recorder: r.Recorder, Metrics: r.Metrics,
		WritesPerSecond: r.StatusWriteQPS, FailoverSlack: r.FailoverSlack,
		Report: r.StatusReport, Manager: r.Manager,
	}
	if r.WriteGate != nil {
		gcfg.Gate = r.WriteGate
	}
	r.grants = grants.New(gcfg, grants.Callbacks{Reconcile: r.enqueue})
	r.wake = &wakeQueue{}
	r.keys = &keys{grants: r.grants, masters: r.Masters, values: r.Values, clock: r.Clock, wake: r.enqueue}
	if r.ReleaseNotices {
		r.wakeups = newWakeups(r.enqueue, r.Clock.Now, r.Metrics.Wakeups)
	}
	if r.WaitingLines {
		r.lines = newLines(r.Clock.Now, r.Metrics.LineChecks)
	}
	r.beats = newHeartbeats(r.Clock)
	hbs, err := mgr.GetCache().GetInformer(ctx, &v1alpha1.LockHeartbeat{})
	if err != nil {
		return fmt.Errorf("heartbeat informer: %w", err)
	}
	r.beats.stopped = r.enqueue // an agent's word: the lock may pass on now
	if _, err := hbs.AddEventHandler(r.beats.handler()); err != nil {
		return fmt.Errorf("heartbeat informer: %w", err)
	}
	if err := mgr.Add(r.grants); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.DistributedLock{}, indexMasterSet, func(o client.Object) []string {
		return []string{o.(*v1alpha1.DistributedLock).Spec.MasterSet}
	}); err != nil {
		return err
	}
	if err := indexRules(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	workers := r.MaxConcurrentReconciles
	if workers <= 0 {
		workers = 4
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("distributedlock").
		// Held locks first when a new leader starts: see adoptionPriority.
		Watches(&v1alpha1.DistributedLock{}, &adoptFirst{now: r.Clock.Now}, builder.WithPredicates(specOrLifecycleChanged())).
		// The namespaces rule of a key governs every lock of the key.
		Watches(&v1alpha1.DistributedLock{}, handler.EnqueueRequestsFromMapFunc(locksOfRule(r.Client)), builder.WithPredicates(namespaceRuleChanged())).
		Watches(&v1alpha1.DistributedSemaphore{}, handler.EnqueueRequestsFromMapFunc(locksOfRule(r.Client)), builder.WithPredicates(namespaceRuleChanged())).
		Watches(&v1alpha1.RedisMasterSet{}, handler.EnqueueRequestsFromMapFunc(locksOfMasterSet(r.Client)),
			builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, listAdopted()))).
		WatchesRawSource(r.wake)
	if r.Pods != nil {
		b = b.WatchesRawSource(source.Kind(r.Pods, &corev1.Pod{}, handler.TypedEnqueueRequestsFromMapFunc(lockOfPod)))
		if !r.IgnoreNodes {
			b = b.Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(locksOnNode(r.Pods)), builder.WithPredicates(nodeReadinessChanged()))
		}
	}
	return b.WithOptions(controller.Options{MaxConcurrentReconciles: workers, RateLimiter: rateLimiter(), UsePriorityQueue: ptr.To(true)}).
		Complete(r)
}

// rateLimiter is controller-runtime's default with the per-item backoff
// capped at maxBackoff: a reconcile that failed drops its RequeueAfter (a
// shown validity to hide, a former holder to look at again), so it must
// come back soon rather than after minutes of backoff.
func rateLimiter() workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, maxBackoff),
		&workqueue.TypedBucketRateLimiter[reconcile.Request]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
	)
}

// lockOfPod enqueues the lock a pod's label names.
func lockOfPod(_ context.Context, pod *corev1.Pod) []reconcile.Request {
	name := pod.Labels[v1alpha1.LockLabel]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: pod.Namespace, Name: name}}}
}

// locksOnNode enqueues the locks of the labelled pods (in pods) bound to
// a node.
func locksOnNode(pods client.Reader) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		var list corev1.PodList
		if err := pods.List(ctx, &list); err != nil {
			logf.FromContext(ctx).Error(err, "list pods of node", "node", o.GetName())
			return nil
		}
		var reqs []reconcile.Request
		for i := range list.Items {
			if list.Items[i].Spec.NodeName == o.GetName() {
				reqs = append(reqs, lockOfPod(ctx, &list.Items[i])...)
			}
		}
		return reqs
	}
}

// nodeReadinessChanged passes node creations, deletions and updates that
// change the Ready condition's status.
func nodeReadinessChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, okOld := e.ObjectOld.(*corev1.Node)
			n, okNew := e.ObjectNew.(*corev1.Node)
			return !okOld || !okNew || nodeReady(o) != nodeReady(n)
		},
	}
}

// listAdopted passes an update of a master set that changed the list locks
// are granted on (status.addresses adopted, a membership change started or
// ended): locks waiting for it go at once.
func listAdopted() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, okOld := e.ObjectOld.(*v1alpha1.RedisMasterSet)
			n, okNew := e.ObjectNew.(*v1alpha1.RedisMasterSet)
			return okOld && okNew && (o.Status.MembershipEpoch != n.Status.MembershipEpoch || len(o.Status.Addresses) == 0 && len(n.Status.Addresses) > 0)
		},
	}
}

// locksOfMasterSet enqueues the locks that use a master set.
func locksOfMasterSet(c client.Reader) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		return listLocks(ctx, c, "list locks of master set", o, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexMasterSet: o.GetName()})
	}
}

// listLocks lists the locks opts select as requests; a failure is logged
// with msg and o.
func listLocks(ctx context.Context, c client.Reader, msg string, o client.Object, opts ...client.ListOption) []reconcile.Request {
	var list v1alpha1.DistributedLockList
	if err := c.List(ctx, &list, append(opts, client.UnsafeDisableDeepCopy)...); err != nil {
		logf.FromContext(ctx).Error(err, msg, "object", client.ObjectKeyFromObject(o))
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// specOrLifecycleChanged passes creations, deletions and updates that change
// the spec, the deletion timestamp, the finalizers, a semaphore's fence
// (MovingPodAnnotation) or the grant status shows (another manager's
// write) — not validity refreshes, which would otherwise reconcile every
// held lock after each of them.
func specOrLifecycleChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			ol, okOld := o.(*v1alpha1.DistributedLock)
			nl, okNew := n.(*v1alpha1.DistributedLock)
			return o.GetGeneration() != n.GetGeneration() ||
				o.GetDeletionTimestamp().IsZero() != n.GetDeletionTimestamp().IsZero() ||
				len(o.GetFinalizers()) != len(n.GetFinalizers()) ||
				!okOld || !okNew || !sameGrant(ol.Status, nl.Status) || ol.MovingPod() != nl.MovingPod()
		},
	}
}
