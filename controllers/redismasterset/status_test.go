package redismasterset

import (
	"errors"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
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

func TestSetWindow(t *testing.T) {
	now := time.Unix(10_000, 0)
	own, long := 5*time.Second, time.Minute
	at := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: now.Add(d)} }
	for _, tc := range []struct {
		name       string
		own        time.Duration
		status     *metav1.Duration
		until      *metav1.Time
		masters    []redlock.MasterStatus
		wantWindow time.Duration // 0: none recorded
		wantUntil  *metav1.Time
		wantCond   metav1.ConditionStatus // "": no condition
		shared     bool
	}{
		{"own window only", own, nil, nil, []redlock.MasterStatus{{Window: own}}, own, nil, metav1.ConditionTrue, false},
		{"a longer window registered on a master", own, nil, nil, []redlock.MasterStatus{{Window: own}, {Window: long, WindowUntil: now.Add(2 * long)}}, long, at(2 * long), metav1.ConditionFalse, true},
		{"a longer window kept in status while it stands (the masters forgot it)", own, &metav1.Duration{Duration: long}, at(time.Second), []redlock.MasterStatus{{Window: own}}, long, at(time.Second), metav1.ConditionFalse, true},
		{"a longer window kept in status lapses", own, &metav1.Duration{Duration: long}, at(-time.Second), []redlock.MasterStatus{{Window: own}}, own, nil, metav1.ConditionTrue, false},
		{"a master refused the registration", own, nil, nil, []redlock.MasterStatus{{Window: own, WindowErr: errors.New("NOPERM")}}, own, nil, metav1.ConditionUnknown, false},
		{"no quarantine (AOFAlways): nothing recorded", 0, &metav1.Duration{Duration: long}, at(time.Second), []redlock.MasterStatus{{}}, 0, nil, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := &v1alpha1.RedisMasterSet{}
			ms.Status.QuarantineWindow, ms.Status.QuarantineWindowUntil = tc.status, tc.until
			if tc.own == 0 {
				meta.SetStatusCondition(&ms.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionOwnWindow, Status: metav1.ConditionFalse, Reason: "x"})
			}
			shared := setWindow(ms, tc.own, tc.masters, now)
			if shared != tc.shared {
				t.Errorf("shared = %v, want %v", shared, tc.shared)
			}
			var got time.Duration
			if ms.Status.QuarantineWindow != nil {
				got = ms.Status.QuarantineWindow.Duration
			}
			if got != tc.wantWindow {
				t.Errorf("quarantineWindow %v, want %v", got, tc.wantWindow)
			}
			if (ms.Status.QuarantineWindowUntil == nil) != (tc.wantUntil == nil) || (tc.wantUntil != nil && !ms.Status.QuarantineWindowUntil.Equal(tc.wantUntil)) {
				t.Errorf("quarantineWindowUntil %v, want %v", ms.Status.QuarantineWindowUntil, tc.wantUntil)
			}
			c := meta.FindStatusCondition(ms.Status.Conditions, v1alpha1.ConditionOwnWindow)
			switch {
			case tc.wantCond == "" && c != nil:
				t.Errorf("condition %+v, want none", c)
			case tc.wantCond != "" && (c == nil || c.Status != tc.wantCond):
				t.Errorf("condition %+v, want %s", c, tc.wantCond)
			}
		})
	}
}

// TestZoneCondition: losing any one zone must leave a quorum of the
// list running; a member that runs nowhere counts as lost, one whose zone
// is not known may be in any zone.
func TestZoneCondition(t *testing.T) {
	// "-": running nowhere; "x": an external member serving; "X": one down.
	const nowhere = "-"
	place := func(zones ...string) []placement {
		out := make([]placement, len(zones))
		for i, z := range zones {
			switch z {
			case nowhere:
			case "x":
				out[i] = placement{running: true, outside: true}
			case "X":
				out[i] = placement{outside: true}
			default:
				out[i] = placement{running: true, zone: z}
			}
		}
		return out
	}
	all := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	for _, c := range []struct {
		name   string
		p      []placement
		list   []int
		status metav1.ConditionStatus
		reason string
	}{
		{"five in three zones", place("a", "b", "c", "a", "b"), all(5), metav1.ConditionTrue, v1alpha1.ReasonNoZoneHoldsQuorum},
		{"three of five in one", place("a", "b", "a", "a", "b"), all(5), metav1.ConditionFalse, v1alpha1.ReasonQuorumInOneZone},
		{"four in two zones, the fifth nowhere (Strict with two zones)", place("a", "a", "b", "b", nowhere), all(5), metav1.ConditionFalse, v1alpha1.ReasonQuorumInOneZone},
		{"all in one", place("a", "a", "a"), all(3), metav1.ConditionFalse, v1alpha1.ReasonQuorumInOneZone},
		{"one member", place("a"), all(1), metav1.ConditionFalse, v1alpha1.ReasonQuorumInOneZone},
		{"two zones and one member nowhere", place("a", "b", nowhere), all(3), metav1.ConditionFalse, v1alpha1.ReasonQuorumInOneZone},
		{"two zones and one unknown", place("a", "b", ""), all(3), metav1.ConditionUnknown, v1alpha1.ReasonZonesUnknown},
		{"one unknown that cannot matter", place("a", "b", "c", "d", ""), all(5), metav1.ConditionTrue, v1alpha1.ReasonNoZoneHoldsQuorum},
		{"none known", place("", "", ""), all(3), metav1.ConditionUnknown, v1alpha1.ReasonZonesUnknown},
		{"none running", place(nowhere, nowhere, nowhere), all(3), metav1.ConditionUnknown, v1alpha1.ReasonZonesUnknown},
		{"the previous list of three, after growing to five", place("a", "b", "c", "a", "b"), []int{0, 1, 2}, metav1.ConditionTrue, v1alpha1.ReasonNoZoneHoldsQuorum},
		{"a previous list with two in one zone", place("a", "c", "c", "a", "b"), []int{0, 1, 2}, metav1.ConditionFalse, v1alpha1.ReasonQuorumInOneZone},
		{"two here in one zone, three elsewhere serving", place("a", "a", "x", "x", "x"), all(5), metav1.ConditionTrue, v1alpha1.ReasonNoZoneHoldsQuorum},
		{"two here in one zone, three elsewhere, one down", place("a", "a", "x", "x", "X"), all(5), metav1.ConditionFalse, v1alpha1.ReasonQuorumInOneZone},
		{"two here in two zones, three elsewhere, one down", place("a", "b", "x", "x", "X"), all(5), metav1.ConditionTrue, v1alpha1.ReasonNoZoneHoldsQuorum},
		{"two here, zones unknown, one elsewhere", place("", "", "x"), all(3), metav1.ConditionUnknown, v1alpha1.ReasonZonesUnknown},
	} {
		status, reason, msg := zoneCondition(c.p, c.list)
		if status != c.status || reason != c.reason || msg == "" {
			t.Errorf("%s: %s/%s (%q), want %s/%s", c.name, status, reason, msg, c.status, c.reason)
		}
	}
	if _, _, msg := zoneCondition(place("a", "b", "a", "a", nowhere), all(5)); msg != "losing zone a (members 0, 2 and 3) leaves 1 of 5 members running, fewer than a quorum (3); not running: member 4" {
		t.Errorf("message %q", msg)
	}
}

func TestRecordNewMembers(t *testing.T) {
	set := func(replicas int32, port int32, external ...string) *v1alpha1.RedisMasterSet {
		ms := &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"},
			Spec:       v1alpha1.RedisMasterSetSpec{Managed: &v1alpha1.ManagedMasters{Replicas: replicas, Port: port, HostNetwork: true}},
		}
		if len(external) > 0 {
			ms.Spec.External = &v1alpha1.ExternalMasters{Addresses: external}
		}
		return ms
	}
	served := func(addrs ...string) []v1alpha1.MemberStatus {
		var out []v1alpha1.MemberStatus
		for _, a := range addrs {
			out = append(out, v1alpha1.MemberStatus{Address: a, State: v1alpha1.MemberServing, RunID: "r-" + a})
		}
		return out
	}
	sts := func(replicas int32) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Replicas: &replicas}}
	}
	neverServed := func(ms *v1alpha1.RedisMasterSet) []string {
		var out []string
		for _, m := range ms.Status.Members {
			if m.NeverServed {
				out = append(out, m.Address)
			}
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		ms       *v1alpha1.RedisMasterSet
		members  []v1alpha1.MemberStatus
		live     *appsv1.StatefulSet
		recorded []string
	}{
		{"a new set: every member", set(3, 7000), nil, nil, []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}},
		{"a new set with external members: its own only", set(2, 7000, "w:1", "n:1"), nil, nil, []string{"127.0.0.1:7000", "127.0.0.1:7001"}},
		{"a set that grew: the new ordinals", set(5, 7000), served("127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"), sts(3), []string{"127.0.0.1:7003", "127.0.0.1:7004"}},
		{"a set with external members that grew", set(4, 7000, "w:1"), served("127.0.0.1:7000", "w:1", "127.0.0.1:7001"), sts(2), []string{"127.0.0.1:7002", "127.0.0.1:7003"}},
		{"a new port: its members may have served, none is new", set(3, 8000), served("127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"), sts(3), nil},
		{"a StatefulSet without records: nothing is known", set(3, 7000), nil, sts(3), nil},
		{"records without a StatefulSet: nothing is new", set(3, 7000), served("127.0.0.1:7000"), nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.ms.Status.Members = tc.members
			got := recordNewMembers(tc.ms, tc.live)
			if rec := neverServed(tc.ms); got != (len(tc.recorded) > 0) || !slices.Equal(rec, tc.recorded) {
				t.Fatalf("recorded %v (%v), want %v", rec, got, tc.recorded)
			}
		})
	}
}

// During a membership change the previous list is judged with its masters
// the spec no longer names: y and z, probed Down, count as lost.
func TestSetZonesCountsThePreviousList(t *testing.T) {
	ms := &v1alpha1.RedisMasterSet{
		Spec: v1alpha1.RedisMasterSetSpec{
			Managed:  &v1alpha1.ManagedMasters{Replicas: 2, HostNetwork: true, Port: 7000},
			External: &v1alpha1.ExternalMasters{Addresses: []string{"x:1"}},
		},
		Status: v1alpha1.RedisMasterSetStatus{
			Addresses:        []string{"127.0.0.1:7000", "127.0.0.1:7001", "x:1"},
			MembershipChange: &v1alpha1.MembershipChange{Previous: []string{"127.0.0.1:7000", "127.0.0.1:7001", "x:1", "y:1", "z:1"}},
			Members: []v1alpha1.MemberStatus{
				{Address: "127.0.0.1:7000", State: v1alpha1.MemberServing}, {Address: "127.0.0.1:7001", State: v1alpha1.MemberServing},
				{Address: "x:1", State: v1alpha1.MemberServing}, {Address: "y:1", State: v1alpha1.MemberDown}, {Address: "z:1", State: v1alpha1.MemberDown},
			},
		},
	}
	placements := []placement{{running: true, zone: "a"}, {running: true, zone: "b"}, {running: true, outside: true}}
	setZones(ms, placements, true)
	c := findCondition(ms, v1alpha1.ConditionSurvivesZoneLoss)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonQuorumInOneZone {
		t.Fatalf("SurvivesZoneLoss %+v: losing zone a leaves 2 of the previous list's 5 running; want False", c)
	}
}
