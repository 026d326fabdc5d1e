package distributedsemaphore_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/distributedsemaphore"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// anotherCluster gives ms's masters a node timeout of 1s (a loaded
// machine's masters may take longer than the suite's 200ms to answer, and
// without the masters' answers these specs would show nothing) and
// returns a client of them playing another cluster's manager.
func anotherCluster(ms *testenv.MasterSet, opts ...redlock.Option) *redlock.Client {
	set := &v1alpha1.RedisMasterSet{}
	Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ms.NS, Name: ms.Name}, set)).To(Succeed())
	set.Spec.NodeTimeout = &metav1.Duration{Duration: time.Second}
	Expect(k8s.Update(suiteCtx, set)).To(Succeed())
	other, err := redlock.New(redistest.Addrs(ms.Servers), append(opts, redlock.WithNodeTimeout(time.Second))...)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(other.Close)
	return other
}

var _ = Describe("A semaphore whose masters another cluster shares", func() {
	It("gives a waiting pod a slot free on the masters, not one another cluster holds", func() {
		mgr := env.StartManager()
		DeferCleanup(mgr.Stop)
		ms := env.NewServingMasters(env.NewNamespace(), "masters", 3, 10*time.Second)
		sem := newSemaphore(ms, "shared", "", 2)
		other := anotherCluster(ms)

		By("holding slot 0 of the semaphore's key on the masters, as another cluster's holder would")
		held, err := other.AcquireSlot(suiteCtx, redlock.Slot{Semaphore: sem.RedisKey(), Slots: 2, Index: 0}, time.Minute)
		Expect(err).NotTo(HaveOccurred(), "another cluster's holder takes slot 0 of %s", sem.RedisKey())
		DeferCleanup(func() { _ = held.Release(suiteCtx) })

		By("creating the semaphore and one waiting pod")
		Expect(k8s.Create(suiteCtx, sem)).To(Succeed())
		pods := semPods(ms.NS, sem.Name, "waits", 1)
		Eventually(func(g Gomega) {
			lock, token := tokenOf(pods[0])
			g.Expect(lock).To(Equal(sem.SlotLockName(2, 1)), "the slot the pod was granted")
			g.Expect(token).To(BeNumerically(">", 0), "the pod's fencing token")
		}).WithTimeout(20*time.Second).Should(Succeed(), "pod %s/%s granted slot 1 of semaphore %s, the one free on the masters", ms.NS, pods[0].Name, sem.Name)
	})
})

var _ = Describe("A semaphore's pod waiting for a slot another cluster holds", func() {
	It("is moved, under the admission policy, to a slot that frees on the masters", func() {
		ns := env.NewNamespace()
		env.InstallAdmissionPolicy(ns)
		mgr := env.StartScopedManager(testenv.Scope{Cfg: env.ConfigAs(testenv.OperatorUser, testenv.Admin)}, nil)
		DeferCleanup(mgr.Stop)
		ms := env.NewServingMasters(ns, "masters", 3, 10*time.Second)
		sem := newSemaphore(ms, "moves", "", 2)
		other := anotherCluster(ms)

		By("holding both slots of the semaphore's key on the masters, as another cluster's holders would")
		var held []*redlock.Lock
		for i := range 2 {
			l, err := other.AcquireSlot(suiteCtx, redlock.Slot{Semaphore: sem.RedisKey(), Slots: 2, Index: i}, time.Minute)
			Expect(err).NotTo(HaveOccurred(), "another cluster's holder takes slot %d of %s", i, sem.RedisKey())
			DeferCleanup(func() { _ = l.Release(suiteCtx) })
			held = append(held, l)
		}

		By("creating the semaphore and a pod, given a slot and refused it by the masters")
		Expect(k8s.Create(suiteCtx, sem)).To(Succeed())
		pod := semPods(ns, sem.Name, "moves", 1)[0]
		var first string
		Eventually(func(g Gomega) {
			first = getPod(pod).Labels[v1alpha1.LockLabel]
			g.Expect(first).NotTo(BeEmpty(), "the slot pod %s was given", pod.Name)
			lock := &v1alpha1.DistributedLock{}
			g.Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: first}, lock)).To(Succeed())
			held := meta.FindStatusCondition(lock.Status.Conditions, v1alpha1.ConditionHeld)
			g.Expect(held).NotTo(BeNil(), "the Held condition of %s", first)
			g.Expect(held.Reason).To(Equal(v1alpha1.ReasonHeldElsewhere), "why %s is not held", first)
		}).WithTimeout(20*time.Second).Should(Succeed(), "pod %s/%s to wait for a slot the other cluster holds", ns, pod.Name)
		freed, want := held[0], sem.SlotLockName(2, 0)
		if first == want {
			freed, want = held[1], sem.SlotLockName(2, 1)
		}
		cur, patch := env.LabelPatch(pod, v1alpha1.LockLabel, want)
		Expect(env.PodEditor(ns, "carol").Patch(suiteCtx, cur, patch)).
			To(MatchError(ContainSubstring("redlock.dev/lock cannot change")), "a user who may edit pods moving pod %s/%s", ns, pod.Name)

		By("releasing the other slot in the other cluster: the pod moves to it and is granted it")
		Expect(freed.Release(suiteCtx)).To(Succeed())
		Eventually(func(g Gomega) {
			lock, token := tokenOf(pod)
			g.Expect(lock).To(Equal(want), "the slot the pod was granted")
			g.Expect(token).To(BeNumerically(">", 0), "the pod's fencing token")
		}).WithTimeout(20*time.Second).Should(Succeed(), "pod %s/%s moved from %s to %s, free on the masters, and granted it", ns, pod.Name, first, want)
		Eventually(func() []string { return env.EventReasons(ns, pod.Name) }).Should(ContainElement(distributedsemaphore.EventSlotMoved), "events of pod %s", pod.Name)
	})
})
