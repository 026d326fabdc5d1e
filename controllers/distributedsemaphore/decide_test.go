package distributedsemaphore

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/podsim"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

func sem(slots int32) *v1alpha1.DistributedSemaphore {
	return &v1alpha1.DistributedSemaphore{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db", UID: "sem-uid", Generation: 3},
		Spec: v1alpha1.DistributedSemaphoreSpec{
			MasterSet: "masters", Slots: slots, TTL: metav1.Duration{Duration: 10 * time.Second},
		},
	}
}

// slotOf is slot index of slots, as the semaphore s created it; holder
// names the pod holding it ("" for none).
func slotOf(s *v1alpha1.DistributedSemaphore, slots, index int32, holder string) *v1alpha1.DistributedLock {
	l := slotLock(s, slots, index)
	if holder != "" {
		l.Status.Holder = &v1alpha1.LockHolder{Pod: &v1alpha1.PodReference{Name: holder, UID: types.UID(holder)}}
		l.Status.FencingToken = int64(index + 1)
	}
	return l
}

// pod is a gated pod labelled for the semaphore, created at t0+age
// seconds; lock, when set, is its redlock.dev/lock label.
func pod(name string, age int, lock string) *corev1.Pod {
	p := podsim.Gated("ns", name, map[string]string{v1alpha1.SemaphoreLabel: "db"})
	p.UID = types.UID(name)
	p.CreationTimestamp = metav1.NewTime(t0.Add(time.Duration(age) * time.Second))
	if lock != "" {
		p.Labels[v1alpha1.LockLabel] = lock
	}
	return p
}

func names[T metav1.Object](objs []T) []string {
	out := []string{}
	for _, o := range objs {
		out = append(out, o.GetName())
	}
	return out
}

func assigned(as []assignment) map[string]string {
	out := map[string]string{}
	for _, a := range as {
		out[a.pod.Name] = a.lock
	}
	return out
}

func TestDecide(t *testing.T) {
	s2, s3 := sem(2), sem(3)
	foreign := slotLock(s2, 2, 1)
	foreign.OwnerReferences = nil
	stray := foreign.DeepCopy()
	stray.Name = "db-migrations"
	ttlChanged := sem(2)
	ttlChanged.Spec.TTL = metav1.Duration{Duration: 30 * time.Second}
	elsewhere := slotOf(s3, 3, 0, "")
	meta.SetStatusCondition(&elsewhere.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionHeld, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonHeldElsewhere, Message: "another cluster",
	})
	finished := pod("done", 0, "db-2-0")
	finished.Status.Phase = corev1.PodSucceeded
	lockKind := slotOf(s3, 3, 0, "")
	meta.SetStatusCondition(&lockKind.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionHeld, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonKeyKindConflict, Message: "a plain lock holds the key",
	})
	// ended is pod name given slot l, granted it and finished, while l's
	// status still shows it holding.
	ended := func(name string, l *v1alpha1.DistributedLock) *corev1.Pod {
		p := granted(pod(name, 0, ""), l)
		p.Status.Phase = corev1.PodSucceeded
		return p
	}

	cases := []struct {
		name   string
		in     inputs
		create []string
		update []string
		remove []string
		assign map[string]string
		taken  []string
	}{{
		name:   "a new semaphore creates its slots and assigns nobody yet",
		in:     inputs{sem: s2, pods: []*corev1.Pod{pod("a", 0, "")}},
		create: []string{"db-2-0", "db-2-1"},
		assign: map[string]string{},
	}, {
		name: "idle slots go to the first waiting pods, first come first served",
		in: inputs{sem: s2, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, ""), slotOf(s2, 2, 1, "")},
			pods: []*corev1.Pod{pod("late", 5, ""), pod("b", 1, ""), pod("a", 1, "")}},
		assign: map[string]string{"a": "db-2-0", "b": "db-2-1"},
	}, {
		name: "a slot last held elsewhere (another cluster) goes after the free ones",
		in: inputs{sem: s3, locks: []*v1alpha1.DistributedLock{elsewhere, slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")},
			pods: []*corev1.Pod{pod("a", 0, ""), pod("b", 1, ""), pod("c", 2, "")}},
		assign: map[string]string{"a": "db-3-1", "b": "db-3-2", "c": "db-3-0"},
	}, {
		name: "the masters' view: an idle slot whose key another cluster holds goes after the free ones, though never refused here",
		in: inputs{sem: s3, locks: []*v1alpha1.DistributedLock{slotOf(s3, 3, 0, ""), slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")},
			pods: []*corev1.Pod{pod("a", 0, ""), pod("b", 1, ""), pod("c", 2, "")}, free: []bool{false, true, true}},
		assign: map[string]string{"a": "db-3-1", "b": "db-3-2", "c": "db-3-0"},
	}, {
		name: "the masters' view: a slot last refused here and free on the masters now goes first",
		in: inputs{sem: s3, locks: []*v1alpha1.DistributedLock{elsewhere, slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")},
			pods: []*corev1.Pod{pod("a", 0, "")}, free: []bool{true, false, false}},
		assign: map[string]string{"a": "db-3-0"},
	}, {
		name: "the masters' view: a slot whose holder ended is held by its own grant there, and goes before those held elsewhere",
		in: inputs{sem: s3, locks: []*v1alpha1.DistributedLock{slotOf(s3, 3, 0, ""), slotOf(s3, 3, 1, "h"), slotOf(s3, 3, 2, "")},
			pods: []*corev1.Pod{ended("h", slotOf(s3, 3, 1, "")), pod("a", 1, ""), pod("b", 2, "")}, free: []bool{false, false, false}},
		assign: map[string]string{"a": "db-3-1", "b": "db-3-0"},
	}, {
		name: "the masters' view: a slot whose holder ended, last refused, still goes after the free ones",
		in: inputs{sem: s3, locks: []*v1alpha1.DistributedLock{func() *v1alpha1.DistributedLock {
			l := slotOf(s3, 3, 0, "h")
			l.Status.Conditions = elsewhere.Status.Conditions
			return l
		}(), slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "i")},
			pods: []*corev1.Pod{ended("h", slotOf(s3, 3, 0, "")), granted(pod("i", 0, ""), slotOf(s3, 3, 2, "")), pod("a", 1, ""), pod("b", 2, "")}, free: []bool{false, true, false}},
		assign: map[string]string{"a": "db-3-1", "b": "db-3-0"},
	}, {
		name: "a slot last refused for a plain lock of the key goes after the free ones",
		in: inputs{sem: s3, locks: []*v1alpha1.DistributedLock{lockKind, slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")},
			pods: []*corev1.Pod{pod("a", 0, ""), pod("b", 1, "")}},
		assign: map[string]string{"a": "db-3-1", "b": "db-3-2"},
	}, {
		name: "a held slot, a slot with a labelled pod and a pending assignment are not idle",
		in: inputs{sem: s3,
			locks:    []*v1alpha1.DistributedLock{slotOf(s3, 3, 0, "h"), slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")},
			pods:     []*corev1.Pod{pod("h", 0, "db-3-0"), pod("w", 1, "db-3-1"), pod("next", 2, "")},
			expected: map[string]types.UID{"db-3-2": "someone"}},
		assign: map[string]string{},
	}, {
		name: "a finished pod labelled for a slot leaves it idle",
		in: inputs{sem: s2, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, ""), slotOf(s2, 2, 1, "x")},
			pods: []*corev1.Pod{finished, pod("x", 1, "db-2-1"), pod("next", 2, "")}},
		assign: map[string]string{"next": "db-2-0"},
	}, {
		name: "a slot whose holder's pod ended goes to the next pod before its lock shows the slot free",
		in: inputs{sem: s2, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, "h0"), slotOf(s2, 2, 1, "h1")},
			pods: []*corev1.Pod{ended("h0", slotOf(s2, 2, 0, "")), granted(pod("h1", 0, ""), slotOf(s2, 2, 1, "")), pod("next", 1, ""), pod("later", 2, "")}},
		assign: map[string]string{"next": "db-2-0"},
	}, {
		name: "idle slots go first, then those whose holder ended, then those last refused by the masters",
		in: inputs{sem: s3, locks: []*v1alpha1.DistributedLock{elsewhere, slotOf(s3, 3, 1, "h"), slotOf(s3, 3, 2, "")},
			pods: []*corev1.Pod{ended("h", slotOf(s3, 3, 1, "")), pod("a", 1, ""), pod("b", 2, ""), pod("c", 3, "")}},
		assign: map[string]string{"a": "db-3-2", "b": "db-3-1", "c": "db-3-0"},
	}, {
		name: "a slot whose holder ended, given a pod already or with one on its way, is given nobody else",
		in: inputs{sem: s2, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, "h0"), slotOf(s2, 2, 1, "h1")},
			pods:     []*corev1.Pod{ended("h0", slotOf(s2, 2, 0, "")), ended("h1", slotOf(s2, 2, 1, "")), pod("given", 1, "db-2-0"), pod("next", 2, "")},
			expected: map[string]types.UID{"db-2-1": "someone"}},
		assign: map[string]string{},
	}, {
		name: "a pod granted a slot whose lock is gone keeps a slot whose holder ended from being given out",
		in: inputs{sem: s2, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, "h0"), slotOf(s2, 2, 1, "h1")},
			pods: []*corev1.Pod{ended("h0", slotOf(s2, 2, 0, "")), granted(pod("h1", 0, ""), slotOf(s2, 2, 1, "")),
				granted(pod("stray", 0, ""), slotOf(sem(3), 3, 2, "")), pod("next", 1, "")}},
		assign: map[string]string{},
	}, {
		name: "resizing drains: a slot of the previous number whose holder ended stays until its lock shows it free",
		in: inputs{sem: s3, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, "h"), slotOf(s2, 2, 1, "")},
			pods: []*corev1.Pod{ended("h", slotOf(s2, 2, 0, "")), pod("next", 1, "")}},
		remove: []string{"db-2-1"},
		assign: map[string]string{},
	}, {
		name: "slots follow the semaphore's ttl",
		in: inputs{sem: ttlChanged, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, "x"), slotOf(s2, 2, 1, "y")},
			pods: []*corev1.Pod{pod("x", 0, "db-2-0"), pod("y", 0, "db-2-1")}},
		update: []string{"db-2-0", "db-2-1"},
		assign: map[string]string{},
	}, {
		name: "resizing drains: idle slots of the previous number go, held ones stay, nothing new is created or assigned",
		in: inputs{sem: s3, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, "x"), slotOf(s2, 2, 1, "")},
			pods: []*corev1.Pod{pod("x", 0, "db-2-0"), pod("next", 1, "")}},
		remove: []string{"db-2-1"},
		assign: map[string]string{},
	}, {
		name: "a lock the semaphore does not own keeps its name: that slot is neither created nor assigned",
		in: inputs{sem: s2, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, ""), foreign},
			pods: []*corev1.Pod{pod("a", 0, ""), pod("b", 1, "")}},
		assign: map[string]string{"a": "db-2-0"},
		taken:  []string{"db-2-1"},
	}, {
		name: "a lock of another name carrying the semaphore's label takes no slot",
		in: inputs{sem: s2, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, "x"), slotOf(s2, 2, 1, "y"), stray},
			pods: []*corev1.Pod{pod("x", 0, "db-2-0"), pod("y", 0, "db-2-1")}},
		assign: map[string]string{},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := decide(tc.in)
			check := func(what string, got, want []string) {
				t.Helper()
				if want == nil {
					want = []string{}
				}
				if len(got) != len(want) {
					t.Fatalf("%s: got %v, want %v", what, got, want)
				}
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("%s: got %v, want %v", what, got, want)
					}
				}
			}
			check("create", names(p.create), tc.create)
			check("update", names(p.update), tc.update)
			check("remove", names(p.remove), tc.remove)
			check("taken", p.taken, tc.taken)
			got := assigned(p.assign)
			if len(got) != len(tc.assign) {
				t.Fatalf("assign: got %v, want %v", got, tc.assign)
			}
			for k, v := range tc.assign {
				if got[k] != v {
					t.Fatalf("assign: got %v, want %v", got, tc.assign)
				}
			}
			for _, u := range p.update {
				if u.Spec.TTL != tc.in.sem.Spec.TTL {
					t.Fatalf("update of %s has ttl %v, want the semaphore's %v", u.Name, u.Spec.TTL, tc.in.sem.Spec.TTL)
				}
			}
		})
	}
}

func TestComputeStatus(t *testing.T) {
	s3 := sem(3)
	conflict := slotOf(s3, 3, 1, "")
	meta.SetStatusCondition(&conflict.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionHeld, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSlotsConflict, Message: "another number",
	})
	lockKind := slotOf(s3, 3, 1, "")
	meta.SetStatusCondition(&lockKind.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionHeld, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonKeyKindConflict, Message: "a plain lock holds the key",
	})
	cases := []struct {
		name         string
		in           inputs
		held         int32
		slots        int32
		queue        []string
		ready        string
		resizing     string
		holderTokens []int64
	}{{
		name:  "no slots yet",
		in:    inputs{sem: s3},
		slots: 3, ready: v1alpha1.ReasonCreatingSlots, resizing: v1alpha1.ReasonResized,
	}, {
		name: "holders are listed per slot and the queue is the waiting pods in order, holders left out",
		in: inputs{sem: s3, locks: []*v1alpha1.DistributedLock{slotOf(s3, 3, 0, "a"), slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "c")},
			pods: []*corev1.Pod{pod("a", 0, "db-3-0"), pod("c", 0, "db-3-2"), pod("z", 9, ""), pod("y", 8, "")}},
		held: 2, slots: 3, queue: []string{"y", "z"}, ready: v1alpha1.ReasonValid, resizing: v1alpha1.ReasonResized,
		holderTokens: []int64{1, 3},
	}, {
		name: "while draining, status.slots is the previous number and Resizing is True",
		in: inputs{sem: s3, locks: []*v1alpha1.DistributedLock{slotOf(sem(2), 2, 0, "a")},
			pods: []*corev1.Pod{pod("a", 0, "db-2-0")}},
		held: 1, slots: 2, ready: v1alpha1.ReasonValid, resizing: v1alpha1.ReasonDraining, holderTokens: []int64{1},
	}, {
		name:  "a slot refused for another number makes the semaphore not ready with SlotsConflict",
		in:    inputs{sem: s3, locks: []*v1alpha1.DistributedLock{slotOf(s3, 3, 0, ""), conflict, slotOf(s3, 3, 2, "")}},
		slots: 3, ready: v1alpha1.ReasonSlotsConflict, resizing: v1alpha1.ReasonResized,
	}, {
		name:  "a slot refused for a plain lock of the key makes the semaphore not ready with KeyKindConflict",
		in:    inputs{sem: s3, locks: []*v1alpha1.DistributedLock{slotOf(s3, 3, 0, ""), lockKind, slotOf(s3, 3, 2, "")}},
		slots: 3, ready: v1alpha1.ReasonKeyKindConflict, resizing: v1alpha1.ReasonResized,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := computeStatus(tc.in, decide(tc.in))
			if st.Held != tc.held || st.Slots != tc.slots {
				t.Fatalf("held/slots = %d/%d, want %d/%d", st.Held, st.Slots, tc.held, tc.slots)
			}
			var queue []string
			if st.Queue != nil {
				for _, w := range st.Queue.Waiting {
					queue = append(queue, w.Name)
				}
				if int(st.Queue.Count) != len(tc.queue) {
					t.Fatalf("queue count %d, want %d", st.Queue.Count, len(tc.queue))
				}
			}
			if len(queue) != len(tc.queue) || (len(queue) > 0 && (queue[0] != tc.queue[0] || queue[len(queue)-1] != tc.queue[len(tc.queue)-1])) {
				t.Fatalf("queue %v, want %v", queue, tc.queue)
			}
			var tokens []int64
			for _, h := range st.Holders {
				tokens = append(tokens, h.FencingToken)
			}
			if len(tokens) != len(tc.holderTokens) {
				t.Fatalf("holder tokens %v, want %v", tokens, tc.holderTokens)
			}
			for i := range tokens {
				if tokens[i] != tc.holderTokens[i] {
					t.Fatalf("holder tokens %v, want %v", tokens, tc.holderTokens)
				}
			}
			if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); c == nil || c.Reason != tc.ready {
				t.Fatalf("Ready = %+v, want reason %s", c, tc.ready)
			}
			if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionResizing); c == nil || c.Reason != tc.resizing {
				t.Fatalf("Resizing = %+v, want reason %s", c, tc.resizing)
			}
		})
	}
}

// TestDecideAfterTheListNarrowed: a pod given a slot that the semaphore's
// list no longer allows leaves the slot to the next pod only once the
// slot's lock carries the new list (an older copy could still grant it);
// a pod with an unusable annotation leaves it at once; a granted pod
// keeps it; the slots of a previous number follow the list too.
func TestDecideAfterTheListNarrowed(t *testing.T) {
	narrowed := sem(1)
	narrowed.Spec.AllowedHolders = &v1alpha1.AllowedHolders{ServiceAccounts: []string{"app"}}
	other := pod("other", 0, "db-1-0")
	other.Spec.ServiceAccountName = "other"
	next := pod("next", 1, "")
	next.Spec.ServiceAccountName = "app"

	oldCopy := slotOf(sem(1), 1, 0, "") // the slot's lock before the update
	p := decide(inputs{sem: narrowed, locks: []*v1alpha1.DistributedLock{oldCopy}, pods: []*corev1.Pod{other, next}})
	if len(p.assign) != 0 || len(p.update) != 1 {
		t.Errorf("with the slot's old copy of the list: assign %v, update %v; want the update only", assigned(p.assign), names(p.update))
	}
	p = decide(inputs{sem: narrowed, locks: []*v1alpha1.DistributedLock{slotOf(narrowed, 1, 0, "")}, pods: []*corev1.Pod{other, next}})
	if got := assigned(p.assign); got["next"] != "db-1-0" {
		t.Errorf("with the new list on the slot: assign %v, want next on db-1-0", got)
	}

	granted := pod("other", 0, "db-1-0")
	granted.Spec.ServiceAccountName = "other"
	granted.Annotations = map[string]string{v1alpha1.FencingTokenAnnotation: "5"}
	p = decide(inputs{sem: narrowed, locks: []*v1alpha1.DistributedLock{slotOf(narrowed, 1, 0, "")}, pods: []*corev1.Pod{granted, next}})
	if len(p.assign) != 0 {
		t.Errorf("a granted pod lost its slot: assign %v", assigned(p.assign))
	}

	bad := pod("bad", 0, "db-1-0")
	bad.Annotations = map[string]string{v1alpha1.PriorityAnnotation: "high"}
	p = decide(inputs{sem: sem(1), locks: []*v1alpha1.DistributedLock{slotOf(sem(1), 1, 0, "")}, pods: []*corev1.Pod{bad, pod("next", 1, "")}})
	if got := assigned(p.assign); got["next"] != "db-1-0" {
		t.Errorf("a pod with an unusable annotation kept its slot: assign %v", got)
	}

	resized := sem(2)
	resized.Spec.AllowedHolders = narrowed.Spec.AllowedHolders
	p = decide(inputs{sem: resized, locks: []*v1alpha1.DistributedLock{slotOf(sem(1), 1, 0, "holder")}})
	if len(p.update) != 1 || p.update[0].Spec.AllowedHolders == nil {
		t.Errorf("a slot of the previous number does not follow the list: update %v", names(p.update))
	}
}

// granted is pod p given slot l and granted its key: ungated, bound, its
// container running, with the lock's annotations.
func granted(p *corev1.Pod, l *v1alpha1.DistributedLock) *corev1.Pod {
	p.Labels[v1alpha1.LockLabel] = l.Name
	p.Annotations = map[string]string{
		v1alpha1.FencingTokenAnnotation: "7", v1alpha1.LockKeyAnnotation: l.RedisKey(), v1alpha1.LockNameAnnotation: l.Name,
	}
	p.Spec.SchedulingGates, p.Spec.NodeName = nil, "node-1"
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "work", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	return p
}

func deleting(p *corev1.Pod) *corev1.Pod {
	at := metav1.NewTime(t0.Add(time.Minute))
	p.DeletionTimestamp = &at
	return p
}

// stopped reports p's container terminated, as the kubelet does before
// the pod object goes.
func stopped(p *corev1.Pod) *corev1.Pod {
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "work", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}}}
	return p
}

// lostBy is slot l after its grant to p was lost: nobody holds it,
// status.lastHolderPod names p.
func lostBy(l *v1alpha1.DistributedLock, p string) *v1alpha1.DistributedLock {
	l.Status.LastHolderPod = &v1alpha1.PodReference{Name: p, UID: types.UID(p)}
	return l
}

// TestIdle: a slot is idle only when no pod that holds or held it may
// still run (podlock.Ended, being deleted or not), and no pod that waits
// for it may still be granted it (podlock.MayHold).
func TestIdle(t *testing.T) {
	s2 := sem(2)
	slot1 := func() *v1alpha1.DistributedLock { return slotOf(s2, 2, 1, "") }
	heldBy := func(p string) *v1alpha1.DistributedLock {
		l := slotOf(s2, 2, 1, p)
		l.Status.LastHolderPod = l.Status.Holder.Pod
		return l
	}
	finishedHolder := granted(pod("h", 0, ""), slot1())
	finishedHolder.Status.Phase = corev1.PodSucceeded
	sameKeyOtherNumber := granted(pod("h", 0, ""), slotOf(sem(3), 3, 1, ""))
	cases := []struct {
		name string
		lock *v1alpha1.DistributedLock
		pods []*corev1.Pod
		idle bool
	}{
		{"a holder pod being deleted", heldBy("h"), []*corev1.Pod{deleting(granted(pod("h", 0, ""), slot1()))}, false},
		{"a last holder pod being deleted, its grant lost", lostBy(slot1(), "h"), []*corev1.Pod{deleting(granted(pod("h", 0, ""), slot1()))}, false},
		{"a last holder pod being deleted, its containers stopped", lostBy(slot1(), "h"), []*corev1.Pod{stopped(deleting(granted(pod("h", 0, ""), slot1())))}, true},
		{"a last holder pod the cache does not list", lostBy(slot1(), "h"), nil, false},
		{"a last holder pod of that name but another UID", lostBy(slot1(), "h"), []*corev1.Pod{func() *corev1.Pod { p := pod("h", 0, ""); p.UID = "other"; return p }()}, false},
		{"a last holder pod that ended", lostBy(slot1(), "h"), []*corev1.Pod{finishedHolder}, true},
		{"a former holder status no longer names, being deleted", slot1(), []*corev1.Pod{deleting(granted(pod("h", 0, ""), slot1()))}, false},
		{"a pod granted the slot's key by a slot of another number", slot1(), []*corev1.Pod{sameKeyOtherNumber}, false},
		{"a pod waiting for the slot", slot1(), []*corev1.Pod{pod("w", 0, "db-2-1")}, false},
		{"a pod that waited for the slot, being deleted", slot1(), []*corev1.Pod{deleting(pod("w", 0, "db-2-1"))}, true},
		{"a pod waiting for another slot", slot1(), []*corev1.Pod{pod("w", 0, "db-2-0")}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			slots, _ := ownedSlots(inputs{sem: s2, locks: []*v1alpha1.DistributedLock{tc.lock}, pods: tc.pods})
			if len(slots) != 1 {
				t.Fatalf("slots: %d, want 1", len(slots))
			}
			if got := slots[0].idle(nil); got != tc.idle {
				t.Errorf("idle = %v, want %v", got, tc.idle)
			}
		})
	}
}

// TestEnding: a slot is given the next pod before its lock ends the grant
// (ending) only when the pod status.holder names, as cached, ended
// (podlock.Ended: its containers will not run again) and nothing else
// keeps the slot busy; such a slot is not idle (it is not removed).
func TestEnding(t *testing.T) {
	s2 := sem(2)
	slot1 := func() *v1alpha1.DistributedLock { return slotOf(s2, 2, 1, "") }
	heldBy := func(p string) *v1alpha1.DistributedLock {
		l := slotOf(s2, 2, 1, p)
		l.Status.LastHolderPod = l.Status.Holder.Pod
		return l
	}
	holder := func() *corev1.Pod { return granted(pod("h", 0, ""), slot1()) }
	finished := func(phase corev1.PodPhase) *corev1.Pod {
		p := stopped(holder())
		p.Status.Phase = phase
		return p
	}
	restarting := holder()
	restarting.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	restarting.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}
	otherUID := finished(corev1.PodSucceeded)
	otherUID.UID = "other"
	lastUnseen := heldBy("h")
	lastUnseen.Status.LastHolderPod = &v1alpha1.PodReference{Name: "gone", UID: "gone"}
	static := slot1()
	static.Status.Holder = &v1alpha1.LockHolder{Identity: "by-hand"}
	deleted := heldBy("h")
	deleted.DeletionTimestamp = &metav1.Time{Time: t0}
	cases := []struct {
		name     string
		lock     *v1alpha1.DistributedLock
		pods     []*corev1.Pod
		expected map[string]types.UID
		ending   bool
	}{
		{name: "its holder pod succeeded", lock: heldBy("h"), pods: []*corev1.Pod{finished(corev1.PodSucceeded)}, ending: true},
		{name: "its holder pod failed", lock: heldBy("h"), pods: []*corev1.Pod{finished(corev1.PodFailed)}, ending: true},
		{name: "its holder pod being deleted, its containers stopped", lock: heldBy("h"), pods: []*corev1.Pod{stopped(deleting(holder()))}, ending: true},
		{name: "its holder pod running", lock: heldBy("h"), pods: []*corev1.Pod{holder()}},
		{name: "its holder pod being deleted, still running", lock: heldBy("h"), pods: []*corev1.Pod{deleting(holder())}},
		{name: "its holder's container exited and will be restarted", lock: heldBy("h"), pods: []*corev1.Pod{restarting}},
		{name: "its holder pod the cache does not list", lock: heldBy("h")},
		{name: "a pod of the holder's name but another UID ended", lock: heldBy("h"), pods: []*corev1.Pod{otherUID}},
		{name: "its holder ended, a pod given the slot waits", lock: heldBy("h"), pods: []*corev1.Pod{finished(corev1.PodSucceeded), pod("w", 1, "db-2-1")}},
		{name: "its holder ended, an assignment is on its way", lock: heldBy("h"), pods: []*corev1.Pod{finished(corev1.PodSucceeded)}, expected: map[string]types.UID{"db-2-1": "w"}},
		{name: "its holder ended, a former holder of its key still runs", lock: heldBy("h"),
			pods: []*corev1.Pod{finished(corev1.PodSucceeded), deleting(granted(pod("before", 0, ""), slot1()))}},
		{name: "its holder ended, status.lastHolderPod names a pod the cache does not list", lock: lastUnseen, pods: []*corev1.Pod{finished(corev1.PodSucceeded)}},
		{name: "its holder ended, the slot's lock being deleted", lock: deleted, pods: []*corev1.Pod{finished(corev1.PodSucceeded)}},
		{name: "a static holder", lock: static},
		{name: "nobody holds it (idle, not ending)", lock: slot1()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			slots, _ := ownedSlots(inputs{sem: s2, locks: []*v1alpha1.DistributedLock{tc.lock}, pods: tc.pods})
			if len(slots) != 1 {
				t.Fatalf("slots: %d, want 1", len(slots))
			}
			if got := slots[0].ending(tc.expected); got != tc.ending {
				t.Errorf("ending = %v, want %v", got, tc.ending)
			}
			if tc.lock.Status.Holder != nil && slots[0].idle(tc.expected) {
				t.Error("idle with status showing a holder: the slot could be removed before its lock ends the grant")
			}
		})
	}
}

// TestDecideKeepsFormerHolders: a shrink removes a slot of the previous
// number only once its former holder, being deleted, stopped; a pod
// granted a slot whose lock is gone keeps a slot of the new number from
// being given out while it may run.
func TestDecideKeepsFormerHolders(t *testing.T) {
	s1, s2 := sem(1), sem(2)
	ended := granted(pod("a", 0, ""), slotOf(s2, 2, 0, ""))
	ended.Status.Phase = corev1.PodSucceeded
	terminating := deleting(granted(pod("b", 0, ""), slotOf(s2, 2, 1, "")))
	p := decide(inputs{sem: s1, locks: []*v1alpha1.DistributedLock{lostBy(slotOf(s2, 2, 0, ""), "a"), lostBy(slotOf(s2, 2, 1, ""), "b")},
		pods: []*corev1.Pod{ended, terminating, pod("next", 1, "")}})
	if got := names(p.remove); len(got) != 1 || got[0] != "db-2-0" || len(p.create)+len(p.assign) != 0 {
		t.Errorf("draining past a terminating former holder: remove %v, create %v, assign %v; want db-2-0 removed only", got, names(p.create), assigned(p.assign))
	}
	p = decide(inputs{sem: s1, locks: []*v1alpha1.DistributedLock{lostBy(slotOf(s2, 2, 1, ""), "b")},
		pods: []*corev1.Pod{ended, stopped(terminating.DeepCopy()), pod("next", 1, "")}})
	if got := names(p.remove); len(got) != 1 || got[0] != "db-2-1" {
		t.Errorf("once the former holder stopped: remove %v, want db-2-1", got)
	}

	// The semaphore was deleted with its slots, and made again with one.
	stray := granted(pod("b", 0, ""), slotOf(s2, 2, 1, ""))
	p = decide(inputs{sem: s1, locks: []*v1alpha1.DistributedLock{slotOf(s1, 1, 0, "")}, pods: []*corev1.Pod{stray, pod("next", 1, "")}})
	if len(p.assign) != 0 {
		t.Errorf("with a holder of a slot whose lock is gone still running: assign %v, want none", assigned(p.assign))
	}
	p = decide(inputs{sem: s1, locks: []*v1alpha1.DistributedLock{slotOf(s1, 1, 0, "")}, pods: []*corev1.Pod{stopped(deleting(stray.DeepCopy())), pod("next", 1, "")}})
	if got := assigned(p.assign); got["next"] != "db-1-0" {
		t.Errorf("once that holder stopped: assign %v, want next on db-1-0", got)
	}
	other := sem(1)
	other.Spec.Key = "another"
	p = decide(inputs{sem: other, locks: []*v1alpha1.DistributedLock{slotOf(other, 1, 0, "")}, pods: []*corev1.Pod{stray, pod("next", 1, "")}})
	if got := assigned(p.assign); got["next"] != "db-1-0" {
		t.Errorf("a holder of another key's slot: assign %v, want next on db-1-0", got)
	}
}

// TestSlotChanged: the semaphore is woken by a slot lock's change of
// holder or last holder pod, not by a refresh of its validity.
func TestSlotChanged(t *testing.T) {
	old := lostBy(slotOf(sem(2), 2, 1, ""), "h")
	refreshed := old.DeepCopy()
	refreshed.Status.RenewedAt = v1alpha1.NewPreciseTime(t0)
	if slotChanged(old, refreshed) {
		t.Error("a refresh of the validity woke the semaphore")
	}
	cleared := old.DeepCopy()
	cleared.Status.LastHolderPod = nil
	if !slotChanged(old, cleared) {
		t.Error("status.lastHolderPod cleared did not wake the semaphore")
	}
}

// TestChoosesSlots: the masters are asked which slots are free only when
// a pod waits and a slot of the current number is idle.
func TestChoosesSlots(t *testing.T) {
	s2 := sem(2)
	for _, tc := range []struct {
		name string
		in   inputs
		want bool
	}{
		{"nobody waits", inputs{sem: s2, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, ""), slotOf(s2, 2, 1, "")}}, false},
		{"a pod waits, a slot idle", inputs{sem: s2, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, "h"), slotOf(s2, 2, 1, "")},
			pods: []*corev1.Pod{granted(pod("h", 0, ""), slotOf(s2, 2, 0, "")), pod("a", 1, "")}}, true},
		{"a pod waits for a slot held elsewhere, a slot idle", inputs{sem: s2, locks: []*v1alpha1.DistributedLock{heldElsewhereSlot(slotOf(s2, 2, 0, "")), slotOf(s2, 2, 1, "")},
			pods: []*corev1.Pod{pod("w", 1, "db-2-0")}}, true},
		{"a pod waits, every slot held", inputs{sem: s2, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, "h"), slotOf(s2, 2, 1, "i")},
			pods: []*corev1.Pod{granted(pod("h", 0, ""), slotOf(s2, 2, 0, "")), granted(pod("i", 0, ""), slotOf(s2, 2, 1, "")), pod("a", 1, "")}}, false},
		{"a pod waits, only a slot of the previous number idle", inputs{sem: s2, locks: []*v1alpha1.DistributedLock{slotOf(sem(3), 3, 2, "")},
			pods: []*corev1.Pod{pod("a", 1, "")}}, false},
		{"a pod waits, a slot idle, but slots of the previous number drain", inputs{sem: s2, locks: []*v1alpha1.DistributedLock{slotOf(s2, 2, 0, ""), slotOf(sem(3), 3, 2, "h")},
			pods: []*corev1.Pod{pod("a", 1, "")}}, false},
		{"a pod waits, a slot idle, but the key's rule refuses the namespace", inputs{sem: s2, locks: []*v1alpha1.DistributedLock{refusedSlot(slotOf(s2, 2, 0, "")), slotOf(s2, 2, 1, "")},
			pods: []*corev1.Pod{pod("a", 1, "")}}, false},
	} {
		if got := choosesSlots(tc.in); got != tc.want {
			t.Errorf("%s: choosesSlots = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// heldElsewhereSlot is l as the lock controller shows it when the masters
// refused it for another holder of its key.
func heldElsewhereSlot(l *v1alpha1.DistributedLock) *v1alpha1.DistributedLock {
	meta.SetStatusCondition(&l.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionHeld, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonHeldElsewhere, Message: "another cluster",
	})
	return l
}

// refusedSlot is l as the lock controller shows it when the key's rule
// refuses its namespace.
func refusedSlot(l *v1alpha1.DistributedLock) *v1alpha1.DistributedLock {
	meta.SetStatusCondition(&l.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNamespaceNotAllowed, Message: "refused",
	})
	return l
}

// TestDecideMoves: a pod that waits for a slot another cluster holds
// moves to an idle slot the masters show free, first in queue order and
// before any new pod is given one; not without the masters' view, not
// once its own slot is free there, not once granted, and not for a
// refusal a move cannot help.
func TestDecideMoves(t *testing.T) {
	s3 := sem(3)
	refusedFor := func(index int32, reason string) *v1alpha1.DistributedLock {
		l := slotOf(s3, 3, index, "")
		meta.SetStatusCondition(&l.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionHeld, Status: metav1.ConditionFalse, Reason: reason, Message: "refused",
		})
		return l
	}
	locks := func(ls ...*v1alpha1.DistributedLock) []*v1alpha1.DistributedLock { return ls }
	elsewhere0, elsewhere1 := refusedFor(0, v1alpha1.ReasonHeldElsewhere), refusedFor(1, v1alpha1.ReasonHeldElsewhere)
	fenced := func(l *v1alpha1.DistributedLock, pod string) *v1alpha1.DistributedLock {
		l = l.DeepCopy()
		l.Annotations = map[string]string{v1alpha1.MovingPodAnnotation: pod}
		return l
	}
	failed := pod("w", 0, "db-3-0")
	failed.Status.Phase = corev1.PodFailed
	tokened := pod("w", 0, "db-3-0")
	tokened.Annotations = map[string]string{v1alpha1.FencingTokenAnnotation: "7"}
	for _, tc := range []struct {
		name       string
		in         inputs
		move       map[string]string
		assign     map[string]string
		stuck      int
		leftBehind []string
	}{{
		name: "to the slot free on the masters, before a new pod",
		in: inputs{sem: s3, locks: locks(elsewhere0, slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")),
			pods: []*corev1.Pod{pod("w", 0, "db-3-0"), pod("a", 1, "")}, free: []bool{false, true, false}},
		move: map[string]string{"w": "db-3-1"}, assign: map[string]string{"a": "db-3-2"}, stuck: 1,
	}, {
		name: "the first in queue order moves when one slot is free",
		in: inputs{sem: s3, locks: locks(elsewhere0, elsewhere1, slotOf(s3, 3, 2, "")),
			pods: []*corev1.Pod{pod("w", 5, "db-3-0"), pod("v", 1, "db-3-1")}, free: []bool{false, false, true}},
		move: map[string]string{"v": "db-3-2"}, assign: map[string]string{}, stuck: 2,
	}, {
		name: "not without the masters' view",
		in: inputs{sem: s3, locks: locks(elsewhere0, slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")),
			pods: []*corev1.Pod{pod("w", 0, "db-3-0")}},
		move: map[string]string{}, assign: map[string]string{}, stuck: 1,
	}, {
		name: "not once its own slot is free on the masters",
		in: inputs{sem: s3, locks: locks(elsewhere0, slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")),
			pods: []*corev1.Pod{pod("w", 0, "db-3-0")}, free: []bool{true, true, true}},
		move: map[string]string{}, assign: map[string]string{}, stuck: 1,
	}, {
		name: "not while no idle slot is free on the masters",
		in: inputs{sem: s3, locks: locks(elsewhere0, slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")),
			pods: []*corev1.Pod{pod("w", 0, "db-3-0")}, free: []bool{false, false, false}},
		move: map[string]string{}, assign: map[string]string{}, stuck: 1,
	}, {
		name: "nothing to look for without a slot idle here",
		in: inputs{sem: s3, locks: locks(elsewhere0, slotOf(s3, 3, 1, "b"), slotOf(s3, 3, 2, "c")),
			pods: []*corev1.Pod{pod("w", 0, "db-3-0"), pod("b", 1, "db-3-1"), pod("c", 2, "db-3-2")}, free: []bool{false, true, true}},
		move: map[string]string{}, assign: map[string]string{}, stuck: 0,
	}, {
		name: "a pod a move left behind is taken back, not moved again",
		in: inputs{sem: s3, locks: locks(fenced(elsewhere0, "w"), slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")),
			pods: []*corev1.Pod{pod("w", 0, "db-3-0")}, free: []bool{false, true, true}},
		move: map[string]string{}, assign: map[string]string{}, stuck: 0, leftBehind: []string{"w"},
	}, {
		name: "a slot fenced against a pod that moved is given again (its fence cleared then)",
		in: inputs{sem: s3, locks: locks(fenced(slotOf(s3, 3, 0, ""), "w"), slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")),
			pods: []*corev1.Pod{pod("w", 0, "db-3-1"), pod("a", 1, "")}, free: []bool{true, true, true}},
		move: map[string]string{}, assign: map[string]string{"a": "db-3-0"}, stuck: 0,
	}, {
		name: "a fence whose move the cache does not show yet stays",
		in: inputs{sem: s3, locks: locks(fenced(elsewhere0, "w"), slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")),
			pods: []*corev1.Pod{pod("w", 0, "db-3-0")}, free: []bool{false, true, true}, expected: map[string]types.UID{"db-3-1": "w"}},
		move: map[string]string{}, assign: map[string]string{}, stuck: 0,
	}, {
		name: "a pod left behind that failed is no obstacle: its slot is given again",
		in: inputs{sem: s3, locks: locks(fenced(slotOf(s3, 3, 0, ""), "w"), slotOf(s3, 3, 1, "b"), slotOf(s3, 3, 2, "c")),
			pods: []*corev1.Pod{failed, pod("b", 1, "db-3-1"), pod("c", 2, "db-3-2"), pod("a", 3, "")}, free: []bool{true, false, false}},
		move: map[string]string{}, assign: map[string]string{"a": "db-3-0"}, stuck: 0,
	}, {
		name: "not a pod granted a token",
		in: inputs{sem: s3, locks: locks(elsewhere0, slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")),
			pods: []*corev1.Pod{tokened}, free: []bool{false, true, true}},
		move: map[string]string{}, assign: map[string]string{}, stuck: 0,
	}, {
		name: "not for another number of slots declared (every slot is refused alike)",
		in: inputs{sem: s3, locks: locks(refusedFor(0, v1alpha1.ReasonSlotsConflict), slotOf(s3, 3, 1, ""), slotOf(s3, 3, 2, "")),
			pods: []*corev1.Pod{pod("w", 0, "db-3-0")}, free: []bool{false, true, true}},
		move: map[string]string{}, assign: map[string]string{}, stuck: 0,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			p := decide(tc.in)
			for what, pair := range map[string][2]map[string]string{"move": {assigned(p.move), tc.move}, "assign": {assigned(p.assign), tc.assign}} {
				got, want := pair[0], pair[1]
				if len(got) != len(want) {
					t.Fatalf("%s: got %v, want %v", what, got, want)
				}
				for k, v := range want {
					if got[k] != v {
						t.Fatalf("%s: got %v, want %v", what, got, want)
					}
				}
			}
			if p.stuck != tc.stuck {
				t.Errorf("stuck: %d, want %d", p.stuck, tc.stuck)
			}
			var left []string
			for _, pod := range p.leftBehind {
				left = append(left, pod.Name)
			}
			if !slices.Equal(left, tc.leftBehind) {
				t.Errorf("left behind: %v, want %v", left, tc.leftBehind)
			}
			for _, a := range slices.Concat(p.move, p.assign) {
				if a.to == nil || a.to.Name != a.lock {
					t.Errorf("%s given slot %s with its lock %v", a.pod.Name, a.lock, a.to)
				}
			}
			for _, a := range p.move {
				if a.from == nil || a.from.Name != a.pod.Labels[v1alpha1.LockLabel] {
					t.Errorf("move of %s from %v, want from its slot", a.pod.Name, a.from)
				}
			}
		})
	}
}
