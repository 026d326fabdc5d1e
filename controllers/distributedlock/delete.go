package distributedlock

import (
	"cmp"
	"context"
	"errors"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// reconcileDelete releases the lock and removes the finalizer, in two
// steps: status stops showing the grant (and, once that committed, the
// grant is released in Redis); then, with no grant shown, the finalizer is
// removed. When the masters cannot be reached, the finalizer stays until
// every copy of the grant has expired: what the session wrote (its latest
// renewal sent, answered or not: renewal.State.ExpiresBy, which for an
// adopted grant covers the previous renewer's copies too) when this
// manager renewed it, otherwise what othersCopiesUntil bounds from
// status's validity, and never before a release recorded in status could
// have run; plus the drift allowance.
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) error {
	lock := s.lock
	r.grants.StopWaiting(client.ObjectKeyFromObject(lock))
	if !controllerutil.ContainsFinalizer(lock, Finalizer) {
		return nil
	}
	if h := s.grant(); h != nil && (lock.Status.Holder == nil || !h.ShowsIn(lock.Status)) {
		// The cache may show the deletion but not this manager's own last
		// commit (a grant made just before it): what status shows decides
		// between giving the Session back now and hiding its grant first.
		// A grant hidden or replaced by a write whose commit this manager
		// did not see is settled as syncSession settles it, before the
		// keys left are waited for.
		fresh, _, err := r.settleUnseen(ctx, s, h)
		switch {
		case err != nil:
			return err
		case fresh == nil || fresh.UID != lock.UID:
			return nil // gone, or re-created: nothing shows the grant any more
		}
		// Nothing of the cached view is kept: the deletion computes no
		// Ready or key of its own.
		*s.lock = *fresh.DeepCopy()
		s.orig = *fresh.Status.DeepCopy()
		lock = s.lock
	}
	c := r.clientFor(ctx, lock)
	if lock.Status.Holder != nil {
		if vu := lock.Status.ValidUntil; vu != nil && s.grant() == nil {
			r.keys.expires(lock.UID, client.ObjectKeyFromObject(lock), othersCopiesUntil(vu.Time, lock.Spec.TTL.Duration))
		}
		cause, err := r.deletionEnd(ctx, s)
		if err != nil {
			return err
		}
		r.endGrant(s, s.grant(), c, cause, v1alpha1.ReasonReleased, endMessage(cause, "released on deletion"))
		s.requeueAfter(time.Millisecond) // then remove the finalizer
		return nil
	}
	return r.removeFinalizer(ctx, s, c)
}

// removeFinalizer lets a lock being deleted, which shows no grant, go:
// once the last grant's end lets its keys go (decideEnd), whatever is
// left is given back, and the finalizer removed once that completed or
// every copy has expired.
func (r *Reconciler) removeFinalizer(ctx context.Context, s *scope, c *redlock.Client) error {
	lock := s.lock
	if at, left := r.keys.left(s.lock, s.grant()); left && s.now.Before(at) {
		s.setHeld(metav1.ConditionFalse, cmp.Or(heldConditionReason(lock.Status), v1alpha1.ReasonReleased),
			"deleting: the last grant's keys are kept until the validity it showed has passed ("+at.UTC().Format(time.RFC3339Nano)+"); the object goes then")
		s.requeueAfter(at.Sub(s.now))
		return nil
	}
	err := r.keys.giveBack(ctx, s.grant(), refOf(lock, grants.GrantIDOf(lock.Status)), c)
	rec, _ := r.keys.record(lock.UID)
	expiry, known := rec.expiry, !rec.expiry.IsZero()
	if ra := lock.Status.ReleasedAt; ra != nil {
		// Another manager (or this one before a restart) stopped showing
		// the grant at releasedAt and renewed it at most until its release
		// ran, within one operation after that.
		if by := ra.Add(opTimeout + lock.Spec.TTL.Duration); !known || by.After(expiry) {
			expiry, known = by, true
		}
	}
	if err != nil && !errors.Is(err, redlock.ErrNotHeld) && known {
		if until := expiry.Add(redlock.Drift(lock.Spec.TTL.Duration)); s.now.Before(until) {
			s.setHeld(metav1.ConditionFalse, v1alpha1.ReasonQuorumUnavailable,
				"deleting: the release did not reach a quorum; retrying until the grant expires at "+until.UTC().Format(time.RFC3339Nano))
			s.requeueAfter(min(time.Second, until.Sub(s.now)))
			return nil
		}
	}
	r.keys.forget(lock.UID)
	r.Metrics.ForgetLock(lock.Namespace, lock.Name)
	controllerutil.RemoveFinalizer(lock, Finalizer)
	if err := r.Update(ctx, lock); err != nil {
		return client.IgnoreNotFound(err)
	}
	r.grants.Forget(client.ObjectKeyFromObject(lock), "")
	return nil
}
