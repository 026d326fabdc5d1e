package redismasterset

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/conditions"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// memberChange is a member's change of state worth an event.
type memberChange struct {
	eventType, reason, note string
}

// membersFromProbe computes the members' status from probe results and
// their previous status: state, run_id, restarts and when each was last
// seen serving. It returns the changes worth an event and how soon to probe
// again (when a quarantine ends before the next regular probe; an hour
// otherwise).
func membersFromProbe(prevMembers []v1alpha1.MemberStatus, results []redlock.ProbeResult, now time.Time) ([]v1alpha1.MemberStatus, []memberChange, time.Duration) {
	prev := map[string]v1alpha1.MemberStatus{}
	for _, m := range prevMembers {
		prev[m.Address] = m
	}
	next := time.Hour
	members := make([]v1alpha1.MemberStatus, 0, len(results))
	var changes []memberChange
	for _, res := range results {
		old, seen := prev[res.Addr]
		m := memberState(res, now)
		m.Restarts, m.LastServingAt, m.NeverServed = old.Restarts, old.LastServingAt, old.NeverServed
		if m.State == v1alpha1.MemberServing {
			m.LastServingAt, m.NeverServed = &metav1.Time{Time: now}, false
		}
		if seen && old.RunID != "" && m.RunID != "" && m.RunID != old.RunID {
			m.Restarts++
		}
		if m.RunID == "" {
			m.RunID = old.RunID
		}
		if c, ok := changeOf(old, seen, m); ok {
			changes = append(changes, c)
		}
		if m.State == v1alpha1.MemberQuarantined {
			if d := m.QuarantinedUntil.Sub(now); d > 0 && d+100*time.Millisecond < next {
				next = d + 100*time.Millisecond
			}
		}
		members = append(members, m)
	}
	return members, changes, next
}

// changeOf returns the event of a member's change from old to m, if any.
func changeOf(old v1alpha1.MemberStatus, seen bool, m v1alpha1.MemberStatus) (memberChange, bool) {
	switch {
	case m.State == v1alpha1.MemberServing && seen && old.State != v1alpha1.MemberServing:
		return memberChange{corev1.EventTypeNormal, EventRejoined, fmt.Sprintf("member %s serves and votes again", m.Address)}, true
	case m.State == v1alpha1.MemberQuarantined && (!seen || old.State != v1alpha1.MemberQuarantined || old.RunID != m.RunID):
		return memberChange{corev1.EventTypeWarning, EventQuarantined, fmt.Sprintf("member %s restarted recently (run_id %s): it does not vote until %s",
			m.Address, m.RunID, m.QuarantinedUntil.UTC().Format(time.RFC3339))}, true
	case m.State == v1alpha1.MemberDown && seen && old.State != v1alpha1.MemberDown:
		return memberChange{corev1.EventTypeWarning, EventDown, fmt.Sprintf("member %s does not answer: %s", m.Address, m.Message)}, true
	}
	return memberChange{}, false
}

// setMembers writes the members, the counts and the Available and Degraded
// conditions into status, and returns how many members serve.
//
// During a membership change the members are those of both lists (the new
// list's first); the counts are the new list's, and Available needs a
// quorum of each list serving.
func setMembers(ms *v1alpha1.RedisMasterSet, members []v1alpha1.MemberStatus) int32 {
	count := func(addrs []string) (serving, total int32) {
		for _, m := range members {
			if addrs == nil || slices.Contains(addrs, m.Address) {
				total++
				if m.State == v1alpha1.MemberServing {
					serving++
				}
			}
		}
		return serving, total
	}
	serving, total := count(ms.Status.Addresses)
	quorum := total/2 + 1
	ms.Status.Members, ms.Status.Serving, ms.Status.Total, ms.Status.Quorum = members, serving, total, quorum
	previousServes := true
	if ch := ms.Status.MembershipChange; ch != nil {
		s, t := count(ch.Previous)
		previousServes = s >= t/2+1
	}
	switch {
	case serving >= quorum && !previousServes:
		setSetCondition(ms, v1alpha1.ConditionAvailable, metav1.ConditionFalse, v1alpha1.ReasonQuorumLost,
			fmt.Sprintf("%d of %d masters serve, but not a quorum of the previous list %s, which every grant needs until the membership change ends", serving, total, list(ms.Status.MembershipChange.Previous)))
	case serving >= quorum:
		setSetCondition(ms, v1alpha1.ConditionAvailable, metav1.ConditionTrue, v1alpha1.ReasonQuorumServing,
			fmt.Sprintf("%d of %d masters serve; a lock needs %d", serving, total, quorum))
	default:
		setSetCondition(ms, v1alpha1.ConditionAvailable, metav1.ConditionFalse, v1alpha1.ReasonQuorumLost,
			fmt.Sprintf("only %d of %d masters serve; a lock needs %d", serving, total, quorum))
	}
	if allServing, all := count(nil); allServing == all {
		setSetCondition(ms, v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.ReasonAllServing, "every master serves")
	} else {
		setSetCondition(ms, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonMembersDown,
			fmt.Sprintf("%d of %d masters down or quarantined", all-allServing, all))
	}
	return serving
}

// memberState maps one probe result to a member's status.
func memberState(res redlock.ProbeResult, now time.Time) v1alpha1.MemberStatus {
	m := v1alpha1.MemberStatus{Address: res.Addr, RunID: res.RunID, Reachable: res.Err == nil}
	switch {
	case res.Err != nil:
		m.State, m.Message = v1alpha1.MemberDown, conditions.Message(res.Err.Error())
	case now.Before(res.QuarantinedUntil):
		m.State = v1alpha1.MemberQuarantined
		m.QuarantinedUntil = &metav1.Time{Time: res.QuarantinedUntil}
	default:
		m.State = v1alpha1.MemberServing
	}
	return m
}

func setSetCondition(ms *v1alpha1.RedisMasterSet, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&ms.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: ms.Generation,
	})
}

// setWindow records in status the longest quarantine window standing for
// the set's masters — its own, the longer one status kept while it stands,
// and any longer one another set registered on them (each master's window
// as its client learned it) — and the OwnQuarantineWindow condition. It
// reports whether another set's longer window governs. A set without a
// quarantine (managed AOFAlways) has neither.
func setWindow(ms *v1alpha1.RedisMasterSet, own time.Duration, masters []redlock.MasterStatus, now time.Time) bool {
	if own <= 0 {
		ms.Status.QuarantineWindow, ms.Status.QuarantineWindowUntil = nil, nil
		meta.RemoveStatusCondition(&ms.Status.Conditions, v1alpha1.ConditionOwnWindow)
		return false
	}
	known, until := own, time.Time{}
	if w, u := ms.Status.QuarantineWindow, ms.Status.QuarantineWindowUntil; w != nil && u != nil && w.Duration > own && now.Before(u.Time) {
		known, until = w.Duration, u.Time
	}
	var refused []string
	for _, m := range masters {
		if m.WindowErr != nil {
			refused = append(refused, m.Addr+": "+m.WindowErr.Error())
		}
		if m.Window > known || (m.Window == known && known > own && m.WindowUntil.After(until)) {
			known, until = m.Window, m.WindowUntil
		}
	}
	ms.Status.QuarantineWindow, ms.Status.QuarantineWindowUntil = &metav1.Duration{Duration: known}, nil
	if known > own {
		ms.Status.QuarantineWindowUntil = &metav1.Time{Time: until}
	}
	switch {
	case len(refused) > 0:
		setSetCondition(ms, v1alpha1.ConditionOwnWindow, metav1.ConditionUnknown, v1alpha1.ReasonWindowNotRegistered,
			fmt.Sprintf("masters refused the window registration, so restarted masters are quarantined by %v whatever window a set sharing them uses: %s", known, strings.Join(refused, "; ")))
		return false
	case known > own:
		setSetCondition(ms, v1alpha1.ConditionOwnWindow, metav1.ConditionFalse, v1alpha1.ReasonWindowShared,
			fmt.Sprintf("a set sharing these masters registered a quarantine window of %v, longer than this set's %v: restarted masters are quarantined by %v (give the sets sharing servers the same maxLockTTL, or each its own servers)", known, own, known))
		return true
	default:
		setSetCondition(ms, v1alpha1.ConditionOwnWindow, metav1.ConditionTrue, v1alpha1.ReasonWindowOwn,
			fmt.Sprintf("no set sharing these masters registered a quarantine window longer than this set's %v", own))
		return false
	}
}
