package semantic

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

func status(at time.Time) v1alpha1.DistributedSemaphoreStatus {
	return v1alpha1.DistributedSemaphoreStatus{Held: 1, Holders: []v1alpha1.SemaphoreHolder{{Slot: 0, Lock: "s-1-0", AcquiredAt: v1alpha1.NewPreciseTime(at)}}}
}

// TestEqualComparesPreciseTimes: equality.Semantic panics on two statuses
// that differ nowhere before a PreciseTime (a reconcile of a semaphore
// whose holders did not change did, once per reconcile); Equal compares
// the instants.
func TestEqualComparesPreciseTimes(t *testing.T) {
	at := time.Date(2026, 12, 4, 3, 0, 0, 123456000, time.UTC)
	func() {
		defer func() {
			if recover() == nil {
				t.Log("equality.Semantic no longer panics on a PreciseTime; Equal may not be needed")
			}
		}()
		equality.Semantic.DeepEqual(status(at), status(at))
	}()
	if !Equal(status(at), status(at.In(time.FixedZone("x", 3600)))) {
		t.Error("one instant in two zones compares unequal")
	}
	if Equal(status(at), status(at.Add(time.Microsecond))) {
		t.Error("two instants compare equal")
	}
	if !Equal(v1alpha1.DistributedSemaphoreStatus{}, v1alpha1.DistributedSemaphoreStatus{Holders: nil}) {
		t.Error("empty statuses compare unequal")
	}
}
