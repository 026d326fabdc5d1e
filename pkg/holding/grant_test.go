package holding

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// TestGrantOfUnderClockOffsets: the deadline, read on the operator's clock,
// never passes the validity shown while this host's clock is off by no more
// than the skew allowance, whichever way; a larger offset behind the
// operator's clock is what the allowance does not cover.
func TestGrantOfUnderClockOffsets(t *testing.T) {
	trueNow := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	validUntil := trueNow.Add(5 * time.Second)
	me := Holder{Name: "p", UID: "uid-p"}
	lock := func(mutate ...func(*v1alpha1.DistributedLock)) *v1alpha1.DistributedLock {
		l := &v1alpha1.DistributedLock{}
		l.Status = v1alpha1.DistributedLockStatus{
			Holder:  &v1alpha1.LockHolder{Identity: "p", Pod: &v1alpha1.PodReference{Name: "p", UID: "uid-p"}},
			GrantID: "g", FencingToken: 7, Key: "k", ValidUntil: v1alpha1.NewPreciseTime(validUntil),
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAcquired}},
		}
		for _, m := range mutate {
			m(l)
		}
		return l
	}
	for _, tc := range []struct {
		name         string
		offset, skew time.Duration // this host's clock minus the operator's
		held         bool
		withinValid  bool // the deadline, on the operator's clock, is no later than the validity
	}{
		{"clocks agree, no allowance", 0, 0, true, true},
		{"clocks agree", 0, time.Second, true, true},
		{"host ahead by the allowance", time.Second, time.Second, true, true},
		{"host behind by the allowance", -time.Second, time.Second, true, true},
		{"host behind by more than the allowance", -2 * time.Second, time.Second, true, false},
		{"host so far ahead that the validity has passed here", 5 * time.Second, 0, false, true},
		{"less validity left than the allowance", 0, 5 * time.Second, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			local := trueNow.Add(tc.offset)
			g := GrantOf(lock(), me, local, tc.skew)
			if (g != nil) != tc.held {
				t.Fatalf("GrantOf = %+v, want held %v", g, tc.held)
			}
			if g == nil {
				return
			}
			if g.Token != 7 || g.GrantID != "g" || g.Key != "k" || !g.ValidUntil.Equal(validUntil) {
				t.Errorf("GrantOf = %+v, want token 7, grant g, key k, validity %v", g, validUntil)
			}
			onOperatorClock := g.Deadline.Add(-tc.offset)
			if got := !onOperatorClock.After(validUntil); got != tc.withinValid {
				t.Errorf("deadline on the operator's clock %v, validity %v: within = %v, want %v", onOperatorClock, validUntil, got, tc.withinValid)
			}
		})
	}

	for _, tc := range []struct {
		name   string
		mutate func(*v1alpha1.DistributedLock)
	}{
		{"another pod holds it", func(l *v1alpha1.DistributedLock) { l.Status.Holder.Pod.UID = "uid-q" }},
		{"a re-created pod of the same name", func(l *v1alpha1.DistributedLock) { l.Status.Holder.Pod.UID = "uid-old" }},
		{"a static holder holds it", func(l *v1alpha1.DistributedLock) { l.Status.Holder.Pod = nil }},
		{"nobody holds it", func(l *v1alpha1.DistributedLock) { l.Status.Holder = nil }},
		{"Held is False", func(l *v1alpha1.DistributedLock) { l.Status.Conditions[0].Status = metav1.ConditionFalse }},
		{"no validity shown", func(l *v1alpha1.DistributedLock) { l.Status.ValidUntil = nil }},
	} {
		if g := GrantOf(lock(tc.mutate), me, trueNow, 0); g != nil {
			t.Errorf("%s: GrantOf = %+v, want none", tc.name, g)
		}
	}
	if g := GrantOf(nil, me, trueNow, 0); g != nil {
		t.Errorf("no lock: GrantOf = %+v, want none", g)
	}
}

// TestGrantOfStaticHolder: a static holder (Identity) holds a grant status
// shows for that identity with no pod, and nothing a pod of the same name
// holds.
func TestGrantOfStaticHolder(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	me := Holder{Identity: "ci-run-1"}
	lock := func(h *v1alpha1.LockHolder) *v1alpha1.DistributedLock {
		return &v1alpha1.DistributedLock{
			Spec: v1alpha1.DistributedLockSpec{HolderLease: &metav1.Duration{Duration: 9 * time.Second}},
			Status: v1alpha1.DistributedLockStatus{
				Holder: h, GrantID: "g", FencingToken: 7, ValidUntil: v1alpha1.NewPreciseTime(now.Add(5 * time.Second)),
				Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAcquired}},
			},
		}
	}
	g := GrantOf(lock(&v1alpha1.LockHolder{Identity: "ci-run-1"}), me, now, 0)
	if g == nil || g.Token != 7 || g.HolderLease != 9*time.Second {
		t.Fatalf("GrantOf = %+v, want token 7 with a holderLease of 9s", g)
	}
	for name, h := range map[string]*v1alpha1.LockHolder{
		"a pod named as the identity": {Identity: "ci-run-1", Pod: &v1alpha1.PodReference{Name: "ci-run-1", UID: "u"}},
		"another static holder":       {Identity: "ci-run-2"},
	} {
		if g := GrantOf(lock(h), me, now, 0); g != nil {
			t.Errorf("%s: GrantOf = %+v, want none", name, g)
		}
	}
}
