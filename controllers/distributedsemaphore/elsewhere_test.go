package distributedsemaphore_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"

	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

var _ = Describe("A semaphore whose masters another cluster shares", func() {
	It("gives a waiting pod a slot free on the masters, not one another cluster holds", func() {
		mgr := env.StartManager()
		DeferCleanup(mgr.Stop)
		ms := env.NewServingMasters(env.NewNamespace(), "masters", 3, 10*time.Second)
		sem := newSemaphore(ms, "shared", "", 2)
		// A loaded machine's masters may take longer than the suite's
		// node timeout (200ms) to answer: without an answer the semaphore gives
		// slots in index order, and this spec would show nothing.
		set := &v1alpha1.RedisMasterSet{}
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ms.NS, Name: ms.Name}, set)).To(Succeed())
		set.Spec.NodeTimeout = &metav1.Duration{Duration: time.Second}
		Expect(k8s.Update(suiteCtx, set)).To(Succeed())

		By("holding slot 0 of the semaphore's key on the masters, as another cluster's holder would")
		other, err := redlock.New(redistest.Addrs(ms.Servers), redlock.WithNodeTimeout(time.Second))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(other.Close)
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
