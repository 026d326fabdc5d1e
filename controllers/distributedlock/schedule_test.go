package distributedlock

import (
	"testing"
	"time"
)

// Status writes are ordered by deadline, and before every ordinary
// reconcile (priority 0, or controller-runtime's low priority for resyncs).
func TestDeadlinePriority(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	soon, later := deadlinePriority(now.Add(time.Second)), deadlinePriority(now.Add(time.Minute))
	if soon <= later {
		t.Fatalf("priority of a deadline in 1s (%d) not above one in 1m (%d)", soon, later)
	}
	if deadlinePriority(now.Add(-time.Hour)) <= soon {
		t.Fatal("a deadline already passed is not the most urgent")
	}
	if deadlinePriority(time.Time{}) <= soon {
		t.Fatal("a lock whose status shows no validity yet is not the most urgent")
	}
	if far := deadlinePriority(now.Add(24 * 365 * time.Hour)); far <= 0 {
		t.Fatalf("a deadline a year away has priority %d: not above ordinary reconciles (0)", far)
	}
}
