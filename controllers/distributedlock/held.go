package distributedlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
)

// releaseOthers releases the grants of objects named name other than uid:
// the lock was deleted (its finalizer stripped by hand) or re-created under
// the same name. Their sessions must not outlive their objects.
func (r *Reconciler) releaseOthers(ctx context.Context, name types.NamespacedName, uid types.UID) {
	for _, h := range r.grants.Others(name, uid) {
		until := r.keys.leave(name, types.NamespacedName{Namespace: name.Namespace, Name: h.MasterSet}, h, h.Ref, time.Time{})
		logf.FromContext(ctx).Info("stopped renewing the grant of a lock object that is gone", "uid", h.UID, "token", h.Token, "keysUntil", until)
	}
}

// syncSession reconciles the renewal session with status: a lost session is
// cleared from status, and a session whose grant status no longer shows
// (another grant was committed since) is given back.
func (r *Reconciler) syncSession(ctx context.Context, s *scope) error {
	lock := s.lock
	h := s.grant()
	if h == nil {
		return nil
	}
	if !h.ShowsIn(lock.Status) || lock.Status.Holder == nil {
		// The cache may not show our own commit yet: ask the API server.
		fresh, ended, err := r.settleUnseen(ctx, s, h)
		if err != nil {
			return err
		}
		if fresh == nil || fresh.UID != lock.UID {
			// Gone, or re-created: the cache is behind, and this
			// reconcile acts on nothing.
			s.stale = true
			return nil
		}
		s.continueFrom(fresh)
		if ended {
			return nil
		}
	}
	if !h.Ended() {
		return r.giveUpIfDue(ctx, s, h)
	}
	r.endSession(ctx, s, h)
	return nil
}

// unseenEnd says how h's grant, which the cached status does not show,
// ended by fresh, the lock as the API server shows it (nil: gone): with
// its object (gone, or re-created under its name), superseded by another
// grant status shows, or hidden by a write this manager did not see
// commit; false when fresh still shows a holder of it (the cache was
// behind, or someone edited its token or holder: its Session goes on,
// for the keys of a grant status shows must stay).
func unseenEnd(lock, fresh *v1alpha1.DistributedLock, h *grants.Grant) (endCause, bool) {
	switch {
	case fresh == nil || fresh.UID != lock.UID:
		return endObjectGone, true
	case grants.GrantIDOf(fresh.Status) != h.ID:
		return endSuperseded, true
	case fresh.Status.Holder == nil:
		return endHiddenElsewhere, true
	}
	return 0, false
}

// settleUnseen reads lock afresh for h's grant, which the cached status
// does not show, and settles its end when the API server does not show it
// either (unseenEnd). It returns the fresh object (nil: gone) and whether
// the grant ended.
func (r *Reconciler) settleUnseen(ctx context.Context, s *scope, h *grants.Grant) (*v1alpha1.DistributedLock, bool, error) {
	lock := s.lock
	fresh := &v1alpha1.DistributedLock{}
	switch err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(lock), fresh); {
	case apierrors.IsNotFound(err):
		fresh = nil
	case err != nil:
		return nil, false, fmt.Errorf("read lock: %w", err)
	}
	cause, ended := unseenEnd(lock, fresh, h)
	if !ended {
		return fresh, false, nil
	}
	// Hidden by a patch whose commit this manager did not see (a release
	// whose write timed out yet committed, a grant hidden when its
	// validity passed): the reconcile that wrote it can no longer say
	// what proof it had, so the keys are left until the validity this
	// manager's Session gave them has passed (decideEnd).
	var shown time.Time
	ref := h.Ref
	if cause == endHiddenElsewhere {
		shown, ref = lastShown(fresh.Status), refOf(fresh, h.ID) // the drift of the ttl now
	}
	_ = r.keys.settle(ctx, lock, h, ref, nil, shown, cause)
	if cause == endObjectGone {
		return fresh, true, nil
	}
	grant := grantName(h.Token, h.Holder)
	switch held := heldCondition(fresh.Status); {
	case cause == endSuperseded:
		r.tellEnd(ctx, lock, grant, cause, "", fmt.Sprintf("status shows another grant (fencing token %d)", fresh.Status.FencingToken), nil)
	case held == nil:
	case givenUp(held.Reason):
		if held.Reason == v1alpha1.ReasonHolderTerminating {
			r.keys.stopping(lock, h)
		}
		s.shedding = true // as the reconcile that gave it up would have gone on
	case held.Reason == v1alpha1.ReasonValidityExpired || held.Reason == v1alpha1.ReasonLost:
		r.tellEnd(ctx, lock, grant, cause, held.Reason, held.Message, nil)
	}
	return fresh, true, nil
}

// giveUpIfDue stops showing h's grant, which its Session still renews,
// when it is due: the status writer sheds it, its pod is being deleted
// (terminating.go), or its holder shows no sign of life (liveness.go).
func (r *Reconciler) giveUpIfDue(ctx context.Context, s *scope, h *grants.Grant) error {
	released, err := r.saidReleased(ctx, s, h, false)
	if err != nil {
		return err
	}
	if released {
		// A static holder's own release (its word for the grant): the
		// keys go at once, and its request ends with it.
		s.lock.Status.EndedRequest = &v1alpha1.EndedRequest{
			Identity: h.Holder, Generation: s.lock.Generation, Reason: v1alpha1.ReasonReleased, At: v1alpha1.NewPreciseTime(s.now),
		}
		r.endGrant(s, h, nil, endReleased, v1alpha1.ReasonReleased, "released by its holder")
		return nil
	}
	if why, shed := r.grants.Shedding(h); shed {
		r.shedGrant(s, h, endShed, why)
		return nil
	}
	terminating, err := r.holderTerminating(ctx, s, h)
	if err != nil {
		return err
	}
	if terminating {
		r.hideForDeletion(s, h)
		return nil
	}
	if ended, err := r.endOnItsOwn(ctx, s, h); ended || err != nil {
		return err
	}
	why, pod, err := r.checkLiveness(ctx, s, h)
	if err != nil || why == "" {
		return err
	}
	// Marked first: once status stops showing the grant, the pod must
	// keep nobody from the lock, whichever manager looks next.
	if err := r.setMark(ctx, pod, h.ID); err != nil {
		return err
	}
	r.shedGrant(s, h, endUnresponsive, why)
	return nil
}

// shedGrant gives up h's grant, which its Session still renews, for
// cause (endGrant): shed by the status writer (grants.Set.Shedding), its holder
// unresponsive (liveness.go), its pod being deleted (terminating.go),
// its lease or maxHoldDuration run out (lease.go). Its holder has lost it
// (a pod gets LockLost, and onLost applies); its keys stay until the
// validity shown has passed. A shed grant is granted again when status
// writes leave room; an unresponsive holder waits behind the others
// (podlock.Choose, markPassable).
func (r *Reconciler) shedGrant(s *scope, h *grants.Grant, cause endCause, why string) {
	if r.endGrant(s, h, nil, cause, "", why) {
		s.shedding = true
	}
}

// givenUp reports whether reason is that of a grant given up with its keys
// left until its validity passed (shedGrant).
func givenUp(reason string) bool {
	switch reason {
	case v1alpha1.ReasonShed, v1alpha1.ReasonHolderUnresponsive, v1alpha1.ReasonHolderTerminating, v1alpha1.ReasonLeaseExpired, v1alpha1.ReasonMaxHoldExceeded:
		return true
	}
	return false
}

// endSession forgets h, whose Session ended by itself (the grant was
// lost), and hides its grant: status stops showing it and, once that
// committed, its value is removed from every master.
func (r *Reconciler) endSession(ctx context.Context, s *scope, h *grants.Grant) {
	lock := s.lock
	r.grants.Drop(h)
	if st := lock.Status; st.Holder != nil && st.ValidUntil != nil && h.ShowsIn(st) && !h.OwnValidity(st.ValidUntil.Time) {
		// Status shows the grant renewed beyond anything this manager's
		// writes showed: another manager renews it now (this one was
		// deposed while paused, and its Session lapsed meanwhile). Not
		// this manager's to hide, nor to release, nor to act on further.
		logf.FromContext(ctx).Info("a lapsed session's grant is renewed by another manager", "lock", h.Name, "token", h.Token)
		s.stale = true
		return
	}
	err := h.Session.Err()
	reason := v1alpha1.ReasonLost
	var lost *renewal.LostError
	if errors.As(err, &lost) {
		reason = lost.Reason
	}
	// Masters that still hold the lost grant's value (a minority its last
	// renewals reached, each refreshed for a whole ttl) would keep the key
	// from the next grant, this holder's included: once the validity
	// shown has passed, the value is removed wherever it is left.
	r.endGrant(s, h, nil, endLost, reason, "the grant was lost: "+errString(err))
}

// countLost counts a grant of lock that ended without its holder giving
// it back, by the Held reason status shows, once status stopped showing it:
// redlock_lock_grants_lost_total, and the time of the loss, which the
// alert reads (a counter's first increment, or one after a restart, is
// invisible to increase()).
func (r *Reconciler) countLost(lock *v1alpha1.DistributedLock, reason string) {
	r.Metrics.GrantsLost.WithLabelValues(lock.Namespace, lock.Name, reason).Inc()
	r.Metrics.GrantLostAt.WithLabelValues(lock.Namespace, lock.Name, reason).Set(float64(r.Clock.Now().UnixNano()) / 1e9)
}
