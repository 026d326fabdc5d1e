package redismasterset

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/masters"
)

// Events of membership changes.
const (
	EventChangeStarted = "MembershipChangeStarted"
	EventChangeEnded   = "MembershipChanged"
)

// membershipStep is what the set's list of masters needs next.
type membershipStep int

const (
	// stepNone: the adopted list is the spec's, no change under way.
	stepNone membershipStep = iota
	// stepAdopt: a set without an adopted list (new, or run by an operator
	// version before membership changes) adopts the spec's at once: no
	// client of another list was ever built from its status.
	stepAdopt
	// stepAdoptChanged: a set run by an operator version before membership
	// changes, whose members (status.members, the list that version used)
	// are not the spec's: a change from them starts.
	stepAdoptChanged
	// stepReorder: the spec names the same masters in another order: the
	// quorums are the same, no change is needed.
	stepReorder
	// stepStart: the spec names another list; a change starts.
	stepStart
	// stepWait: a change is under way and cannot end yet.
	stepWait
	// stepEnd: the change can end; grants go on the new list alone.
	stepEnd
)

// nextMembership decides the next step of a set's list of masters from its
// status, the list its spec names, and for how long this process has used
// only the joint client of the change under way (jointOK false when it has
// not yet). wait is how long a change has left at least.
func nextMembership(st *v1alpha1.RedisMasterSetStatus, desired []string, jointFor time.Duration, jointOK bool) (step membershipStep, wait time.Duration) {
	ch := st.MembershipChange
	switch {
	case len(st.Addresses) == 0 && ch == nil && !sameSet(membersOf(st), desired):
		return stepAdoptChanged, 0
	case len(st.Addresses) == 0 && ch == nil:
		return stepAdopt, 0
	case ch == nil && slices.Equal(st.Addresses, desired):
		return stepNone, 0
	case ch == nil && sameSet(st.Addresses, desired):
		return stepReorder, 0
	case ch == nil:
		return stepStart, 0
	case jointOK && jointFor >= ch.Duration.Duration:
		return stepEnd, 0
	case jointOK:
		return stepWait, ch.Duration.Duration - jointFor
	default:
		return stepWait, ch.Duration.Duration
	}
}

// reconcileMembership adopts the spec's list of masters (status.addresses)
// through a membership change with joint quorums, one change at a time, and
// writes the MembershipChanging condition. It returns whether status
// changed the list grants are made on (the caller then builds no client
// from this view before status is written), and how soon to look again.
func (r *Reconciler) reconcileMembership(ms *v1alpha1.RedisMasterSet, desired []string, now time.Time) (changed bool, next time.Duration) {
	st := &ms.Status
	var jointFor time.Duration
	var jointOK bool
	if st.MembershipChange != nil {
		jointFor, jointOK = r.Masters.JointFor(client.ObjectKeyFromObject(ms), ms.UID, st.MembershipEpoch)
	}
	step, wait := nextMembership(st, desired, jointFor, jointOK)
	switch step {
	case stepAdopt, stepReorder:
		st.Addresses = slices.Clone(desired)
	case stepAdoptChanged, stepStart:
		previous := st.Addresses
		if step == stepAdoptChanged {
			previous = membersOf(st)
		}
		st.MembershipChange = &v1alpha1.MembershipChange{
			Previous: previous, Since: metav1.Time{Time: now}, Duration: metav1.Duration{Duration: masters.ChangeDuration(ms)},
		}
		st.Addresses = slices.Clone(desired)
		st.MembershipEpoch++
		r.Recorder.Eventf(ms, nil, corev1.EventTypeNormal, EventChangeStarted, "Change",
			"masters change from %s to %s: every grant needs a quorum of both lists for at least %v", list(st.MembershipChange.Previous), list(st.Addresses), st.MembershipChange.Duration.Duration)
	case stepEnd:
		r.Recorder.Eventf(ms, nil, corev1.EventTypeNormal, EventChangeEnded, "Change",
			"masters changed from %s to %s: grants need a quorum of the new list alone", list(st.MembershipChange.Previous), list(st.Addresses))
		st.MembershipChange = nil
		st.MembershipEpoch++
	}
	setMembershipCondition(ms, desired)
	switch step {
	case stepAdopt, stepReorder, stepAdoptChanged, stepStart, stepEnd:
		// No client is built from a list status does not show yet.
		return true, time.Millisecond
	case stepWait:
		return false, wait + 100*time.Millisecond
	}
	return false, 0
}

// setMembershipCondition writes MembershipChanging from status and the
// spec's list.
func setMembershipCondition(ms *v1alpha1.RedisMasterSet, desired []string) {
	st := &ms.Status
	switch ch := st.MembershipChange; {
	case ch != nil && !slices.Equal(st.Addresses, desired):
		setSetCondition(ms, v1alpha1.ConditionMembershipChanging, metav1.ConditionTrue, v1alpha1.ReasonChangeQueued,
			fmt.Sprintf("changing from %s to %s; the spec's %s follows once this change ends", list(ch.Previous), list(st.Addresses), list(desired)))
	case ch != nil:
		setSetCondition(ms, v1alpha1.ConditionMembershipChanging, metav1.ConditionTrue, v1alpha1.ReasonJointQuorums,
			fmt.Sprintf("changing from %s to %s: every grant needs a quorum of both lists, and masters only in the new list do not vote, until at least %s",
				list(ch.Previous), list(st.Addresses), ch.Since.Add(ch.Duration.Duration).UTC().Format(time.RFC3339)))
	case meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionMembershipChanging) != nil || st.MembershipEpoch > 0:
		setSetCondition(ms, v1alpha1.ConditionMembershipChanging, metav1.ConditionFalse, v1alpha1.ReasonMembershipStable,
			"locks are granted on "+list(st.Addresses))
	}
}

func list(addrs []string) string { return "[" + strings.Join(addrs, " ") + "]" }

// membersOf returns the addresses of the members status records (the list
// an operator version before membership changes used), or nil.
func membersOf(st *v1alpha1.RedisMasterSetStatus) []string {
	var out []string
	for _, m := range st.Members {
		if m.NeverServed && m.RunID == "" {
			continue // recorded before its first pod (recordNewMembers): no grant was ever made on it
		}
		out = append(out, m.Address)
	}
	return out
}

// sameSet reports whether a and b name the same masters, in any order; an
// empty a matches anything (nothing recorded).
func sameSet(a, b []string) bool {
	if len(a) == 0 {
		return true
	}
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}
