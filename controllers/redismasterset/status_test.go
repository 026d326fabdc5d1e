package redismasterset

import (
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

func TestMembersFromProbe(t *testing.T) {
	now := time.Unix(1000, 0)
	earlier := &metav1.Time{Time: now.Add(-time.Minute)}
	serving := func(addr, runID string) v1alpha1.MemberStatus {
		return v1alpha1.MemberStatus{Address: addr, RunID: runID, State: v1alpha1.MemberServing, Reachable: true, LastServingAt: earlier}
	}
	for _, tc := range []struct {
		name        string
		prev        []v1alpha1.MemberStatus
		res         redlock.ProbeResult
		wantState   string
		wantRestart int32
		wantServing time.Time // zero: unchanged
		wantEvent   string
		wantNext    time.Duration
	}{
		{"a member that keeps serving is seen serving now, without an event",
			[]v1alpha1.MemberStatus{serving("m", "r1")}, redlock.ProbeResult{Addr: "m", RunID: "r1"},
			v1alpha1.MemberServing, 0, now, "", time.Hour},
		{"a member that stops answering is Down with an event, and keeps when it last served",
			[]v1alpha1.MemberStatus{serving("m", "r1")}, redlock.ProbeResult{Addr: "m", Err: errors.New("refused")},
			v1alpha1.MemberDown, 0, earlier.Time, EventDown, time.Hour},
		{"a member back with a new run_id counts a restart and sits out its quarantine",
			[]v1alpha1.MemberStatus{serving("m", "r1")}, redlock.ProbeResult{Addr: "m", RunID: "r2", QuarantinedUntil: now.Add(3 * time.Second)},
			v1alpha1.MemberQuarantined, 1, earlier.Time, EventQuarantined, 3*time.Second + 100*time.Millisecond},
		{"a member whose quarantine passed rejoins with an event",
			[]v1alpha1.MemberStatus{{Address: "m", RunID: "r2", State: v1alpha1.MemberQuarantined}}, redlock.ProbeResult{Addr: "m", RunID: "r2", QuarantinedUntil: now.Add(-time.Second)},
			v1alpha1.MemberServing, 0, now, EventRejoined, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			members, changes, next := membersFromProbe(tc.prev, []redlock.ProbeResult{tc.res}, now)
			m := members[0]
			if m.State != tc.wantState || m.Restarts != tc.wantRestart {
				t.Errorf("state %s, restarts %d; want %s, %d", m.State, m.Restarts, tc.wantState, tc.wantRestart)
			}
			if m.LastServingAt == nil || !m.LastServingAt.Time.Equal(tc.wantServing) {
				t.Errorf("lastServingAt %v, want %v", m.LastServingAt, tc.wantServing)
			}
			gotEvent := ""
			if len(changes) == 1 {
				gotEvent = changes[0].reason
			}
			if gotEvent != tc.wantEvent || len(changes) > 1 {
				t.Errorf("events %+v, want %q", changes, tc.wantEvent)
			}
			if next != tc.wantNext {
				t.Errorf("next probe in %v, want %v", next, tc.wantNext)
			}
		})
	}
}

func TestSetMembersConditions(t *testing.T) {
	for _, tc := range []struct {
		name                string
		states              []string
		available, degraded metav1.ConditionStatus
	}{
		{"all serving: available, not degraded", []string{v1alpha1.MemberServing, v1alpha1.MemberServing, v1alpha1.MemberServing}, metav1.ConditionTrue, metav1.ConditionFalse},
		{"a quorum serving: available and degraded", []string{v1alpha1.MemberServing, v1alpha1.MemberServing, v1alpha1.MemberDown}, metav1.ConditionTrue, metav1.ConditionTrue},
		{"less than a quorum: unavailable", []string{v1alpha1.MemberServing, v1alpha1.MemberQuarantined, v1alpha1.MemberDown}, metav1.ConditionFalse, metav1.ConditionTrue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := &v1alpha1.RedisMasterSet{}
			var members []v1alpha1.MemberStatus
			for _, s := range tc.states {
				members = append(members, v1alpha1.MemberStatus{State: s})
			}
			setMembers(ms, members)
			for typ, want := range map[string]metav1.ConditionStatus{v1alpha1.ConditionAvailable: tc.available, v1alpha1.ConditionDegraded: tc.degraded} {
				var got metav1.ConditionStatus
				for _, c := range ms.Status.Conditions {
					if c.Type == typ {
						got = c.Status
					}
				}
				if got != want {
					t.Errorf("%s = %s, want %s", typ, got, want)
				}
			}
		})
	}
}
