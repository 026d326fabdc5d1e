package redismasterset

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

func TestNextMembership(t *testing.T) {
	a, b := []string{"a:1", "b:1", "c:1"}, []string{"a:1", "b:1", "d:1"}
	change := &v1alpha1.MembershipChange{Previous: a, Duration: metav1.Duration{Duration: 4 * time.Second}}
	tests := []struct {
		name     string
		st       v1alpha1.RedisMasterSetStatus
		desired  []string
		jointFor time.Duration
		jointOK  bool
		step     membershipStep
		wait     time.Duration
	}{
		{"a new set adopts the spec's list", v1alpha1.RedisMasterSetStatus{}, a, 0, false, stepAdopt, 0},
		{"nothing to do", v1alpha1.RedisMasterSetStatus{Addresses: a}, a, 0, false, stepNone, 0},
		{"an edited list starts a change", v1alpha1.RedisMasterSetStatus{Addresses: a}, b, 0, false, stepStart, 0},
		{"no joint client yet: the whole change is left", v1alpha1.RedisMasterSetStatus{Addresses: b, MembershipChange: change}, b, 0, false, stepWait, 4 * time.Second},
		{"the joint client for part of the change", v1alpha1.RedisMasterSetStatus{Addresses: b, MembershipChange: change}, b, time.Second, true, stepWait, 3 * time.Second},
		{"the joint client for the whole change", v1alpha1.RedisMasterSetStatus{Addresses: b, MembershipChange: change}, b, 4 * time.Second, true, stepEnd, 0},
		{"another edit waits for the change under way", v1alpha1.RedisMasterSetStatus{Addresses: b, MembershipChange: change}, a, time.Second, true, stepWait, 3 * time.Second},
		{"and ends it before it starts", v1alpha1.RedisMasterSetStatus{Addresses: b, MembershipChange: change}, a, 5 * time.Second, true, stepEnd, 0},
		{"the same masters in another order need no change", v1alpha1.RedisMasterSetStatus{Addresses: a}, []string{"c:1", "a:1", "b:1"}, 0, false, stepReorder, 0},
		{"a set an older operator ran on other members changes from them", v1alpha1.RedisMasterSetStatus{Members: []v1alpha1.MemberStatus{{Address: "a:1"}, {Address: "b:1"}, {Address: "c:1"}}}, b, 0, false, stepAdoptChanged, 0},
		{"a set an older operator ran on the spec's members adopts them", v1alpha1.RedisMasterSetStatus{Members: []v1alpha1.MemberStatus{{Address: "a:1"}, {Address: "b:1"}, {Address: "c:1"}}}, a, 0, false, stepAdopt, 0},
		{"a new set with managed and external members adopts the spec's list: its recorded members never served", v1alpha1.RedisMasterSetStatus{Members: []v1alpha1.MemberStatus{{Address: "a:1", NeverServed: true}, {Address: "b:1", NeverServed: true}}}, a, 0, false, stepAdopt, 0},
	}
	for _, tc := range tests {
		step, wait := nextMembership(&tc.st, tc.desired, tc.jointFor, tc.jointOK)
		if step != tc.step || wait != tc.wait {
			t.Errorf("%s: step %d, wait %v; want %d, %v", tc.name, step, wait, tc.step, tc.wait)
		}
	}
}

// During a change, the counts are the new list's, and Available needs a
// quorum of each list.
func TestSetMembersDuringAChange(t *testing.T) {
	member := func(addr, state string) v1alpha1.MemberStatus {
		return v1alpha1.MemberStatus{Address: addr, State: state}
	}
	ms := &v1alpha1.RedisMasterSet{Status: v1alpha1.RedisMasterSetStatus{
		Addresses:        []string{"a:1", "b:1", "d:1"},
		MembershipChange: &v1alpha1.MembershipChange{Previous: []string{"a:1", "b:1", "c:1"}},
	}}
	members := []v1alpha1.MemberStatus{
		member("a:1", v1alpha1.MemberServing), member("b:1", v1alpha1.MemberDown), member("d:1", v1alpha1.MemberServing), member("c:1", v1alpha1.MemberDown),
	}
	if serving := setMembers(ms, members); serving != 2 || ms.Status.Total != 3 || ms.Status.Quorum != 2 {
		t.Fatalf("serving %d, total %d, quorum %d; want the new list's 2, 3, 2", serving, ms.Status.Total, ms.Status.Quorum)
	}
	if c := findCondition(ms, v1alpha1.ConditionAvailable); c == nil || c.Status != metav1.ConditionFalse {
		t.Fatalf("Available %+v with one of the previous list's three serving; want False", c)
	}
	members[3].State = v1alpha1.MemberServing
	setMembers(ms, members)
	if c := findCondition(ms, v1alpha1.ConditionAvailable); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("Available %+v with a quorum of each list serving; want True", c)
	}
	if c := findCondition(ms, v1alpha1.ConditionDegraded); c == nil || c.Status != metav1.ConditionTrue || c.Message != "1 of 4 masters down or quarantined" {
		t.Fatalf("Degraded %+v; want True over the masters of both lists", c)
	}
}

func findCondition(ms *v1alpha1.RedisMasterSet, typ string) *metav1.Condition {
	return meta.FindStatusCondition(ms.Status.Conditions, typ)
}
