package distributedlock

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

func TestAdoptionPriority(t *testing.T) {
	now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	held := func(ahead time.Duration) v1alpha1.DistributedLockStatus {
		return v1alpha1.DistributedLockStatus{Holder: &v1alpha1.LockHolder{Identity: "a"}, ValidUntil: v1alpha1.NewPreciseTime(now.Add(ahead))}
	}
	for _, tc := range []struct {
		name string
		st   v1alpha1.DistributedLockStatus
		want int
		ok   bool
	}{
		{"no holder: the queue's default", v1alpha1.DistributedLockStatus{}, 0, false},
		{"a holder without validity: the queue's default", v1alpha1.DistributedLockStatus{Holder: &v1alpha1.LockHolder{Identity: "a"}}, 0, false},
		{"validity passed: after every adoptable lock", held(-time.Second), lapsedPriority, true},
		{"validity passing now", held(0), lapsedPriority, true},
		{"50 ms ahead: the top of the band", held(50 * time.Millisecond), adoptBand, true},
		{"1 s ahead", held(time.Second), adoptBand - 10, true},
		{"a year ahead: still above the lapsed", held(365 * 24 * time.Hour), lapsedPriority + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := adoptionPriority(tc.st, now)
			if got != tc.want || ok != tc.ok {
				t.Errorf("adoptionPriority = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestNewLeaderAdoptsNearestValidityFirst feeds a new leader's initial list
// (in name order) through the controller's handler into controller-runtime's
// priority queue: the held locks come out nearest shown validity first, then
// the lapsed, then the rest.
func TestNewLeaderAdoptsNearestValidityFirst(t *testing.T) {
	now := time.Now()
	locks := []struct {
		name  string
		ahead time.Duration // 0: not held
		held  bool
	}{
		{"a-free", 0, false},
		{"b-held-30s", 30 * time.Second, true},
		{"c-lapsed", -time.Second, true},
		{"d-held-2s", 2 * time.Second, true},
		{"e-free", 0, false},
		{"f-held-9s", 9 * time.Second, true},
	}
	q := priorityqueue.New[reconcile.Request]("adoption-order-test")
	defer q.ShutDown()
	h := &adoptFirst{now: func() time.Time { return now }}
	for _, l := range locks {
		lock := &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: l.name}}
		if l.held {
			lock.Status.Holder = &v1alpha1.LockHolder{Identity: "x"}
			lock.Status.ValidUntil = v1alpha1.NewPreciseTime(now.Add(l.ahead))
		}
		h.Create(context.Background(), event.CreateEvent{Object: lock, IsInInitialList: true}, q)
	}
	want := []string{"d-held-2s", "f-held-9s", "b-held-30s", "c-lapsed", "a-free", "e-free"}
	for i, name := range want {
		req, _, shutdown := q.GetWithPriority()
		if shutdown {
			t.Fatal("queue shut down")
		}
		if req.Name != name {
			t.Fatalf("item %d is %s, want %s (order %v)", i, req.Name, name, want)
		}
		q.Done(req)
	}
}

// TestWakeUpsGoAheadOfRequeues: a wake-up from this manager's Sessions or
// status writer (a lost or shed grant) goes ahead of requeues at the
// default priority, such as thousands of grants waiting for room; one asked
// for before the controller started is kept until it starts, and one asked
// for twice is reconciled once.
func TestWakeUpsGoAheadOfRequeues(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("wake-order-test")
	defer q.ShutDown()
	for i := range 5 {
		q.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(0)}, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("waiting-%d", i)}})
	}
	var w wakeQueue
	w.add(types.NamespacedName{Namespace: "ns", Name: "early"})
	if err := w.Start(t.Context(), q); err != nil {
		t.Fatal(err)
	}
	w.add(types.NamespacedName{Namespace: "ns", Name: "shed"})
	w.add(types.NamespacedName{Namespace: "ns", Name: "shed"})
	var got []string
	for range 3 {
		req, _, _ := q.GetWithPriority()
		got = append(got, req.Name)
		q.Done(req)
	}
	slices.Sort(got[:2])
	if want := []string{"early", "shed", "waiting-0"}; !slices.Equal(got, want) {
		t.Fatalf("first three items %v, want %v: the wake-ups once each, then the requeues", got, want)
	}
}
