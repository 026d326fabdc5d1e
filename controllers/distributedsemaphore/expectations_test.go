package distributedsemaphore

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// TestExpectations: an assignment counts until the cache shows the pod
// labelled for it, the cache no longer lists the pod (deleted before its
// label was seen), or it is older than expectationTTL.
func TestExpectations(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "db"}
	pod := func(uid, lock string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Labels: map[string]string{v1alpha1.SemaphoreLabel: "db"}}}
		if lock != "" {
			p.Labels[v1alpha1.LockLabel] = lock
		}
		return p
	}
	for _, tc := range []struct {
		name    string
		pods    []*corev1.Pod
		elapsed time.Duration
		want    map[string]types.UID
	}{
		{name: "the cache shows the pod unlabelled yet: pending", pods: []*corev1.Pod{pod("a", "")}, want: map[string]types.UID{"db-2-0": "a"}},
		{name: "the cache shows the label: done", pods: []*corev1.Pod{pod("a", "db-2-0")}, want: map[string]types.UID{}},
		{name: "the cache no longer lists the pod: deleted, the slot is free", pods: []*corev1.Pod{pod("b", "")}, want: map[string]types.UID{}},
		{name: "older than expectationTTL: the cache is trusted", pods: []*corev1.Pod{pod("a", "")}, elapsed: expectationTTL + time.Second, want: map[string]types.UID{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			r := &Reconciler{Clock: clk}
			r.expect(key, "db-2-0", "a")
			clk.Step(tc.elapsed)
			got := r.expectations(key, tc.pods)
			if len(got) != len(tc.want) || got["db-2-0"] != tc.want["db-2-0"] {
				t.Fatalf("expectations = %v, want %v", got, tc.want)
			}
			if r.pending(key) != (len(tc.want) > 0) {
				t.Fatalf("pending = %v with expectations %v", r.pending(key), got)
			}
		})
	}
}
