package demo

import (
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

func heldLock(name, key, identity string, token int64) v1alpha1.DistributedLock {
	l := v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.DistributedLockSpec{Key: key}}
	l.Status.Key, l.Status.FencingToken = key, token
	l.Status.Holder = &v1alpha1.LockHolder{Identity: identity}
	meta.SetStatusCondition(&l.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAcquired})
	return l
}

func jobPod(name string, running bool) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LockLabel: JobsLk}}}
	if running {
		p.Status.Phase = corev1.PodRunning
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	} else {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGate}}
	}
	return p
}

// webPod is a Ready pod of the Deployment, marked as the holder of its
// lock when marked.
func webPod(name string, marked bool) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": Deployment}}}
	if marked {
		p.Labels[v1alpha1.HoldsLabel] = LeaderLk
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	return p
}

// The demo's checks are what make its report worth asserting: each broken
// promise must be seen, and a sound sample must pass.
func TestCheckSeesBrokenPromises(t *testing.T) {
	sound := func() snapshot {
		return snapshot{
			locks: []v1alpha1.DistributedLock{heldLock(IdentityLk, "demo/report", Identity, 10), heldLock(JobsLk, "demo/migrations", "migrate-1", 20)},
			pods:  []corev1.Pod{jobPod("migrate-1", true), jobPod("migrate-2", false), webPod("web-a", true), webPod("web-b", false)},
		}
	}
	for _, tc := range []struct {
		name  string
		edit  func(*snapshot)
		wants string
	}{
		{"a sound sample", func(*snapshot) {}, ""},
		{"two locks of one key held", func(s *snapshot) { s.locks = append(s.locks, heldLock(RivalLk, "demo/report", RivalID, 11)) }, "key demo/report held by"},
		{"two Job pods running", func(s *snapshot) { s.pods[1] = jobPod("migrate-2", true) }, "may run at once"},
		{"two pods marked", func(s *snapshot) { s.pods[3] = webPod("web-b", true) }, "marked as the holder at once"},
		{"the identity lock's token changed", func(s *snapshot) { s.locks[0].Status.FencingToken = 12 }, "changed token 10 → 12"},
		{"the identity lock lost", func(s *snapshot) { s.locks[0].Status.Conditions = nil }, "lost its grant"},
		{"a gated pod scheduled", func(s *snapshot) { s.pods[1].Spec.NodeName = "node" }, "scheduled while gated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &demo{start: time.Now(), heldBefore: map[string]bool{}}
			first := sound()
			d.check(snapshot{}, first)
			next := sound()
			tc.edit(&next)
			d.check(first, next)
			got := strings.Join(d.rep.Violations, "; ")
			if tc.wants == "" && got != "" {
				t.Fatalf("violations on a sound sample: %s", got)
			}
			if !strings.Contains(got, tc.wants) {
				t.Fatalf("violations %q, want one containing %q", got, tc.wants)
			}
		})
	}
}

func finishedJob(name string, token int64, start, finish time.Time) corev1.Pod {
	p := jobPod(name, false)
	p.Spec.SchedulingGates = nil
	p.Annotations = map[string]string{v1alpha1.FencingTokenAnnotation: itoa(token)}
	p.Status.Phase = corev1.PodSucceeded
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		Message: itoa(token), StartedAt: metav1.NewTime(start), FinishedAt: metav1.NewTime(finish),
	}}}}
	return p
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestFinishChecksTheRunsFromPodStatus(t *testing.T) {
	t0 := time.Now()
	for _, tc := range []struct {
		name  string
		pods  []corev1.Pod
		crash *Crash
		wants string
	}{
		{"runs one after another with rising tokens", []corev1.Pod{
			finishedJob("a", 5, t0, t0.Add(time.Second)), finishedJob("b", 7, t0.Add(2*time.Second), t0.Add(3*time.Second)),
		}, nil, ""},
		{"overlapping runs", []corev1.Pod{
			finishedJob("a", 5, t0, t0.Add(2*time.Second)), finishedJob("b", 7, t0.Add(time.Second), t0.Add(3*time.Second)),
		}, nil, "b started before a finished"},
		{"a token not rising", []corev1.Pod{
			finishedJob("a", 7, t0, t0.Add(time.Second)), finishedJob("b", 5, t0.Add(2*time.Second), t0.Add(3*time.Second)),
		}, nil, "not above a's 7"},
		{"a member back before its restart delay", nil,
			&Crash{Member: 2, At: t0, ServedAgain: t0.Add(time.Second), OutOfService: time.Second, RestartDelay: 2 * time.Second}, "before its restart delay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &demo{start: t0, snap: snapshot{pods: tc.pods}}
			d.rep.Crash = tc.crash
			rep := d.finish()
			got := strings.Join(rep.Violations, "; ")
			if tc.wants == "" && got != "" {
				t.Fatalf("violations: %s", got)
			}
			if !strings.Contains(got, tc.wants) {
				t.Fatalf("violations %q, want one containing %q", got, tc.wants)
			}
			if len(rep.Missing) == 0 {
				t.Fatal("steps never done are not reported missing")
			}
		})
	}
}

func TestRenderShowsTheCrashedMemberAndHolders(t *testing.T) {
	now := time.Now()
	s := snapshot{at: now, set: &v1alpha1.RedisMasterSet{ObjectMeta: metav1.ObjectMeta{Name: MasterSet}}}
	for i := range 5 {
		state := v1alpha1.MemberServing
		if i == CrashMember {
			state = v1alpha1.MemberDown
		}
		s.set.Status.Members = append(s.set.Status.Members, v1alpha1.MemberStatus{State: state})
	}
	s.locks = []v1alpha1.DistributedLock{heldLock(IdentityLk, "demo/report", Identity, 42)}
	rep := &Report{Crash: &Crash{Member: CrashMember, At: now.Add(-3 * time.Second), RestartDelay: 7 * time.Second}}
	frame := render(s, rep, Options{Namespace: "demo"}, 90*time.Second, []string{"an event"})
	for _, want := range []string{"1:30", "#2 Down (crashed: out 3.0s of 7.0s delay)", IdentityLk, Identity, "42", "an event"} {
		if !strings.Contains(frame, want) {
			t.Errorf("frame lacks %q:\n%s", want, frame)
		}
	}
}
