package distributedsemaphore

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

func TestStranded(t *testing.T) {
	s2 := sem(2)
	granted := pod("granted", 0, "db-3-1")
	granted.Annotations = map[string]string{v1alpha1.FencingTokenAnnotation: "4"}
	ungated := pod("ungated", 0, "db-3-1")
	ungated.Spec.SchedulingGates = nil
	deleting := pod("deleting", 0, "db-3-1")
	deleting.DeletionTimestamp = &metav1.Time{Time: t0}
	done := pod("done", 0, "db-3-1")
	done.Status.Phase = corev1.PodFailed

	cases := []struct {
		name  string
		locks []*v1alpha1.DistributedLock
		pods  []*corev1.Pod
		want  []string
	}{
		{name: "a waiting pod labelled for a slot of another number that no lock has", pods: []*corev1.Pod{pod("w", 0, "db-3-1"), pod("w1", 0, "db-1-0")}, want: []string{"w", "w1"}},
		{name: "a slot of the current number is created, not stranded", pods: []*corev1.Pod{pod("w", 0, "db-2-1")}},
		{name: "a slot of another number still there (draining) holds its pod", locks: []*v1alpha1.DistributedLock{slotOf(sem(3), 3, 1, "")}, pods: []*corev1.Pod{pod("w", 0, "db-3-1")}},
		{name: "a granted, ungated, deleting or finished pod stays", pods: []*corev1.Pod{granted, ungated, deleting, done}},
		{name: "a pod waiting for no slot, or for a lock that is no slot name of the semaphore, stays", pods: []*corev1.Pod{
			pod("none", 0, ""), pod("other", 0, "other-3-1"), pod("index", 0, "db-3-3"), pod("zero", 0, "db-03-1"), pod("huge", 0, "db-1001-0"), pod("parts", 0, "db-3-1-0"),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, s := range stranded(inputs{sem: s2, locks: tc.locks, pods: tc.pods}) {
				if s.lock != s.pod.Labels[v1alpha1.LockLabel] {
					t.Errorf("pod %s: lock %q, labelled %q", s.pod.Name, s.lock, s.pod.Labels[v1alpha1.LockLabel])
				}
				got = append(got, s.pod.Name)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("stranded: got %v, want %v", got, tc.want)
			}
		})
	}
}
