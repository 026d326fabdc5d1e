package distributedsemaphore_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// lineWait is what a slot's lock waiting for its turn in the semaphore's
// line says (Held False, HeldElsewhere).
const lineWait = "waiting in the semaphore's line on the masters"

var _ = Describe("A semaphore's pods and another cluster's in one line", func() {
	var (
		mgr   *testenv.Manager
		ms    *testenv.MasterSet
		other *redlock.Client
	)
	BeforeEach(func() {
		mgr = env.StartManager()
		DeferCleanup(mgr.Stop)
		ms = env.NewServingMasters(env.NewNamespace(), "masters", 3, 10*time.Second)
		other = anotherCluster(ms)
	})

	// waitingInLine creates a semaphore of one slot whose key another
	// cluster's holder has, with that cluster's waiter in the semaphore's
	// line, and a pod of this cluster; it releases the holder once the
	// pod's slot lock found the slot held, and returns when that lock
	// waits for its turn with the slot free on the masters.
	waitingInLine := func(name string) (*v1alpha1.DistributedSemaphore, redlock.Slot, redlock.Turn, *corev1.Pod) {
		sem := newSemaphore(ms, name, "", 1)
		slot := redlock.Slot{Semaphore: sem.RedisKey(), Slots: 1, Index: 0}
		By("holding the slot, and queueing a waiter in the semaphore's line, as another cluster would")
		held, err := other.AcquireSlot(suiteCtx, slot, time.Minute)
		Expect(err).NotTo(HaveOccurred(), "another cluster's holder takes the slot of %s", slot.Semaphore)
		turn := other.CheckSlotTurn(suiteCtx, slot, "other-cluster-pod", 0, time.Minute)
		Expect(turn.Err).NotTo(HaveOccurred(), "another cluster's waiter in the line of %s", slot.Semaphore)
		Expect(turn.Registered).To(BeTrue(), "another cluster's waiter registered on a quorum")

		By("creating the semaphore and a pod that waits for it")
		Expect(k8s.Create(suiteCtx, sem)).To(Succeed())
		pod := semPods(ms.NS, sem.Name, name, 1)[0]
		lock := &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ms.NS, Name: sem.SlotLockName(1, 0)}}
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(lock), lock)).To(Succeed())
			held := meta.FindStatusCondition(lock.Status.Conditions, v1alpha1.ConditionHeld)
			g.Expect(held).NotTo(BeNil(), "the Held condition")
			g.Expect(held.Reason).To(Equal(v1alpha1.ReasonHeldElsewhere))
		}).WithTimeout(20*time.Second).Should(Succeed(), "slot lock %s/%s to find its slot held elsewhere for pod %s", lock.Namespace, lock.Name, pod.Name)

		By("releasing the other cluster's holder: the pod's lock waits for its turn")
		Expect(held.Release(suiteCtx)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(lock), lock)).To(Succeed())
			held := meta.FindStatusCondition(lock.Status.Conditions, v1alpha1.ConditionHeld)
			g.Expect(held).NotTo(BeNil(), "the Held condition")
			g.Expect(held.Message).To(ContainSubstring(lineWait))
		}).WithTimeout(20*time.Second).Should(Succeed(), "slot lock %s/%s to wait in the semaphore's line behind the other cluster's waiter", lock.Namespace, lock.Name)
		free, err := other.FreeSlots(suiteCtx, slot.Semaphore, 1)
		Expect(err).NotTo(HaveOccurred())
		Expect(free).To(Equal([]bool{true}), "the slot is free on the masters while the pod waits for its turn")
		_, token := tokenOf(pod)
		Expect(token).To(BeZero(), "pod %s granted before its turn", pod.Name)
		return sem, slot, turn, pod
	}

	It("serves the other cluster's pod that came first, then this one, woken by the release", func() {
		// Made first: the other cluster's waiter must take the slot within
		// the line's bound (6s) of its release.
		teller := anotherCluster(ms, redlock.WithReleaseNotices())
		sem, slot, turn, pod := waitingInLine("after")
		By("the other cluster's waiter taking the slot in its turn")
		theirs, err := teller.AcquireSlot(suiteCtx, slot, time.Minute, redlock.WithFencing())
		Expect(err).NotTo(HaveOccurred(), "the waiter first in line is granted the slot its turn came for")
		Expect(teller.LeaveLine(suiteCtx, slot.Semaphore, "other-cluster-pod", turn.Ticket)).To(Succeed())

		By("giving the slot back, told on the semaphore's channel that this manager listens to")
		Eventually(func(g Gomega) {
			n, err := redistest.Subscribers(suiteCtx, ms.Servers, redlock.NoticeChannel(slot.Semaphore))
			g.Expect(err).NotTo(HaveOccurred())
			for i, s := range ms.Servers {
				g.Expect(n[i]).To(BeNumerically(">=", 1), "subscribers on %s", s.Addr())
			}
		}).Should(Succeed(), "the manager to listen for the releases of semaphore %s's slots on every master", sem.Name)
		woken := testutil.ToFloat64(mgr.Metrics.Wakeups.WithLabelValues("release"))
		Expect(theirs.Release(suiteCtx)).To(Succeed())
		Eventually(func() float64 { return testutil.ToFloat64(mgr.Metrics.Wakeups.WithLabelValues("release")) }).
			Should(BeNumerically(">", woken), "the slot lock of pod %s woken by the notice of the other cluster's release", pod.Name)
		Eventually(func(g Gomega) {
			_, token := tokenOf(pod)
			g.Expect(token).To(BeNumerically(">", theirs.Token()), "the pod's fencing token, above the other cluster's")
		}).WithTimeout(20*time.Second).Should(Succeed(), "pod %s of semaphore %s granted after the other cluster's pod", pod.Name, sem.Name)
	})

	It("attempts once the slot has been free for the bound when the waiter ahead never does", func() {
		sem, slot, _, pod := waitingInLine("bound")
		Eventually(func(g Gomega) {
			_, token := tokenOf(pod)
			g.Expect(token).To(BeNumerically(">", 0), "the pod's fencing token")
		}).WithTimeout(30*time.Second).Should(Succeed(), "pod %s of semaphore %s granted at the line's bound", pod.Name, sem.Name)
		seen, err := redistest.LineWaiters(suiteCtx, ms.Servers, redlock.LineKey(slot.Semaphore), time.Second)
		Expect(err).NotTo(HaveOccurred())
		Expect(seen).To(HaveKey("other-cluster-pod"), "the waiter ahead still in the line: the pod went at the bound, not in its turn")
	})
})
