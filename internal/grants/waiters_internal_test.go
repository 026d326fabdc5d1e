package grants

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// TestWaitQueueKeepsTheFirstWaiter: after any sequence of puts (new
// locks, and locks waiting again from earlier or later) and deletions, the
// queue's first waiter is the one a scan of every waiter finds.
func TestWaitQueueKeepsTheFirstWaiter(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 3))
	q := waitQueue{byName: map[types.NamespacedName]waiter{}}
	base := time.Unix(1000, 0)
	for step := range 5000 {
		name := types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("l%d", rng.IntN(40))}
		if rng.IntN(3) == 0 {
			q.del(name)
		} else {
			q.put(waiter{name: name, since: base.Add(time.Duration(rng.IntN(50)) * time.Second)})
		}
		var want waiter
		for _, x := range q.byName {
			if want.name.Name == "" || before(x, want) {
				want = x
			}
		}
		got, ok := q.first()
		if ok != (want.name.Name != "") || got != want {
			t.Fatalf("step %d: first waiter %v (%v); a scan finds %v", step, got, ok, want)
		}
		other := waiter{name: types.NamespacedName{Namespace: "ns", Name: "probe"}, since: base.Add(25 * time.Second)}
		if q.behind(other) != (ok && before(want, other)) {
			t.Fatalf("step %d: behind(%v) = %v with %v first", step, other, q.behind(other), want)
		}
	}
}

// TestWakeLimit: waiting locks are woken a grant's writes at a time out of
// what the API server takes beyond the refreshes, at least one.
func TestWakeLimit(t *testing.T) {
	for _, tc := range []struct {
		capacity, demand float64
		want             int
	}{
		{10, 8, 1},   // 2 writes/s spare: less than a grant's
		{10, 10, 1},  // none spare: one still goes, when it fits
		{40, 10, 10}, // 30 spare: ten grants' writes
		{150, 0, 50},
	} {
		if got := wakeLimit(tc.capacity, tc.demand); got != tc.want {
			t.Errorf("wakeLimit(%v, %v) = %d, want %d", tc.capacity, tc.demand, got, tc.want)
		}
	}
}
