package podgate_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/distributedlock"
	"github.com/redlock-operator/redlock-operator/controllers/podgate"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// createLock creates a pod-serving lock with a 1.5s ttl on set.
func createLock(ns, name, set string, onLost v1alpha1.LostPolicy) {
	Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.DistributedLockSpec{MasterSet: set, TTL: metav1.Duration{Duration: 1500 * time.Millisecond}, OnLost: onLost},
	})).To(Succeed())
}

// expectHolds checks that lock's status names pod p as its holder, that p
// carries the grant's token and has no scheduling gate left.
func expectHolds(g Gomega, ns, lock string, p *corev1.Pod) {
	l := &v1alpha1.DistributedLock{}
	g.Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: lock}, l)).To(Succeed())
	g.Expect(l.Status.Holder).NotTo(BeNil(), "%s has no holder", lock)
	g.Expect(l.Status.Holder.Pod).NotTo(BeNil(), "%s is held by %s, not a pod", lock, l.Status.Holder.Identity)
	cur := &corev1.Pod{}
	g.Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(p), cur)).To(Succeed())
	g.Expect(l.Status.Holder.Pod.UID).To(Equal(cur.UID), "%s is held by %s, not %s", lock, l.Status.Holder.Identity, p.Name)
	g.Expect(cur.Annotations).To(HaveKeyWithValue(v1alpha1.FencingTokenAnnotation, strconv.FormatInt(l.Status.FencingToken, 10)))
	g.Expect(gated(cur)).To(BeFalse(), "the holder %s is still gated", p.Name)
}

func tokenOf(p *corev1.Pod) int64 {
	t, err := strconv.ParseInt(getPod(p).Annotations[v1alpha1.FencingTokenAnnotation], 10, 64)
	Expect(err).NotTo(HaveOccurred())
	return t
}

// setNodeReady creates node (if needed) and reports its Ready condition.
func setNodeReady(name string, status corev1.ConditionStatus) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := k8s.Create(suiteCtx, node); err == nil {
		DeferCleanup(func() { _ = k8s.Delete(context.Background(), node) })
	}
	Eventually(func() error {
		cur := &corev1.Node{}
		if err := k8s.Get(suiteCtx, client.ObjectKeyFromObject(node), cur); err != nil {
			return err
		}
		cur.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		return k8s.Status().Update(suiteCtx, cur)
	}).Should(Succeed(), "node %s to report Ready %s", name, status)
}

// denyTokenAnnotation installs a ValidatingAdmissionPolicy that refuses
// to add or remove the fencing-token annotation of pod p, as a manager
// that dies between committing a grant and annotating its pod would leave
// it. The returned function lifts it.
func denyTokenAnnotation(p *corev1.Pod) func() {
	const label = "test.redlock.dev/deny-token"
	name := "deny-token-" + p.Namespace + "-" + p.Name
	has := func(o string) string {
		return "(has(" + o + ".metadata.annotations) && '" + v1alpha1.FencingTokenAnnotation + "' in " + o + ".metadata.annotations)"
	}
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: new(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{
				ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{label: p.Name}},
				ResourceRules: []admissionv1.NamedRuleWithOperations{{RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Update},
					Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
				}}},
			},
			Validations: []admissionv1.Validation{{Expression: has("object") + " == " + has("oldObject"), Message: "refused by the test"}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: name, ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": p.Namespace},
			}},
		},
	}
	Expect(k8s.Create(suiteCtx, policy)).To(Succeed())
	Expect(k8s.Create(suiteCtx, binding)).To(Succeed())
	lift := func() {
		_ = k8s.Delete(context.Background(), binding)
		_ = k8s.Delete(context.Background(), policy)
	}
	DeferCleanup(lift)
	Eventually(func() error { // the pod carries the label the policy selects
		cur := getPod(p)
		cur.Labels[label] = p.Name
		return k8s.Update(suiteCtx, cur)
	}).Should(Succeed(), "pod %s/%s to carry label %s", p.Namespace, p.Name, label)
	By("waiting until the API server enforces the policy (probed with a dry run)")
	Eventually(func() string {
		cur := getPod(p)
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations[v1alpha1.FencingTokenAnnotation] = "probe"
		if err := k8s.Update(suiteCtx, cur, client.DryRunAll); err != nil {
			return err.Error()
		}
		return "accepted"
	}).Should(ContainSubstring("refused by the test"), "policy %s to refuse a change of pod %s/%s's fencing token (dry run)", name, p.Namespace, p.Name)
	return lift
}

var _ = Describe("Pods and locks in trouble", Ordered, func() {
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

	It("evicts a holder whose lock was lost when onLost is Evict, as far as its PodDisruptionBudget allows", func() {
		fragile := env.NewServingMasters(ns, "evict-masters", 3, 2*time.Second)
		createLock(ns, "evict", fragile.Name, v1alpha1.LostEvict)
		p := gatedPod(ns, "evict-a", "evict", true)
		p.Labels["app"] = "evict"
		Expect(k8s.Create(suiteCtx, p)).To(Succeed())
		kubeletRuns(p)
		Eventually(func() corev1.ConditionStatus { return gateCondition(getPod(p)) }).Should(Equal(corev1.ConditionTrue), "pod %s/%s to be granted lock evict", ns, p.Name)
		Expect(getPod(p).Annotations).To(HaveKeyWithValue(v1alpha1.OnLostAnnotation, string(v1alpha1.LostEvict)))

		By("guarding the pod with a PodDisruptionBudget that allows no disruption")
		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "evict"},
			Spec: policyv1.PodDisruptionBudgetSpec{
				MinAvailable: new(intstr.FromInt32(1)),
				Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "evict"}},
			},
		}
		Expect(k8s.Create(suiteCtx, pdb)).To(Succeed())

		By("losing the lock: two of three masters stopped past the validity")
		for _, srv := range fragile.Servers[:2] {
			Expect(srv.Stop()).To(Succeed())
		}
		DeferCleanup(func() {
			for _, srv := range fragile.Servers[:2] {
				_ = srv.Cont()
			}
		})
		Eventually(func(g Gomega) {
			g.Expect(env.EventReasons(ns, p.Name)).To(ContainElement(podgate.EventEvictionRefused), "lock status %+v; pod %+v %+v", fetchLock(ns, "evict").Status, getPod(p).Annotations, getPod(p).Status.Conditions)
		}).Should(Succeed(), "pod %s/%s to get event %s, its budget refusing the eviction", ns, p.Name, podgate.EventEvictionRefused)
		Expect(getPod(p).DeletionTimestamp).To(BeNil(), "evicted against its budget")
		Expect(gateCondition(getPod(p))).To(Equal(corev1.ConditionFalse))
		Eventually(func() []string { return env.EventReasons(ns, p.Name) }).Should(ContainElement(podgate.EventLockLost), "pod %s/%s to get event %s once lock evict is lost", ns, p.Name, podgate.EventLockLost)

		By("evicting it once the budget is gone")
		Expect(k8s.Delete(suiteCtx, pdb)).To(Succeed())
		Eventually(func() *metav1.Time { return getPod(p).DeletionTimestamp }).ShouldNot(BeNil(), "pod %s/%s to be evicted once its budget is gone", ns, p.Name)
		// Events are sent asynchronously, after the eviction returned.
		Eventually(func() []string { return env.EventReasons(ns, p.Name) }).Should(ContainElement(podgate.EventEvicted), "pod %s/%s to get event %s", ns, p.Name, podgate.EventEvicted)
	})

	It("tells the holder when its lock is deleted, and applies the lock's onLost", func() {
		createLock(ns, "doomed-keep", ms.Name, v1alpha1.LostKeep)
		createLock(ns, "doomed-evict", ms.Name, v1alpha1.LostEvict)
		keep, evict := gatedPod(ns, "doomed-keep", "doomed-keep", true), gatedPod(ns, "doomed-evict", "doomed-evict", true)
		for _, p := range []*corev1.Pod{keep, evict} {
			Expect(k8s.Create(suiteCtx, p)).To(Succeed())
			kubeletRuns(p)
		}
		Eventually(func(g Gomega) {
			g.Expect(gateCondition(getPod(keep))).To(Equal(corev1.ConditionTrue))
			g.Expect(gateCondition(getPod(evict))).To(Equal(corev1.ConditionTrue))
		}).Should(Succeed(), "pods %s and %s in %s to be granted their locks doomed-keep and doomed-evict", keep.Name, evict.Name, ns)

		By("deleting both locks while their pods hold them")
		Expect(k8s.Delete(suiteCtx, fetchLock(ns, "doomed-keep"))).To(Succeed())
		Expect(k8s.Delete(suiteCtx, fetchLock(ns, "doomed-evict"))).To(Succeed())
		Eventually(func(g Gomega) {
			for _, p := range []*corev1.Pod{keep, evict} {
				cur := getPod(p)
				g.Expect(gateCondition(cur)).To(Equal(corev1.ConditionFalse), "%s still shows its lock held", p.Name)
				g.Expect(cur.Annotations).To(HaveKeyWithValue(podgate.ProblemAnnotation, ContainSubstring("was deleted")), "%s was not told", p.Name)
			}
			g.Expect(env.EventReasons(ns, keep.Name)).To(ContainElement(podgate.EventLockLost), "pod %s to get event %s", keep.Name, podgate.EventLockLost)
		}).Should(Succeed(), "pods %s and %s in %s to be told their locks were deleted", keep.Name, evict.Name, ns)

		By("evicting only the pod whose lock asked for it")
		Eventually(func() *metav1.Time { return getPod(evict).DeletionTimestamp }).ShouldNot(BeNil(), "pod %s/%s (lock onLost Evict) to be evicted once its lock is deleted", ns, evict.Name)
		Consistently(func() *metav1.Time { return getPod(keep).DeletionTimestamp }, time.Second).Should(BeNil(), "pod %s/%s (lock onLost Keep) to stay undeleted after its lock is deleted", ns, keep.Name)
	})

	It("keeps the lock with a holder relabelled after its grant, and does not queue it for the other lock", func() {
		createLock(ns, "first", ms.Name, "")
		createLock(ns, "second", ms.Name, "")
		a, b := gatedPod(ns, "relabel-a", "first", false), gatedPod(ns, "relabel-b", "first", false)
		Expect(k8s.Create(suiteCtx, a)).To(Succeed())
		Eventually(func(g Gomega) { expectHolds(g, ns, "first", a) }).Should(Succeed(), "lock %s/first to be held by pod %s", ns, a.Name)
		Expect(k8s.Create(suiteCtx, b)).To(Succeed())
		kubeletRuns(a)

		By("relabelling the holder for another lock")
		relabel(a, "second")
		Eventually(func() map[string]string { return getPod(a).Annotations }).Should(HaveKeyWithValue(podgate.ProblemAnnotation, ContainSubstring("labelled for second")), "pod %s/%s to be told it is labelled for lock second", ns, a.Name)
		Consistently(func(g Gomega) {
			expectHolds(g, ns, "first", a)
			g.Expect(gated(getPod(b))).To(BeTrue(), "the next pod was ungated while the relabelled holder runs")
			g.Expect(fetchLock(ns, "second").Status.Holder).To(BeNil(), "the relabelled pod was granted the other lock too")
		}, 2*time.Second).Should(Succeed(), "lock %s/first to stay with relabelled pod %s, pod %s gated, lock second unheld", ns, a.Name, b.Name)
		Eventually(func() []string { return env.EventReasons(ns, a.Name) }).Should(ContainElement(distributedlock.EventHolderRelabelled), "pod %s/%s to get event %s", ns, a.Name, distributedlock.EventHolderRelabelled)

		By("handing over once the relabelled holder ended")
		kubeletStops(a, corev1.PodSucceeded)
		Eventually(func(g Gomega) { expectHolds(g, ns, "first", b) }).Should(Succeed(), "lock %s/first to pass to pod %s once %s ended", ns, b.Name, a.Name)
	})

	It("does not take another lock's running holder of the same key for its own former holder", func() {
		Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "alpha"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: ms.Name, Key: "shared-key", TTL: metav1.Duration{Duration: 1500 * time.Millisecond}},
		})).To(Succeed())
		a := gatedPod(ns, "alpha-holder", "alpha", false)
		Expect(k8s.Create(suiteCtx, a)).To(Succeed())
		Eventually(func(g Gomega) { expectHolds(g, ns, "alpha", a) }).Should(Succeed(), "lock %s/alpha to be held by pod %s", ns, a.Name)
		kubeletRuns(a)

		By("creating a second lock of the same key while alpha's holder runs")
		Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "beta"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: ms.Name, Key: "shared-key", TTL: metav1.Duration{Duration: 1500 * time.Millisecond}},
		})).To(Succeed())
		Eventually(func(g Gomega) {
			beta := fetchLock(ns, "beta")
			g.Expect(beta.Status.ObservedGeneration).To(BeEquivalentTo(1), "lock %s/beta not reconciled yet", ns)
			g.Expect(meta.FindStatusCondition(beta.Status.Conditions, v1alpha1.ConditionHeld)).NotTo(BeNil(), "lock %s/beta has no Held condition yet", ns)
		}).Should(Succeed(), "lock %s/beta to be reconciled with a Held condition", ns)
		Consistently(func(g Gomega) {
			g.Expect(fetchLock(ns, "beta").Status.LastHolderPod).To(BeNil(), "beta took alpha's holder for its own")
			g.Expect(env.EventReasons(ns, a.Name)).NotTo(ContainElement(distributedlock.EventHolderRelabelled), "a false HolderRelabelled event on alpha's holder")
			expectHolds(g, ns, "alpha", a)
		}, time.Second).Should(Succeed(), "lock %s/beta not to take alpha's holder %s for its own", ns, a.Name)
	})

	It("keeps others waiting behind a holder whose label was removed, even after its grant was lost", func() {
		fragile := env.NewServingMasters(ns, "unlabel-masters", 3, 2*time.Second)
		createLock(ns, "unlabel", fragile.Name, "")
		a, b := gatedPod(ns, "unlabel-a", "unlabel", true), gatedPod(ns, "unlabel-b", "unlabel", true)
		Expect(k8s.Create(suiteCtx, a)).To(Succeed())
		kubeletRuns(a)
		Eventually(func() corev1.ConditionStatus { return gateCondition(getPod(a)) }).Should(Equal(corev1.ConditionTrue), "pod %s/%s to be granted lock unlabel", ns, a.Name)
		Expect(k8s.Create(suiteCtx, b)).To(Succeed())
		kubeletRuns(b)

		By("removing the holder's label: it is no longer Ready")
		Eventually(func() error {
			cur := getPod(a)
			delete(cur.Labels, v1alpha1.LockLabel)
			return k8s.Update(suiteCtx, cur)
		}).Should(Succeed(), "pod %s/%s to lose its label %s", ns, a.Name, v1alpha1.LockLabel)
		Eventually(func() corev1.ConditionStatus { return gateCondition(getPod(a)) }).Should(Equal(corev1.ConditionFalse), "unlabelled pod %s/%s to be no longer Ready for lock unlabel", ns, a.Name)

		By("losing the grant, then letting the masters serve again: the next pod still waits while the old holder runs")
		for _, srv := range fragile.Servers[:2] {
			Expect(srv.Stop()).To(Succeed())
		}
		Eventually(func() *v1alpha1.LockHolder { return fetchLock(ns, "unlabel").Status.Holder }).Should(BeNil(), "lock %s/unlabel to lose its grant with two of three masters stopped", ns)
		for _, srv := range fragile.Servers[:2] {
			Expect(srv.Cont()).To(Succeed())
		}
		Consistently(func(g Gomega) {
			g.Expect(gateCondition(getPod(a))).To(Equal(corev1.ConditionFalse), "unlabelled former holder %s", a.Name)
			g.Expect(gateCondition(getPod(b))).To(Equal(corev1.ConditionFalse), "granted while the unlabelled former holder runs")
			g.Expect(fetchLock(ns, "unlabel").Status.LastHolderPod).NotTo(BeNil(), "lock unlabel's last holder pod")
		}, 3*time.Second).Should(Succeed(), "pod %s/%s to wait behind unlabelled former holder %s of lock unlabel", ns, b.Name, a.Name)

		By("granting the next pod once the old holder's container stopped")
		kubeletStops(a, corev1.PodSucceeded)
		Eventually(func() corev1.ConditionStatus { return gateCondition(getPod(b)) }, 30*time.Second).Should(Equal(corev1.ConditionTrue), "pod %s/%s to be granted lock unlabel once %s stopped", ns, b.Name, a.Name)
	})

	It("grants a slot's pod nothing while its semaphore moves it (the lock fenced against it), and grants it once unfenced", func() {
		key := "moving-sem"
		lock := &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "moving-0"},
			Spec: v1alpha1.DistributedLockSpec{MasterSet: ms.Name, Key: key + ":slot:0", TTL: metav1.Duration{Duration: 2 * time.Second},
				SlotOf: &v1alpha1.SemaphoreSlot{SemaphoreKey: key, Slots: 1, Index: 0}},
		}
		By("holding the slot on the masters, as another cluster's holder would")
		other, err := redlock.New(redistest.Addrs(ms.Servers), redlock.WithNodeTimeout(time.Second))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(other.Close)
		held, err := other.AcquireSlot(suiteCtx, redlock.Slot{Semaphore: key, Slots: 1, Index: 0}, time.Minute)
		Expect(err).NotTo(HaveOccurred(), "another cluster's holder takes slot 0 of %s", key)
		DeferCleanup(func() { _ = held.Release(context.Background()) })
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		p := gatedPod(ns, "moving-a", lock.Name, false)
		Expect(k8s.Create(suiteCtx, p)).To(Succeed())
		Eventually(func() string { return heldOf(fetchLock(ns, lock.Name)) }).Should(Equal("False/"+v1alpha1.ReasonHeldElsewhere), "slot lock %s/%s to wait for the slot the other cluster holds", ns, lock.Name)

		By("fencing the lock against the pod, as its semaphore does before it relabels the pod")
		Eventually(func() error {
			cur := fetchLock(ns, lock.Name)
			cur.Annotations = map[string]string{v1alpha1.MovingPodAnnotation: string(getPod(p).UID)}
			return k8s.Update(suiteCtx, cur)
		}).Should(Succeed(), "slot lock %s/%s to be fenced", ns, lock.Name)

		By("releasing the slot in the other cluster: the lock, woken or retrying every min(ttl/4, 5s) = 0.5s, grants the fenced pod nothing")
		Expect(held.Release(suiteCtx)).To(Succeed())
		Consistently(func(g Gomega) {
			g.Expect(fetchLock(ns, lock.Name).Status.Holder).To(BeNil(), "holder of %s", lock.Name)
			g.Expect(gated(getPod(p))).To(BeTrue(), "pod %s still gated", p.Name)
		}).WithTimeout(3*time.Second).Should(Succeed(), "slot lock %s/%s to grant its fenced pod %s nothing", ns, lock.Name, p.Name)

		By("unfencing: the lock grants the pod")
		Eventually(func() error {
			cur := fetchLock(ns, lock.Name)
			delete(cur.Annotations, v1alpha1.MovingPodAnnotation)
			return k8s.Update(suiteCtx, cur)
		}).Should(Succeed(), "slot lock %s/%s to be unfenced", ns, lock.Name)
		Eventually(func(g Gomega) { expectHolds(g, ns, lock.Name, p) }).Should(Succeed(), "slot lock %s/%s to grant pod %s once unfenced", ns, lock.Name, p.Name)
	})

	It("refuses pods with both gates or a label that cannot name a lock, and keeps them gated", func() {
		createLock(ns, "picky", ms.Name, "")
		both := gatedPod(ns, "both-gates", "picky", false)
		both.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: v1alpha1.ReadinessGate}}
		malformed := gatedPod(ns, "malformed", "Not_A_Lock", false)
		for _, p := range []*corev1.Pod{both, malformed} {
			Expect(k8s.Create(suiteCtx, p)).To(Succeed())
		}
		Eventually(func(g Gomega) {
			g.Expect(getPod(both).Annotations).To(HaveKeyWithValue(podgate.ProblemAnnotation, ContainSubstring("both")), "problem of pod %s", both.Name)
			g.Expect(getPod(malformed).Annotations).To(HaveKeyWithValue(podgate.ProblemAnnotation, ContainSubstring("does not name a DistributedLock")), "problem of pod %s", malformed.Name)
			g.Expect(env.EventReasons(ns, both.Name)).To(ContainElement(podgate.EventBadLockSpec), "events of pod %s", both.Name)
			g.Expect(env.EventReasons(ns, malformed.Name)).To(ContainElement(podgate.EventBadLockSpec), "events of pod %s", malformed.Name)
		}).Should(Succeed(), "pods %s and %s in %s to be told their lock spec is bad", both.Name, malformed.Name, ns)
		Consistently(func(g Gomega) {
			g.Expect(gated(getPod(both))).To(BeTrue(), "pod %s gated", both.Name)
			g.Expect(gated(getPod(malformed))).To(BeTrue(), "pod %s gated", malformed.Name)
			g.Expect(fetchLock(ns, "picky").Status.Holder).To(BeNil(), "holder of lock picky")
		}, time.Second).Should(Succeed(), "pods %s and %s to stay gated and lock %s/picky unheld", both.Name, malformed.Name, ns)
	})

	It("keeps the lock with a holder on an unreachable node, says so, and hands over at once when the holder is force-deleted", func() {
		setNodeReady("far-node", corev1.ConditionTrue)
		createLock(ns, "far", ms.Name, "")
		a, b := gatedPod(ns, "far-a", "far", true), gatedPod(ns, "far-b", "far", true)
		Expect(k8s.Create(suiteCtx, a)).To(Succeed())
		kubeletRunsOn(a, "far-node")
		Eventually(func() corev1.ConditionStatus { return gateCondition(getPod(a)) }).Should(Equal(corev1.ConditionTrue), "pod %s/%s to be granted lock far", ns, a.Name)
		Expect(k8s.Create(suiteCtx, b)).To(Succeed())
		kubeletRuns(b)
		reachable := func() *metav1.Condition {
			return meta.FindStatusCondition(fetchLock(ns, "far").Status.Conditions, v1alpha1.ConditionHolderReachable)
		}
		Eventually(reachable).Should(HaveField("Status", metav1.ConditionTrue), "lock %s/far to show its holder %s reachable", ns, a.Name)

		By("losing contact with the holder's node")
		setNodeReady("far-node", corev1.ConditionUnknown)
		Eventually(reachable).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", v1alpha1.ReasonHolderUnreachable)), "lock %s/far to show its holder %s unreachable once node far-node is not Ready", ns, a.Name)
		Consistently(func(g Gomega) {
			expectHolds(g, ns, "far", a)
			g.Expect(gateCondition(getPod(b))).To(Equal(corev1.ConditionFalse), "gate of pod %s", b.Name)
		}, 2*time.Second).Should(Succeed(), "lock %s/far to stay with unreachable holder %s, pod %s gated", ns, a.Name, b.Name)

		By("handing over at once when the holder is force-deleted")
		Expect(k8s.Delete(suiteCtx, getPod(a), client.GracePeriodSeconds(0))).To(Succeed())
		Eventually(func(g Gomega) {
			expectHolds(g, ns, "far", b)
			g.Expect(gateCondition(getPod(b))).To(Equal(corev1.ConditionTrue), "gate of pod %s", b.Name)
		}).Should(Succeed(), "lock %s/far to pass at once to pod %s once %s is force-deleted", ns, b.Name, a.Name)
		Eventually(reachable).Should(HaveField("Status", metav1.ConditionTrue), "lock %s/far to show its new holder %s reachable", ns, b.Name)
	})

	It("leaves neither two holders nor a stuck queue when the manager restarts in the middle of a handover", func() {
		own := env.NewNamespace() // watchExclusion looks at every pod of the namespace
		set := env.NewServingMasters(own, "masters", 3, 4*time.Second)
		violations := watchExclusion(own)
		createLock(own, "steps", set.Name, "")
		var pods []*corev1.Pod
		for _, name := range []string{"step-1", "step-2", "step-3"} {
			p := gatedPod(own, name, "steps", false)
			Expect(k8s.Create(suiteCtx, p)).To(Succeed())
			pods = append(pods, p)
		}
		Eventually(func(g Gomega) { expectHolds(g, own, "steps", pods[0]) }).Should(Succeed(), "lock %s/steps to be held by pod %s", own, pods[0].Name)
		kubeletRuns(pods[0])

		By("finishing the holder while no manager runs")
		mgr.Stop()
		kubeletStops(pods[0], corev1.PodSucceeded)
		mgr = env.StartManager()
		Eventually(func(g Gomega) { expectHolds(g, own, "steps", pods[1]) }).Should(Succeed(), "lock %s/steps to pass to pod %s after the manager restarted", own, pods[1].Name)

		By("committing the next grant while its pod cannot be annotated, as a manager dying in between would")
		lift := denyTokenAnnotation(pods[2])
		kubeletRuns(pods[1])
		kubeletStops(pods[1], corev1.PodSucceeded)
		Eventually(func(g Gomega) {
			h := fetchLock(own, "steps").Status.Holder
			g.Expect(h).NotTo(BeNil(), "holder of lock steps")
			g.Expect(h.Pod).NotTo(BeNil(), "holder pod of lock steps")
			g.Expect(h.Pod.UID).To(Equal(getPod(pods[2]).UID), "holder pod of lock steps, want pod %s", pods[2].Name)
		}).Should(Succeed(), "lock %s/steps to commit its grant to pod %s", own, pods[2].Name)
		Consistently(func() bool { return gated(getPod(pods[2])) }, time.Second).Should(BeTrue(), "pod %s/%s ungated before its token was on it", own, pods[2].Name)

		By("restarting the manager with the refusal lifted: the committed grant reaches its pod")
		mgr.Stop()
		lift()
		mgr = env.StartManager()
		Eventually(func(g Gomega) { expectHolds(g, own, "steps", pods[2]) }).Should(Succeed(), "lock %s/steps to reach pod %s once the manager restarted", own, pods[2].Name)
		Expect(tokenOf(pods[1])).To(BeNumerically(">", tokenOf(pods[0])))
		Expect(tokenOf(pods[2])).To(BeNumerically(">", tokenOf(pods[1])))
		Expect(violations()).To(BeEmpty())
	})
})

// The same key served by two operators on two API servers: pods in both
// clusters queue on it, and never hold it at once.
var _ = Describe("Pods of two clusters sharing masters", Ordered, func() {
	var (
		other           *testenv.Env
		mgrs            []*testenv.Manager
		nsHere, nsThere string
		clusters        []client.Client
		namespaces      []string
		servers         *testenv.MasterSet
		violations      func() []string
	)
	BeforeAll(func() {
		other = testenv.Start()
		DeferCleanup(other.Stop)
		mgrs = []*testenv.Manager{env.StartManager(), other.StartManager()}
		DeferCleanup(func() {
			for _, m := range mgrs {
				m.Stop()
			}
		})
		nsHere, nsThere = env.NewNamespace(), other.NewNamespace()
		servers = env.NewServingMasters(nsHere, "masters", 3, 4*time.Second)
		other.CreateMasterSet(&testenv.MasterSet{Servers: servers.Servers, Name: "masters", NS: nsThere}, 4*time.Second)
		clusters, namespaces = []client.Client{k8s, other.Client}, []string{nsHere, nsThere}
	})

	It("hands the key from pod to pod across both clusters, one at a time, with increasing tokens", func() {
		violations = watchAcross(clusters, namespaces)
		for i, c := range clusters {
			Expect(c.Create(suiteCtx, &v1alpha1.DistributedLock{
				ObjectMeta: metav1.ObjectMeta{Namespace: namespaces[i], Name: "shared"},
				Spec:       v1alpha1.DistributedLockSpec{MasterSet: "masters", Key: "shared-key", TTL: metav1.Duration{Duration: 1500 * time.Millisecond}},
			})).To(Succeed())
			for j := range 2 {
				Expect(c.Create(suiteCtx, gatedPod(namespaces[i], "worker-"+strconv.Itoa(j), "shared", false))).To(Succeed())
			}
		}

		By("finishing each pod as soon as it is ungated, until all four ran")
		var order []string
		var tokens []int64
		for len(order) < 4 {
			var ungated *corev1.Pod
			var cluster client.Client
			Eventually(func(g Gomega) {
				for i, c := range clusters {
					var list corev1.PodList
					g.Expect(c.List(suiteCtx, &list, client.InNamespace(namespaces[i]))).To(Succeed())
					for k := range list.Items {
						p := &list.Items[k]
						if !gated(p) && p.Status.Phase != corev1.PodSucceeded {
							ungated, cluster = p, c
							return
						}
					}
				}
				g.Expect(ungated).NotTo(BeNil(), "no pod ungated; ran so far: %v", order)
			}, 30*time.Second).Should(Succeed(), "a pod of namespaces %v to be ungated (ran so far: %v)", namespaces, order)
			token, err := strconv.ParseInt(ungated.Annotations[v1alpha1.FencingTokenAnnotation], 10, 64)
			Expect(err).NotTo(HaveOccurred())
			order = append(order, ungated.Namespace+"/"+ungated.Name)
			tokens = append(tokens, token)
			Eventually(func() error {
				cur := &corev1.Pod{}
				if err := cluster.Get(suiteCtx, client.ObjectKeyFromObject(ungated), cur); err != nil {
					return err
				}
				cur.Status.Phase = corev1.PodSucceeded
				return cluster.Status().Update(suiteCtx, cur)
			}).Should(Succeed(), "pod %s/%s to be reported Succeeded", ungated.Namespace, ungated.Name)
		}
		Expect(strings.Join(order, " ")).To(And(ContainSubstring(nsHere), ContainSubstring(nsThere)), "both clusters took part")
		for i := 1; i < len(tokens); i++ {
			Expect(tokens[i]).To(BeNumerically(">", tokens[i-1]), "tokens in grant order %v (%v)", tokens, order)
		}
		Expect(violations()).To(BeEmpty())
	})
})

// watchAcross polls the pods of namespaces[i] in clusters[i] until the
// spec ends and records any moment at which two of them, in any of the
// clusters, could run.
func watchAcross(clusters []client.Client, namespaces []string) func() []string {
	var mu sync.Mutex
	var violations []string
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond): // sampling interval
			}
			var running []string
			for i, c := range clusters {
				var list corev1.PodList
				if c.List(suiteCtx, &list, client.InNamespace(namespaces[i])) != nil {
					continue
				}
				for k := range list.Items {
					if runnable(&list.Items[k]) {
						running = append(running, namespaces[i]+"/"+list.Items[k].Name)
					}
				}
			}
			if len(running) > 1 {
				mu.Lock()
				violations = append(violations, strings.Join(running, ", ")+" may run at once")
				mu.Unlock()
			}
		}
	}()
	DeferCleanup(func() { close(stop); <-done })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(violations)
	}
}

// updateLabel sets label key of pod p to value ("" removes it) with an
// update of the pod as read now.
func updateLabel(p *corev1.Pod, key, value string) error { return updateLabelAs(k8s, p, key, value) }

// updateLabelAs is updateLabel written by c (whom it acts as).
func updateLabelAs(c client.Client, p *corev1.Pod, key, value string) error {
	cur := getPod(p)
	if value == "" {
		delete(cur.Labels, key)
	} else {
		cur.Labels[key] = value
	}
	return c.Update(suiteCtx, cur)
}

// The policy config/admission-policy ships, applied as it is.
var _ = Describe("The lock-gate admission policy", Ordered, func() {
	var ns string
	BeforeAll(func() {
		ns = env.NewNamespace()
		env.InstallAdmissionPolicy(ns)
	})

	It("refuses a pod that waits behind a lock gate without the label naming its lock, and admits labelled ones", func() {
		bare := func(name string) *corev1.Pod {
			p := gatedPod(ns, name, "", false)
			p.Labels = nil
			return p
		}
		schedulingGated := bare("gate-no-label")
		readinessGated := bare("readiness-no-label")
		readinessGated.Spec.SchedulingGates = nil
		readinessGated.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: v1alpha1.ReadinessGate}}
		By("waiting until the API server enforces the policy (probed with a dry run)")
		Eventually(func() error { return k8s.Create(suiteCtx, schedulingGated.DeepCopy(), client.DryRunAll) }).
			Should(MatchError(ContainSubstring("has no label redlock.dev/lock")), "the policy to refuse pod %s/%s, gated without label %s (dry run)", ns, schedulingGated.Name, v1alpha1.LockLabel)
		Expect(k8s.Create(suiteCtx, readinessGated)).To(MatchError(ContainSubstring("readiness gate redlock.dev/lock-held but no label")))

		emptyLabel := gatedPod(ns, "empty-label", "", false)
		Expect(k8s.Create(suiteCtx, emptyLabel)).To(MatchError(ContainSubstring("has no label redlock.dev/lock")), "an empty label names no lock")

		By("admitting a labelled gated pod and an unlabelled pod without a gate")
		labelled := gatedPod(ns, "labelled", "some-lock", false)
		Expect(k8s.Create(suiteCtx, labelled)).To(Succeed())
		plain := bare("plain")
		plain.Spec.SchedulingGates = nil
		Expect(k8s.Create(suiteCtx, plain)).To(Succeed())

		By("refusing to change or remove the label while the pod waits for its lock")
		relabel := func(p *corev1.Pod, value string) error { return updateLabel(p, v1alpha1.LockLabel, value) }
		Expect(relabel(labelled, "other-lock")).To(MatchError(ContainSubstring("cannot change")))
		Expect(relabel(labelled, "")).To(MatchError(ContainSubstring("denied request")), "removing the label of a gated pod")

		By("refusing it for a pod granted a lock that may still run, allowing it once the pod finished")
		granted := gatedPod(ns, "granted", "some-lock", true)
		granted.Annotations = map[string]string{v1alpha1.FencingTokenAnnotation: "7"}
		Expect(k8s.Create(suiteCtx, granted)).To(Succeed())
		Expect(relabel(granted, "other-lock")).To(MatchError(ContainSubstring("cannot change")))
		kubeletRuns(granted)
		kubeletStops(granted, corev1.PodSucceeded)
		Expect(relabel(granted, "other-lock")).To(Succeed())
	})

	It("admits a pod gated for a semaphore, lets only the operator label it for a slot, move it or take it back from the slot while it waits ungranted, and fixes that label", func() {
		semPod := gatedPod(ns, "sem-waiting", "", false)
		semPod.Labels = map[string]string{v1alpha1.SemaphoreLabel: "some-semaphore"}
		By("waiting until the API server enforces the policy (probed with a dry run of an unlabelled gated pod)")
		unlabelled := gatedPod(ns, "sem-unlabelled", "", false)
		unlabelled.Labels = nil
		Eventually(func() error { return k8s.Create(suiteCtx, unlabelled, client.DryRunAll) }).
			Should(MatchError(ContainSubstring("nor redlock.dev/semaphore")), "the policy to refuse pod %s/%s, gated without a label (dry run)", ns, unlabelled.Name)

		By("admitting the pod labelled only for its semaphore")
		Expect(k8s.Create(suiteCtx, semPod)).To(Succeed(), "pod %s/%s gated for a semaphore", ns, semPod.Name)

		By("refusing a semaphore's pod created already labelled for a slot: it would skip the queue")
		preslotted := gatedPod(ns, "sem-preslotted", "", false)
		preslotted.Labels = map[string]string{v1alpha1.SemaphoreLabel: "some-semaphore", v1alpha1.LockLabel: "some-semaphore-2-0"}
		Expect(k8s.Create(suiteCtx, preslotted, client.DryRunAll)).To(MatchError(ContainSubstring("create it with the label redlock.dev/semaphore only")),
			"pod %s/%s created labelled for a slot", ns, preslotted.Name)

		By("allowing the operator, and nobody else, the label naming a slot's lock, and a move to another slot while the pod waits ungranted")
		operator := env.ClientAs(testenv.OperatorUser, testenv.Admin)
		user := env.PodEditor(ns, "alice")
		cannotChange := MatchError(ContainSubstring("redlock.dev/lock cannot change"))
		Expect(updateLabelAs(user, semPod, v1alpha1.LockLabel, "some-semaphore-2-0")).To(cannotChange, "alice labelling pod %s for a slot", semPod.Name)
		Expect(updateLabelAs(operator, semPod, v1alpha1.LockLabel, "some-semaphore-2-0")).To(Succeed(), "labelling pod %s for a slot", semPod.Name)
		Expect(updateLabelAs(user, semPod, v1alpha1.LockLabel, "some-semaphore-2-1")).To(cannotChange, "alice moving pod %s to another slot", semPod.Name)
		Expect(updateLabelAs(operator, semPod, v1alpha1.LockLabel, "some-semaphore-2-1")).To(Succeed(), "the operator moving the waiting pod %s to another slot", semPod.Name)

		By("letting the operator, and nobody else, take the waiting pod back from its slot, and label it for another")
		Expect(updateLabelAs(user, semPod, v1alpha1.LockLabel, "")).To(cannotChange, "alice removing the slot label of pod %s", semPod.Name)
		Expect(updateLabelAs(operator, semPod, v1alpha1.LockLabel, "")).To(Succeed(), "the operator taking pod %s back from its slot", semPod.Name)
		Expect(updateLabelAs(operator, semPod, v1alpha1.LockLabel, "some-semaphore-3-2")).To(Succeed(), "labelling pod %s for another slot", semPod.Name)

		By("refusing the operator too once the pod was granted its slot")
		granted := getPod(semPod)
		granted.Annotations = map[string]string{v1alpha1.FencingTokenAnnotation: "3"}
		Expect(k8s.Update(suiteCtx, granted)).To(Succeed(), "annotating pod %s with its token", semPod.Name)
		Expect(updateLabelAs(operator, semPod, v1alpha1.LockLabel, "")).To(cannotChange, "the operator taking the granted pod %s back", semPod.Name)
		Expect(updateLabelAs(operator, semPod, v1alpha1.LockLabel, "some-semaphore-3-0")).To(cannotChange, "the operator moving the granted pod %s to another slot", semPod.Name)

		By("refusing a change or removal of its semaphore label while it waits")
		Expect(updateLabel(semPod, v1alpha1.SemaphoreLabel, "other-semaphore")).To(MatchError(ContainSubstring("redlock.dev/semaphore cannot change")), "moving pod %s to another semaphore", semPod.Name)
		Expect(updateLabel(semPod, v1alpha1.SemaphoreLabel, "")).To(MatchError(ContainSubstring("redlock.dev/semaphore cannot change")), "removing pod %s's semaphore label", semPod.Name)
	})

	It("refuses a pod created with the holder mark, and a change of a pod's gate mode", func() {
		By("waiting until the API server enforces the policy (probed with a dry run)")
		premarked := holderLabelPod(ns, "premarked", "some-lock")
		premarked.Labels[v1alpha1.HoldsLabel] = "some-lock"
		Eventually(func() error { return k8s.Create(suiteCtx, premarked.DeepCopy(), client.DryRunAll) }).
			Should(MatchError(ContainSubstring("redlock.dev/holds marks the pod that holds a lock")), "the policy to refuse pod %s/%s, created with the holder mark (dry run)", ns, premarked.Name)

		By("admitting a pod in holder-label mode, and the operator's mark on it later")
		p := holderLabelPod(ns, "label-mode", "some-lock")
		Expect(k8s.Create(suiteCtx, p)).To(Succeed())
		operator := env.ClientAs(testenv.OperatorUser, testenv.Admin)
		Expect(updateLabelAs(operator, p, v1alpha1.HoldsLabel, "some-lock")).To(Succeed(), "the operator marking pod label-mode")

		By("refusing the mark, or a change of it, by a user who may edit pods; letting the user remove it")
		user := env.PodEditor(ns, "alice")
		other := holderLabelPod(ns, "label-mode-other", "some-lock")
		Expect(k8s.Create(suiteCtx, other)).To(Succeed())
		markAs := func(c client.Client, p *corev1.Pod, value string) error {
			return updateLabelAs(c, p, v1alpha1.HoldsLabel, value)
		}
		Expect(markAs(user, other, "some-lock")).To(MatchError(ContainSubstring("only redlock-operator ("+testenv.OperatorUser+") adds or changes it")), "alice marking pod %s", other.Name)
		Expect(markAs(user, p, "other-lock")).To(MatchError(ContainSubstring("only redlock-operator")), "alice changing the mark of pod %s", p.Name)
		Expect(markAs(user, p, "")).To(Succeed(), "alice removing the mark of pod %s", p.Name)
		Expect(markAs(operator, p, "some-lock")).To(Succeed(), "the operator marking pod %s again", p.Name)

		By("refusing to change or remove its gate mode")
		changeMode := func(mode string) func() error {
			// A conflict with the pod gate controller's write is tried again.
			return func() error { return updateLabel(p, v1alpha1.GateModeLabel, mode) }
		}
		Eventually(changeMode(v1alpha1.GateModeReadiness)).Should(MatchError(ContainSubstring("fixed at creation")), "changing the gate mode of pod label-mode")
		Eventually(changeMode("")).Should(MatchError(ContainSubstring("fixed at creation")), "removing the gate mode of pod label-mode")
	})

	It("refuses a pod that asks for the agent and has none, so that its app never runs without the lock", func() {
		// No webhook runs in this spec: as if the pod were not labelled,
		// its namespace not watched, or the webhook turned off.
		By("waiting until the API server enforces the policy (probed with a dry run)")
		bare := holderLabelPod(ns, "agent-missing", "some-lock")
		bare.Annotations = map[string]string{v1alpha1.AgentAnnotation: v1alpha1.AgentRun}
		bare.Spec.Containers[0].Command = []string{"app"}
		Eventually(func() error { return k8s.Create(suiteCtx, bare.DeepCopy(), client.DryRunAll) }).
			Should(MatchError(ContainSubstring("asks for the in-pod agent (annotation redlock.dev/agent) but has none")), "the policy to refuse pod %s/%s, asking for the agent without it (dry run)", ns, bare.Name)
		unlabelled := bare.DeepCopy()
		unlabelled.Name, unlabelled.Labels = "agent-unlabelled", nil
		Expect(k8s.Create(suiteCtx, unlabelled)).To(MatchError(ContainSubstring("but has none")), "an unlabelled pod asking for the agent")

		By("admitting the same pod once the agent is in it, as the webhook adds it")
		withAgent := bare.DeepCopy()
		_, err := podagent.Inject(withAgent, podagent.Options{Image: "redlock-operator:test"})
		Expect(err).NotTo(HaveOccurred())
		Expect(k8s.Create(suiteCtx, withAgent)).To(Succeed())
	})
})
