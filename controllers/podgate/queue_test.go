package podgate_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// podCondition is pod p's condition typ as the API server shows it, or
// nil.
func podCondition(p *corev1.Pod, typ string) *corev1.PodCondition {
	for _, c := range getPod(p).Status.Conditions {
		if string(c.Type) == typ {
			return &c
		}
	}
	return nil
}

// expectNotAllowed checks that pod p is told it is never granted (reason):
// the condition redlock.dev/HolderNotAllowed True, the problem annotation,
// an event, and its gate still on.
func expectNotAllowed(g Gomega, p *corev1.Pod, reason string) {
	cur := getPod(p)
	c := podCondition(p, v1alpha1.ConditionHolderNotAllowed)
	g.Expect(c).NotTo(BeNil(), "condition %s of pod %s", v1alpha1.ConditionHolderNotAllowed, p.Name)
	g.Expect(c.Status).To(Equal(corev1.ConditionTrue), "condition %s of pod %s", v1alpha1.ConditionHolderNotAllowed, p.Name)
	g.Expect(c.Reason).To(Equal(reason), "reason of condition %s of pod %s", v1alpha1.ConditionHolderNotAllowed, p.Name)
	g.Expect(cur.Annotations).To(HaveKey(v1alpha1.ProblemAnnotation), "problem annotation of pod %s", p.Name)
	g.Expect(env.EventReasons(p.Namespace, p.Name)).To(ContainElement(reason), "events of pod %s", p.Name)
	g.Expect(gated(cur)).To(BeTrue(), "pod %s is ungated", p.Name)
}

// queueNames are the names and priorities status.queue lists, in order.
func queueNames(l *v1alpha1.DistributedLock) []string {
	var out []string
	if l.Status.Queue != nil {
		for _, q := range l.Status.Queue.Waiting {
			out = append(out, q.Name)
		}
	}
	return out
}

var _ = Describe("Who may hold a lock, and who goes first", Ordered, func() {
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

	It("never grants a pod whose ServiceAccount the lock does not name, tells it so, and grants it once the list names it", func() {
		lock := &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "accounts"},
			Spec: v1alpha1.DistributedLockSpec{MasterSet: ms.Name, TTL: metav1.Duration{Duration: 2 * time.Second},
				AllowedHolders: &v1alpha1.AllowedHolders{ServiceAccounts: []string{"app"}}},
		}
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		intruder := gatedPod(ns, "intruder", "accounts", false) // created first: it would be first in line
		intruder.Spec.ServiceAccountName = "other"
		Expect(k8s.Create(suiteCtx, intruder)).To(Succeed())
		app := gatedPod(ns, "app-1", "accounts", false)
		app.Spec.ServiceAccountName = "app"
		Expect(k8s.Create(suiteCtx, app)).To(Succeed())

		By("granting the pod of the named ServiceAccount, though it came second")
		Eventually(func(g Gomega) { expectHolds(g, ns, "accounts", app) }).Should(Succeed(), "lock %s/accounts to be held by pod app-1", ns)
		By("telling the other pod with a condition, the problem annotation and an event, and leaving it out of the queue")
		Eventually(func(g Gomega) { expectNotAllowed(g, intruder, v1alpha1.ReasonServiceAccountNotAllowed) }).Should(Succeed(),
			"pod %s/intruder to be told it is never granted lock accounts", ns)
		Expect(fetchLock(ns, "accounts").Status.Queue).To(BeNil(), "queue of lock %s/accounts", ns)

		By("granting nobody once the holder finished")
		kubeletRuns(app)
		kubeletStops(app, corev1.PodSucceeded)
		Eventually(func() *v1alpha1.LockHolder { return fetchLock(ns, "accounts").Status.Holder }).Should(BeNil(), "lock %s/accounts to be released by app-1", ns)
		Consistently(func() bool { return gated(getPod(intruder)) }, 2*time.Second).Should(BeTrue(), "pod %s/intruder to stay gated", ns)
		Expect(fetchLock(ns, "accounts").Status.Holder).To(BeNil(), "holder of lock %s/accounts", ns)

		By("granting it once spec.allowedHolders names its ServiceAccount")
		Eventually(func() error {
			cur := fetchLock(ns, "accounts")
			cur.Spec.AllowedHolders.ServiceAccounts = append(cur.Spec.AllowedHolders.ServiceAccounts, "other")
			return k8s.Update(suiteCtx, cur)
		}).Should(Succeed(), "lock %s/accounts to take the ServiceAccount other into its list", ns)
		Eventually(func(g Gomega) {
			expectHolds(g, ns, "accounts", intruder)
			c := podCondition(intruder, v1alpha1.ConditionHolderNotAllowed)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(corev1.ConditionFalse), "condition %s of pod intruder", v1alpha1.ConditionHolderNotAllowed)
			g.Expect(getPod(intruder).Annotations).NotTo(HaveKey(v1alpha1.ProblemAnnotation))
		}).Should(Succeed(), "lock %s/accounts to be held by pod intruder, allowed now", ns)
	})

	It("refuses a lock of another namespace that names a key whose lock allows only its own, and serves it once allowed", func() {
		other := env.NewNamespace()
		env.CreateMasterSet(&testenv.MasterSet{Servers: ms.Servers, Name: ms.Name, NS: other}, 4*time.Second)
		env.WaitServing(&testenv.MasterSet{Servers: ms.Servers, Name: ms.Name, NS: other}, 0)
		owner := &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owned"},
			Spec: v1alpha1.DistributedLockSpec{MasterSet: ms.Name, Key: "shared/owned", TTL: metav1.Duration{Duration: 2 * time.Second},
				AllowedHolders: &v1alpha1.AllowedHolders{Namespaces: []string{ns}}},
		}
		Expect(k8s.Create(suiteCtx, owner)).To(Succeed())
		Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "owned"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: ms.Name, Key: "shared/owned", TTL: metav1.Duration{Duration: 2 * time.Second}},
		})).To(Succeed())
		outsider := gatedPod(other, "outsider", "owned", false) // first: it would get the key
		Expect(k8s.Create(suiteCtx, outsider)).To(Succeed())

		By("showing the other namespace's lock not Ready, with an event, and telling its pod")
		Eventually(func(g Gomega) {
			l := fetchLock(other, "owned")
			c := meta.FindStatusCondition(l.Status.Conditions, v1alpha1.ConditionReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonNamespaceNotAllowed), "Ready reason of lock %s/owned", other)
			g.Expect(c.Message).To(ContainSubstring(ns+"/owned"), "Ready message names the lock that refuses it")
			g.Expect(env.EventReasons(other, "owned")).To(ContainElement(v1alpha1.ReasonNamespaceNotAllowed), "events of lock %s/owned", other)
			expectNotAllowed(g, outsider, v1alpha1.ReasonNamespaceNotAllowed)
		}).Should(Succeed(), "lock %s/owned to be refused by %s/owned", other, ns)
		insider := gatedPod(ns, "insider", "owned", false)
		Expect(k8s.Create(suiteCtx, insider)).To(Succeed())
		Eventually(func(g Gomega) { expectHolds(g, ns, "owned", insider) }).Should(Succeed(), "lock %s/owned to be held by pod insider", ns)
		kubeletRuns(insider)
		Expect(fetchLock(other, "owned").Status.Holder).To(BeNil(), "holder of refused lock %s/owned", other)

		By("serving it once the owner's list names its namespace, after the owner's holder finished")
		Eventually(func() error {
			cur := fetchLock(ns, "owned")
			cur.Spec.AllowedHolders.Namespaces = append(cur.Spec.AllowedHolders.Namespaces, other)
			return k8s.Update(suiteCtx, cur)
		}).Should(Succeed(), "lock %s/owned to take namespace %s into its list", ns, other)
		Eventually(func() string {
			c := meta.FindStatusCondition(fetchLock(other, "owned").Status.Conditions, v1alpha1.ConditionReady)
			if c == nil {
				return ""
			}
			return c.Reason
		}).Should(Equal(v1alpha1.ReasonValid), "lock %s/owned to be Ready once allowed", other)
		Eventually(func(g Gomega) {
			c := podCondition(outsider, v1alpha1.ConditionHolderNotAllowed)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(corev1.ConditionFalse), "condition %s", v1alpha1.ConditionHolderNotAllowed)
		}).Should(Succeed(), "pod %s/outsider to be told it is allowed now, while the key is still held", other)
		Consistently(func() bool { return gated(getPod(outsider)) }, time.Second).Should(BeTrue(), "pod %s/outsider to wait while %s/insider holds the key", other, ns)
		kubeletStops(insider, corev1.PodSucceeded)
		Eventually(func(g Gomega) { expectHolds(g, other, "owned", outsider) }).WithTimeout(20*time.Second).Should(Succeed(), "lock %s/owned to be held by pod outsider", other)
	})

	It("serves higher priority first, then first come first served, shows it in status.queue, and never pre-empts the holder", func() {
		high := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "redlock-test-high"}, Value: 1000}
		Expect(k8s.Create(suiteCtx, high)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(suiteCtx, high))).To(Succeed()) })
		createLock(ns, "ranked", ms.Name, v1alpha1.LostKeep)
		holder := gatedPod(ns, "ranked-holder", "ranked", false)
		Expect(k8s.Create(suiteCtx, holder)).To(Succeed())
		Eventually(func(g Gomega) { expectHolds(g, ns, "ranked", holder) }).Should(Succeed(), "lock %s/ranked to be held by its first pod", ns)
		kubeletRuns(holder)

		By("queueing: the annotation's 5000, the PriorityClass's 1000, then the two of priority 0 in creation order")
		low1 := gatedPod(ns, "ranked-low-b", "ranked", false) // first, though its name sorts last
		Expect(k8s.Create(suiteCtx, low1)).To(Succeed())
		// Creation times have whole seconds: the next second, so that
		// creation order and not the name decides between the two.
		created := getPod(low1).CreationTimestamp.Time
		Eventually(func() time.Time { return time.Now().Truncate(time.Second) }).WithTimeout(3*time.Second).Should(BeTemporally(">", created),
			"the clock to pass the second pod %s/ranked-low-b was created in", ns)
		classy := gatedPod(ns, "ranked-class", "ranked", false)
		classy.Spec.PriorityClassName = high.Name
		Expect(k8s.Create(suiteCtx, classy)).To(Succeed())
		Expect(getPod(classy).Spec.Priority).To(HaveValue(Equal(int32(1000))), "the API server sets spec.priority from the PriorityClass")
		low2 := gatedPod(ns, "ranked-low-a", "ranked", false)
		Expect(k8s.Create(suiteCtx, low2)).To(Succeed())
		urgent := gatedPod(ns, "ranked-urgent", "ranked", false)
		urgent.Annotations = map[string]string{v1alpha1.PriorityAnnotation: "5000"}
		Expect(k8s.Create(suiteCtx, urgent)).To(Succeed())
		Eventually(func(g Gomega) {
			l := fetchLock(ns, "ranked")
			g.Expect(queueNames(l)).To(Equal([]string{"ranked-urgent", "ranked-class", "ranked-low-b", "ranked-low-a"}), "status.queue of lock ranked")
			g.Expect(l.Status.Queue.Waiting[0].Priority).To(Equal(int32(5000)))
			g.Expect(l.Status.Queue.Waiting[1].Priority).To(Equal(int32(1000)))
			g.Expect(l.Status.Queue.Waiting[2].Priority).To(BeZero())
		}).Should(Succeed(), "lock %s/ranked to queue its pods by priority", ns)
		Expect(fetchLock(ns, "ranked").Status.Holder.Identity).To(Equal("ranked-holder"), "the running holder is not pre-empted")

		By("granting them in that order as each holder finishes")
		prev := holder
		for _, next := range []*corev1.Pod{urgent, classy, low1, low2} {
			kubeletStops(prev, corev1.PodSucceeded)
			Eventually(func(g Gomega) { expectHolds(g, ns, "ranked", next) }).WithTimeout(20*time.Second).Should(Succeed(), "lock %s/ranked to pass to pod %s after %s", ns, next.Name, prev.Name)
			kubeletRuns(next)
			prev = next
		}
	})

	It("tells a pod that waited past the lock's waitTimeout and keeps it waiting, or sets a scheduling-gated one Failed", func() {
		Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "patience"},
			Spec: v1alpha1.DistributedLockSpec{MasterSet: ms.Name, TTL: metav1.Duration{Duration: 2 * time.Second}, HolderIdentity: "maintenance",
				WaitTimeout: &metav1.Duration{Duration: 2 * time.Second}, OnWaitTimeout: v1alpha1.WaitFail},
		})).To(Succeed())
		Eventually(func() *v1alpha1.LockHolder { return fetchLock(ns, "patience").Status.Holder }).ShouldNot(BeNil(), "lock %s/patience to be held by its static holder", ns)
		gatedFail := gatedPod(ns, "patience-fail", "patience", false)
		gatedFail.Spec.RestartPolicy = corev1.RestartPolicyNever // as a Job's pod: nothing re-creates it in its place
		readinessWaits := gatedPod(ns, "patience-ready", "patience", true)
		keeps := gatedPod(ns, "patience-keep", "patience", false)
		keeps.Annotations = map[string]string{v1alpha1.OnWaitTimeoutAnnotation: string(v1alpha1.WaitKeep), v1alpha1.WaitTimeoutAnnotation: "3s"}
		for _, p := range []*corev1.Pod{gatedFail, readinessWaits, keeps} {
			Expect(k8s.Create(suiteCtx, p)).To(Succeed())
		}
		kubeletRuns(readinessWaits)

		By("setting the scheduling-gated pod Failed with the condition, in one write")
		Eventually(func(g Gomega) {
			cur := getPod(gatedFail)
			g.Expect(cur.Status.Phase).To(Equal(corev1.PodFailed), "phase of pod %s", gatedFail.Name)
			c := podCondition(gatedFail, v1alpha1.ConditionLockWaitTimeout)
			g.Expect(c).NotTo(BeNil(), "condition %s", v1alpha1.ConditionLockWaitTimeout)
			g.Expect(c.Status).To(Equal(corev1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonWaitTimeout))
			g.Expect(cur.Status.Reason).To(Equal("LockWaitTimeout"))
			g.Expect(env.EventReasons(ns, gatedFail.Name)).To(ContainElement("LockWaitTimeout"), "events of pod %s", gatedFail.Name)
		}).Should(Succeed(), "pod %s/patience-fail to be Failed past its 2s wait", ns)
		created := getPod(gatedFail).CreationTimestamp.Time
		c := podCondition(gatedFail, v1alpha1.ConditionLockWaitTimeout)
		Expect(c.LastTransitionTime.Time).NotTo(BeTemporally("<", created.Add(2*time.Second).Truncate(time.Second)), "not before its limit")

		By("leaving a readiness-gated pod, and one whose annotation says Keep, waiting with the condition")
		for _, p := range []*corev1.Pod{readinessWaits, keeps} {
			Eventually(func(g Gomega) {
				c := podCondition(p, v1alpha1.ConditionLockWaitTimeout)
				g.Expect(c).NotTo(BeNil(), "condition %s", v1alpha1.ConditionLockWaitTimeout)
				g.Expect(c.Status).To(Equal(corev1.ConditionTrue))
				g.Expect(env.EventReasons(ns, p.Name)).To(ContainElement("LockWaitTimeout"), "events of pod %s", p.Name)
			}).Should(Succeed(), "pod %s/%s to be told it waited past its limit", ns, p.Name)
			Expect(getPod(p).Status.Phase).NotTo(Equal(corev1.PodFailed), "pod %s was failed", p.Name)
		}
		Expect(gated(getPod(keeps))).To(BeTrue())

		By("granting a pod that kept waiting once the static holder is gone, and turning its condition False")
		Eventually(func() error {
			cur := fetchLock(ns, "patience")
			cur.Spec.HolderIdentity = ""
			return k8s.Update(suiteCtx, cur)
		}).Should(Succeed(), "lock %s/patience to drop its static holder", ns)
		Eventually(func(g Gomega) {
			l := fetchLock(ns, "patience")
			g.Expect(l.Status.Holder).NotTo(BeNil(), "holder of lock patience")
			g.Expect(l.Status.Holder.Identity).To(BeElementOf(readinessWaits.Name, keeps.Name), "a pod still waiting (the failed one is out)")
			p := readinessWaits
			if l.Status.Holder.Identity == keeps.Name {
				p = keeps
			}
			c := podCondition(p, v1alpha1.ConditionLockWaitTimeout)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(corev1.ConditionFalse), "condition %s of the holder once granted", v1alpha1.ConditionLockWaitTimeout)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonGranted))
		}).WithTimeout(20*time.Second).Should(Succeed(), "lock %s/patience to pass to a pod that kept waiting, and turn its condition False", ns)
	})
})
