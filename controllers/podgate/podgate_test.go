package podgate_test

import (
	"fmt"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/podgate"
	"github.com/redlock-operator/redlock-operator/internal/harness/benchenv"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

// gatedPod returns a pod labelled for lock, waiting with the given gate.
func gatedPod(ns, name, lock string, readiness bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.LockLabel: lock}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "work", Image: "busybox"}}},
	}
	if readiness {
		p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: v1alpha1.ReadinessGate}}
	} else {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGate}}
	}
	return p
}

// holderLabelPod is a pod labelled for lock in holder-label mode: no gate,
// the holder is marked redlock.dev/holds.
func holderLabelPod(ns, name, lock string) *corev1.Pod {
	p := gatedPod(ns, name, lock, false)
	p.Spec.SchedulingGates = nil
	p.Labels[v1alpha1.GateModeLabel] = v1alpha1.GateModeHolderLabel
	return p
}

func getPod(p *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{}
	Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(p), out)).To(Succeed())
	return out
}

// relabel points pod p's lock label at lock (retried: the operator patches
// the pod too).
func relabel(p *corev1.Pod, lock string) {
	Eventually(func() error { return updateLabel(p, v1alpha1.LockLabel, lock) }).Should(Succeed(), "pod %s/%s to be relabelled for lock %q", p.Namespace, p.Name, lock)
}

// gated and runnable are the checks the demo and the e2e suite use too.
var gated, runnable = demo.Gated, demo.MayRun

// kubeletRuns plays the scheduler and the kubelet: it binds the pod to
// node-1 and reports its container running, with the kubelet's own
// conditions.
func kubeletRuns(p *corev1.Pod) { kubeletRunsOn(p, "node-1") }

// kubeletRunsOn is kubeletRuns on the named node.
func kubeletRunsOn(p *corev1.Pod, node string) {
	Expect(k8s.SubResource("binding").Create(suiteCtx, p, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	})).To(Succeed())
	Eventually(func() error { // retried: the operator patches the pod too
		cur := getPod(p)
		cur.Status.Phase = corev1.PodRunning
		cur.Status.Conditions = append(cur.Status.Conditions, corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
		cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "work", Image: "busybox", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
		return k8s.Status().Update(suiteCtx, cur)
	}).Should(Succeed(), "pod %s/%s to be reported running on node %s", p.Namespace, p.Name, node)
}

// kubeletStops reports the pod's container terminated (and the pod finished
// with phase, unless phase is "").
func kubeletStops(p *corev1.Pod, phase corev1.PodPhase) {
	Eventually(func() error {
		cur := getPod(p)
		if phase != "" {
			cur.Status.Phase = phase
		}
		cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "work", Image: "busybox", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}}}
		return k8s.Status().Update(suiteCtx, cur)
	}).Should(Succeed(), "pod %s/%s to be reported stopped (phase %q)", p.Namespace, p.Name, phase)
}

func gateCondition(p *corev1.Pod) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == v1alpha1.ReadinessGate {
			return c.Status
		}
	}
	return ""
}

func fetchLock(ns, name string) *v1alpha1.DistributedLock {
	l := &v1alpha1.DistributedLock{}
	Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, l)).To(Succeed())
	return l
}

// watchExclusion polls the pods of ns until the spec ends and records any
// moment at which two of them could run.
func watchExclusion(ns string) func() []string {
	return watchAcross([]client.Client{k8s}, []string{ns})
}

var _ = Describe("Pods gating on a lock", Ordered, func() {
	var (
		mgr *testenv.Manager
		ns  string
		ms  *testenv.MasterSet
	)
	BeforeAll(func() {
		mgr = env.StartManager()
		ns = env.NewNamespace()
		ms = env.NewServingMasters(ns, "masters", 3, 4*time.Second)
	})
	AfterAll(func() { mgr.Stop() })

	It("ungates scheduling-gated pods one at a time, first come first served, with the token on the pod before it runs", func() {
		violations := watchExclusion(ns)
		Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "jobs"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: ms.Name, TTL: metav1.Duration{Duration: 2 * time.Second}},
		})).To(Succeed())
		pods := []*corev1.Pod{gatedPod(ns, "job-1", "jobs", false), gatedPod(ns, "job-2", "jobs", false), gatedPod(ns, "job-3", "jobs", false)}
		for _, p := range pods {
			Expect(k8s.Create(suiteCtx, p)).To(Succeed())
		}

		var tokens []int64
		expectHolder := func(i int) {
			By("ungating " + pods[i].Name + " with its token already on it")
			Eventually(func(g Gomega) {
				cur := getPod(pods[i])
				g.Expect(gated(cur)).To(BeFalse(), "still gated")
				lock := fetchLock(ns, "jobs")
				g.Expect(lock.Status.Holder).NotTo(BeNil(), "holder of lock jobs")
				g.Expect(lock.Status.Holder.Pod).NotTo(BeNil(), "holder pod of lock jobs")
				g.Expect(lock.Status.Holder.Pod.UID).To(Equal(cur.UID), "holder pod of lock jobs, want %s", pods[i].Name)
				g.Expect(cur.Annotations).To(HaveKeyWithValue(v1alpha1.FencingTokenAnnotation, strconv.FormatInt(lock.Status.FencingToken, 10)), "fencing token on pod %s", pods[i].Name)
				g.Expect(cur.Annotations).To(HaveKeyWithValue(v1alpha1.LockKeyAnnotation, lock.Status.Key), "lock key on pod %s", pods[i].Name)
			}).Should(Succeed(), "lock %s/jobs to be held by pod %s, ungated with its token on it", ns, pods[i].Name)
			token, err := strconv.ParseInt(getPod(pods[i]).Annotations[v1alpha1.FencingTokenAnnotation], 10, 64)
			Expect(err).NotTo(HaveOccurred())
			tokens = append(tokens, token)
			for j := i + 1; j < len(pods); j++ {
				Expect(gated(getPod(pods[j]))).To(BeTrue(), "%s ungated out of turn", pods[j].Name)
			}
		}

		expectHolder(0)
		Expect(fetchLock(ns, "jobs").Status.Queue).NotTo(BeNil())
		Expect(fetchLock(ns, "jobs").Status.Queue.Count).To(Equal(int32(2)))
		kubeletRuns(pods[0])
		By("handing over when the holder succeeded")
		kubeletStops(pods[0], corev1.PodSucceeded)
		expectHolder(1)

		By("keeping the lock with a terminating holder whose container still runs")
		kubeletRuns(pods[1])
		Expect(k8s.Delete(suiteCtx, getPod(pods[1]))).To(Succeed())
		Consistently(func() bool { return gated(getPod(pods[2])) }, 2*time.Second).Should(BeTrue(), "pod %s/%s to stay gated while terminating holder %s's container runs", ns, pods[2].Name, pods[1].Name)
		By("handing over once its container stopped")
		kubeletStops(pods[1], "")
		expectHolder(2)
		Expect(tokens).To(HaveLen(3))
		Expect(tokens[1]).To(BeNumerically(">", tokens[0]))
		Expect(tokens[2]).To(BeNumerically(">", tokens[1]))
		Expect(violations()).To(BeEmpty())
		Expect(k8s.Delete(suiteCtx, getPod(pods[1]), client.GracePeriodSeconds(0))).To(Succeed())
	})

	It("keeps the readiness gate True on the holder only, False once its deletion starts, and leaves the kubelet's conditions alone", func() {
		Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "active"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: ms.Name, TTL: metav1.Duration{Duration: 2 * time.Second}},
		})).To(Succeed())
		a, b := gatedPod(ns, "active-a", "active", true), gatedPod(ns, "active-b", "active", true)
		for _, p := range []*corev1.Pod{a, b} {
			Expect(k8s.Create(suiteCtx, p)).To(Succeed())
			kubeletRuns(p)
		}
		Eventually(func(g Gomega) {
			g.Expect(gateCondition(getPod(a))).To(Equal(corev1.ConditionTrue), "gate of pod %s", a.Name)
			g.Expect(gateCondition(getPod(b))).To(Equal(corev1.ConditionFalse), "gate of pod %s", b.Name)
		}).Should(Succeed(), "lock %s/active to be held by pod %s only (gate True on %s, False on %s)", ns, a.Name, a.Name, b.Name)
		Expect(getPod(a).Status.Conditions).To(ContainElement(HaveField("Type", corev1.ContainersReady)), "the kubelet's condition survives")

		By("turning the holder's condition False as soon as its deletion starts")
		Expect(k8s.Delete(suiteCtx, getPod(a))).To(Succeed())
		Eventually(func() corev1.ConditionStatus { return gateCondition(getPod(a)) }).Should(Equal(corev1.ConditionFalse), "gate of pod %s/%s to turn False as soon as its deletion starts", ns, a.Name)
		Consistently(func() corev1.ConditionStatus { return gateCondition(getPod(b)) }, time.Second).Should(Equal(corev1.ConditionFalse),
			"pod %s/%s to wait while the container of lock active's old holder %s runs", ns, b.Name, a.Name)
		kubeletStops(a, "")
		Eventually(func() corev1.ConditionStatus { return gateCondition(getPod(b)) }).Should(Equal(corev1.ConditionTrue), "pod %s/%s to be granted lock active once %s's container stopped", ns, b.Name, a.Name)
		Expect(k8s.Delete(suiteCtx, getPod(a), client.GracePeriodSeconds(0))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(suiteCtx, client.ObjectKeyFromObject(a), &corev1.Pod{}))
		}).Should(BeTrue(), "pod %s/%s to be gone", ns, a.Name)
	})

	It("turns the readiness gate False when the lock is lost, and grants the same pod again with a new token", func() {
		fragile := env.NewServingMasters(ns, "fragile", 3, 2*time.Second)
		Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fragile"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: fragile.Name, TTL: metav1.Duration{Duration: 1500 * time.Millisecond}},
		})).To(Succeed())
		active, standby := gatedPod(ns, "fragile-a", "fragile", true), gatedPod(ns, "fragile-b", "fragile", true)
		for _, p := range []*corev1.Pod{active, standby} {
			Expect(k8s.Create(suiteCtx, p)).To(Succeed())
			kubeletRuns(p)
		}
		Eventually(func() corev1.ConditionStatus { return gateCondition(getPod(active)) }).Should(Equal(corev1.ConditionTrue), "pod %s/%s to be granted lock fragile", ns, active.Name)
		first := getPod(active).Annotations[v1alpha1.FencingTokenAnnotation]

		By("losing the lock: two of three masters stopped past the validity")
		for _, srv := range fragile.Servers[:2] {
			Expect(srv.Stop()).To(Succeed())
		}
		Eventually(func() corev1.ConditionStatus { return gateCondition(getPod(active)) }).Should(Equal(corev1.ConditionFalse), "gate of pod %s/%s to turn False once lock fragile is lost", ns, active.Name)
		Expect(gateCondition(getPod(standby))).To(Equal(corev1.ConditionFalse), "the standby never got it")
		Eventually(func() []string { return env.EventReasons(ns, "fragile") }).Should(ContainElement("Lost"), "lock %s/fragile to get event Lost", ns)

		By("granting the same pod again, with a larger token, once a quorum serves")
		for _, srv := range fragile.Servers[:2] {
			Expect(srv.Cont()).To(Succeed())
		}
		Eventually(func(g Gomega) {
			cur := getPod(active)
			g.Expect(gateCondition(cur)).To(Equal(corev1.ConditionTrue), "gate of pod %s", active.Name)
			g.Expect(cur.Annotations[v1alpha1.FencingTokenAnnotation]).NotTo(Equal(first), "fencing token on pod %s", active.Name)
		}, 30*time.Second).Should(Succeed(), "pod %s/%s to be granted lock fragile again with a new token (was %s)", ns, active.Name, first)
		again, _ := strconv.ParseInt(getPod(active).Annotations[v1alpha1.FencingTokenAnnotation], 10, 64)
		before, _ := strconv.ParseInt(first, 10, 64)
		Expect(again).To(BeNumerically(">", before))
		Expect(gateCondition(getPod(standby))).To(Equal(corev1.ConditionFalse))
	})

	It("tells a pod why it cannot take part, and grants it once its lock appears", func() {
		By("a labelled pod without a gate")
		bare := gatedPod(ns, "no-gate", "whatever", false)
		bare.Spec.SchedulingGates = nil
		Expect(k8s.Create(suiteCtx, bare)).To(Succeed())
		Eventually(func() map[string]string { return getPod(bare).Annotations }).Should(HaveKeyWithValue(podgate.ProblemAnnotation, ContainSubstring("neither")), "pod %s/%s to be told it has neither gate", ns, bare.Name)
		Eventually(func() []string { return env.EventReasons(ns, "no-gate") }).Should(ContainElement(podgate.EventBadLockSpec), "pod %s/%s to get event %s", ns, bare.Name, podgate.EventBadLockSpec)

		By("a gated pod whose lock does not exist yet")
		early := gatedPod(ns, "early", "later", false)
		Expect(k8s.Create(suiteCtx, early)).To(Succeed())
		Eventually(func() map[string]string { return getPod(early).Annotations }).Should(HaveKeyWithValue(podgate.ProblemAnnotation, ContainSubstring("not found")), "pod %s/%s to be told its lock later is not found", ns, early.Name)
		Expect(gated(getPod(early))).To(BeTrue())
		Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "later"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: ms.Name, TTL: metav1.Duration{Duration: 2 * time.Second}},
		})).To(Succeed())
		Eventually(func() bool { return gated(getPod(early)) }).Should(BeFalse(), "pod %s/%s to be ungated once lock later exists", ns, early.Name)
		Expect(getPod(early).Annotations).NotTo(HaveKey(podgate.ProblemAnnotation))
	})

	It("wakes a lock's waiting pods when its grant changes, not when its shown validity is refreshed", func() {
		const waiting = 10
		Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "busy"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: ms.Name, TTL: metav1.Duration{Duration: 2 * time.Second}},
		})).To(Succeed())
		holder := gatedPod(ns, "busy-0", "busy", false)
		Expect(k8s.Create(suiteCtx, holder)).To(Succeed())
		Eventually(func() bool { return gated(getPod(holder)) }).Should(BeFalse(), "busy-0 ungated")
		kubeletRuns(holder)
		var queued []*corev1.Pod
		for i := 1; i <= waiting; i++ {
			p := gatedPod(ns, fmt.Sprintf("busy-%d", i), "busy", false)
			Expect(k8s.Create(suiteCtx, p)).To(Succeed())
			queued = append(queued, p)
		}
		Eventually(func(g Gomega) {
			q := fetchLock(ns, "busy").Status.Queue
			g.Expect(q).NotTo(BeNil(), "lock busy shows no queue")
			g.Expect(q.Count).To(Equal(int32(waiting)), "pods queued on lock busy")
		}).Should(Succeed(), "lock %s/busy to show %d pods queued", ns, waiting)

		By("counting the pod-gate reconciles over five refreshes of the same grant")
		grant := fetchLock(ns, "busy").Status.GrantID
		before := podgateReconciles()
		shown := map[time.Time]bool{}
		var last time.Time
		late := 0 // refreshes seen after the validity shown before had passed: those wake every pod, by design
		Eventually(func(g Gomega) {
			l := fetchLock(ns, "busy")
			g.Expect(l.Status.GrantID).To(Equal(grant), "lock busy was granted again while counting")
			if v := l.Status.ValidUntil.Time; !shown[v] {
				if !last.IsZero() && time.Now().After(last) {
					late++
				}
				shown[v], last = true, v
			}
			g.Expect(len(shown)).To(BeNumerically(">", 5), "validities shown by lock busy")
		}).WithTimeout(30*time.Second).WithPolling(50*time.Millisecond).Should(Succeed(), "lock %s/busy to show more than 5 validities of grant %s", ns, grant)
		refreshes := float64(len(shown) - 1)
		woken := podgateReconciles() - before - float64(late*(waiting+1))
		perRefresh := woken / refreshes
		// Every refresh woke all 11 pods before; now the holder wakes at
		// the validity it was shown, and other locks' holders at theirs.
		// A refresh that came after the shown validity had passed (a
		// loaded machine) still wakes them all: those are taken out.
		Expect(perRefresh).To(BeNumerically("<", waiting/2),
			"pod-gate reconciles per refresh of lock busy (%v refreshes, %d of them late): a refresh must not wake its %d waiting pods", refreshes, late, waiting)

		By("waking the next pod when the grant changes")
		kubeletStops(holder, corev1.PodSucceeded)
		Eventually(func() bool { return gated(getPod(queued[0])) }).Should(BeFalse(), "busy-1 ungated after busy-0 finished")
		for _, p := range queued[1:] {
			Expect(gated(getPod(p))).To(BeTrue(), "%s ungated out of turn", p.Name)
		}
	})

	Context("in holder-label mode", func() {
		holderLabelSpecs(func() (string, *testenv.MasterSet) { return ns, ms })
	})
})

// podgateReconciles is the pod-gate controller's reconcile count so far, in
// this process.
func podgateReconciles() float64 {
	n, err := benchenv.Reconciles("podgate")
	Expect(err).NotTo(HaveOccurred())
	return n
}
