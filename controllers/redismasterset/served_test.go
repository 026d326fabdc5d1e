package redismasterset

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

func TestOwnServingIsOnlyThisProcesssObservation(t *testing.T) {
	r := &Reconciler{}
	ms := &v1alpha1.RedisMasterSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "set", UID: "uid-1"}}
	now := time.Now()
	r.recordServing(ms, []v1alpha1.MemberStatus{{Address: "a:1", State: v1alpha1.MemberServing}, {Address: "b:1", State: v1alpha1.MemberDown}}, now)
	// As status keeps it: whole seconds.
	stamped := func(t time.Time) *v1alpha1.MemberStatus {
		return &v1alpha1.MemberStatus{Address: "a:1", LastServingAt: &metav1.Time{Time: t.Truncate(time.Second)}}
	}
	got := r.ownServing(ms, stamped(now))
	if got == nil || !got.Equal(now.Add(time.Second)) {
		t.Fatalf("own observation recorded in status: %v, want now + 1s (the stamp's resolution)", got)
	}
	for name, m := range map[string]*v1alpha1.MemberStatus{
		"another process's later stamp":   stamped(now.Add(3 * time.Second)),
		"another process's earlier stamp": stamped(now.Add(-3 * time.Second)),
		"a member this process never saw": {Address: "b:1", LastServingAt: &metav1.Time{Time: now.Truncate(time.Second)}},
		"no lastServingAt":                {Address: "a:1"},
	} {
		if got := r.ownServing(ms, m); got != nil {
			t.Errorf("%s: %v, want nil", name, got)
		}
	}
	recreated := ms.DeepCopy()
	recreated.UID = "uid-2"
	if got := r.ownServing(recreated, stamped(now)); got != nil {
		t.Errorf("a set recreated under the same name: %v, want nil", got)
	}
}
