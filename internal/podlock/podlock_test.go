package podlock

import (
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
)

var t0 = time.Unix(1000, 0)

// pod returns a labelled, scheduling-gated pod created at t0+age.
func pod(name string, age time.Duration, mutate ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.Time{Time: t0.Add(age)},
			Labels: map[string]string{v1alpha1.LockLabel: "lock"},
		},
		Spec: corev1.PodSpec{SchedulingGates: []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGate}}},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func running(p *corev1.Pod) {
	p.Spec.SchedulingGates = nil
	p.Spec.NodeName = "node"
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
}

func deleting(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: t0} }

func containersExited(p *corev1.Pod) {
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}}}
}

func succeeded(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }

func heldKey(p *corev1.Pod) {
	p.Annotations = map[string]string{v1alpha1.LockKeyAnnotation: "key", v1alpha1.FencingTokenAnnotation: "7"}
}

// withAgent gives p the agent, as the webhook adds it.
func withAgent(p *corev1.Pod) {
	p.Spec.Containers = []corev1.Container{{Name: "app", Command: []string{podagent.Agent, "run", "--", "/app"}}}
}

// labelMode puts p in holder-label mode: no gate, it runs and waits.
func labelMode(p *corev1.Pod) { p.Labels[v1alpha1.GateModeLabel] = v1alpha1.GateModeHolderLabel }

// passable labels p for isPassable: its last grant can no longer be acted
// on.
func passable(p *corev1.Pod) { p.Labels["test/passable"] = "true" }

func isPassable(p *corev1.Pod) bool { return p.Labels["test/passable"] == "true" }

// unresponsive marks p as the lock controller does.
func unresponsive(p *corev1.Pod) {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[v1alpha1.UnresponsiveAnnotation] = "grant-1"
}

func holderOf(p *corev1.Pod) *v1alpha1.LockHolder {
	return &v1alpha1.LockHolder{Identity: p.Name, Pod: &v1alpha1.PodReference{Name: p.Name, UID: p.UID}}
}

func TestChoose(t *testing.T) {
	a, b, c := pod("a", 0), pod("b", time.Second), pod("c", 2*time.Second)
	aRunning := pod("a", 0, running)
	for _, tc := range []struct {
		name        string
		static      string
		holder      *v1alpha1.LockHolder
		last        *v1alpha1.PodReference
		pods        []*corev1.Pod
		wantStatic  string
		wantPod     string
		wantWaiting []string
	}{
		{"nobody asks: nobody holds", "", nil, nil, nil, "", "", nil},
		{"the oldest pod goes first, the others wait in creation order", "", nil, nil, []*corev1.Pod{c, a, b}, "", "a", []string{"b", "c"}},
		{"pods created together go by name", "", nil, nil, []*corev1.Pod{pod("y", 0), pod("x", 0)}, "", "x", []string{"y"}},
		{"a static holder is served and pods wait behind it", "team", nil, nil, []*corev1.Pod{a, b}, "team", "", []string{"a", "b"}},
		{"the holder keeps the lock while it runs, even if older pods arrive", "", holderOf(pod("b", time.Second)), nil, []*corev1.Pod{a, pod("b", time.Second, running)}, "", "b", []string{"a"}},
		// Granted but still gated in this view: its gate is being lifted,
		// so it may run any moment (the e2e suite once saw two Jobs run).
		{"a granted holder still behind its gate keeps the lock when an older pod arrives", "", holderOf(pod("y", 0)), nil, []*corev1.Pod{pod("x", 0), pod("y", 0)}, "", "y", []string{"x"}},
		{"a granted holder already annotated, still gated, keeps the lock", "", holderOf(pod("y", 0)), nil, []*corev1.Pod{pod("x", 0), pod("y", 0, heldKey)}, "", "y", []string{"x"}},
		{"a former holder annotated and still gated stays first in line", "", nil, nil, []*corev1.Pod{pod("x", 0), pod("y", 0, heldKey)}, "", "y", []string{"x"}},
		{"a finished holder hands over to the next", "", holderOf(aRunning), nil, []*corev1.Pod{pod("a", 0, running, succeeded), b, c}, "", "b", []string{"c"}},
		{"a holder whose object is gone hands over", "", holderOf(aRunning), nil, []*corev1.Pod{b}, "", "b", nil},
		{"a terminating holder whose containers still run keeps the lock", "", holderOf(aRunning), nil, []*corev1.Pod{pod("a", 0, running, deleting), b}, "", "a", []string{"b"}},
		{"a terminating holder whose containers exited hands over", "", holderOf(aRunning), nil, []*corev1.Pod{pod("a", 0, running, deleting, containersExited), b}, "", "b", nil},
		{"a re-created pod of the holder's name is another pod", "", &v1alpha1.LockHolder{Identity: "a", Pod: &v1alpha1.PodReference{Name: "a", UID: "old"}}, nil, []*corev1.Pod{pod("a", 5*time.Second), b}, "", "b", []string{"a"}},
		{"a running holder keeps the lock even when a static holder is asked for", "team", holderOf(aRunning), nil, []*corev1.Pod{aRunning, b}, "", "a", []string{"b"}},
		{"a former holder that still runs after its grant was lost is first in line again", "", nil, nil, []*corev1.Pod{b, pod("a", 5*time.Second, running, heldKey)}, "", "a", []string{"b"}},
		{"a former holder that still runs while being deleted keeps everyone waiting", "team", nil, nil, []*corev1.Pod{b, pod("a", 5*time.Second, running, heldKey, deleting)}, "", "", []string{"b"}},
		// The pod of the last committed grant, whose annotation is not
		// written yet (issue 18, case 4): the pod gate may still ungate it.
		{"the last grant's pod, not yet annotated, is first in line after the grant was lost", "", nil, &v1alpha1.PodReference{Name: "y", UID: "uid-y"}, []*corev1.Pod{pod("x", 0), pod("y", time.Second)}, "", "y", []string{"x"}},
		{"the last grant's pod keeps everyone waiting while it is being deleted", "", nil, &v1alpha1.PodReference{Name: "y", UID: "uid-y"}, []*corev1.Pod{pod("x", 0), pod("y", time.Second, deleting)}, "", "", []string{"x"}},
		{"the last grant's pod that finished does not count", "", nil, &v1alpha1.PodReference{Name: "y", UID: "uid-y"}, []*corev1.Pod{pod("x", 0), pod("y", time.Second, succeeded)}, "", "x", nil},
		{"a former holder that stopped does not count", "", nil, nil, []*corev1.Pod{b, pod("a", 0, running, heldKey, succeeded)}, "", "b", nil},
		{"a pod relabelled after a grant of another key is not queued", "", nil, nil, []*corev1.Pod{
			pod("moved", 0, running, func(p *corev1.Pod) {
				p.Annotations = map[string]string{v1alpha1.LockKeyAnnotation: "other-key", v1alpha1.FencingTokenAnnotation: "3"}
			}), b,
		}, "", "b", nil},
		{"two former holders that still run keep everyone waiting", "", nil, nil, []*corev1.Pod{
			b, pod("a", 5*time.Second, running, heldKey), pod("z", 6*time.Second, running, heldKey),
		}, "", "", []string{"b"}},
		{"a former holder relabelled after its grant keeps everyone waiting while it runs, and is not granted again", "", nil, nil, []*corev1.Pod{
			b, pod("a", 5*time.Second, running, heldKey, func(p *corev1.Pod) { p.Labels[v1alpha1.LockLabel] = "other" }),
		}, "", "", []string{"b"}},
		{"a marked former holder that is passable waits behind every other candidate", "", nil, nil, []*corev1.Pod{
			pod("a", 0, running, labelMode, heldKey, withAgent, unresponsive, passable), b,
		}, "", "b", []string{"a"}},
		{"a marked pod that is passable is granted when nobody else waits", "", nil, nil, []*corev1.Pod{
			pod("a", 0, running, labelMode, heldKey, withAgent, unresponsive, passable),
		}, "", "a", nil},
		{"a marked pod not yet passable keeps everyone waiting and is not granted again", "", nil, &v1alpha1.PodReference{Name: "a", UID: "uid-a"}, []*corev1.Pod{
			b, pod("a", 0, running, heldKey, withAgent, unresponsive),
		}, "", "", []string{"b"}},
		{"a marked pod not yet passable and alone is not granted again", "", nil, nil, []*corev1.Pod{
			pod("a", 0, running, heldKey, withAgent, unresponsive),
		}, "", "", nil},
		{"a marked pod that ended counts for nothing", "", nil, nil, []*corev1.Pod{
			b, pod("a", 0, running, heldKey, withAgent, unresponsive, succeeded),
		}, "", "b", nil},
		{"a marked holder stays the holder until its grant is given up", "", holderOf(aRunning), nil, []*corev1.Pod{
			pod("a", 0, running, heldKey, withAgent, unresponsive), b,
		}, "", "a", []string{"b"}},
		{"the mark counts for nothing on a pod without the agent: nothing would stop it", "", nil, nil, []*corev1.Pod{
			b, pod("a", 5*time.Second, running, heldKey, unresponsive),
		}, "", "a", []string{"b"}},
		{"the mark counts for nothing on a pod whose agent only watches: the app stops itself, if it can", "", nil, nil, []*corev1.Pod{
			b, pod("a", 5*time.Second, running, heldKey, unresponsive, func(p *corev1.Pod) {
				p.Spec.InitContainers = []corev1.Container{{Name: podagent.SidecarContainer, Command: []string{"/agent", "watch"}}}
			}),
		}, "", "a", []string{"b"}},
		{"pods being deleted, finished or without a usable gate never get it", "", nil, nil, []*corev1.Pod{
			pod("deleting", 0, deleting), pod("done", 0, succeeded), pod("ungated", 0, func(p *corev1.Pod) { p.Spec.SchedulingGates = nil }),
			pod("both", 0, func(p *corev1.Pod) {
				p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: v1alpha1.ReadinessGate}}
			}), c,
		}, "", "c", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Choose(tc.static, "lock", "key", tc.holder, tc.last, tc.pods, Rules{Passable: isPassable})
			gotPod := ""
			if got.Pod != nil {
				gotPod = got.Pod.Name
			}
			var waiting []string
			for _, p := range got.Waiting {
				waiting = append(waiting, p.Name)
			}
			if got.Static != tc.wantStatic || gotPod != tc.wantPod || !equal(waiting, tc.wantWaiting) {
				t.Errorf("Choose = static %q, pod %q, waiting %v; want %q, %q, %v", got.Static, gotPod, waiting, tc.wantStatic, tc.wantPod, tc.wantWaiting)
			}
		})
	}
}

func TestProblem(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		ok   bool
	}{
		{"a scheduling-gated pod naming a lock is fine", pod("a", 0), true},
		{"a readiness-gated pod is fine", pod("a", 0, func(p *corev1.Pod) {
			p.Spec.SchedulingGates = nil
			p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: v1alpha1.ReadinessGate}}
		}), true},
		{"no gate is refused", pod("a", 0, func(p *corev1.Pod) { p.Spec.SchedulingGates = nil }), false},
		{"both gates are refused", pod("a", 0, func(p *corev1.Pod) {
			p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: v1alpha1.ReadinessGate}}
		}), false},
		{"a label that cannot name a lock is refused", pod("a", 0, func(p *corev1.Pod) { p.Labels[v1alpha1.LockLabel] = "Not_A_Name" }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Problem(tc.pod); (got == "") != tc.ok {
				t.Errorf("Problem = %q, want ok=%v", got, tc.ok)
			}
		})
	}
}

func TestStopped(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"a gated pod never ran", pod("a", 0), true},
		{"an ungated pod not yet scheduled may run any moment", pod("a", 0, func(p *corev1.Pod) { p.Spec.SchedulingGates = nil }), false},
		{"a running pod runs", pod("a", 0, running), false},
		{"a bound pod without container status may be starting", pod("a", 0, func(p *corev1.Pod) { p.Spec.SchedulingGates, p.Spec.NodeName = nil, "n" }), false},
		{"a terminating pod whose containers exited is stopped", pod("a", 0, running, deleting, containersExited), true},
		{"an exited container of a pod that restarts always will run again", pod("a", 0, running, containersExited), false},
		{"an exited container of a pod that never restarts stays stopped", pod("a", 0, running, containersExited, func(p *corev1.Pod) {
			p.Spec.RestartPolicy = corev1.RestartPolicyNever
		}), true},
		{"a container that failed under OnFailure will run again", pod("a", 0, running, containersExited, func(p *corev1.Pod) {
			p.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
			p.Status.ContainerStatuses[0].State.Terminated.ExitCode = 1
		}), false},
		{"a container that succeeded under OnFailure stays stopped", pod("a", 0, running, containersExited, func(p *corev1.Pod) {
			p.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
		}), true},
		{"an exited sidecar of a live pod is restarted", pod("a", 0, running, containersExited, func(p *corev1.Pod) {
			p.Spec.RestartPolicy = corev1.RestartPolicyNever
			p.Spec.InitContainers = []corev1.Container{{Name: "proxy", RestartPolicy: new(corev1.ContainerRestartPolicyAlways)}}
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "proxy", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}}}
		}), false},
		{"a finished pod is stopped", pod("a", 0, running, succeeded), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Stopped(tc.pod); got != tc.want {
				t.Errorf("Stopped = %v, want %v", got, tc.want)
			}
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestMayHold: what a fresh read of a pod must show before it is granted a
// lock (issue 18, case 7: a stale cache showed a finished pod running).
func TestMayHold(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"gone", nil, false},
		{"waiting behind its gate", pod("p", 0), true},
		{"running", pod("p", 0, running), true},
		{"finished", pod("p", 0, running, succeeded), false},
		{"its containers exited and are not restarted", pod("p", 0, running, func(p *corev1.Pod) {
			p.Spec.RestartPolicy = corev1.RestartPolicyNever
			containersExited(p)
		}), false},
		{"being deleted", pod("p", 0, running, deleting), false},
	} {
		if got := MayHold(tc.pod); got != tc.want {
			t.Errorf("%s: MayHold = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestChooseServesTheCurrentRevisionFirst(t *testing.T) {
	rev := func(hash string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = hash }
	}
	oldA, oldB := pod("old-a", 0, rev("v1")), pod("old-b", time.Second, rev("v1"))
	newA, newB := pod("new-a", 2*time.Second, rev("v2")), pod("new-b", 3*time.Second, rev("v2"))
	stale := func(p *corev1.Pod) bool { return Revision(p) == "v1" }
	for _, tc := range []struct {
		name        string
		holder      *v1alpha1.LockHolder
		pods        []*corev1.Pod
		stale       func(*corev1.Pod) bool
		wantPod     string
		wantWaiting []string
	}{
		{"without revisions known, first come first served", nil, []*corev1.Pod{newB, oldB, newA, oldA}, nil, "old-a", []string{"old-b", "new-a", "new-b"}},
		{"the current revision first, first come first served within each", nil, []*corev1.Pod{newB, oldB, newA, oldA}, stale, "new-a", []string{"new-b", "old-a", "old-b"}},
		{"only old pods: the oldest", nil, []*corev1.Pod{oldB, oldA}, stale, "old-a", []string{"old-b"}},
		{"a running holder of an old revision keeps the lock", holderOf(pod("old-a", 0, running)), []*corev1.Pod{pod("old-a", 0, running, rev("v1")), newA}, stale, "old-a", []string{"new-a"}},
		{"a former holder of an old revision that still runs stays first", nil, []*corev1.Pod{newA, pod("old-a", 0, running, heldKey, rev("v1"))}, stale, "old-a", []string{"new-a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Choose("", "lock", "key", tc.holder, nil, tc.pods, Rules{Stale: tc.stale})
			var waiting []string
			for _, p := range got.Waiting {
				waiting = append(waiting, p.Name)
			}
			if got.Pod == nil || got.Pod.Name != tc.wantPod || !equal(waiting, tc.wantWaiting) {
				t.Errorf("Choose = pod %v, waiting %v; want %q, %v", got.Pod, waiting, tc.wantPod, tc.wantWaiting)
			}
		})
	}
}

// priority gives p a queue priority: its PriorityClass's value
// (spec.priority), as the API server sets it.
func priority(n int32) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Spec.Priority = &n } }

// annotated gives p the annotation redlock.dev/priority.
func annotated(v string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[v1alpha1.PriorityAnnotation] = v
	}
}

// asServiceAccount runs p as sa.
func asServiceAccount(sa string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.ServiceAccountName = sa }
}

// TestChooseQueueOrder: the whole queue order of docs/concepts/queue-order.md
// (issue 22, items 2 and 3).
func TestChooseQueueOrder(t *testing.T) {
	rev := func(hash string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = hash }
	}
	stale := func(p *corev1.Pod) bool { return Revision(p) == "v1" }
	onlyApp := func(p *corev1.Pod) bool {
		return NotAllowed(&v1alpha1.AllowedHolders{ServiceAccounts: []string{"app"}}, "", p) == ""
	}
	for _, tc := range []struct {
		name        string
		holder      *v1alpha1.LockHolder
		pods        []*corev1.Pod
		rules       Rules
		wantPod     string
		wantWaiting []string
	}{
		{"higher priority first, first come first served within one",
			nil, []*corev1.Pod{pod("low-old", 0), pod("high-new", 3*time.Second, priority(100)), pod("high-old", time.Second, priority(100)), pod("mid", 2*time.Second, priority(10))},
			Rules{}, "high-old", []string{"high-new", "mid", "low-old"}},
		{"the annotation overrides the PriorityClass value",
			nil, []*corev1.Pod{pod("class", 0, priority(1000)), pod("annotated", time.Second, priority(1000), annotated("2000")), pod("lowered", 2*time.Second, priority(5000), annotated("-1"))},
			Rules{}, "annotated", []string{"class", "lowered"}},
		{"a pod with an unusable annotation waits nowhere",
			nil, []*corev1.Pod{pod("bad", 0, annotated("high")), pod("ok", time.Second)},
			Rules{}, "ok", nil},
		{"a running holder is never pre-empted by a higher priority",
			holderOf(pod("low", 0, running)), []*corev1.Pod{pod("low", 0, running), pod("high", time.Second, priority(1<<30))},
			Rules{}, "low", []string{"high"}},
		{"a former holder that still runs comes before any priority",
			nil, []*corev1.Pod{pod("high", time.Second, priority(1<<30)), pod("former", 0, running, heldKey)},
			Rules{}, "former", []string{"high"}},
		{"the current revision before a higher priority of an old one",
			nil, []*corev1.Pod{pod("old-high", 0, rev("v1"), priority(100)), pod("new-low", time.Second, rev("v2")), pod("new-high", 2*time.Second, rev("v2"), priority(5))},
			Rules{Stale: stale}, "new-high", []string{"new-low", "old-high"}},
		{"pods of other ServiceAccounts are never queued",
			nil, []*corev1.Pod{pod("other", 0, priority(100)), pod("default", 0), pod("app", time.Second, asServiceAccount("app"))},
			Rules{Allowed: onlyApp}, "app", nil},
		{"a running holder the list no longer allows keeps the lock",
			holderOf(pod("other", 0, running)), []*corev1.Pod{pod("other", 0, running, asServiceAccount("other")), pod("app", time.Second, asServiceAccount("app"))},
			Rules{Allowed: onlyApp}, "other", []string{"app"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Choose("", "lock", "key", tc.holder, nil, tc.pods, tc.rules)
			var waiting []string
			for _, p := range got.Waiting {
				waiting = append(waiting, p.Name)
			}
			gotPod := ""
			if got.Pod != nil {
				gotPod = got.Pod.Name
			}
			if gotPod != tc.wantPod || !equal(waiting, tc.wantWaiting) {
				t.Errorf("Choose = pod %q, waiting %v; want %q, %v", gotPod, waiting, tc.wantPod, tc.wantWaiting)
			}
		})
	}
}

// TestChooseGrantsAFormerHolderNoLongerAllowed: changing who may hold
// never takes the lock from a pod that may still act on its token: a
// former holder (its grant lost in a blip) is granted again, and a
// terminating one keeps everyone waiting.
func TestChooseGrantsAFormerHolderNoLongerAllowed(t *testing.T) {
	onlyApp := Rules{Allowed: func(p *corev1.Pod) bool { return ServiceAccount(p) == "app" }}
	former := pod("former", 0, running, heldKey, asServiceAccount("other"))
	last := &v1alpha1.PodReference{Name: former.Name, UID: former.UID}
	got := Choose("", "lock", "key", nil, last, []*corev1.Pod{former, pod("app", time.Second, asServiceAccount("app"))}, onlyApp)
	if got.Pod == nil || got.Pod.Name != "former" || len(got.Waiting) != 1 || got.Waiting[0].Name != "app" {
		t.Errorf("Choose = pod %v, waiting %d; want former, app waiting", got.Pod, len(got.Waiting))
	}
	// A pod that only carries a key and a token, which anyone who may
	// create pods can write, is no proven former holder: not granted.
	forged := pod("forged", 0, heldKey, asServiceAccount("other"))
	got = Choose("", "lock", "key", nil, nil, []*corev1.Pod{forged, pod("app", time.Second, asServiceAccount("app"))}, onlyApp)
	if got.Pod != nil {
		t.Errorf("Choose granted %s, which only claims to have held the key", got.Pod.Name)
	}
	terminating := pod("former", 0, running, heldKey, asServiceAccount("other"), deleting)
	got = Choose("", "lock", "key", nil, nil, []*corev1.Pod{terminating, pod("app", time.Second, asServiceAccount("app"))}, onlyApp)
	if got.Pod != nil {
		t.Errorf("Choose = pod %v while a terminating former holder may run; want nobody", got.Pod.Name)
	}
}

func TestPriorityAndQueue(t *testing.T) {
	for _, tc := range []struct {
		name        string
		pod         *corev1.Pod
		want        int32
		wantProblem bool
	}{
		{"none", pod("p", 0), 0, false},
		{"PriorityClass", pod("p", 0, priority(7)), 7, false},
		{"annotation", pod("p", 0, priority(7), annotated("-3")), -3, false},
		{"largest", pod("p", 0, annotated("2147483647")), 1<<31 - 1, false},
		{"out of range", pod("p", 0, annotated("2147483648")), 0, true},
		{"not a number", pod("p", 0, annotated("high")), 0, true},
	} {
		got, problem := Priority(tc.pod)
		if got != tc.want || (problem != "") != tc.wantProblem {
			t.Errorf("%s: Priority = %d, %q; want %d, problem %v", tc.name, got, problem, tc.want, tc.wantProblem)
		}
		if tc.wantProblem && (Problem(tc.pod) == "" || SemaphoreProblem(tc.pod) == "") {
			t.Errorf("%s: neither Problem nor SemaphoreProblem refuses the pod", tc.name)
		}
	}
	q := Queue([]*corev1.Pod{pod("a", 0, priority(9)), pod("b", 0)})
	if q.Count != 2 || q.Waiting[0].Priority != 9 || q.Waiting[1].Priority != 0 || q.Waiting[0].Name != "a" || q.Waiting[0].UID != "uid-a" {
		t.Errorf("Queue = %+v", q)
	}
}

func TestNotAllowed(t *testing.T) {
	only := &v1alpha1.AllowedHolders{ServiceAccounts: []string{"app", "default"}}
	for _, tc := range []struct {
		name    string
		allowed *v1alpha1.AllowedHolders
		pod     *corev1.Pod
		want    bool
	}{
		{"no list", nil, pod("p", 0, asServiceAccount("x")), true},
		{"namespaces only", &v1alpha1.AllowedHolders{Namespaces: []string{"a"}}, pod("p", 0, asServiceAccount("x")), true},
		{"named", only, pod("p", 0, asServiceAccount("app")), true},
		{"unset is default", only, pod("p", 0), true},
		{"another", only, pod("p", 0, asServiceAccount("intruder")), false},
	} {
		msg := NotAllowed(tc.allowed, "DistributedLock l", tc.pod)
		if (msg == "") != tc.want {
			t.Errorf("%s: NotAllowed = %q, want allowed %v", tc.name, msg, tc.want)
		}
	}
}

func TestMixedRevisions(t *testing.T) {
	withLabel := func(key, value string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Labels[key] = value }
	}
	deploy := func(h string) func(*corev1.Pod) { return withLabel(appsv1.DefaultDeploymentUniqueLabelKey, h) }
	sts := func(h string) func(*corev1.Pod) { return withLabel(appsv1.ControllerRevisionHashLabelKey, h) }
	for _, tc := range []struct {
		name string
		pods []*corev1.Pod
		want bool
	}{
		{"no pods", nil, false},
		{"pods of no workload", []*corev1.Pod{pod("a", 0), pod("b", 0)}, false},
		{"one ReplicaSet", []*corev1.Pod{pod("a", 0, deploy("v1")), pod("b", 0, deploy("v1")), pod("c", 0)}, false},
		{"two ReplicaSets", []*corev1.Pod{pod("a", 0, deploy("v1")), pod("b", 0), pod("c", 0, deploy("v2"))}, true},
		{"two StatefulSet revisions", []*corev1.Pod{pod("a", 0, sts("s-1")), pod("b", 0, sts("s-2"))}, true},
		{"one StatefulSet revision", []*corev1.Pod{pod("a", 0, sts("s-1")), pod("b", 0, sts("s-1"))}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MixedRevisions(tc.pods); got != tc.want {
				t.Errorf("MixedRevisions = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWaitLimitOf(t *testing.T) {
	minute := &metav1.Duration{Duration: time.Minute}
	withAnnotations := func(kv ...string) *corev1.Pod {
		p := pod("p", 0)
		p.Annotations = map[string]string{}
		for pair := range slices.Chunk(kv, 2) {
			p.Annotations[pair[0]] = pair[len(pair)-1]
		}
		return p
	}
	for _, tc := range []struct {
		name        string
		pod         *corev1.Pod
		timeout     *metav1.Duration
		policy      v1alpha1.WaitTimeoutPolicy
		want        WaitLimit
		wantProblem bool
	}{
		{"none", withAnnotations(), nil, "", WaitLimit{}, false},
		{"the lock's", withAnnotations(), minute, v1alpha1.WaitFail, WaitLimit{Timeout: time.Minute, Fail: true}, false},
		{"the annotations override", withAnnotations(v1alpha1.WaitTimeoutAnnotation, "10s", v1alpha1.OnWaitTimeoutAnnotation, "Keep"), minute, v1alpha1.WaitFail, WaitLimit{Timeout: 10 * time.Second}, false},
		{"an annotation alone", withAnnotations(v1alpha1.OnWaitTimeoutAnnotation, "Fail"), nil, "", WaitLimit{Fail: true}, false},
		{"not a duration", withAnnotations(v1alpha1.WaitTimeoutAnnotation, "soon"), minute, "", WaitLimit{}, true},
		{"too short", withAnnotations(v1alpha1.WaitTimeoutAnnotation, "10ms"), nil, "", WaitLimit{}, true},
		{"too long", withAnnotations(v1alpha1.WaitTimeoutAnnotation, "721h"), nil, "", WaitLimit{}, true},
		{"an unknown policy", withAnnotations(v1alpha1.OnWaitTimeoutAnnotation, "fail"), nil, "", WaitLimit{}, true},
	} {
		got, problem := WaitLimitOf(tc.pod, tc.timeout, tc.policy)
		if got != tc.want || (problem != "") != tc.wantProblem {
			t.Errorf("%s: WaitLimitOf = %+v, %q; want %+v, problem %v", tc.name, got, problem, tc.want, tc.wantProblem)
		}
		if tc.wantProblem && (Problem(tc.pod) == "" || SemaphoreProblem(tc.pod) == "" || AnnotationProblem(tc.pod) == "") {
			t.Errorf("%s: the pod is not refused", tc.name)
		}
	}
	if d := (WaitLimit{Timeout: time.Minute}).WaitDeadline(pod("p", time.Second)); !d.Equal(t0.Add(61 * time.Second)) {
		t.Errorf("WaitDeadline = %v, want creation + 1m", d)
	}
}
