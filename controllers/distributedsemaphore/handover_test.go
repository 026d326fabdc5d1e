package distributedsemaphore_test

import (
	"context"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/podsim"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

// A slot passes to the next pod through its lock's queue: the semaphore
// gives the next pod a slot once the pod holding it ended, without
// waiting for the slot's lock to show it free, and the lock hands over to
// it as to any pod in its queue, once it has ended the grant.
var _ = Describe("A semaphore's slot handover", Ordered, func() {
	var (
		mgr *testenv.Manager
		ns  string
		ms  *testenv.MasterSet
		// held, when set, holds back the status patches that stop showing
		// the holder of the slot lock it names until its channel closes.
		held    atomic.Pointer[heldBack]
		blocked atomic.Int32
	)
	BeforeAll(func() {
		ns = env.NewNamespace()
		mgr = env.StartScopedManager(testenv.Scope{Intercept: &interceptor.Funcs{
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				if h := held.Load(); h != nil {
					if l, ok := obj.(*v1alpha1.DistributedLock); ok && l.Namespace == ns && l.Name == h.lock && l.Status.Holder == nil {
						blocked.Add(1)
						select {
						case <-h.release:
						case <-ctx.Done():
							return ctx.Err()
						}
					}
				}
				return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			},
		}}, nil)
		ms = env.NewServingMasters(ns, "masters", 3, 4*time.Second)
	})
	AfterAll(func() { mgr.Stop() })

	It("gives the slot of a pod that ended to the next pod before its lock shows the slot free, and the lock grants it after ending the grant", func() {
		sem := newSemaphore(ms, "quick", "", 1)
		Expect(k8s.Create(suiteCtx, sem)).To(Succeed())
		pods := semPods(ns, "quick", "quick", 2)
		first, next := pods[0], pods[1]
		Eventually(func() []string { return ungated(pods) }).WithTimeout(20*time.Second).
			Should(Equal([]string{first.Name}), "pod %s of semaphore %s/quick to be ungated", first.Name, ns)
		Expect(podsim.Run(suiteCtx, k8s, first, "node-1")).To(Succeed())
		slot, token := tokenOf(first)
		Expect(slot).To(Equal("quick-1-0"), "pod %s's slot", first.Name)
		running := watchRunning(ns, "quick", 1)

		By("holding back the patch by which lock quick-1-0 stops showing " + first.Name + ", then finishing it")
		h := &heldBack{lock: slot, release: make(chan struct{})}
		held.Store(h)
		DeferCleanup(h.open)
		Expect(podsim.Finish(suiteCtx, k8s, first, 0)).To(Succeed())
		Eventually(func(g Gomega) {
			l, err := getLock(ns, slot)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(l.Status.Holder).NotTo(BeNil(), "holder of lock %s", slot)
			g.Expect(l.Status.Holder.Pod.Name).To(Equal(first.Name), "holder of lock %s", slot)
			cur := getPod(next)
			g.Expect(cur.Labels).To(HaveKeyWithValue(v1alpha1.LockLabel, slot), "slot of pod %s", next.Name)
			g.Expect(demo.Gated(cur)).To(BeTrue(), "gate of pod %s", next.Name)
			g.Expect(cur.Annotations).NotTo(HaveKey(v1alpha1.FencingTokenAnnotation), "token of pod %s", next.Name)
			g.Expect(blocked.Load()).To(BeNumerically(">", 0), "patches of lock %s held back", slot)
		}).WithTimeout(20*time.Second).Should(Succeed(),
			"pod %s/%s to be given slot %s, still gated, while the lock, trying to stop showing the ended pod %s, still shows it holding", ns, next.Name, slot, first.Name)

		By("letting the lock end the grant: it grants the pod in its queue")
		h.open()
		Eventually(func(g Gomega) {
			g.Expect(demo.Gated(getPod(next))).To(BeFalse(), "gate of pod %s", next.Name)
			lock, tok := tokenOf(next)
			g.Expect(lock).To(Equal(slot), "the lock that granted pod %s", next.Name)
			g.Expect(tok).To(BeNumerically(">", token), "pod %s's token of slot %s", next.Name, slot)
		}).WithTimeout(20*time.Second).Should(Succeed(), "pod %s/%s to be granted slot %s once the lock ended the grant of %s", ns, next.Name, slot, first.Name)
		Expect(podsim.Run(suiteCtx, k8s, next, "node-1")).To(Succeed())
		Expect(podsim.Finish(suiteCtx, k8s, next, 0)).To(Succeed())
		_, violations := running()
		Expect(violations).To(BeEmpty(), "moments more than one pod of semaphore %s/quick could run", ns)
		Eventually(func() int32 { return fetchSemaphore(sem).Status.Held }).WithTimeout(20*time.Second).Should(BeZero(), "semaphore %s/quick to be free", ns)
	})

	It("gives the slot of a pod being deleted to the next pod only once its containers stopped, and the lock grants it before the pod is gone", func() {
		sem, holder := holdingOne(ms, "graceful")
		slot, token := tokenOf(holder)
		running := watchRunning(ns, "graceful", 1)
		next := semPods(ns, "graceful", "graceful-next", 1)[0]

		By("deleting the holder pod, which keeps running through its grace period: a finalizer stands in for the kubelet")
		Expect(setGraceFinalizer(holder, true)).To(Succeed())
		DeferCleanup(func() { Expect(setGraceFinalizer(holder, false)).To(Succeed()) })
		Expect(k8s.Delete(suiteCtx, getPod(holder))).To(Succeed())
		Expect(getPod(holder).DeletionTimestamp).NotTo(BeNil(), "pod %s is being deleted", holder.Name)
		// Given the slot, the pod would be granted within a second or
		// two: three ttls show that it is not.
		Consistently(func(g Gomega) {
			cur := getPod(next)
			g.Expect(cur.Labels).NotTo(HaveKey(v1alpha1.LockLabel), "pod %s given no slot", next.Name)
			g.Expect(demo.Gated(cur)).To(BeTrue(), "gate of pod %s", next.Name)
		}).WithTimeout(3*sem.Spec.TTL.Duration).Should(Succeed(), "pod %s/%s to wait while %s, being deleted, runs", ns, next.Name, holder.Name)

		By("stopping the deleted pod's container: the next pod is given its slot and granted it while the old pod object stays")
		Expect(podsim.Finish(suiteCtx, k8s, holder, 137)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(demo.Gated(getPod(next))).To(BeFalse(), "gate of pod %s", next.Name)
			lock, tok := tokenOf(next)
			g.Expect(lock).To(Equal(slot), "the lock that granted pod %s", next.Name)
			g.Expect(tok).To(BeNumerically(">", token), "pod %s's token of slot %s", next.Name, slot)
		}).WithTimeout(20*time.Second).Should(Succeed(), "pod %s/%s to be granted slot %s once the container of %s stopped", ns, next.Name, slot, holder.Name)
		Expect(apierrors.IsNotFound(k8s.Get(suiteCtx, client.ObjectKeyFromObject(holder), &corev1.Pod{}))).To(BeFalse(), "pod %s is still there", holder.Name)
		Expect(podsim.Run(suiteCtx, k8s, next, "node-1")).To(Succeed())
		Expect(podsim.Finish(suiteCtx, k8s, next, 0)).To(Succeed())
		_, violations := running()
		Expect(violations).To(BeEmpty(), "moments more than one pod of semaphore %s/graceful could run", ns)
	})
})

// heldBack holds back the status patches that stop showing the holder of
// lock until release closes.
type heldBack struct {
	lock    string
	release chan struct{}
	closed  atomic.Bool
}

func (h *heldBack) open() {
	if h.closed.CompareAndSwap(false, true) {
		close(h.release)
	}
}
