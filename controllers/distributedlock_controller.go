package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/lockvalue"
	"github.com/redlock-operator/redlock-operator/internal/masters"
	"github.com/redlock-operator/redlock-operator/pkg/metrics"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// LockFinalizer makes deleting a DistributedLock release it in Redis first.
const LockFinalizer = "redlock.dev/release"

// indexMasterSet indexes DistributedLocks by spec.masterSet.
const indexMasterSet = "spec.masterSet"

// opTimeout bounds one Redis operation of the controllers (each master is
// bounded by the node timeout inside it).
const opTimeout = 5 * time.Second

// Event reasons of DistributedLocks.
const (
	EventGranted           = "Granted"
	EventAdopted           = "Adopted"
	EventReleased          = "Released"
	EventReleaseIncomplete = "ReleaseIncomplete"
	EventLost              = "Lost"
	EventRenewFailed       = "RenewFailed"
)

// DistributedLockReconciler acquires, renews and releases DistributedLocks.
//
// Renewals run on their own goroutine per held lock (holdings), on their
// own schedule, so that a backed-up work queue never delays them; the
// renewer writes renewals and losses into status itself.
type DistributedLockReconciler struct {
	client.Client
	// APIReader reads without the cache, to check a conflicting grant.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Masters   *masters.Registry
	Values    *lockvalue.Deriver
	Metrics   *metrics.Metrics
	// Clock is used for status times and requeue delays.
	Clock clock.PassiveClock
	// MaxConcurrentReconciles defaults to 4.
	MaxConcurrentReconciles int

	held *holdings
	wake chan event.TypedGenericEvent[*v1alpha1.DistributedLock]
}

// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=distributedlocks,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=distributedlocks/status,verbs=get;patch
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=distributedlocks/finalizers,verbs=update
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=redismastersets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// lockScope is what one reconcile works on.
type lockScope struct {
	lock       *v1alpha1.DistributedLock
	origStatus v1alpha1.DistributedLockStatus // status as read, for the final patch
	now        time.Time
	requeue    time.Duration // 0: none
}

func (s *lockScope) requeueAfter(d time.Duration) {
	if d > 0 && (s.requeue == 0 || d < s.requeue) {
		s.requeue = d
	}
}

func (s *lockScope) setCondition(typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&s.lock.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: s.lock.Generation,
	})
}

// Reconcile implements reconcile.Reconciler.
func (r *DistributedLockReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	lock := &v1alpha1.DistributedLock{}
	if err := r.Get(ctx, req.NamespacedName, lock); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	s := &lockScope{lock: lock, origStatus: *lock.Status.DeepCopy(), now: r.Clock.Now()}
	defer func() {
		if err := r.patchStatus(ctx, s); err != nil {
			retErr = kerrors.NewAggregate([]error{retErr, err})
		}
		if retErr == nil && s.requeue > 0 {
			result.RequeueAfter = s.requeue
		}
	}()

	if !lock.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.reconcileDelete(ctx, s)
	}
	if controllerutil.AddFinalizer(lock, LockFinalizer) {
		if err := r.Update(ctx, lock); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}
	lock.Status.Key = effectiveKey(lock)

	c, ok, err := r.resolveMasterSet(ctx, s)
	if err != nil || !ok {
		// Nothing can be written to Redis: stop renewing (the keys expire
		// with their TTL) and show the holder only while it is valid.
		r.held.remove(lock.UID)
		r.showHolder(s)
		return ctrl.Result{}, err
	}
	if err := r.reconcileHolder(ctx, s, c); err != nil {
		return ctrl.Result{}, err
	}
	r.showHolder(s)
	return ctrl.Result{}, nil
}

// resolveMasterSet finds the lock's master set and its client, and checks
// what only the controller can check. It sets Ready and reports whether the
// lock can be acted on.
func (r *DistributedLockReconciler) resolveMasterSet(ctx context.Context, s *lockScope) (*redlock.Client, bool, error) {
	lock := s.lock
	ms := &v1alpha1.RedisMasterSet{}
	err := r.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: lock.Spec.MasterSet}, ms)
	switch {
	case apierrors.IsNotFound(err):
		s.setCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonMasterSetNotFound,
			fmt.Sprintf("RedisMasterSet %q not found in namespace %q", lock.Spec.MasterSet, lock.Namespace))
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("get master set: %w", err)
	}
	ttl := lock.Spec.TTL.Duration
	if maxTTL := ms.Spec.MaxLockTTL.Duration; ttl > maxTTL {
		s.setCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonTTLTooLong,
			fmt.Sprintf("ttl %v exceeds maxLockTTL %v of RedisMasterSet %q", ttl, maxTTL, ms.Name))
		return nil, false, nil
	}
	if ttl%time.Millisecond != 0 || renewInterval(lock.Spec) >= ttl {
		s.setCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec,
			fmt.Sprintf("ttl %v must be whole milliseconds and longer than the renew interval %v", ttl, renewInterval(lock.Spec)))
		return nil, false, nil
	}
	c, err := r.Masters.Client(ctx, ms)
	if err != nil {
		s.setCondition(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonMasterSetNotReady,
			fmt.Sprintf("RedisMasterSet %q cannot be used: %v", ms.Name, err))
		s.requeueAfter(10 * time.Second) // a Secret is not watched: look again
		return nil, false, nil
	}
	s.setCondition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonValid, "the spec is valid and its master set usable")
	return c, true, nil
}

// reconcileHolder decides what to do with the holder and does it.
func (r *DistributedLockReconciler) reconcileHolder(ctx context.Context, s *lockScope, c *redlock.Client) error {
	lock := s.lock
	in := holderInputs{Requested: lock.Spec.HolderIdentity, Now: s.now}
	if h := r.held.get(lock.UID); h != nil {
		h.setTiming(lock.Spec.TTL.Duration, renewInterval(lock.Spec))
		snap := h.snapshot()
		in.Holder, in.ValidUntil, in.InMemory = snap.holder, snap.validUntil, true
	} else if st := lock.Status; st.Holder != nil && st.ValidUntil != nil {
		in.Holder, in.ValidUntil = st.Holder.Identity, st.ValidUntil.Time
	}
	action := decideHolder(in)
	logf.FromContext(ctx).V(1).Info("holder decision", "action", action.String(), "requested", in.Requested, "holder", in.Holder)
	switch action {
	case actAcquire:
		return r.acquire(ctx, s, c)
	case actAdopt:
		return r.adopt(ctx, s, c)
	case actRelease:
		r.release(ctx, s, c, v1alpha1.ReasonNotRequested, "no holder is requested")
	case actHandover:
		r.release(ctx, s, c, v1alpha1.ReasonReleased, "released for the new holder")
		return r.acquire(ctx, s, c)
	case actNone:
		if lock.Spec.HolderIdentity == "" {
			s.setCondition(v1alpha1.ConditionHeld, metav1.ConditionFalse, v1alpha1.ReasonNotRequested, "no holder is requested")
		}
	}
	return nil
}

// acquire takes the lock for the requested holder with the next fencing
// token, then commits the grant to status with optimistic concurrency; a
// grant that cannot be committed is released again.
func (r *DistributedLockReconciler) acquire(ctx context.Context, s *lockScope, c *redlock.Client) error {
	lock := s.lock
	token := lock.Status.FencingToken + 1
	ttl := lock.Spec.TTL.Duration
	value := r.Values.Value(string(lock.UID), token)
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	lk, err := c.Acquire(octx, effectiveKey(lock), ttl, redlock.WithValue(value))
	if err != nil {
		s.setCondition(v1alpha1.ConditionHeld, metav1.ConditionFalse, heldReason(err), truncate(err.Error()))
		setQuorum(&lock.Status, c.Quorum(), votesOf(err))
		s.requeueAfter(retryDelay(ttl, jitter))
		return nil
	}
	now := r.Clock.Now()
	holder := lock.Spec.HolderIdentity
	st := &lock.Status
	st.Holder = &v1alpha1.LockHolder{Identity: holder}
	st.FencingToken = token
	st.AcquiredAt, st.RenewedAt = &metav1.Time{Time: now}, &metav1.Time{Time: now}
	st.ValidUntil = &metav1.Time{Time: lk.ValidUntil()}
	setQuorum(st, c.Quorum(), lk.Votes())
	s.setCondition(v1alpha1.ConditionHeld, metav1.ConditionTrue, v1alpha1.ReasonAcquired, "held by "+holder)
	if err := r.commitGrant(ctx, s, token); err != nil {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		defer rcancel()
		_ = lk.Release(rctx) // the grant did not commit: give it back
		return fmt.Errorf("commit grant %d: %w", token, err)
	}
	r.hold(lock, holder, token, value, now, lk, c.Quorum())
	r.Recorder.Eventf(lock, nil, corev1.EventTypeNormal, EventGranted, "Acquire", "granted to %s with fencing token %d", holder, token)
	r.Metrics.FencingToken.WithLabelValues(lock.Namespace, lock.Name).Set(float64(token))
	return nil
}

// commitGrant writes the grant into status only if nobody wrote the lock
// since it was read, so that two grants of one token cannot both commit. A
// conflict caused by another writer of an unchanged token is retried once.
func (r *DistributedLockReconciler) commitGrant(ctx context.Context, s *lockScope, token int64) error {
	lock := s.lock
	base := lock.DeepCopy()
	base.Status = s.origStatus
	err := r.Status().Patch(ctx, lock, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsConflict(err) {
		fresh := &v1alpha1.DistributedLock{}
		if gerr := r.APIReader.Get(ctx, client.ObjectKeyFromObject(lock), fresh); gerr != nil {
			return gerr
		}
		if fresh.UID != lock.UID || fresh.Status.FencingToken != token-1 || !fresh.DeletionTimestamp.IsZero() {
			return fmt.Errorf("lock changed while granting: %w", err)
		}
		granted := lock.Status
		granted.Conditions = fresh.Status.Conditions
		meta.SetStatusCondition(&granted.Conditions, *meta.FindStatusCondition(lock.Status.Conditions, v1alpha1.ConditionHeld))
		base, lock.ObjectMeta, lock.Status = fresh.DeepCopy(), fresh.ObjectMeta, granted
		err = r.Status().Patch(ctx, lock, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	}
	if err != nil {
		return err
	}
	r.Metrics.StatusWrites.WithLabelValues("grant").Inc()
	s.origStatus = *lock.Status.DeepCopy()
	return nil
}

// hold registers a held lock and starts renewing it.
func (r *DistributedLockReconciler) hold(lock *v1alpha1.DistributedLock, holder string, token int64, value string, acquiredAt time.Time, lk *redlock.Lock, quorum int) {
	h := &heldLock{
		uid:       lock.UID,
		name:      client.ObjectKeyFromObject(lock),
		masterSet: types.NamespacedName{Namespace: lock.Namespace, Name: lock.Spec.MasterSet},
		key:       lk.Key(),
		value:     value,
		holder:    holder,
		token:     token,
	}
	h.setTiming(lock.Spec.TTL.Duration, renewInterval(lock.Spec))
	h.acquiredAt = acquiredAt
	h.renewed(r.Clock.Now(), lk.ValidUntil(), lk.Votes())
	h.quorum = quorum
	r.held.add(h, r.renewLoop)
	r.Metrics.LocksHeld.Set(float64(r.held.count()))
}

// adopt resumes a lock that the status shows held but this manager does not
// renew: its value is derived again from the fencing token, and one
// extension proves the masters still hold it.
func (r *DistributedLockReconciler) adopt(ctx context.Context, s *lockScope, c *redlock.Client) error {
	lock := s.lock
	st := lock.Status
	token := st.FencingToken
	value := r.Values.Value(string(lock.UID), token)
	lk, err := c.Restore(effectiveKey(lock), value, lock.Spec.TTL.Duration, st.ValidUntil.Time)
	if err == nil {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		err = lk.Extend(octx)
		cancel()
	}
	switch {
	case err == nil:
		acquiredAt := s.now
		if st.AcquiredAt != nil {
			acquiredAt = st.AcquiredAt.Time
		}
		r.hold(lock, st.Holder.Identity, token, value, acquiredAt, lk, c.Quorum())
		r.Recorder.Eventf(lock, nil, corev1.EventTypeNormal, EventAdopted, "Renew", "resumed renewing the grant to %s (fencing token %d)", st.Holder.Identity, token)
		return nil
	case errors.Is(err, redlock.ErrNotHeld) || errors.Is(err, redlock.ErrExpired):
		r.clearHolder(s, v1alpha1.ReasonLost, "the masters no longer hold this grant: "+truncate(err.Error()))
		r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, EventLost, "Renew", "grant %d to %s was lost", token, st.Holder.Identity)
		s.requeueAfter(time.Millisecond) // acquire again right away
		return nil
	default:
		// The grant may still stand: keep showing it while it is valid and
		// try again soon.
		setQuorum(&lock.Status, c.Quorum(), votesOf(err))
		s.requeueAfter(min(time.Second, time.Until(st.ValidUntil.Time)))
		return nil
	}
}

// release stops renewing and releases the lock in Redis. The holder is
// cleared whatever the masters answer: an unfinished release leaves copies
// that expire with the TTL, never a holder that is still shown.
func (r *DistributedLockReconciler) release(ctx context.Context, s *lockScope, c *redlock.Client, reason, msg string) {
	lock := s.lock
	err := r.releaseInRedis(ctx, lock, c)
	holder := ""
	if lock.Status.Holder != nil {
		holder = lock.Status.Holder.Identity
	}
	r.clearHolder(s, reason, msg)
	switch {
	case err == nil || errors.Is(err, redlock.ErrNotHeld):
		r.Recorder.Eventf(lock, nil, corev1.EventTypeNormal, EventReleased, "Release", "released by %s", holder)
	default:
		r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, EventReleaseIncomplete, "Release",
			"release of %s's grant did not reach a quorum; copies expire with the TTL: %s", holder, truncate(err.Error()))
	}
}

// releaseInRedis stops the renewer and releases the current grant.
func (r *DistributedLockReconciler) releaseInRedis(ctx context.Context, lock *v1alpha1.DistributedLock, c *redlock.Client) error {
	token := lock.Status.FencingToken
	if h := r.held.remove(lock.UID); h != nil {
		token = h.token
		r.Metrics.LocksHeld.Set(float64(r.held.count()))
	}
	if c == nil {
		return redlock.ErrQuorumUnavailable
	}
	lk, err := c.Restore(effectiveKey(lock), r.Values.Value(string(lock.UID), token), lock.Spec.TTL.Duration, time.Time{})
	if err != nil {
		return err
	}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return lk.Release(octx)
}

// reconcileDelete releases the lock and removes the finalizer. When the
// masters cannot be reached, the finalizer stays until the grant's validity
// (plus the drift allowance) has passed: by then every copy has expired.
func (r *DistributedLockReconciler) reconcileDelete(ctx context.Context, s *lockScope) error {
	lock := s.lock
	if !controllerutil.ContainsFinalizer(lock, LockFinalizer) {
		return nil
	}
	held := r.held.get(lock.UID) != nil || lock.Status.Holder != nil
	if held {
		var c *redlock.Client
		ms := &v1alpha1.RedisMasterSet{}
		if err := r.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: lock.Spec.MasterSet}, ms); err == nil {
			c, _ = r.Masters.Client(ctx, ms)
		}
		err := r.releaseInRedis(ctx, lock, c)
		if err != nil && !errors.Is(err, redlock.ErrNotHeld) {
			expiry := s.now
			if vu := lock.Status.ValidUntil; vu != nil {
				expiry = vu.Add(redlock.Drift(lock.Spec.TTL.Duration))
			}
			if s.now.Before(expiry) {
				s.setCondition(v1alpha1.ConditionHeld, metav1.ConditionFalse, v1alpha1.ReasonQuorumUnavailable,
					"deleting: the release did not reach a quorum; retrying until the grant expires at "+expiry.UTC().Format(time.RFC3339))
				s.requeueAfter(min(time.Second, expiry.Sub(s.now)))
				return nil
			}
		}
		r.clearHolder(s, v1alpha1.ReasonReleased, "released on deletion")
		r.Recorder.Eventf(lock, nil, corev1.EventTypeNormal, EventReleased, "Delete", "released on deletion")
	}
	r.Metrics.FencingToken.DeleteLabelValues(lock.Namespace, lock.Name)
	controllerutil.RemoveFinalizer(lock, LockFinalizer)
	if err := r.Update(ctx, lock); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}

// clearHolder removes the holder from status (the fencing token stays).
func (r *DistributedLockReconciler) clearHolder(s *lockScope, reason, msg string) {
	st := &s.lock.Status
	st.Holder, st.AcquiredAt, st.RenewedAt, st.ValidUntil = nil, nil, nil, nil
	s.setCondition(v1alpha1.ConditionHeld, metav1.ConditionFalse, reason, msg)
}

// showHolder fills status from the in-memory grant, or hides a holder whose
// validity has passed and schedules a look at the moment it will pass.
func (r *DistributedLockReconciler) showHolder(s *lockScope) {
	lock := s.lock
	if h := r.held.get(lock.UID); h != nil {
		applyHeld(&lock.Status, h.snapshot(), lock.Generation)
		return
	}
	st := &lock.Status
	if st.Holder == nil {
		return
	}
	if st.ValidUntil == nil || !s.now.Before(st.ValidUntil.Time) {
		r.clearHolder(s, v1alpha1.ReasonValidityExpired, "the grant's validity passed without renewal")
		return
	}
	s.requeueAfter(st.ValidUntil.Sub(s.now))
}

// applyHeld writes a held grant into status.
func applyHeld(st *v1alpha1.DistributedLockStatus, snap snapshot, generation int64) {
	st.Holder = &v1alpha1.LockHolder{Identity: snap.holder}
	st.FencingToken = max(st.FencingToken, snap.token)
	st.AcquiredAt = &metav1.Time{Time: snap.acquiredAt}
	st.RenewedAt = &metav1.Time{Time: snap.renewedAt}
	st.ValidUntil = &metav1.Time{Time: snap.validUntil}
	setQuorum(st, snap.quorum, snap.votes)
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAcquired,
		Message: "held by " + snap.holder, ObservedGeneration: generation,
	})
}

// setQuorum records the masters' votes.
func setQuorum(st *v1alpha1.DistributedLockStatus, quorum int, votes []redlock.Vote) {
	if len(votes) == 0 {
		return
	}
	q := &v1alpha1.QuorumStatus{Quorum: int32(quorum)} //nolint:gosec // a handful of masters
	for _, v := range votes {
		mv := v1alpha1.MasterVote{Address: v.Addr, Vote: voteName(v.Outcome)}
		if v.Err != nil {
			mv.Error = truncate(v.Err.Error())
		}
		if v.Outcome == redlock.OutcomeGranted {
			q.Granted++
		}
		q.Masters = append(q.Masters, mv)
	}
	st.Quorum = q
}

func voteName(o redlock.Outcome) string {
	switch o {
	case redlock.OutcomeGranted:
		return "Granted"
	case redlock.OutcomeHeld:
		return "Held"
	case redlock.OutcomeAbsent:
		return "Absent"
	case redlock.OutcomeError:
		return "Error"
	case redlock.OutcomeQuarantined:
		return "Quarantined"
	default:
		return "Pending"
	}
}

func votesOf(err error) []redlock.Vote {
	var e *redlock.Error
	if errors.As(err, &e) {
		return e.Votes
	}
	return nil
}

// truncate keeps messages within what a condition comfortably shows.
func truncate(s string) string {
	const limit = 1024
	if len(s) > limit {
		return s[:limit-3] + "..."
	}
	return s
}

// patchStatus writes the status changes of this reconcile in one patch.
func (r *DistributedLockReconciler) patchStatus(ctx context.Context, s *lockScope) error {
	lock := s.lock
	lock.Status.ObservedGeneration = lock.Generation
	base := lock.DeepCopy()
	base.Status = s.origStatus
	if equalStatus(base.Status, lock.Status) {
		return nil
	}
	if err := r.Status().Patch(ctx, lock, client.MergeFrom(base)); err != nil {
		return client.IgnoreNotFound(err)
	}
	r.Metrics.StatusWrites.WithLabelValues("reconcile").Inc()
	return nil
}

// SetupWithManager registers the controller and its renewers.
func (r *DistributedLockReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	r.held = newHoldings()
	r.wake = make(chan event.TypedGenericEvent[*v1alpha1.DistributedLock], 1024)
	if err := mgr.Add(r.held); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.DistributedLock{}, indexMasterSet, func(o client.Object) []string {
		return []string{o.(*v1alpha1.DistributedLock).Spec.MasterSet}
	}); err != nil {
		return err
	}
	workers := r.MaxConcurrentReconciles
	if workers <= 0 {
		workers = 4
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.DistributedLock{}, builder.WithPredicates(specOrLifecycleChanged())).
		Watches(&v1alpha1.RedisMasterSet{}, handler.EnqueueRequestsFromMapFunc(r.locksOfMasterSet),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(r.wake, &handler.TypedEnqueueRequestForObject[*v1alpha1.DistributedLock]{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Named("distributedlock").
		Complete(r)
}

// locksOfMasterSet enqueues the locks that use a master set.
func (r *DistributedLockReconciler) locksOfMasterSet(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.DistributedLockList
	if err := r.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexMasterSet: o.GetName()}); err != nil {
		logf.FromContext(ctx).Error(err, "list locks of master set", "masterSet", o.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// specOrLifecycleChanged passes creations, deletions and updates that change
// the spec, the deletion timestamp or the finalizers — not the status writes
// of renewals, which would otherwise reconcile every lock on every renewal.
func specOrLifecycleChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			return o.GetGeneration() != n.GetGeneration() ||
				o.GetDeletionTimestamp().IsZero() != n.GetDeletionTimestamp().IsZero() ||
				len(o.GetFinalizers()) != len(n.GetFinalizers())
		},
	}
}
