package distributedlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/conditions"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// How a grant ends (docs/design/grant-life.md). Every way has a row in
// endRules; endGrant carries it out.

// endCause is a way a grant ends.
type endCause int

const (
	// endReleased: the holder's own release. A static holder with a lease
	// releases by its word for the grant (LockHeartbeat releasedGrant); one
	// without a lease by clearing or changing spec.holderIdentity.
	endReleased endCause = iota
	// endAgentWord: the in-pod agent of a pod being deleted said the app
	// of the grant, already hidden, stopped.
	endAgentWord
	// endPodEnded: the holder pod ended, or is gone.
	endPodEnded
	// endRequestChanged: someone else cleared or changed a leased static
	// holder's request.
	endRequestChanged
	// endSpecInvalid: the spec no longer allows the grant (maxLockTTL
	// shrank under its ttl).
	endSpecInvalid
	// endDeleted: the lock is being deleted.
	endDeleted
	// endSlotRemoved: a semaphore's slot lock is being deleted (the
	// semaphore resized, drained or was deleted).
	endSlotRemoved
	// endShed: the status writer cannot keep the grant's validity fresh.
	endShed
	// endLeaseExpired: a static holder did not renew its lease.
	endLeaseExpired
	// endUnresponsive: the holder pod showed no sign of life.
	endUnresponsive
	// endMaxHold: the grant was held for spec.maxHoldDuration.
	endMaxHold
	// endTerminating: the holder pod is being deleted and its agent's
	// word would count; the keys go sooner on that word or the pod's end.
	endTerminating
	// endLost: the renewals lost the quorum.
	endLost
	// endLapsed: the validity shown passed without a renewal here.
	endLapsed
	// endAdoptionFailed: a new leader could not adopt the grant.
	endAdoptionFailed
	// endHiddenElsewhere: a write this manager did not see commit stopped
	// showing the grant.
	endHiddenElsewhere
	// endSuperseded: status shows another grant, which holds the key on a
	// quorum.
	endSuperseded
	// endNotCommitted: the status write that would have shown the grant
	// was refused: nobody ever saw it.
	endNotCommitted
	// endCommitUnknown: whether the status write that shows the grant
	// committed is not known.
	endCommitUnknown
	// endObjectGone: the lock object is gone (its finalizer removed by
	// hand) or was re-created.
	endObjectGone

	numEndCauses // not a cause: the number of causes
)

func (c endCause) String() string {
	if c < 0 || c >= numEndCauses || endRules[c].name == "" {
		return "unknown"
	}
	return endRules[c].name
}

// hideWhen is when status stops showing an ended grant.
type hideWhen int

const (
	// hideNow: the patch of the reconcile that decided the end.
	hideNow hideWhen = iota
	// hideAtValidity: once the validity shown passed (and the drift
	// allowance, for a validity another manager's clock may have set).
	hideAtValidity
	// notShown: status does not show it (hidden before, or never shown).
	notShown
)

// keysWhen is when an ended grant's keys may be removed from the masters.
type keysWhen int

const (
	// keysAfterShown: once the validity status showed, and the drift
	// allowance, passed: a reader may act on the grant until then.
	keysAfterShown keysWhen = iota
	// keysNow: once status no longer shows the grant. Only on proof that
	// the holder stopped, or when no reader can act on the grant.
	keysNow
	// keysExpire: never removed here; they expire with the TTL. For a
	// grant status may still come to show (a write whose fate is not
	// known), which the next reconcile then adopts.
	keysExpire
)

// endRule is how a grant ends for a cause. The zero rule is the safe
// one: hidden now, the keys kept until the validity shown has passed.
type endRule struct {
	name string
	hide hideWhen
	keys keysWhen
	// held is the Held reason status shows ("": the caller's).
	held string
	// event is the reason of the event that tells of the end once its
	// keys' fate is known ("": none). A Released event of keys released
	// now reports an incomplete release instead when it failed.
	event, action string
	// atDecision sends the event when the end is decided rather than
	// once status stopped showing it: a loss in Redis is told while
	// status cannot be written too.
	atDecision bool
	// lost counts the grant lost by its Held reason (countLost); shed
	// counts it shed too.
	lost, shed bool
}

// endRules has a row per cause. The keys go before the validity shown
// only on proof that the holder stopped (its release, the agent's word,
// its pod's end), or when no reader acts on the grant: another grant
// holds the key on a quorum (superseded), or it was never shown. A grant
// given up or lost leaves them until the holder can no longer act on it.
var endRules = [numEndCauses]endRule{
	endReleased:        {name: "released", keys: keysNow, event: EventReleased, action: "Release"},
	endAgentWord:       {name: "agent word", hide: notShown, keys: keysNow, event: EventReleased, action: "Release"},
	endPodEnded:        {name: "pod ended", keys: keysNow, event: EventReleased, action: "Release"},
	endRequestChanged:  {name: "request changed", held: v1alpha1.ReasonRequestChanged, event: EventReleased, action: "Release"},
	endSpecInvalid:     {name: "spec invalid", event: EventReleased, action: "Release"},
	endDeleted:         {name: "deleted", held: v1alpha1.ReasonDeleting, event: EventReleased, action: "Release"},
	endSlotRemoved:     {name: "slot removed", held: v1alpha1.ReasonDeleting, event: EventReleased, action: "Release"},
	endShed:            {name: "shed", held: v1alpha1.ReasonShed, event: EventShed, action: "Release", lost: true, shed: true},
	endLeaseExpired:    {name: "lease expired", held: v1alpha1.ReasonLeaseExpired, event: EventLeaseExpired, action: "Release", lost: true},
	endUnresponsive:    {name: "unresponsive", held: v1alpha1.ReasonHolderUnresponsive, event: EventHolderUnresponsive, action: "Release", lost: true},
	endMaxHold:         {name: "max hold", held: v1alpha1.ReasonMaxHoldExceeded, event: EventMaxHoldExceeded, action: "Release", lost: true},
	endTerminating:     {name: "terminating", held: v1alpha1.ReasonHolderTerminating},
	endLost:            {name: "lost", event: EventLost, action: "Renew", atDecision: true, lost: true},
	endLapsed:          {name: "lapsed", hide: hideAtValidity, held: v1alpha1.ReasonValidityExpired, event: EventLost, action: "Renew", lost: true},
	endAdoptionFailed:  {name: "adoption failed", event: EventLost, action: "Renew", atDecision: true, lost: true},
	endHiddenElsewhere: {name: "hidden elsewhere", hide: notShown, event: EventLost, action: "Renew", lost: true},
	endSuperseded:      {name: "superseded", hide: notShown, keys: keysNow, held: v1alpha1.ReasonSuperseded, event: EventSuperseded, action: "Renew", lost: true},
	endNotCommitted:    {name: "not committed", hide: notShown, keys: keysNow, event: EventNotCommitted, action: "Acquire"},
	endCommitUnknown:   {name: "commit unknown", hide: notShown, keys: keysExpire, event: EventNotCommitted, action: "Acquire"},
	endObjectGone:      {name: "object gone", hide: notShown},
}

// decideEnd is the rule of cause; an unknown cause gets the safe one.
func decideEnd(c endCause) endRule {
	if c < 0 || c >= numEndCauses {
		return endRule{}
	}
	return endRules[c]
}

// tellEnd tells of the end of grant (grantName) for cause, with the Held
// reason and message status shows of it, once its keys' fate is settled
// (err: their release's error): it counts it, and sends its event unless
// that went when the end was decided (atDecision).
func (r *Reconciler) tellEnd(ctx context.Context, lock *v1alpha1.DistributedLock, grant string, cause endCause, reason, msg string, err error) {
	t := decideEnd(cause)
	reason = cmp.Or(t.held, reason)
	if t.lost {
		logf.FromContext(ctx).Info("a grant ended without its holder's release", "lock", client.ObjectKeyFromObject(lock), "grant", grant, "cause", cause.String(), "reason", reason)
		r.countLost(lock, reason)
	}
	if t.shed {
		r.Metrics.LocksShed.Inc()
		r.grants.ShedShown()
	}
	if !t.atDecision {
		r.endEvent(lock, grant, cause, msg, err)
	}
}

// endEvent records the event of the end of grant for cause (endRules).
func (r *Reconciler) endEvent(lock *v1alpha1.DistributedLock, grant string, cause endCause, msg string, err error) {
	t := decideEnd(cause)
	switch {
	case t.event == "":
	case t.event == EventReleased && t.keys == keysNow && err != nil && !errors.Is(err, redlock.ErrNotHeld):
		r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, EventReleaseIncomplete, t.action,
			"release of %s did not reach a quorum; copies expire with the TTL: %s", grant, conditions.Message(err.Error()))
	case t.event == EventReleased:
		r.Recorder.Eventf(lock, nil, corev1.EventTypeNormal, t.event, t.action, "%s: %s", grant, conditions.Message(msg))
	default:
		r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, t.event, t.action, "%s: %s", grant, conditions.Message(msg))
	}
}

// lapsedMessage is the Held message of a grant whose validity passed.
const lapsedMessage = "the grant's validity passed without renewal"

// grantName names a grant in events: "grant N to H", or "grant N" when
// its holder is not known.
func grantName(token int64, holder string) string {
	if holder == "" {
		return fmt.Sprintf("grant %d", token)
	}
	return fmt.Sprintf("grant %d to %s", token, holder)
}

// endGrant ends the grant status shows for cause: status stops showing it
// with its Held reason (endRules, or reason) and msg when decideEnd says
// so now, and once that committed its keys go as decideEnd says (settle),
// and the end is told (tellEnd). h is this manager's Session of the grant
// (nil: none); c the master set's client (nil: its last good one). A
// reconcile ends one grant once: the first end decided stands (a holder's
// word, then a spec turned invalid, would have released the keys and then
// left them, with two events), and a later one reports false.
func (r *Reconciler) endGrant(s *scope, h *grants.Grant, c *redlock.Client, cause endCause, reason, msg string) bool {
	if s.endDecided {
		return false
	}
	s.endDecided = true
	lock := s.lock
	rule := decideEnd(cause)
	reason = cmp.Or(rule.held, reason)
	grantID := grants.GrantIDOf(lock.Status)
	name := grantName(s.orig.FencingToken, "")
	if s.orig.Holder != nil {
		name = grantName(s.orig.FencingToken, s.orig.Holder.Identity)
	}
	if h != nil {
		grantID, name = h.ID, grantName(h.Token, h.Holder)
	}
	g := refOf(lock, grantID)
	var shown time.Time
	if vu := s.orig.ValidUntil; vu != nil {
		shown = vu.Time
	}
	if rule.hide == hideNow {
		s.clear(reason, msg)
	}
	s.ended = grantID
	s.givingBack = s.givingBack || rule.keys == keysNow
	if rule.atDecision {
		r.endEvent(lock, name, cause, msg, nil)
	}
	s.afterCommit = append(s.afterCommit, func(ctx context.Context) {
		if lv := lock.Status.LastValidUntil; lv != nil && grants.GrantIDOf(lock.Status) == g.GrantID && lv.After(shown) {
			shown = lv.Time // as committed, a conflict's fresh validity included
		}
		err := r.keys.settle(ctx, lock, h, g, c, shown, cause)
		logf.FromContext(ctx).V(1).Info("ended a grant", "lock", client.ObjectKeyFromObject(lock), "grantID", g.GrantID, "cause", cause.String(), "error", errString(err))
		r.tellEnd(ctx, lock, name, cause, reason, msg, err)
	})
	return true
}

// requestEnd says how the current grant ends now that its holder is no
// longer the one requested. A holder pod is no longer requested only once
// it ended or is gone (podlock.Choose keeps it while it may run); a static
// holder without a lease releases by changing its request; one with a
// lease by its word, and a change of its request by anyone else keeps the
// keys until the validity shown has passed.
// endRequest calls it only for a grant status shows or this manager renews.
func (r *Reconciler) requestEnd(ctx context.Context, s *scope) (endCause, error) {
	lock := s.lock
	holder := lock.Status.Holder
	h := s.grant()
	if h != nil {
		holder = &v1alpha1.LockHolder{Identity: h.Holder, Pod: h.Pod}
	}
	switch {
	case holder.Pod != nil:
		if r.Pods == nil {
			return endRequestChanged, nil
		}
		i := slices.IndexFunc(s.pods, func(p *corev1.Pod) bool { return podlock.Is(p, holder.Pod) })
		if i < 0 || podlock.Ended(s.pods[i]) {
			return endPodEnded, nil // podsOf read it afresh when the cache did not list it
		}
		return endRequestChanged, nil
	case !leasedGrant(lock, h):
		return endReleased, nil
	}
	said, err := r.saidReleased(ctx, s, h, true)
	switch {
	case err != nil:
		return 0, err
	case said:
		return endReleased, nil
	default:
		return endRequestChanged, nil
	}
}

// deletionEnd says how the current grant ends with its lock's deletion:
// released at once only when its holder pod ended or is gone (a fresh
// read).
func (r *Reconciler) deletionEnd(ctx context.Context, s *scope) (endCause, error) {
	lock := s.lock
	cause := endDeleted
	if lock.Spec.SlotOf != nil {
		cause = endSlotRemoved
	}
	holder := lock.Status.Holder
	if holder == nil || holder.Pod == nil || r.Pods == nil {
		return cause, nil
	}
	pod, err := r.api().podByRef(ctx, lock.Namespace, holder.Pod)
	switch {
	case err != nil:
		return 0, err
	case pod == nil || podlock.Ended(pod):
		return endPodEnded, nil
	}
	return cause, nil
}

// saidReleased reports whether the static holder of the leased grant
// status shows (h: its Session here, or nil) gave it back by its word: the
// LockHeartbeat the operator keeps for the lock names the grant in
// releasedGrant. fresh reads it from the API server rather than the cache
// (its request may have been withdrawn after the word, and the two
// caches keep no order between them).
func (r *Reconciler) saidReleased(ctx context.Context, s *scope, h *grants.Grant, fresh bool) (bool, error) {
	lock := s.lock
	grantID := grants.GrantIDOf(lock.Status)
	if h != nil {
		grantID = h.ID
	}
	if !leasedGrant(lock, h) || grantID == "" {
		return false, nil
	}
	var hb *v1alpha1.LockHeartbeat
	var err error
	if fresh {
		hb = &v1alpha1.LockHeartbeat{}
		if err = r.APIReader.Get(ctx, client.ObjectKeyFromObject(lock), hb); apierrors.IsNotFound(err) {
			hb, err = nil, nil
		}
	} else {
		hb, err = r.heartbeat(ctx, s)
	}
	switch {
	case err != nil:
		return false, fmt.Errorf("read the holder's word: %w", err)
	case hb == nil:
		return false, nil
	}
	return metav1.IsControlledBy(hb, lock) && hb.Spec.ReleasedGrant == grantID, nil
}

// leasedGrant reports whether the grant status shows (h: its Session
// here, or nil) is a static holder's under a lease: made or adopted here
// while the lock set spec.holderLease, or, without a Session here, while
// it sets one now. Only such a grant ends by its holder's word; any other
// static grant ends when its request changes.
func leasedGrant(lock *v1alpha1.DistributedLock, h *grants.Grant) bool {
	if h != nil {
		return h.Leased || h.Pod == nil && lock.Spec.HolderLease != nil
	}
	st := lock.Status
	return st.Holder != nil && st.Holder.Pod == nil && lock.Spec.HolderLease != nil
}

// endMessage is the Held message of a grant that ends for cause.
func endMessage(cause endCause, msg string) string {
	switch decideEnd(cause).keys {
	case keysNow:
		return msg
	default:
		switch cause {
		case endRequestChanged:
			msg = "the request was changed without the holder's release"
		case endDeleted, endSlotRemoved:
			msg = "the lock is being deleted"
		}
		return msg + ": the grant ended; its keys are kept until the validity status showed has passed"
	}
}

// lastShown is the validity status last showed of its hidden grant (zero
// when it does not say).
func lastShown(st v1alpha1.DistributedLockStatus) time.Time {
	if st.LastValidUntil != nil {
		return st.LastValidUntil.Time
	}
	return time.Time{}
}
