package distributedlock

import (
	"errors"
	"fmt"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/conditions"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// grantView is a grant as status shows it.
type grantView struct {
	holder     string
	pod        *v1alpha1.PodReference
	grantID    string
	token      int64
	acquiredAt time.Time
	renewedAt  time.Time
	validUntil time.Time
	quorum     int
	votes      []redlock.Vote
}

// viewOf is what status shows of a grant this manager renews.
func viewOf(h *grants.Grant, st renewal.State) grantView {
	return grantView{
		holder: h.Holder, pod: h.Pod, grantID: h.ID, token: h.Token, acquiredAt: h.AcquiredAt,
		renewedAt: st.RenewedAt, validUntil: st.ValidUntil, quorum: h.Quorum, votes: st.Votes,
	}
}

// showGrant writes a held grant into status.
func showGrant(st *v1alpha1.DistributedLockStatus, g grantView, generation int64) {
	if st.GrantID != g.grantID {
		st.ReleasedAt, st.LastValidUntil = nil, nil
	}
	st.Holder = &v1alpha1.LockHolder{Identity: g.holder, Pod: g.pod}
	if g.pod != nil {
		st.LastHolderPod = g.pod
	}
	st.GrantID = g.grantID
	st.FencingToken = g.token
	st.AcquiredAt = v1alpha1.NewPreciseTime(g.acquiredAt)
	st.RenewedAt = v1alpha1.NewPreciseTime(g.renewedAt)
	st.ValidUntil = v1alpha1.NewPreciseTime(g.validUntil)
	setQuorum(st, g.quorum, g.votes)
	setCondition(st, generation, v1alpha1.ConditionHeld, metav1.ConditionTrue, v1alpha1.ReasonAcquired, "held by "+g.holder)
}

// clearGrant removes the holder from status at now; the token and grant ID
// of the latest grant stay. A grant whose validity passed ended at its
// validity, not earlier: a reconcile that started a moment before the end
// (now) and found the session lapsed on its way records the end shown.
func clearGrant(st *v1alpha1.DistributedLockStatus, generation int64, now time.Time, reason, msg string) {
	if st.Holder != nil {
		st.LastValidUntil = st.ValidUntil.DeepCopy()
		st.ReleasedAt = v1alpha1.NewPreciseTime(now)
		if reason == v1alpha1.ReasonValidityExpired && st.ValidUntil != nil && now.Before(st.ValidUntil.Time) {
			st.ReleasedAt = st.ValidUntil.DeepCopy()
		}
	}
	st.Holder, st.AcquiredAt, st.RenewedAt, st.ValidUntil = nil, nil, nil, nil
	meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionHolderReachable)
	setCondition(st, generation, v1alpha1.ConditionHeld, metav1.ConditionFalse, reason, msg)
}

func setCondition(st *v1alpha1.DistributedLockStatus, generation int64, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: conditions.Message(msg), ObservedGeneration: generation,
	})
}

// setQuorum records the masters' votes.
func setQuorum(st *v1alpha1.DistributedLockStatus, quorum int, votes []redlock.Vote) {
	if q := grants.QuorumOf(quorum, votes); q != nil {
		st.Quorum = q
	}
}

func votesOf(err error) []redlock.Vote {
	var e *redlock.Error
	if errors.As(err, &e) {
		return e.Votes
	}
	return nil
}

// writeKind names a status write for the status-writes metric: a new
// grant, a renewal, a loss or release, or anything else.
func writeKind(before, after v1alpha1.DistributedLockStatus) string {
	switch {
	case after.GrantID != before.GrantID && after.Holder != nil:
		return "grant"
	case after.Holder == nil && before.Holder != nil:
		return "loss"
	case after.Holder != nil && !reflect.DeepEqual(after.ValidUntil, before.ValidUntil):
		return "renewal"
	default:
		return "reconcile"
	}
}

// sameGrant reports whether two statuses show the same grant: the
// precondition of every status write.
func sameGrant(a, b v1alpha1.DistributedLockStatus) bool {
	return a.GrantID == b.GrantID && a.FencingToken == b.FencingToken && (a.Holder == nil) == (b.Holder == nil)
}

// hidesGrant reports whether a status write from before to after stops
// showing the grant before shows held (a release, a handover or a loss).
func hidesGrant(before, after v1alpha1.DistributedLockStatus) bool {
	return before.Holder != nil && (after.Holder == nil || after.GrantID != before.GrantID || after.FencingToken != before.FencingToken)
}

// sameValidity reports whether two statuses show the same validity.
func sameValidity(a, b v1alpha1.DistributedLockStatus) bool {
	if a.ValidUntil == nil || b.ValidUntil == nil {
		return a.ValidUntil == nil && b.ValidUntil == nil
	}
	return a.ValidUntil.Equal(b.ValidUntil.Time)
}

// keepLaterValidity makes st, about to be written over fresh, keep fresh's
// validity (and the renewal and votes it came from) when both show the
// same grant held and fresh shows it valid for longer: a write sent again
// after a conflict never moves the validity back (another writer, such as
// the status writer or a deposed leader woken from a pause, showed a later
// renewal meanwhile).
func keepLaterValidity(st *v1alpha1.DistributedLockStatus, fresh v1alpha1.DistributedLockStatus) {
	if st.Holder == nil && fresh.Holder != nil && fresh.ValidUntil != nil && grants.GrantIDOf(*st) == grants.GrantIDOf(fresh) &&
		(st.LastValidUntil == nil || fresh.ValidUntil.After(st.LastValidUntil.Time)) {
		// A hide sent again: the validity shown last is the fresh one.
		st.LastValidUntil = fresh.ValidUntil.DeepCopy()
		return
	}
	if st.Holder == nil || !sameGrant(*st, fresh) || st.Holder.Identity != fresh.Holder.Identity || fresh.ValidUntil == nil {
		return
	}
	if st.ValidUntil == nil || fresh.ValidUntil.After(st.ValidUntil.Time) {
		st.ValidUntil, st.RenewedAt = fresh.ValidUntil.DeepCopy(), fresh.RenewedAt.DeepCopy()
		if fresh.Quorum != nil {
			st.Quorum = fresh.Quorum.DeepCopy()
		}
	}
}

// equalStatus reports whether two statuses are the same.
func equalStatus(a, b v1alpha1.DistributedLockStatus) bool {
	return reflect.DeepEqual(a, b)
}

// nodeReady is the status of node's Ready condition ("Unknown" when it
// reports none).
func nodeReady(node *corev1.Node) corev1.ConditionStatus {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}

// holderReachability is the HolderReachable condition of a lock held by pod
// on node (nil: the node object is gone). A node that does not report
// (Ready Unknown) or is gone leaves the pod's containers in an unknown
// state: the lock stays with the pod until its object is gone.
func holderReachability(pod *corev1.Pod, node *corev1.Node) (metav1.ConditionStatus, string, string) {
	const keeps = ": the lock stays with the pod until its object is gone; force-deleting the pod hands the lock over at once, and only fencing tokens then protect against the old holder if it still runs"
	switch {
	case node == nil:
		return metav1.ConditionFalse, v1alpha1.ReasonHolderUnreachable,
			fmt.Sprintf("holder pod %s is bound to node %s, which no longer exists%s", pod.Name, pod.Spec.NodeName, keeps)
	case nodeReady(node) == corev1.ConditionUnknown:
		return metav1.ConditionFalse, v1alpha1.ReasonHolderUnreachable,
			fmt.Sprintf("holder pod %s runs on node %s, which does not report to the API server (Ready=Unknown)%s", pod.Name, node.Name, keeps)
	default:
		return metav1.ConditionTrue, v1alpha1.ReasonHolderReachable,
			fmt.Sprintf("holder pod %s runs on node %s, which reports to the API server", pod.Name, node.Name)
	}
}
