package distributedsemaphore_test

import (
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/podsim"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

// graceFinalizer keeps a deleted pod in place, as a kubelet does during
// its grace period.
const graceFinalizer = "test.redlock.dev/grace-period"

// setGraceFinalizer adds (on) or removes the finalizer graceFinalizer of
// pod; a pod already gone is left alone.
func setGraceFinalizer(pod *corev1.Pod, on bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &corev1.Pod{}
		if err := k8s.Get(suiteCtx, client.ObjectKeyFromObject(pod), cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		has := slices.Contains(cur.Finalizers, graceFinalizer)
		switch {
		case on && !has:
			cur.Finalizers = append(cur.Finalizers, graceFinalizer)
		case !on && has:
			cur.Finalizers = slices.DeleteFunc(cur.Finalizers, func(f string) bool { return f == graceFinalizer })
		default:
			return nil
		}
		return client.IgnoreNotFound(k8s.Update(suiteCtx, cur))
	})
}

func getLock(ns, name string) (*v1alpha1.DistributedLock, error) {
	l := &v1alpha1.DistributedLock{}
	return l, k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, l)
}

// holdingTwo creates a semaphore of two slots and two pods given one each,
// reported running; it returns the semaphore and the pods of slots 0 and 1.
func holdingTwo(ms *testenv.MasterSet, name string) (*v1alpha1.DistributedSemaphore, *corev1.Pod, *corev1.Pod) {
	sem := newSemaphore(ms, name, "", 2)
	Expect(k8s.Create(suiteCtx, sem)).To(Succeed())
	pods := semPods(ms.NS, name, name, 2)
	Eventually(func() []string { return ungated(pods) }).WithTimeout(20*time.Second).
		Should(Equal([]string{name + "-1", name + "-2"}), "the pods of semaphore %s/%s to be ungated", ms.NS, name)
	bySlot := map[string]*corev1.Pod{}
	for _, p := range pods {
		lock, _ := tokenOf(p)
		bySlot[lock] = p
		Expect(podsim.Run(suiteCtx, k8s, p, "node-1")).To(Succeed())
	}
	for i := range int32(2) {
		Expect(bySlot).To(HaveKey(sem.SlotLockName(2, i)), "a pod given slot %d of semaphore %s/%s", i, ms.NS, name)
	}
	return sem, bySlot[sem.SlotLockName(2, 0)], bySlot[sem.SlotLockName(2, 1)]
}

var _ = Describe("DistributedSemaphore idle slots", Ordered, func() {
	var (
		mgr *testenv.Manager
		ns  string
	)
	BeforeAll(func() {
		mgr = env.StartManager()
		ns = env.NewNamespace()
	})
	AfterAll(func() { mgr.Stop() })

	It("keeps a slot of the previous number while its former holder, deleted after its grant was lost, may still run", func() {
		masters := env.NewServingMasters(ns, "fragile", 3, 4*time.Second)
		sem, ended, deleted := holdingTwo(masters, "shrunk")
		ttl := sem.Spec.TTL.Duration
		bySlot := map[string]*corev1.Pod{"shrunk-2-0": ended, "shrunk-2-1": deleted}

		By("giving the pod of slot 1 a grace period: a finalizer stands in for the kubelet")
		Expect(setGraceFinalizer(deleted, true)).To(Succeed())
		DeferCleanup(func() { Expect(setGraceFinalizer(deleted, false)).To(Succeed()) })

		By("losing both grants: two of the three masters stopped past the ttl")
		for _, srv := range masters.Servers[:2] {
			Expect(srv.Stop()).To(Succeed())
			DeferCleanup(func() { _ = srv.Cont() })
		}
		for lock, holder := range bySlot {
			Eventually(func(g Gomega) {
				l, err := getLock(ns, lock)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(l.Status.Holder).To(BeNil(), "holder")
				g.Expect(l.Status.LastHolderPod).NotTo(BeNil(), "last holder pod")
				g.Expect(l.Status.LastHolderPod.Name).To(Equal(holder.Name), "last holder pod")
			}).WithTimeout(5*ttl).Should(Succeed(), "slot lock %s/%s to lose the grant of pod %s", ns, lock, holder.Name)
		}

		By("deleting the pod of slot 1 (it keeps running) and ending the pod of slot 0")
		Expect(k8s.Delete(suiteCtx, getPod(deleted), client.GracePeriodSeconds(0))).To(Succeed())
		Expect(getPod(deleted).DeletionTimestamp).NotTo(BeNil(), "pod %s is being deleted", deleted.Name)
		Expect(podsim.Finish(suiteCtx, k8s, ended, 0)).To(Succeed())
		for _, srv := range masters.Servers[:2] {
			Expect(srv.Cont()).To(Succeed())
		}

		By("shrinking to one slot: slot 0 drains, slot 1 stays while its deleted pod may run")
		running := watchRunning(ns, "shrunk", 1)
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := fetchSemaphore(sem)
			cur.Spec.Slots = 1
			return k8s.Update(suiteCtx, cur)
		})).To(Succeed())
		Eventually(func() bool {
			_, err := getLock(ns, "shrunk-2-0")
			return apierrors.IsNotFound(err)
		}).WithTimeout(20*time.Second).Should(BeTrue(), "slot lock %s/shrunk-2-0, whose pod ended, to be removed", ns)
		waiter := semPods(ns, "shrunk", "waiter", 1)[0]
		// With the masters back, a slot given out now would be granted
		// within a ttl: three of them show that none is.
		Consistently(func(g Gomega) {
			cur := getPod(waiter)
			g.Expect(cur.Labels).NotTo(HaveKey(v1alpha1.LockLabel), "pod %s given no slot", waiter.Name)
			g.Expect(demo.Gated(cur)).To(BeTrue(), "pod %s gated", waiter.Name)
			_, err := getLock(ns, "shrunk-2-1")
			g.Expect(err).NotTo(HaveOccurred(), "slot lock shrunk-2-1")
		}).WithTimeout(3*ttl).Should(Succeed(), "slot shrunk-2-1 to stay and pod %s/%s to stay gated while pod %s may run", ns, waiter.Name, deleted.Name)

		By("giving the new number's slot to the waiting pod once the deleted pod is gone")
		Expect(setGraceFinalizer(deleted, false)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(suiteCtx, client.ObjectKeyFromObject(deleted), &corev1.Pod{}))
		}).Should(BeTrue(), "pod %s/%s to be gone", ns, deleted.Name)
		Eventually(func() bool { return !demo.Gated(getPod(waiter)) }).WithTimeout(30*time.Second).
			Should(BeTrue(), "pod %s/%s to be given a slot of semaphore shrunk once %s is gone", ns, waiter.Name, deleted.Name)
		lock, _ := tokenOf(waiter)
		Expect(lock).To(Equal("shrunk-1-0"), "pod %s's slot", waiter.Name)
		_, violations := running()
		Expect(violations).To(BeEmpty(), "moments more than one pod of semaphore %s/shrunk could run after the shrink", ns)
		Expect(podsim.Finish(suiteCtx, k8s, waiter, 0)).To(Succeed())
	})

	It("gives no slot while a pod granted a slot that no lock has now may run (the semaphore made again with fewer slots)", func() {
		masters := env.NewServingMasters(ns, "masters", 3, 4*time.Second)
		sem, ended, stray := holdingTwo(masters, "again")

		By("deleting the semaphore and its slots' locks (envtest has no garbage collector), the pod of slot 1 still running")
		Expect(k8s.Delete(suiteCtx, fetchSemaphore(sem))).To(Succeed())
		for _, lock := range []string{"again-2-0", "again-2-1"} {
			Expect(k8s.Delete(suiteCtx, &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lock}})).To(Succeed())
			Eventually(func() bool {
				_, err := getLock(ns, lock)
				return apierrors.IsNotFound(err)
			}).WithTimeout(20*time.Second).Should(BeTrue(), "slot lock %s/%s to be gone", ns, lock)
		}
		Expect(podsim.Finish(suiteCtx, k8s, ended, 0)).To(Succeed())

		By("making it again with one slot: nobody is given it while the pod of the old slot 1 runs")
		running := watchRunning(ns, "again", 1)
		Expect(k8s.Create(suiteCtx, newSemaphore(masters, "again", "", 1))).To(Succeed())
		waiter := semPods(ns, "again", "again-waiter", 1)[0]
		Eventually(func() error {
			_, err := getLock(ns, "again-1-0")
			return err
		}).Should(Succeed(), "slot lock %s/again-1-0 to be created", ns)
		// A slot given out would be granted within a ttl: three of them
		// show that none is.
		Consistently(func(g Gomega) {
			cur := getPod(waiter)
			g.Expect(cur.Labels).NotTo(HaveKey(v1alpha1.LockLabel), "pod %s given no slot", waiter.Name)
			g.Expect(demo.Gated(cur)).To(BeTrue(), "pod %s gated", waiter.Name)
		}).WithTimeout(3*sem.Spec.TTL.Duration).Should(Succeed(), "pod %s/%s to stay gated while pod %s, granted the old slot 1, may run", ns, waiter.Name, stray.Name)

		By("giving the slot once that pod finished")
		Expect(podsim.Finish(suiteCtx, k8s, stray, 0)).To(Succeed())
		Eventually(func() bool { return !demo.Gated(getPod(waiter)) }).WithTimeout(20*time.Second).
			Should(BeTrue(), "pod %s/%s to be given slot again-1-0 once %s finished", ns, waiter.Name, stray.Name)
		_, violations := running()
		Expect(violations).To(BeEmpty(), "moments more than one pod of semaphore %s/again could run", ns)
		Expect(podsim.Finish(suiteCtx, k8s, waiter, 0)).To(Succeed())
	})
})
