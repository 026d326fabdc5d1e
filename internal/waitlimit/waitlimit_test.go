package waitlimit

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

var created = time.Unix(1_000_000, 0)

func pod(mutate ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", CreationTimestamp: metav1.Time{Time: created}, Labels: map[string]string{v1alpha1.LockLabel: "l"}},
		Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, SchedulingGates: []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGate}}},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func readiness(p *corev1.Pod) {
	p.Spec.SchedulingGates = nil
	p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: v1alpha1.ReadinessGate}}
}

func shown(p *corev1.Pod) {
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: v1alpha1.ConditionLockWaitTimeout, Status: corev1.ConditionTrue})
}

func heldBefore(p *corev1.Pod) {
	p.Annotations = map[string]string{v1alpha1.FencingTokenAnnotation: "7"}
}

func TestDecide(t *testing.T) {
	keep := podlock.WaitLimit{Timeout: time.Minute}
	fail := podlock.WaitLimit{Timeout: time.Minute, Fail: true}
	for _, tc := range []struct {
		name        string
		pod         *corev1.Pod
		limit       podlock.WaitLimit
		granted     bool
		after       time.Duration
		want        Action
		wantRecheck time.Duration
	}{
		{"no limit", pod(), podlock.WaitLimit{}, false, time.Hour, Nothing, 0},
		{"before the limit: look again at it", pod(), keep, false, 20 * time.Second, Nothing, 40 * time.Second},
		{"past it, keep: tell", pod(), keep, false, time.Minute, Tell, 0},
		{"past it, told already", pod(shown), keep, false, 2 * time.Minute, Nothing, 0},
		{"past it, fail, scheduling-gated: fail", pod(), fail, false, time.Minute, Fail, 0},
		{"past it, fail, readiness-gated: keeps waiting, told", pod(readiness), fail, false, time.Minute, Tell, 0},
		{"past it, fail, a pod something restarts in its place (not restartPolicy Never): told", pod(func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyAlways }), fail, false, time.Minute, Tell, 0},
		{"past it but granted: nothing to tell", pod(), fail, true, time.Hour, Nothing, 0},
		{"granted after it was told: clear", pod(shown), keep, true, time.Hour, Clear, 0},
		{"a former holder waiting to be granted again is not timed", pod(heldBefore), fail, false, time.Hour, Nothing, 0},
		{"finished", pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), fail, false, time.Hour, Nothing, 0},
		{"being deleted", pod(func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: created} }), fail, false, time.Hour, Nothing, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, recheck := Decide(tc.pod, tc.limit, tc.granted, created.Add(tc.after))
			if got != tc.want || recheck != tc.wantRecheck {
				t.Errorf("Decide = %v, recheck %v; want %v, %v", got, recheck, tc.want, tc.wantRecheck)
			}
		})
	}
}
