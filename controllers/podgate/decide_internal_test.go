package podgate

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
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

// TestDecideMarkAndLapse: in holder-label mode only a holder that runs and
// is not being deleted is marked; a holder whose shown validity passed is
// not, and looks again soon whether or not the refresh wakes it.
func TestDecideMarkAndLapse(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	lock := func(validFor time.Duration) *v1alpha1.DistributedLock {
		l := &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: "l"}}
		l.Status = v1alpha1.DistributedLockStatus{
			Holder:  &v1alpha1.LockHolder{Identity: "p", Pod: &v1alpha1.PodReference{Name: "p", UID: "uid-p"}},
			GrantID: "g", FencingToken: 7, ValidUntil: v1alpha1.NewPreciseTime(now.Add(validFor)),
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAcquired}},
		}
		return l
	}
	runningPod := func() *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "uid-p", Labels: map[string]string{v1alpha1.GateModeLabel: v1alpha1.GateModeHolderLabel},
				Annotations: map[string]string{v1alpha1.FencingTokenAnnotation: "7"}},
			Spec: corev1.PodSpec{NodeName: "n", RestartPolicy: corev1.RestartPolicyNever},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
				{Name: "c", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
		}
	}
	deleting := runningPod()
	deleting.DeletionTimestamp = &metav1.Time{Time: now}
	exited := deleting.DeepCopy()
	exited.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}
	other := runningPod()
	other.UID, other.Annotations = "uid-q", nil
	for _, tc := range []struct {
		name          string
		pod           *corev1.Pod
		validFor      time.Duration
		grant, mark   bool
		recheckAtMost time.Duration
	}{
		{"a running holder is marked and looks again at its validity", runningPod(), 3 * time.Second, true, true, 3 * time.Second},
		{"a holder being deleted holds, unmarked", deleting, 3 * time.Second, true, false, 3 * time.Second},
		{"a holder whose containers stopped holds, unmarked", exited, 3 * time.Second, true, false, 3 * time.Second},
		{"a holder past its shown validity is not marked and looks again soon", runningPod(), -time.Millisecond, false, false, lapseRecheck},
		{"another pod is not marked and waits for the lock's events", other, 3 * time.Second, false, false, 0},
	} {
		d := decide(tc.pod, lock(tc.validFor), now)
		if d.grant != tc.grant || d.mark != tc.mark || d.recheck > tc.recheckAtMost || (tc.recheckAtMost > 0 && d.recheck == 0) {
			t.Errorf("%s: grant %v, mark %v, recheck %v; want %v, %v, recheck in (0, %v]", tc.name, d.grant, d.mark, d.recheck, tc.grant, tc.mark, tc.recheckAtMost)
		}
	}
}

// TestGrantChanged: a lock version wakes the lock's pods unless it only
// refreshed the same grant's shown validity before the shown one passed.
func TestGrantChanged(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	held := func() *v1alpha1.DistributedLock {
		l := &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: "l", Generation: 1}}
		l.Status = v1alpha1.DistributedLockStatus{
			Key:     "k",
			Holder:  &v1alpha1.LockHolder{Identity: "p", Pod: &v1alpha1.PodReference{Name: "p", UID: "uid-p"}},
			GrantID: "g", FencingToken: 7,
			RenewedAt:  v1alpha1.NewPreciseTime(now.Add(-time.Second)),
			ValidUntil: v1alpha1.NewPreciseTime(now.Add(time.Second)),
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAcquired, Message: "held by p"}},
		}
		return l
	}
	for _, tc := range []struct {
		name   string
		old    func(*v1alpha1.DistributedLock)
		change func(*v1alpha1.DistributedLock)
		want   bool
	}{
		{"a refresh of the shown validity", nil, func(l *v1alpha1.DistributedLock) {
			l.Status.RenewedAt = v1alpha1.NewPreciseTime(now)
			l.Status.ValidUntil = v1alpha1.NewPreciseTime(now.Add(9 * time.Second))
			l.Status.Quorum = &v1alpha1.QuorumStatus{}
			l.Status.Queue = &v1alpha1.LockQueue{}
		}, false},
		{"a refresh after the shown validity passed", func(l *v1alpha1.DistributedLock) {
			l.Status.ValidUntil = v1alpha1.NewPreciseTime(now.Add(-time.Millisecond))
		}, func(l *v1alpha1.DistributedLock) {
			l.Status.ValidUntil = v1alpha1.NewPreciseTime(now.Add(9 * time.Second))
		}, true},
		{"a new grant", nil, func(l *v1alpha1.DistributedLock) { l.Status.GrantID = "g2" }, true},
		{"a new token", nil, func(l *v1alpha1.DistributedLock) { l.Status.FencingToken = 8 }, true},
		{"another holder", nil, func(l *v1alpha1.DistributedLock) {
			l.Status.Holder = &v1alpha1.LockHolder{Identity: "q", Pod: &v1alpha1.PodReference{Name: "q", UID: "uid-q"}}
		}, true},
		{"no holder", nil, func(l *v1alpha1.DistributedLock) { l.Status.Holder = nil }, true},
		{"no validity shown", nil, func(l *v1alpha1.DistributedLock) { l.Status.ValidUntil = nil }, true},
		{"Held turned False", nil, func(l *v1alpha1.DistributedLock) { l.Status.Conditions[0].Status = metav1.ConditionFalse }, true},
		{"Held's reason changed", nil, func(l *v1alpha1.DistributedLock) { l.Status.Conditions[0].Reason = v1alpha1.ReasonShed }, true},
		{"Held removed", nil, func(l *v1alpha1.DistributedLock) { l.Status.Conditions = nil }, true},
		{"another key", nil, func(l *v1alpha1.DistributedLock) { l.Status.Key = "k2" }, true},
		{"the spec changed", nil, func(l *v1alpha1.DistributedLock) { l.Generation = 2 }, true},
		{"its deletion started", nil, func(l *v1alpha1.DistributedLock) { l.DeletionTimestamp = &metav1.Time{Time: now} }, true},
		{"a validity moved back (not a refresh)", nil, func(l *v1alpha1.DistributedLock) {
			l.Status.ValidUntil = v1alpha1.NewPreciseTime(now.Add(500 * time.Millisecond))
		}, true},
		{"a lock re-created under the same name", nil, func(l *v1alpha1.DistributedLock) { l.UID = "other" }, true},
		{"refused by the namespaces rule of its key", nil, func(l *v1alpha1.DistributedLock) {
			l.Status.Conditions = append(l.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNamespaceNotAllowed})
		}, true},
		{"no longer refused", func(l *v1alpha1.DistributedLock) {
			l.Status.Conditions = append(l.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNamespaceNotAllowed})
		}, func(l *v1alpha1.DistributedLock) {
			l.Status.Conditions[1] = metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid}
		}, true},
		{"Ready's message changed", func(l *v1alpha1.DistributedLock) {
			l.Status.Conditions = append(l.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid})
		}, func(l *v1alpha1.DistributedLock) { l.Status.Conditions[1].Message = "other" }, false},
	} {
		old, cur := held(), held()
		if tc.old != nil {
			tc.old(old)
			tc.old(cur)
		}
		tc.change(cur)
		if got := grantChanged(old, cur, now); got != tc.want {
			t.Errorf("%s: grantChanged = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestDecideHandedBackOnDeletion: a holder whose app the agent runs and
// whose grant was handed back because it is being deleted
// (HolderTerminating, or another reason written since) has not lost it:
// no LockLost, no eviction; the same end of a grant on a pod that is not
// being deleted is a loss.
func TestDecideHandedBackOnDeletion(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	lock := &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: "l"}, Spec: v1alpha1.DistributedLockSpec{OnLost: v1alpha1.LostEvict}}
	lock.Status = v1alpha1.DistributedLockStatus{GrantID: "g", FencingToken: 7, Conditions: []metav1.Condition{{
		Type: v1alpha1.ConditionHeld, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonHolderTerminating}}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "uid-p", Annotations: map[string]string{v1alpha1.FencingTokenAnnotation: "7"}},
		Spec:       corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "app", Command: []string{podagent.Agent, "run", "--", "/app"}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "c", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
	}
	deleting := pod.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: now}
	for _, reason := range []string{v1alpha1.ReasonHolderTerminating, v1alpha1.ReasonPreviousHolderMarked} {
		lock.Status.Conditions[0].Reason = reason
		if d := decide(deleting, lock, now); d.lost != "" || d.evict || d.grant || d.reason != "Terminating" {
			t.Errorf("a holder handed back on its deletion: lost %q, evict %v, grant %v, reason %q; want no loss, Terminating", d.lost, d.evict, d.grant, d.reason)
		}
	}
	lock.Status.Conditions[0].Reason = v1alpha1.ReasonValidityExpired
	if d := decide(deleting, lock, now); d.lost == "" {
		t.Errorf("a holder being deleted whose grant lapsed: lost %q; want LockLost", d.lost)
	}
	if d := decide(pod, lock, now); d.lost == "" || !d.evict {
		t.Errorf("a running pod whose grant ended: lost %q, evict %v; want LockLost and eviction (onLost: Evict)", d.lost, d.evict)
	}
}
