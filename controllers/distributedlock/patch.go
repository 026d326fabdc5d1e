package distributedlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/writegate"
)

// patchStatus writes the status changes of this reconcile in one patch,
// conditional on the status the reconcile started from. A conflict is
// retried once when a fresh read shows the same grant; otherwise the
// reconcile gives up. A grant made by this reconcile counts only once the
// patch succeeded, and is given back otherwise.
func (r *Reconciler) patchStatus(ctx context.Context, s *scope) error {
	lock := s.lock
	lock.Status.ObservedGeneration = lock.Generation
	var err error
	if !equalStatus(s.orig, lock.Status) {
		err = r.patch(ctx, s)
	}
	if err != nil {
		if h := s.pending; h != nil {
			switch r.writeOutcome(ctx, lock, h, err) {
			case writeRefused:
				r.endPending(ctx, s, h, endNotCommitted, err)
			case writeUnknown:
				r.endPending(ctx, s, h, endCommitUnknown, err)
			case writeCommitted:
				r.Metrics.Grants.WithLabelValues(lock.Namespace, lock.Name).Inc()
			}
		}
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patch status: %w", err)
	}
	for _, f := range s.afterCommit {
		f(context.WithoutCancel(ctx))
	}
	if h := s.pending; h != nil {
		r.Recorder.Eventf(lock, nil, corev1.EventTypeNormal, EventGranted, "Acquire", "granted to %s with fencing token %d", h.Holder, h.Token)
		r.Metrics.Grants.WithLabelValues(lock.Namespace, lock.Name).Inc()
		r.Metrics.FencingToken.WithLabelValues(lock.Namespace, lock.Name).Set(float64(h.Token))
	}
	if h := s.pending; h != nil && s.ownValidity != nil {
		h.Committed(*s.ownValidity)
	}
	if h := s.grant(); h != nil && lock.Status.GrantID == h.ID && lock.Status.Holder != nil && lock.Status.ValidUntil != nil {
		r.grants.Show(h, lock.Status.ValidUntil.Time, lock.Spec.TTL.Duration)
	}
	return nil
}

// writeResult is what a failed status write did with the grant it showed.
type writeResult int

// writeOutcome tells what a status write that returned err did with the
// grant h (see commitOutcome), reading the lock afresh when the error
// does not say.
func (r *Reconciler) writeOutcome(ctx context.Context, lock *v1alpha1.DistributedLock, h *grants.Grant, err error) writeResult {
	return commitOutcome(err, func() (bool, error) {
		fresh := &v1alpha1.DistributedLock{}
		if gerr := r.APIReader.Get(context.WithoutCancel(ctx), client.ObjectKeyFromObject(lock), fresh); gerr != nil {
			return false, gerr
		}
		return fresh.UID == h.UID && fresh.Status.GrantID == h.ID && fresh.Status.Holder != nil, nil
	})
}

// commitOutcome decides what a failed status write did with its new grant
// (its ID was never shown before). A refusal (conflict, invalid, gone,
// forbidden, bad request) committed nothing — unless it is a conflict and a
// fresh read shows the grant: the refusal then answered a resend of a
// request that had committed (client-go resends after a 5xx with
// Retry-After).
// A write that never left the manager (writegate.ErrNotSent) committed
// nothing. Any other error (a timeout, a reset connection, a request cancelled
// while the manager stops) leaves the write in flight at the API server,
// where it may still be applied after any read made now: a fresh read that
// shows the grant says it committed; one that does not, or that fails,
// says nothing for certain.
func commitOutcome(err error, showsGrant func() (bool, error)) writeResult {
	if errors.Is(err, writegate.ErrNotSent) {
		return writeRefused // it never left the manager
	}
	if apierrors.IsConflict(err) || apierrors.IsInvalid(err) || apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) {
		if apierrors.IsConflict(err) {
			if shows, rerr := showsGrant(); rerr == nil && shows {
				return writeCommitted
			}
		}
		return writeRefused
	}
	if shows, rerr := showsGrant(); rerr == nil && shows {
		return writeCommitted
	}
	return writeUnknown
}

// endPending ends a grant this reconcile made whose status write did not
// commit (endNotCommitted: released, its value being unique to it) or
// may still (endCommitUnknown: its Session stops and its keys are left to
// expire; they outlive any validity a late commit shows, and the next
// reconcile adopts the grant if status shows it, where a release could
// leave status showing a grant whose keys are gone).
func (r *Reconciler) endPending(ctx context.Context, s *scope, h *grants.Grant, cause endCause, err error) {
	ctx = context.WithoutCancel(ctx)
	_ = r.keys.settle(ctx, s.lock, h, h.Ref, nil, time.Time{}, cause)
	what := "given back: status could not be written"
	if cause == endCommitUnknown {
		what = "left to expire: whether its status write committed is not known"
	}
	r.tellEnd(ctx, s.lock, grantName(h.Token, h.Holder), cause, "", what+": "+err.Error(), nil)
}

// patch sends the status patch with optimistic concurrency; see
// patchStatus. A conflict is retried while a fresh read shows the same
// grant as the status this reconcile started from: the same changes are
// sent again on the fresh version, so that a validity the status writer
// refreshed meanwhile is kept.
func (r *Reconciler) patch(ctx context.Context, s *scope) error {
	lock := s.lock
	kind := writeKind(s.orig, lock.Status)
	switch {
	case s.shedding:
		// A grant given up does not wait behind the manager's other
		// writes (internal/writegate): the status writer paces its sheds
		// in the refreshes' turn; the others given up are one per holder
		// that stopped.
		ctx = writegate.WithExempt(ctx)
	case s.pending != nil:
		// A new grant, admitted by the status writer, goes before the
		// other writes waiting there: a grant that waited would show a
		// validity the wait used up. It still counts among the writes at
		// the API server, which the writer's refreshes are not queued
		// behind more than the gate allows.
		ctx = writegate.WithFirst(ctx)
	}
	var err error
	for attempt := 0; ; attempt++ {
		base := lock.DeepCopy()
		base.Status = s.orig
		err = r.Status().Patch(ctx, lock, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		if !apierrors.IsConflict(err) || attempt == patchAttempts-1 {
			break
		}
		fresh := &v1alpha1.DistributedLock{}
		if gerr := r.APIReader.Get(ctx, client.ObjectKeyFromObject(lock), fresh); gerr != nil {
			return gerr
		}
		asks, rerr := r.podStillAsks(ctx, s)
		if rerr != nil {
			return errors.Join(err, rerr)
		}
		if why := noRetry(s, lock, fresh, asks); why != "" {
			return fmt.Errorf("%s: %w", why, err)
		}
		keepLaterValidity(&lock.Status, fresh.Status)
		lock.ResourceVersion = fresh.ResourceVersion
	}
	if err != nil {
		return err
	}
	r.grants.Wrote(client.ObjectKeyFromObject(lock), lock.UID)
	r.Metrics.StatusWrites.WithLabelValues(kind).Inc()
	return nil
}

// podStillAsks reports, for a new grant to a pod, whether a fresh read
// shows the pod still asking for the lock (labelled for it, or carrying
// its key's token): a semaphore may have moved it since the grant was
// decided. True when there is no such grant.
func (r *Reconciler) podStillAsks(ctx context.Context, s *scope) (bool, error) {
	h := s.pending
	if h == nil || h.Pod == nil || r.Pods == nil {
		return true, nil
	}
	pod, err := r.api().podByRef(ctx, s.lock.Namespace, h.Pod)
	if err != nil {
		return false, fmt.Errorf("read the pod of the new grant: %w", err)
	}
	return pod != nil && asksFor(pod, s.lock), nil
}

// noRetry says why this reconcile's status patch, refused for a conflict,
// must not be retried on fresh, the lock as it is now ("": it may be);
// asks is podStillAsks.
func noRetry(s *scope, lock, fresh *v1alpha1.DistributedLock, asks bool) string {
	switch {
	case fresh.UID != lock.UID || !sameGrant(fresh.Status, s.orig):
		return "status changed under this reconcile (another writer)"
	case s.pending != nil && (fresh.Generation != lock.Generation || fresh.MovingPod() != lock.MovingPod() || !asks):
		// The new grant was decided on a spec, a semaphore's fence
		// (MovingPodAnnotation) or a pod's request that changed since
		// (a fence set and cleared again leaves its pod moved): it must
		// not commit over them.
		return "the lock or its pod changed under this reconcile's grant"
	case hidesGrant(s.orig, lock.Status) && !sameValidity(fresh.Status, s.orig) && !ownValidity(s, fresh.Status):
		// This reconcile stops showing a grant that another writer has
		// shown renewed since it read status (the status writer, or the
		// leader that took over from this manager): its decision rests on
		// a stale view. The next reconcile decides again.
		return "the grant was renewed under this reconcile, which would hide it"
	}
	return ""
}

// ownValidity reports whether the validity st shows is one this manager's
// own writes showed for the grant it renews (the status writer's refresh),
// rather than another manager's.
func ownValidity(s *scope, st v1alpha1.DistributedLockStatus) bool {
	h := s.grant()
	return h != nil && st.ValidUntil != nil && h.ShowsIn(st) && h.OwnValidity(st.ValidUntil.Time)
}

// patchAttempts bounds the status patches of one reconcile that conflict
// with validity refreshes.
const patchAttempts = 4

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
