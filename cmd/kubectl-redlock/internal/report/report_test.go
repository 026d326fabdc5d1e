package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/printers"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

var now = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func lockWith(ns, name string, mod func(*v1alpha1.DistributedLock)) *v1alpha1.DistributedLock {
	l := &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("lock-" + name)},
		Spec: v1alpha1.DistributedLockSpec{MasterSet: "masters", TTL: metav1.Duration{Duration: 30 * time.Second}}}
	if mod != nil {
		mod(l)
	}
	return l
}

func grantedTo(pod string, uid types.UID, validFor time.Duration) func(*v1alpha1.DistributedLock) {
	return func(l *v1alpha1.DistributedLock) {
		l.Status.Holder = &v1alpha1.LockHolder{Identity: pod, Pod: &v1alpha1.PodReference{Name: pod, UID: uid}}
		l.Status.ValidUntil = v1alpha1.NewPreciseTime(now.Add(validFor))
		l.Status.FencingToken, l.Status.GrantID = 42, "g-"+pod
	}
}

func queued(refs ...v1alpha1.PodReference) func(*v1alpha1.DistributedLock) {
	return func(l *v1alpha1.DistributedLock) {
		q := &v1alpha1.LockQueue{Count: int32(len(refs))} //nolint:gosec // a few
		for _, r := range refs {
			q.Waiting = append(q.Waiting, v1alpha1.QueuedPod{Name: r.Name, UID: r.UID})
		}
		l.Status.Queue = q
	}
}

func both(fs ...func(*v1alpha1.DistributedLock)) func(*v1alpha1.DistributedLock) {
	return func(l *v1alpha1.DistributedLock) {
		for _, f := range fs {
			f(l)
		}
	}
}

func condition(t, status, reason, msg string) func(*v1alpha1.DistributedLock) {
	return func(l *v1alpha1.DistributedLock) {
		l.Status.Conditions = append(l.Status.Conditions, metav1.Condition{Type: t, Status: metav1.ConditionStatus(status), Reason: reason, Message: msg})
	}
}

func podWith(name, lock string, mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID("uid-" + name),
		CreationTimestamp: metav1.NewTime(now.Add(-time.Minute))}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
	if lock != "" {
		p.Labels = map[string]string{v1alpha1.LockLabel: lock}
	}
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGate}}
	if mod != nil {
		mod(p)
	}
	return p
}

func ref(name string) v1alpha1.PodReference {
	return v1alpha1.PodReference{Name: name, UID: types.UID("uid-" + name)}
}

func TestValidity(t *testing.T) {
	for _, tc := range []struct {
		name  string
		st    v1alpha1.DistributedLockStatus
		valid bool
		shown string
	}{
		{"nobody", v1alpha1.DistributedLockStatus{}, false, "-"},
		{"holder without validity", v1alpha1.DistributedLockStatus{Holder: &v1alpha1.LockHolder{Identity: "x"}}, false, "-"},
		{"validity without holder (released)", v1alpha1.DistributedLockStatus{ValidUntil: v1alpha1.NewPreciseTime(now.Add(time.Minute))}, false, "-"},
		{"held", v1alpha1.DistributedLockStatus{Holder: &v1alpha1.LockHolder{Identity: "x"}, ValidUntil: v1alpha1.NewPreciseTime(now.Add(19500 * time.Millisecond))}, true, "19s"},
		{"held for minutes", v1alpha1.DistributedLockStatus{Holder: &v1alpha1.LockHolder{Identity: "x"}, ValidUntil: v1alpha1.NewPreciseTime(now.Add(5*time.Minute + 3*time.Second))}, true, "5m3s"},
		{"ends now", v1alpha1.DistributedLockStatus{Holder: &v1alpha1.LockHolder{Identity: "x"}, ValidUntil: v1alpha1.NewPreciseTime(now)}, false, "expired"},
		{"passed", v1alpha1.DistributedLockStatus{Holder: &v1alpha1.LockHolder{Identity: "x"}, ValidUntil: v1alpha1.NewPreciseTime(now.Add(-time.Second))}, false, "expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, valid, shown := Validity(tc.st, now)
			if valid != tc.valid || shown != tc.shown {
				t.Fatalf("Validity = %v, %q; want %v, %q", valid, shown, tc.valid, tc.shown)
			}
		})
	}
}

func TestKey(t *testing.T) {
	for _, tc := range []struct {
		lock *v1alpha1.DistributedLock
		want string
	}{
		{lockWith("shop", "a", nil), "redlock:shop/a"},
		{lockWith("shop", "a", func(l *v1alpha1.DistributedLock) { l.Spec.Key = "ledger" }), "ledger"},
		{lockWith("shop", "a", func(l *v1alpha1.DistributedLock) { l.Spec.Key, l.Status.Key = "ledger", "ledger-in-use" }), "ledger-in-use"},
	} {
		if got := Key(tc.lock); got != tc.want {
			t.Errorf("Key(%s) = %q, want %q", tc.lock.Name, got, tc.want)
		}
	}
}

func TestLocksAndWho(t *testing.T) {
	locks := []v1alpha1.DistributedLock{
		*lockWith("shop", "b", func(l *v1alpha1.DistributedLock) { l.Spec.Key = "ledger" }),
		*lockWith("billing", "z", both(func(l *v1alpha1.DistributedLock) { l.Spec.Key = "ledger" }, grantedTo("p", "u", 10*time.Second))),
		*lockWith("shop", "a", queued(ref("x"), ref("y"))),
	}
	l := Locks(locks, now)
	var names []string
	for _, x := range l.Items {
		names = append(names, x.Namespace+"/"+x.Name)
	}
	if got := strings.Join(names, " "); got != "billing/z shop/a shop/b" {
		t.Fatalf("Locks order = %s", got)
	}
	if l.Items[0].Holder.String() != "pod/p" || !l.Items[0].Held || l.Items[0].ValidFor != "10s" || l.Items[1].Waiting != 2 {
		t.Fatalf("Locks = %+v", l.Items)
	}
	w := Who("ledger", locks, now)
	if len(w.Items) != 2 || w.Items[0].Namespace != "billing" || w.Items[1].Name != "b" {
		t.Fatalf("Who(ledger) = %+v", w.Items)
	}
	if w := Who("redlock:shop/a", locks, now); len(w.Items) != 1 || w.Items[0].Name != "a" {
		t.Fatalf("Who(default key) = %+v", w.Items)
	}
	if w := Who("nothing", locks, now); w.Items == nil || len(w.Items) != 0 {
		t.Fatalf("Who(nothing) = %#v, want an empty list (JSON [])", w.Items)
	}
	var b bytes.Buffer
	if err := WriteStatus(&b, &l, false); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if strings.Join(strings.Fields(lines[0]), " ") != "NAMESPACE NAME KEY HOLDER VALID-FOR TOKEN WAITING" ||
		strings.Join(strings.Fields(lines[1]), " ") != "billing z ledger pod/p 10s 42 0" ||
		strings.Join(strings.Fields(lines[2]), " ") != "shop a redlock:shop/a - - - 2" {
		t.Fatalf("status table:\n%s", b.String())
	}
}

func TestGates(t *testing.T) {
	readiness := func(status corev1.ConditionStatus) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.SchedulingGates = nil
			p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: v1alpha1.ReadinessGate}}
			if status != "" {
				p.Status.Conditions = []corev1.PodCondition{{Type: v1alpha1.ReadinessGate, Status: status}}
			}
		}
	}
	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		gate  string
		gated bool
	}{
		{"scheduling gate", podWith("a", "l", nil), GateScheduling, true},
		{"scheduling gate lifted", podWith("a", "l", func(p *corev1.Pod) { p.Spec.SchedulingGates = nil }), GateNone, false},
		{"readiness gate, no condition yet", podWith("a", "l", readiness("")), GateReadiness, true},
		{"readiness gate False", podWith("a", "l", readiness(corev1.ConditionFalse)), GateReadiness, true},
		{"readiness gate True", podWith("a", "l", readiness(corev1.ConditionTrue)), GateReadiness, false},
		{"label mode", podWith("a", "l", func(p *corev1.Pod) {
			p.Spec.SchedulingGates = nil
			p.Labels[v1alpha1.GateModeLabel] = v1alpha1.GateModeHolderLabel
		}), GateLabel, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if g := GateOf(tc.pod); g != tc.gate {
				t.Errorf("GateOf = %q, want %q", g, tc.gate)
			}
			if g := Gated(tc.pod); g != tc.gated {
				t.Errorf("Gated = %v, want %v", g, tc.gated)
			}
		})
	}
}

func TestExplain(t *testing.T) {
	me := ref("me")
	holder := podWith("holder", "l", func(p *corev1.Pod) { p.Spec.SchedulingGates, p.Status.Phase = nil, corev1.PodRunning })
	deleting := holder.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: now.Add(-5 * time.Second)}
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		lock      *v1alpha1.DistributedLock
		holderPod *corev1.Pod
		lastPod   *corev1.Pod
		reason    string
		says      []string
	}{
		{"no such lock", podWith("me", "l", nil), nil, nil, nil, WhyLockNotFound, []string{`no DistributedLock "l" exists in namespace shop`}},
		{"behind a pod holder, second in line", podWith("me", "l", nil),
			lockWith("shop", "l", both(grantedTo("holder", "uid-holder", 19*time.Second), queued(ref("first"), me))), holder, nil,
			WhyWaitingForHolder, []string{"waits for pod holder (Running), which holds the lock (valid for 19s", "1 pod is ahead of it in line (first)"}},
		{"holder being deleted", podWith("me", "l", nil),
			lockWith("shop", "l", both(grantedTo("holder", "uid-holder", 19*time.Second), queued(me))), deleting, nil,
			WhyHolderTerminating, []string{"pod holder, which holds the lock and is being deleted (for 5s)", "once that pod's containers have stopped"}},
		{"holder gone", podWith("me", "l", nil),
			lockWith("shop", "l", both(grantedTo("holder", "uid-holder", 19*time.Second), queued(me))), nil, nil,
			WhyHolderGone, []string{"no longer exists"}},
		{"static holder", podWith("me", "l", nil),
			lockWith("shop", "l", both(func(l *v1alpha1.DistributedLock) {
				l.Spec.HolderIdentity = "nightly"
				l.Status.Holder = &v1alpha1.LockHolder{Identity: "nightly"}
			}, queued(me))), nil, nil,
			WhyStaticHolder, []string{`static holder "nightly" (spec.holderIdentity)`, "kubectl redlock handover l"}},
		{"static holder whose request ended, its grant being given up", podWith("me", "l", nil),
			lockWith("shop", "l", both(func(l *v1alpha1.DistributedLock) {
				l.Spec.HolderIdentity = "nightly"
				l.Status.Holder = &v1alpha1.LockHolder{Identity: "nightly"}
				l.Status.EndedRequest = &v1alpha1.EndedRequest{Identity: "nightly", Reason: v1alpha1.ReasonLeaseExpired}
			}, queued(me))), nil, nil,
			WhyReleasing, []string{`still held by "nightly", which the spec no longer asks for`}},
		{"quorum unavailable", podWith("me", "l", nil),
			lockWith("shop", "l", both(queued(me), condition(v1alpha1.ConditionHeld, "False", v1alpha1.ReasonQuorumUnavailable, "2 of 3 masters down"))), nil, nil,
			WhyLockNotHeld, []string{"nobody holds the lock: Held=False, reason QuorumUnavailable: 2 of 3 masters down"}},
		{"held elsewhere", podWith("me", "l", nil),
			lockWith("shop", "l", both(queued(me), condition(v1alpha1.ConditionHeld, "False", v1alpha1.ReasonHeldElsewhere, "held"))), nil, nil,
			WhyLockNotHeld, []string{"kubectl redlock who redlock:shop/l"}},
		{"master set missing", podWith("me", "l", nil),
			lockWith("shop", "l", both(queued(me), condition(v1alpha1.ConditionReady, "False", v1alpha1.ReasonMasterSetNotFound, "no RedisMasterSet masters"))), nil, nil,
			WhyLockNotReady, []string{"cannot act on the lock: Ready=False, reason MasterSetNotFound"}},
		{"former holder still runs", podWith("me", "l", nil),
			lockWith("shop", "l", both(queued(me), func(l *v1alpha1.DistributedLock) { r := ref("holder"); l.Status.LastHolderPod = &r })), nil, holder,
			WhyFormerHolderRuns, []string{"its last holder, pod holder (Running), may still run"}},
		{"first in a free lock", podWith("me", "l", nil), lockWith("shop", "l", queued(me)), nil, nil, WhyNext, []string{"first in line"}},
		{"not queued", podWith("me", "l", nil), lockWith("shop", "l", nil), nil, nil, WhyNotQueued, []string{"is the operator running?"}},
		{"refused by the operator", podWith("me", "l", func(p *corev1.Pod) {
			p.Annotations = map[string]string{v1alpha1.ProblemAnnotation: "both the scheduling gate and the readiness gate"}
		}), lockWith("shop", "l", nil), nil, nil, WhyPodRefused, []string{"the operator refuses the pod (annotation redlock.dev/problem): both the scheduling gate and the readiness gate"}},
		{"beyond the ten listed", podWith("me", "l", nil), lockWith("shop", "l", func(l *v1alpha1.DistributedLock) {
			l.Status.Queue = &v1alpha1.LockQueue{Waiting: []v1alpha1.QueuedPod{{Name: "a", UID: "uid-a"}}, Count: 12}
		}), nil, nil, WhyBehindOthers, []string{"12 pods wait and status lists only the first 1"}},
		{"holds, gate being lifted", podWith("me", "l", nil), lockWith("shop", "l", grantedTo("me", "uid-me", 25*time.Second)), nil, nil,
			WhyBeingUngated, []string{"holds the lock (fencing token 42, valid for 25s)", "lifts its scheduling gate"}},
		{"holds", podWith("me", "l", func(p *corev1.Pod) { p.Spec.SchedulingGates = nil }), lockWith("shop", "l", grantedTo("me", "uid-me", 25*time.Second)), nil, nil,
			WhyHolds, []string{"holds the lock (fencing token 42, valid for 25s, renewed while it runs)"}},
		{"holder whose validity passed", podWith("me", "l", func(p *corev1.Pod) { p.Spec.SchedulingGates = nil }), lockWith("shop", "l", grantedTo("me", "uid-me", -time.Second)), nil, nil,
			WhyHolderExpired, []string{"validity it shows has passed"}},
		{"finished", podWith("me", "l", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), lockWith("shop", "l", nil), nil, nil, WhyPodFinished, []string{"finished (Succeeded)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := Explain(WhyInput{Pod: tc.pod, Lock: tc.lock, HolderPod: tc.holderPod, LastHolderPod: tc.lastPod, Now: now})
			if err != nil {
				t.Fatal(err)
			}
			if w.Reason != tc.reason {
				t.Errorf("reason %s, want %s (%s)", w.Reason, tc.reason, w.Explanation)
			}
			for _, s := range tc.says {
				if !strings.Contains(w.Explanation, s) {
					t.Errorf("explanation %q does not say %q", w.Explanation, s)
				}
			}
		})
	}
}

func TestExplainPodWithoutLockLabel(t *testing.T) {
	_, err := Explain(WhyInput{Pod: podWith("web", "", nil), Now: now})
	if err == nil || !strings.Contains(err.Error(), "pod shop/web asks for no lock") || !strings.Contains(err.Error(), "no label redlock.dev/lock") {
		t.Fatalf("Explain of a pod without the label: %v", err)
	}
}

func TestExplainPositionAndEvents(t *testing.T) {
	lock := lockWith("shop", "l", both(grantedTo("holder", "uid-holder", 10*time.Second), queued(ref("a"), ref("b"), ref("me"))))
	events := []corev1.Event{
		{InvolvedObject: corev1.ObjectReference{Kind: "DistributedLock", Name: "l"}, Reason: "Granted", Type: "Normal", Message: "granted", EventTime: metav1.NewMicroTime(now.Add(-2 * time.Minute))},
		{InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "me"}, Reason: "Scheduled", Type: "Normal", Message: "older", LastTimestamp: metav1.NewTime(now.Add(-3 * time.Minute))},
		{InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "me"}, Reason: "Newest", Type: "Warning", Message: "newest", LastTimestamp: metav1.NewTime(now.Add(-time.Second))},
	}
	w, err := Explain(WhyInput{Pod: podWith("me", "l", nil), Lock: lock, HolderPod: podWith("holder", "l", nil), Events: events, MaxEvents: 2, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if w.Position != 3 || w.Waiting != 3 || strings.Join(w.Ahead, ",") != "a,b" || !w.Gated {
		t.Fatalf("position %d of %d, ahead %v, gated %v", w.Position, w.Waiting, w.Ahead, w.Gated)
	}
	if len(w.Events) != 2 || w.Events[0].Object != "distributedlock/l" || w.Events[1].Reason != "Newest" || w.Events[0].Age != "2m" {
		t.Fatalf("events %+v: want the 2 newest, oldest first", w.Events)
	}
	var b bytes.Buffer
	if err := WriteWhy(&b, &w); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"Queue:     number 3 of 3 waiting", "Holder:    pod/holder (Pending), token 42, valid for 10s", "Events:\n  TYPE "} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("why output does not hold %q:\n%s", s, b.String())
		}
	}
}

func TestQueueOf(t *testing.T) {
	lock := lockWith("shop", "l", func(l *v1alpha1.DistributedLock) {
		queued(ref("a"), ref("gone"), ref("renamed"))(l)
		l.Status.Queue.Count = 14
		l.Status.Queue.Waiting[0].Priority = 1000
	})
	pods := map[string]*corev1.Pod{
		"a":       podWith("a", "l", nil),
		"renamed": podWith("renamed", "l", func(p *corev1.Pod) { p.UID = "another" }),
	}
	q := QueueOf(lock, pods, now)
	if len(q.Waiting) != 3 || q.Waiting[0].Phase != "Pending" || q.Waiting[0].Gate != GateScheduling || q.Waiting[0].Age != "60s" ||
		q.Waiting[1].Phase != PhaseGone || q.Waiting[2].Phase != PhaseGone || q.Waiting[2].Position != 3 {
		t.Fatalf("queue %+v", q.Waiting)
	}
	var out, errOut bytes.Buffer
	if err := WriteQueue(&out, &errOut, &q, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "... and 11 more: status lists the first 3 of the 14 pods that wait.") {
		t.Fatalf("queue table:\n%s", out.String())
	}
	if q.Waiting[0].Priority != 1000 || !regexp.MustCompile(`(?m)^1 +a +1000 +Pending`).MatchString(out.String()) {
		t.Fatalf("the first pod's priority (1000) is not in the queue table:\n%s", out.String())
	}
	out.Reset()
	if err := WriteQueue(&out, &errOut, new(QueueOf(lockWith("shop", "free", nil), nil, now)), false); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 || errOut.String() != "No pods wait for lock shop/free.\n" {
		t.Fatalf("empty queue: out %q, err %q", out.String(), errOut.String())
	}
}

func TestTokenOf(t *testing.T) {
	annotated := func(tok string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Annotations = map[string]string{v1alpha1.FencingTokenAnnotation: tok, v1alpha1.LockNameAnnotation: "l"}
		}
	}
	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		lock  *v1alpha1.DistributedLock
		holds bool
		token int64
		says  string
	}{
		{"holder, annotated", podWith("me", "l", annotated("42")), lockWith("shop", "l", grantedTo("me", "uid-me", 9*time.Second)), true, 42,
			"pod shop/me holds lock l (key redlock:shop/l) with fencing token 42, valid for 9s"},
		{"holder, not yet annotated", podWith("me", "l", nil), lockWith("shop", "l", grantedTo("me", "uid-me", 9*time.Second)), true, 42,
			"has not yet written the annotation redlock.dev/fencing-token"},
		{"former holder", podWith("me", "l", annotated("41")), lockWith("shop", "l", grantedTo("other", "uid-other", 9*time.Second)), false, 0,
			"pod shop/me holds nothing: lock l is held by pod/other; its annotation redlock.dev/fencing-token=41 is from a grant it no longer holds"},
		{"no lock", podWith("me", "", func(p *corev1.Pod) { p.Spec.SchedulingGates = nil }), nil, false, 0, "holds nothing: it asks for no lock"},
		{"lock missing", podWith("me", "l", nil), nil, false, 0, "holds nothing: its lock l does not exist"},
		{"validity passed", podWith("me", "l", annotated("42")), lockWith("shop", "l", grantedTo("me", "uid-me", -time.Second)), false, 0, "the validity shown has passed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := TokenOf(tc.pod, tc.lock, now)
			if got.Holds != tc.holds || got.FencingToken != tc.token || !strings.Contains(got.Explanation, tc.says) {
				t.Fatalf("TokenOf = holds %v token %d %q; want holds %v token %d, saying %q", got.Holds, got.FencingToken, got.Explanation, tc.holds, tc.token, tc.says)
			}
		})
	}
}

// TestDocuments: the documents print with kubectl's printers, carry their
// apiVersion and kind, name their objects for -o name, and copy deeply.
func TestDocuments(t *testing.T) {
	l := Locks([]v1alpha1.DistributedLock{*lockWith("shop", "a", nil)}, now)
	l.Semaphores = []Semaphore{{Namespace: "shop", Name: "s", Slots: 2}}
	var b bytes.Buffer
	if err := (&printers.JSONPrinter{}).PrintObj(&l, &b); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	item := back["items"].([]any)[0].(map[string]any)
	if back["kind"] != "LockList" || back["apiVersion"] != APIVersion || item["holder"] != nil || item["validFor"] != "-" || item["key"] != "redlock:shop/a" {
		t.Fatalf("json %s", b.String())
	}
	b.Reset()
	if err := (&printers.YAMLPrinter{}).PrintObj(&l, &b); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "apiVersion: "+APIVersion+"\nitems:\n- fencingToken: 0\n") || !strings.Contains(b.String(), "kind: LockList\n") {
		t.Fatalf("yaml %s", b.String())
	}
	if got, want := l.Names(), []string{"distributedlock.coordination.redlock.dev/a", "distributedsemaphore.coordination.redlock.dev/s"}; !slices.Equal(got, want) {
		t.Fatalf("LockList.Names() = %q, want %q", got, want)
	}
	q := Queue{Waiting: []QueueEntry{{Pod: "p1"}, {Pod: "p2"}}}
	if got, want := q.Names(), []string{"pod/p1", "pod/p2"}; !slices.Equal(got, want) {
		t.Fatalf("Queue.Names() = %q, want %q", got, want)
	}
	k := KeyHolders{Items: []Lock{{Name: "a"}}, Slots: []Slot{{Semaphore: "s", Lock: "s-0"}}}
	if got, want := k.Names(), []string{"distributedlock.coordination.redlock.dev/a", "distributedlock.coordination.redlock.dev/s-0"}; !slices.Equal(got, want) {
		t.Fatalf("KeyHolders.Names() = %q, want %q", got, want)
	}
	c := l.DeepCopyObject().(*LockList)
	c.Items[0].Name = "changed"
	if l.Items[0].Name != "a" || c.Kind != "LockList" {
		t.Fatalf("DeepCopyObject shares items with the original, or lost the kind: %+v", c)
	}
}

// TestExplainSemaphorePod: a pod waiting for a semaphore's slot, before it
// is given one, is explained by the semaphore.
func TestExplainSemaphorePod(t *testing.T) {
	semPod := func(mod func(*corev1.Pod)) *corev1.Pod {
		return podWith("me", "", func(p *corev1.Pod) {
			p.Labels = map[string]string{v1alpha1.SemaphoreLabel: "reports"}
			if mod != nil {
				mod(p)
			}
		})
	}
	sem := func(held int32, waiting []v1alpha1.PodReference, mod func(*v1alpha1.DistributedSemaphore)) *v1alpha1.DistributedSemaphore {
		s := &v1alpha1.DistributedSemaphore{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "reports"}}
		s.Spec.Slots = 2
		s.Status.Held = held
		for i := range held {
			s.Status.Holders = append(s.Status.Holders, v1alpha1.SemaphoreHolder{Slot: i, Lock: fmt.Sprintf("reports-2-%d", i),
				Holder: v1alpha1.LockHolder{Identity: fmt.Sprintf("h%d", i), Pod: &v1alpha1.PodReference{Name: fmt.Sprintf("h%d", i)}}})
		}
		s.Status.Queue = &v1alpha1.LockQueue{Count: int32(len(waiting))} //nolint:gosec // a few
		for _, r := range waiting {
			s.Status.Queue.Waiting = append(s.Status.Queue.Waiting, v1alpha1.QueuedPod{Name: r.Name, UID: r.UID})
		}
		if mod != nil {
			mod(s)
		}
		return s
	}
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		sem    *v1alpha1.DistributedSemaphore
		reason string
		says   []string
	}{
		{"no such semaphore", semPod(nil), nil, WhySemaphoreNotFound, []string{`no DistributedSemaphore "reports" exists in namespace shop`}},
		{"every slot held, second in line", semPod(nil), sem(2, []v1alpha1.PodReference{ref("first"), ref("me")}, nil),
			WhyAllSlotsHeld, []string{"all 2 slots are held (slot 0: pod h0, slot 1: pod h1)", "1 pod is ahead of it in line (first)"}},
		{"a slot free, first in line", semPod(nil), sem(1, []v1alpha1.PodReference{ref("me")}, nil),
			WhyNext, []string{"1 of 2 slots are held and the pod is first in line"}},
		{"a slot free, third in line", semPod(nil), sem(1, []v1alpha1.PodReference{ref("a"), ref("b"), ref("me")}, nil),
			WhyBehindOthers, []string{"number 3 in line", "(a, b)"}},
		{"not ready", semPod(nil), sem(0, []v1alpha1.PodReference{ref("me")}, func(s *v1alpha1.DistributedSemaphore) {
			s.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSlotsConflict, Message: "the masters store 3 slots"}}
		}), WhySemaphoreNotReady, []string{"Ready=False, reason SlotsConflict: the masters store 3 slots"}},
		{"not listed", semPod(nil), sem(1, nil, nil), WhyNotQueued, []string{"does not list the pod"}},
		{"finished", semPod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), sem(1, nil, nil), WhyPodFinished, []string{"finished (Succeeded)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := Explain(WhyInput{Pod: tc.pod, Semaphore: tc.sem, Now: now})
			if err != nil {
				t.Fatal(err)
			}
			if w.Reason != tc.reason || w.Semaphore != "reports" || w.Lock != "" {
				t.Errorf("reason %q, semaphore %q, lock %q; want %q, reports, none", w.Reason, w.Semaphore, w.Lock, tc.reason)
			}
			for _, s := range tc.says {
				if !strings.Contains(w.Explanation, s) {
					t.Errorf("explanation %q does not say %q", w.Explanation, s)
				}
			}
			var out strings.Builder
			if err := WriteWhy(&out, &w); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), "Semaphore: shop/reports") || !strings.Contains(out.String(), "Why:") {
				t.Errorf("WriteWhy names no semaphore or verdict:\n%s", out.String())
			}
		})
	}
}

// TestSemaphoreQueue: `queue dsem/NAME` lists the pods waiting for a slot
// from the semaphore's status, and says when none waits.
func TestSemaphoreQueue(t *testing.T) {
	sem := &v1alpha1.DistributedSemaphore{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "reports"}}
	sem.Spec.Slots, sem.Status.Held = 3, 3
	sem.Status.Queue = &v1alpha1.LockQueue{Count: 2, Waiting: []v1alpha1.QueuedPod{{Name: "a", UID: "uid-a"}, {Name: "gone", UID: "uid-gone"}}}
	q := SemaphoreQueueOf(sem, map[string]*corev1.Pod{"a": podWith("a", "", nil)}, now)
	if q.Kind != "SemaphoreQueue" || q.Semaphore != "reports" || q.Lock != "" || q.Slots != 3 || q.Held != 3 || q.Count != 2 || len(q.Waiting) != 2 {
		t.Fatalf("SemaphoreQueueOf = %+v", q)
	}
	if q.Waiting[0].Phase != "Pending" || q.Waiting[0].Gate != GateScheduling || q.Waiting[1].Phase != PhaseGone {
		t.Errorf("entries %+v: want a Pending at the scheduling gate, then one gone", q.Waiting)
	}
	var out, errOut strings.Builder
	if err := WriteQueue(&out, &errOut, &q, false); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "Semaphore shop/reports: 3 of 3 slots held.\n") || !strings.Contains(out.String(), "gone") {
		t.Errorf("WriteQueue printed:\n%s", out.String())
	}
	sem.Status.Held, sem.Status.Queue = 1, nil
	out.Reset()
	if err := WriteQueue(&out, &errOut, new(SemaphoreQueueOf(sem, nil, now)), false); err != nil {
		t.Fatal(err)
	}
	if got := errOut.String(); got != "No pods wait for a slot of semaphore shop/reports (1 of 3 slots held).\n" || out.Len() != 0 {
		t.Errorf("with nobody waiting: out %q, errOut %q", out.String(), got)
	}
}

// TestStatusSemaphores: `status` lists semaphores after the locks, sorted,
// with slots held of N, waiting pods and Ready.
func TestStatusSemaphores(t *testing.T) {
	sem := func(ns, name string, held int32) v1alpha1.DistributedSemaphore {
		s := v1alpha1.DistributedSemaphore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		s.Spec.Slots, s.Status.Held, s.Status.Queue = 3, held, &v1alpha1.LockQueue{Count: 4}
		return s
	}
	l := Locks([]v1alpha1.DistributedLock{*lockWith("shop", "l", nil)}, now)
	l.Semaphores = Semaphores([]v1alpha1.DistributedSemaphore{sem("shop", "z", 1), sem("shop", "a", 3)})
	if len(l.Semaphores) != 2 || l.Semaphores[0].Name != "a" || l.Semaphores[0].Held != 3 || l.Semaphores[0].Slots != 3 || l.Semaphores[0].Waiting != 4 {
		t.Fatalf("Semaphores = %+v", l.Semaphores)
	}
	var out strings.Builder
	if err := WriteStatus(&out, &l, false); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	locksAt, semsAt := strings.Index(got, strings.Join(StatusHeaders[:2], "   ")), strings.Index(got, "SEMAPHORE")
	if locksAt < 0 || semsAt < locksAt || !strings.Contains(got, "3/3") || !strings.Contains(got, "1/3") {
		t.Errorf("WriteStatus printed:\n%s", got)
	}
	out.Reset()
	if err := WriteStatus(&out, &LockList{Semaphores: l.Semaphores}, false); err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(out.String(), "\n") || strings.Contains(out.String(), "HOLDER") {
		t.Errorf("with semaphores only, WriteStatus printed:\n%s", out.String())
	}
}

// TestWhoSlots: `who KEY` lists the held slots of the semaphores on KEY,
// sorted, after the locks, and only theirs.
func TestWhoSlots(t *testing.T) {
	sem := func(ns, name, key string, holders ...string) v1alpha1.DistributedSemaphore {
		s := v1alpha1.DistributedSemaphore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		s.Spec.Key, s.Spec.Slots = key, int32(len(holders)) //nolint:gosec // a few
		for i, h := range holders {
			s.Status.Holders = append(s.Status.Holders, v1alpha1.SemaphoreHolder{Slot: int32(len(holders) - 1 - i), Lock: fmt.Sprintf("%s-%d", name, i), //nolint:gosec // a few
				Holder: v1alpha1.LockHolder{Identity: h, Pod: &v1alpha1.PodReference{Name: h}}, FencingToken: int64(10 + i)})
		}
		return s
	}
	slots := SlotsOn("k", []v1alpha1.DistributedSemaphore{sem("b", "s", "k", "x"), sem("a", "s", "k", "y", "z"), sem("a", "other", "j", "w")})
	if len(slots) != 3 || slots[0].Namespace != "a" || slots[0].Slot != 0 || slots[0].Holder.Pod != "z" || slots[2].Namespace != "b" {
		t.Fatalf("SlotsOn = %+v", slots)
	}
	var out strings.Builder
	if err := WriteWho(&out, &KeyHolders{Key: "k", Slots: slots}, false); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "NAMESPACE") || !strings.Contains(out.String(), "SEMAPHORE") || !strings.Contains(out.String(), "pod/z") || strings.Contains(out.String(), "pod/w") {
		t.Errorf("WriteWho printed:\n%s", out.String())
	}
}
