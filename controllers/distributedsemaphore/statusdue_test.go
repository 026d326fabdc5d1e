package distributedsemaphore

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// TestStatusDue: a status that changes only who holds and who waits is
// written at most once per StatusInterval; any other change, and the
// first write of a manager, at once.
func TestStatusDue(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "db"}
	shown := v1alpha1.DistributedSemaphoreStatus{Slots: 2, Held: 1, Holders: []v1alpha1.SemaphoreHolder{{Slot: 0, Lock: "db-2-0"}}}
	handedOver := *shown.DeepCopy()
	handedOver.Holders[0].FencingToken = 8
	handedOver.Queue = &v1alpha1.LockQueue{Count: 1}
	released := *shown.DeepCopy()
	released.Held, released.Holders = 0, nil
	resized := *shown.DeepCopy()
	resized.Slots = 3
	notReady := *shown.DeepCopy()
	notReady.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSlotsConflict}}

	clk := clocktesting.NewFakeClock(t0)
	r := &Reconciler{Clock: clk}
	if got := r.statusDue(key, shown, handedOver); got != 0 {
		t.Fatalf("before this manager wrote the status: due in %v, want now", got)
	}
	r.written = map[types.NamespacedName]time.Time{key: t0}
	clk.Step(300 * time.Millisecond)
	for _, tc := range []struct {
		name string
		want v1alpha1.DistributedSemaphoreStatus
		due  time.Duration
	}{
		{"a slot handed over", handedOver, StatusInterval - 300*time.Millisecond},
		{"a slot released", released, StatusInterval - 300*time.Millisecond},
		{"another number of slots", resized, 0},
		{"a condition changed", notReady, 0},
	} {
		if got := r.statusDue(key, shown, tc.want); got != tc.due {
			t.Errorf("%s: due in %v, want %v", tc.name, got, tc.due)
		}
	}
	clk.Step(StatusInterval)
	if got := r.statusDue(key, shown, handedOver); got != 0 {
		t.Errorf("past the interval: due in %v, want now", got)
	}
	r.forget(key)
	if got := r.statusDue(key, shown, handedOver); got != 0 || r.written[key] != (time.Time{}) {
		t.Errorf("a semaphore forgotten: due in %v, want now", got)
	}
}
