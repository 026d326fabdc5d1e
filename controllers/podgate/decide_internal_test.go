package podgate

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// TestDecideNeverGrantsAFinishedPod: a holder pod that finished is never
// annotated or ungated, whatever status shows (issue 18, case 7).
func TestDecideNeverGrantsAFinishedPod(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	lock := &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: "l"}}
	lock.Status = v1alpha1.DistributedLockStatus{
		Holder:  &v1alpha1.LockHolder{Identity: "p", Pod: &v1alpha1.PodReference{Name: "p", UID: "uid-p"}},
		GrantID: "g", FencingToken: 7, ValidUntil: v1alpha1.NewPreciseTime(now.Add(time.Second)),
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAcquired}},
	}
	for _, tc := range []struct {
		name  string
		phase corev1.PodPhase
		grant bool
	}{
		{"running holder", corev1.PodRunning, true},
		{"pending holder", corev1.PodPending, true},
		{"holder that succeeded", corev1.PodSucceeded, false},
		{"holder that failed", corev1.PodFailed, false},
	} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "uid-p"}, Status: corev1.PodStatus{Phase: tc.phase}}
		if got := decide(pod, lock, now).grant; got != tc.grant {
			t.Errorf("%s: grant = %v, want %v", tc.name, got, tc.grant)
		}
	}
}
