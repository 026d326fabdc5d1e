package distributedlock

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/lockvalue"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// acquire takes the lock for the requested holder under a fresh grant ID
// and a fencing token from the masters, and starts renewing it. The grant
// counts once the status patch commits it.
func (r *Reconciler) acquire(ctx context.Context, s *scope, c *redlock.Client) {
	lock := s.lock
	name, ttl := client.ObjectKeyFromObject(lock), lock.Spec.TTL.Duration
	if !r.grants.Admit(name, ttl) {
		// The held locks' refreshes are behind, or would be with this
		// grant: they go first, a new grant waits until the writer has
		// room and asks for a reconcile (internal/grants; at the latest after
		// grantRecheck). redlock_status_write_backlog, _demand_per_second
		// and _capacity_per_second show why. One message for both
		// causes: a message alternating between them would cost a status
		// write each time.
		reason, msg := waitingForRoom(heldCondition(lock.Status))
		s.setHeld(metav1.ConditionFalse, reason, msg)
		recheck := cmp.Or(r.GrantRecheck, grants.GrantRecheck)
		s.requeueAfter(recheck + jitter(recheck))
		return
	}
	if !r.requestedPodMayHold(ctx, s) || r.previousHolderMarked(ctx, s) {
		r.grants.StopWaiting(name) // no grant: its room goes back
		return
	}
	if lock.Status.Holder != nil && s.grant() == nil && !s.now.Before(releasableAt(lock)) {
		// Status still shows a grant whose validity passed (decideHolder)
		// and that no Session here renews: it is replaced or hidden by
		// this reconcile's patch, and what it left released after that.
		r.endGrant(s, nil, c, endLapsed, "", lapsedMessage)
	}
	retry := cmp.Or(r.RetryDelay, retryDelay(ttl, jitter))
	set := masterSetOf(lock)
	s.attempted = true
	waiter := lineWaiter(lock, s.requested)
	if ok, recheck := r.lines.mayAttempt(ctx, name, lock, waiter, c, retry); !ok {
		// Waiters ahead in the key's line (lines.go), in this cluster or
		// another: this lock attempts in its turn, woken by the key's
		// release as a lock that lost the key is, and looks again when
		// the bound may have come.
		r.grants.StopWaiting(name)
		s.setHeld(metav1.ConditionFalse, v1alpha1.ReasonHeldElsewhere, waitMessage(lock))
		s.requeueAfter(min(retry, cmp.Or(recheck, retry)))
		r.wakeups.wait(name, set, lineKey(lock), retry, c)
		return
	}
	grantID := lockvalue.NewGrantID()
	value := r.Values.Value(string(lock.UID), grantID)
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	lk, err := acquire(octx, c, lock, ttl, redlock.WithValue(value), redlock.WithFencing())
	if err != nil {
		// No grant: the room admit kept for it goes back (a lock whose
		// key another lock holds, or whose masters lack a quorum, would
		// otherwise keep it for as long as that lasts).
		r.grants.StopWaiting(name)
		if at, left := r.keys.left(s.lock, s.grant()); left && errors.Is(err, redlock.ErrLockHeld) && s.now.Before(at) {
			// Most likely the keys of the last grant, which its end left
			// until the validity it showed has passed: the reason stays.
			s.setHeld(metav1.ConditionFalse, heldConditionReason(lock.Status),
				"the last grant's keys are kept until the validity it showed has passed ("+at.UTC().Format(time.RFC3339Nano)+"); the next is granted then: "+err.Error())
		} else {
			s.setHeld(metav1.ConditionFalse, heldReason(err), heldMessage(lock, err))
		}
		setQuorum(&lock.Status, c.Quorum(), votesOf(err))
		s.requeueAfter(retry)
		switch {
		case errors.Is(err, redlock.ErrLockHeld):
			// Tried again at once when the masters tell of the key's
			// release (another cluster's holder ended); the retry stays.
			// Its arrival in the key's line is now.
			r.wakeups.wait(name, set, lineKey(lock), retry, c)
			r.lines.join(ctx, name, lock, waiter, c, retry)
		case errors.Is(err, redlock.ErrKindConflict):
			// The other kind holds the key: a lock and a semaphore of one
			// key share its line, and this one's turn would only hold up
			// the other kind's waiters.
			r.lines.withdraw(name)
		}
		if s.givingBack && errors.Is(err, redlock.ErrLockHeld) {
			// Perhaps the copies of the grant this reconcile stops
			// showing: try again once they are released.
			s.requeueAfter(time.Millisecond)
		}
		return
	}
	h := &grants.Grant{
		UID: lock.UID, Name: name, Ref: refOf(lock, grantID), MasterSet: lock.Spec.MasterSet,
		Leased: s.requested.Pod == nil && lock.Spec.HolderLease != nil,
		ID:     grantID, Holder: s.requested.Identity, Pod: s.requested.Pod, Token: lk.Token(),
		AcquiredAt: r.Clock.Now(), Quorum: c.Quorum(),
	}
	r.startSession(s, h, lk, c)
}

// waitingForRoom is the Held reason and message (status False) of a lock
// whose grant waits for room in the status writes, held showing before. A
// grant shed by the status writer keeps showing Shed with the writer's
// message (why, and that it is granted again once there is room): a
// message of the waiting reconcile's would cost a second status write for
// each grant shed, while status writes are short. Any other Shed message
// (the last grant's keys kept until a time) gives way to the waiting one.
func waitingForRoom(held *metav1.Condition) (reason, msg string) {
	const waiting = "waiting: the status refreshes of the locks held go first; a grant is made when they leave room (redlock_status_write_backlog, redlock_status_write_capacity_per_second)"
	switch {
	case held == nil || held.Reason != v1alpha1.ReasonShed:
		return v1alpha1.ReasonStatusWritesBehind, waiting
	case strings.HasPrefix(held.Message, grants.ShedWhy):
		return held.Reason, held.Message
	}
	return v1alpha1.ReasonShed, waiting
}

// adopt resumes a grant that status shows valid but this manager does not
// renew (it restarted, or leadership moved): its value is derived again
// from the grant ID, and one extension proves the masters still hold it.
func (r *Reconciler) adopt(ctx context.Context, s *scope, c *redlock.Client) {
	lock := s.lock
	st := lock.Status
	if sp := lock.Spec; sp.HolderLease != nil || sp.MaxHoldDuration != nil || sp.HeartbeatTimeout != nil {
		// The adopted grant's lease, bound or heartbeat is counted from
		// the next look (giveUpIfDue), which nothing else may bring
		// soon (a static holder has no pods whose events would).
		s.requeueAfter(time.Millisecond)
	}
	grantID := grants.GrantIDOf(st)
	var lk *redlock.Lock
	err := errors.New("status names no grant")
	if grantID != "" {
		// The adopting extension covers at least the validity status
		// shows (its ttl may have shrunk since the grant): the keys never
		// expire, nor is the validity shown moved back, before that.
		ttl := renewal.CoveringTTL(lock.Spec.TTL.Duration, st.ValidUntil.Time, time.Now())
		lk, err = c.Restore(lock.RedisKey(), r.Values.Value(string(lock.UID), grantID), ttl, st.ValidUntil.Time, restoreOptions(slotOf(lock), st.FencingToken)...)
	}
	if err == nil {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		err = lk.Extend(octx)
		cancel()
	}
	if err != nil && !errors.Is(err, redlock.ErrNotHeld) && !errors.Is(err, redlock.ErrExpired) && grantID != "" {
		// The grant may still stand: keep showing it while it is valid and
		// try again soon.
		setQuorum(&lock.Status, c.Quorum(), votesOf(err))
		s.requeueAfter(min(time.Second, st.ValidUntil.Sub(s.now)))
		return
	}
	if err != nil {
		// The adopting extension may have refreshed copies (a minority's,
		// or a quorum's too late): removed once status stopped showing
		// the grant and its validity passed.
		// A validity that passed between this reconcile's start and the
		// adopting extension (ErrExpired) ended at the validity shown,
		// which clearGrant records, not at this reconcile's start.
		reason := v1alpha1.ReasonLost
		if errors.Is(err, redlock.ErrExpired) {
			reason = v1alpha1.ReasonValidityExpired
		}
		r.endGrant(s, nil, c, endAdoptionFailed, reason, "the grant could not be adopted: "+err.Error())
		r.acquire(ctx, s, c)
		return
	}
	acquiredAt := s.now
	if st.AcquiredAt != nil {
		acquiredAt = st.AcquiredAt.Time
	}
	h := &grants.Grant{
		UID: lock.UID, Name: client.ObjectKeyFromObject(lock), Ref: refOf(lock, grantID), MasterSet: lock.Spec.MasterSet,
		Leased: st.Holder.Pod == nil && lock.Spec.HolderLease != nil,
		ID:     grantID, Holder: st.Holder.Identity, Pod: st.Holder.Pod, Token: st.FencingToken,
		AcquiredAt: acquiredAt, Quorum: c.Quorum(),
		OthersCopiesUntil: othersCopiesUntil(st.ValidUntil.Time, lock.Spec.TTL.Duration),
	}
	// Adopted without a status write of this reconcile's: the writer
	// refreshes the grant at once, adopted grants nearest shown validity
	// first, within its budget (writeAdopted), so that a new leader's
	// adoption of thousands of locks does not wait on a write each (make
	// bench-failover). The validity shown becomes this manager's to renew.
	r.startSession(s, h, lk, c)
	s.pending = nil
	h.Committed(st.ValidUntil.Time)
	r.grants.ShowAdopted(h, st.ValidUntil.Time, lock.Spec.TTL.Duration)
	r.Recorder.Eventf(lock, nil, corev1.EventTypeNormal, EventAdopted, "Renew", "resumed renewing the grant to %s (fencing token %d)", h.Holder, h.Token)
	r.Metrics.FencingToken.WithLabelValues(lock.Namespace, lock.Name).Set(float64(h.Token))
}

// startSession starts renewing a grant made or adopted by this reconcile.
func (r *Reconciler) startSession(s *scope, h *grants.Grant, lk *redlock.Lock, c *redlock.Client) {
	lock := s.lock
	ms := masterSetOf(lock)
	s.held = h
	r.wakeups.forget(h.Name)
	r.lines.granted(h.Name)
	r.grants.Hold(h, renewal.Grant{
		Lock: lk, Client: c,
		Key: lk.Key(), Value: lk.Value(), Token: lk.Token(), Slot: slotOf(lock), TTL: lock.Spec.TTL.Duration, Every: renewInterval(lock.Spec),
		ValidUntil: lk.ValidUntil(), Votes: lk.Votes(), OthersCopiesUntil: h.OthersCopiesUntil,
	}, renewal.Config{
		Client:  func() *redlock.Client { return r.Masters.Lookup(ms) },
		Metrics: r.Metrics,
		Reasons: heldReason,
	})
	s.pending = h
}
