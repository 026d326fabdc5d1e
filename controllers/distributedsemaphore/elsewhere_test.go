package distributedsemaphore_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
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
	patientMasters(k8s, ms)
	other, err := redlock.New(redistest.Addrs(ms.Servers), append(opts, redlock.WithNodeTimeout(time.Second))...)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(other.Close)
	return other
}

// patientMasters gives the master set ms of the API server c a node
// timeout of 1s.
func patientMasters(c client.Client, ms *testenv.MasterSet) {
	// Retried: the controller writes the set's status meanwhile.
	Eventually(func() error {
		set := &v1alpha1.RedisMasterSet{}
		if err := c.Get(suiteCtx, client.ObjectKey{Namespace: ms.NS, Name: ms.Name}, set); err != nil {
			return err
		}
		set.Spec.NodeTimeout = &metav1.Duration{Duration: time.Second}
		return c.Update(suiteCtx, set)
	}).Should(Succeed(), "master set %s/%s to take a node timeout of 1s", ms.NS, ms.Name)
}

// holdElsewhere takes slot index of sem's key on the masters, as another
// cluster's holder would (given back when the spec ends).
func holdElsewhere(other *redlock.Client, sem *v1alpha1.DistributedSemaphore, index int) *redlock.Lock {
	l, err := other.AcquireSlot(suiteCtx, redlock.Slot{Semaphore: sem.RedisKey(), Slots: int(sem.Spec.Slots), Index: index}, time.Minute)
	Expect(err).NotTo(HaveOccurred(), "another cluster's holder takes slot %d of %s", index, sem.RedisKey())
	DeferCleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// waitsHeldElsewhere waits until pod is given a slot whose lock the masters
// refused for another holder (HeldElsewhere), and returns that slot.
func waitsHeldElsewhere(pod *corev1.Pod) string {
	var slot string
	Eventually(func(g Gomega) {
		slot = getPod(pod).Labels[v1alpha1.LockLabel]
		g.Expect(slot).NotTo(BeEmpty(), "the slot pod %s was given", pod.Name)
		lock := &v1alpha1.DistributedLock{}
		g.Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: pod.Namespace, Name: slot}, lock)).To(Succeed())
		held := meta.FindStatusCondition(lock.Status.Conditions, v1alpha1.ConditionHeld)
		g.Expect(held).NotTo(BeNil(), "the Held condition of %s", slot)
		g.Expect(held.Reason).To(Equal(v1alpha1.ReasonHeldElsewhere), "why %s is not held", slot)
	}).WithTimeout(20*time.Second).Should(Succeed(), "pod %s/%s to wait for a slot the other cluster holds", pod.Namespace, pod.Name)
	return slot
}

var _ = Describe("A semaphore whose masters another cluster shares", func() {
	It("gives a waiting pod a slot free on the masters, not one another cluster holds", func() {
		mgr := env.StartManager()
		DeferCleanup(mgr.Stop)
		ms := env.NewServingMasters(env.NewNamespace(), "masters", 3, 10*time.Second)
		sem := newSemaphore(ms, "shared", "", 2)
		other := anotherCluster(ms)

		By("holding slot 0 of the semaphore's key on the masters, as another cluster's holder would")
		holdElsewhere(other, sem, 0)

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
		held := []*redlock.Lock{holdElsewhere(other, sem, 0), holdElsewhere(other, sem, 1)}

		By("creating the semaphore and a pod, given a slot and refused it by the masters")
		Expect(k8s.Create(suiteCtx, sem)).To(Succeed())
		pod := semPods(ns, sem.Name, "moves", 1)[0]
		first := waitsHeldElsewhere(pod)
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
		left := &v1alpha1.DistributedLock{}
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: first}, left)).To(Succeed())
		Expect(left.Annotations).To(HaveKeyWithValue(v1alpha1.MovingPodAnnotation, string(getPod(pod).UID)), "slot lock %s fenced against the pod that left it", first)
		Expect(left.Status.Holder).To(BeNil(), "slot lock %s, which the pod left, holds nothing", first)
	})
})

var _ = Describe("A semaphore's pod whose move did not land", func() {
	It("is taken back into the queue, given a slot again (its fence cleared) and granted it", func() {
		mgr := env.StartManager()
		DeferCleanup(mgr.Stop)
		ms := env.NewServingMasters(env.NewNamespace(), "masters", 3, 10*time.Second)
		sem := newSemaphore(ms, "left", "", 1)
		other := anotherCluster(ms)

		By("holding the one slot on the masters, as another cluster's holder would")
		held := holdElsewhere(other, sem, 0)
		Expect(k8s.Create(suiteCtx, sem)).To(Succeed())
		pod := semPods(ms.NS, sem.Name, "left", 1)[0]
		slot := waitsHeldElsewhere(pod)
		Expect(slot).To(Equal(sem.SlotLockName(1, 0)), "the one slot")

		By("fencing the slot's lock against the pod, as a move whose relabel then failed leaves it")
		Eventually(func() error {
			lock := &v1alpha1.DistributedLock{}
			if err := k8s.Get(suiteCtx, client.ObjectKey{Namespace: ms.NS, Name: slot}, lock); err != nil {
				return err
			}
			lock.Annotations = map[string]string{v1alpha1.MovingPodAnnotation: string(getPod(pod).UID)}
			return k8s.Update(suiteCtx, lock)
		}).Should(Succeed(), "slot lock %s/%s to be fenced", ms.NS, slot)
		Eventually(func() []string { return env.EventReasons(ms.NS, pod.Name) }).Should(ContainElement(distributedsemaphore.EventSlotTakenBack), "pod %s/%s taken back into the queue", ms.NS, pod.Name)

		By("releasing the slot in the other cluster: the pod, given the slot again, is granted it")
		Expect(held.Release(suiteCtx)).To(Succeed())
		Eventually(func(g Gomega) {
			lock, token := tokenOf(pod)
			g.Expect(lock).To(Equal(slot), "the slot the pod was granted")
			g.Expect(token).To(BeNumerically(">", 0), "the pod's fencing token")
			cur := &v1alpha1.DistributedLock{}
			g.Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ms.NS, Name: slot}, cur)).To(Succeed())
			g.Expect(cur.Annotations).NotTo(HaveKey(v1alpha1.MovingPodAnnotation), "the fence of %s", slot)
		}).WithTimeout(20*time.Second).Should(Succeed(), "pod %s/%s granted slot %s again", ms.NS, pod.Name, slot)
	})
})
