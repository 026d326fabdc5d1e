package controllers

import (
	"context"
	"errors"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// renewLoop renews a held lock on its own schedule until the lock is
// released (ctx ends) or lost. Each renewal is written into status; a loss
// is written the moment it is known, and at the latest when the validity
// passes, so that status never shows a holder past its validity.
func (r *DistributedLockReconciler) renewLoop(ctx context.Context, h *heldLock) {
	log := logf.FromContext(ctx).WithValues("lock", h.name.String(), "token", h.token)
	failures := 0
	shown := h.snapshot().validUntil // the validity status shows (written by the grant)
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		snap := h.snapshot()
		ttl, every := h.timing()
		now := time.Now()
		next := nextRenewal(snap.renewedAt, every, failures, snap.validUntil, now)
		wake := next
		if snap.validUntil.Before(wake) {
			wake = snap.validUntil
		}
		wait := wake.Sub(now)
		timer.Reset(max(wait, 0))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		now = time.Now()
		if !now.Before(snap.validUntil) {
			r.lose(ctx, h, v1alpha1.ReasonValidityExpired, "the validity passed without a successful renewal")
			return
		}
		if late := now.Sub(next); late > 0 {
			r.Metrics.RenewLateness.Observe(late.Seconds())
		}
		err := r.renewOnce(ctx, h, ttl, snap.validUntil)
		switch {
		case err == nil:
			failures = 0
			if needStatusWrite(shown, time.Now(), every) {
				if r.writeRenewal(ctx, h) {
					shown = h.snapshot().validUntil
				}
			}
		case ctx.Err() != nil:
			return
		case errors.Is(err, redlock.ErrNotHeld) || errors.Is(err, redlock.ErrExpired):
			r.Metrics.RenewFailures.WithLabelValues(heldReason(err)).Inc()
			r.lose(ctx, h, v1alpha1.ReasonLost, "the masters no longer hold this grant: "+truncate(err.Error()))
			return
		default:
			failures++
			r.Metrics.RenewFailures.WithLabelValues(heldReason(err)).Inc()
			log.Info("renewal failed", "failures", failures, "validUntil", snap.validUntil, "error", err.Error())
			if failures == 1 {
				r.event(ctx, h, corev1.EventTypeWarning, EventRenewFailed, "renewal failed, retrying until the validity passes: %s", truncate(err.Error()))
			}
		}
	}
}

// renewOnce extends the grant on the master set's current client.
func (r *DistributedLockReconciler) renewOnce(ctx context.Context, h *heldLock, ttl time.Duration, validUntil time.Time) error {
	c := r.Masters.Lookup(h.masterSet)
	if c == nil {
		return redlock.ErrQuorumUnavailable
	}
	lk, err := c.Restore(h.key, h.value, ttl, validUntil)
	if err != nil {
		return err
	}
	octx, cancel := context.WithTimeout(ctx, time.Until(validUntil))
	defer cancel()
	if err := lk.Extend(octx); err != nil {
		return err
	}
	h.renewed(time.Now(), lk.ValidUntil(), lk.Votes())
	return nil
}

// needStatusWrite reports whether a renewal must be written to status: when
// the validity status shows could pass before the next renewal and its write
// (one renew interval plus a margin). Otherwise writing every other renewal
// halves the API writes, and status still never shows a holder past its
// validity: the validity it shows only trails the real one.
func needStatusWrite(shown, now time.Time, every time.Duration) bool {
	return shown.Sub(now) < every+max(time.Second, every/2)
}

// writeRenewal writes the renewed grant into status and reports success.
func (r *DistributedLockReconciler) writeRenewal(ctx context.Context, h *heldLock) bool {
	lock, ok := r.current(ctx, h)
	if !ok {
		return false
	}
	base := lock.DeepCopy()
	applyHeld(&lock.Status, h.snapshot(), lock.Generation)
	if err := r.Status().Patch(ctx, lock, client.MergeFrom(base)); err != nil {
		logf.FromContext(ctx).Info("status write of a renewal failed", "lock", h.name.String(), "error", err.Error())
		return false
	}
	r.Metrics.StatusWrites.WithLabelValues("renewal").Inc()
	return true
}

// lose records a lost grant in status, stops tracking it and asks the
// reconciler to look at the lock again.
func (r *DistributedLockReconciler) lose(ctx context.Context, h *heldLock, reason, msg string) {
	if lock, ok := r.current(ctx, h); ok {
		base := lock.DeepCopy()
		s := &lockScope{lock: lock, now: r.Clock.Now()}
		r.clearHolder(s, reason, msg)
		if err := r.Status().Patch(ctx, lock, client.MergeFrom(base)); err != nil {
			logf.FromContext(ctx).Info("status write of a lost grant failed", "lock", h.name.String(), "error", err.Error())
		} else {
			r.Metrics.StatusWrites.WithLabelValues("loss").Inc()
		}
		r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, EventLost, "Renew", "grant %d to %s lost: %s", h.token, h.holder, msg)
		select {
		case r.wake <- event.TypedGenericEvent[*v1alpha1.DistributedLock]{Object: lock}:
		default: // the queue is full of wake-ups already
		}
	}
	r.held.forget(h)
	r.Metrics.LocksHeld.Set(float64(r.held.count()))
}

// current reads the lock of h from the cache; false when it is gone or was
// replaced by another object of the same name.
func (r *DistributedLockReconciler) current(ctx context.Context, h *heldLock) (*v1alpha1.DistributedLock, bool) {
	lock := &v1alpha1.DistributedLock{}
	if err := r.Get(ctx, h.name, lock); err != nil || lock.UID != h.uid {
		return nil, false
	}
	return lock, true
}

func (r *DistributedLockReconciler) event(ctx context.Context, h *heldLock, typ, reason, note string, args ...any) {
	if lock, ok := r.current(ctx, h); ok {
		r.Recorder.Eventf(lock, nil, typ, reason, "Renew", note, args...)
	}
}

// equalStatus reports whether two statuses are the same.
func equalStatus(a, b v1alpha1.DistributedLockStatus) bool {
	return reflect.DeepEqual(a, b)
}
