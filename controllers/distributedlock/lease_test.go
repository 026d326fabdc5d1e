package distributedlock_test

import (
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/pkg/holding"
)

// renewing renews lock l's lease as `kubectl redlock renew` does
// (holding.Beat), every
// interval, until the returned stop is called; it counts the renewals
// written.
func renewing(l *v1alpha1.DistributedLock, interval time.Duration) (stop func() int) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	n := 0
	wg.Go(func() {
		defer GinkgoRecover()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if cur := fetch(l); cur.Status.GrantID != "" && holding.Beat(suiteCtx, k8s, client.ObjectKeyFromObject(l), cur.Status.GrantID, time.Now()) == nil {
				n++
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return sync.OnceValue(func() int { close(done); wg.Wait(); return n })
}

var _ = Describe("Leased static holders and maxHoldDuration", Ordered, func() {
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

	It("keeps a static holder's grant while it renews its lease, ends it and the request once it stops, and serves a new request", func() {
		l := newLock(ms, "freeze", "", "ci-run-1", 4*time.Second)
		l.Spec.HolderLease = &metav1.Duration{Duration: 3 * time.Second}
		Expect(k8s.Create(suiteCtx, l)).To(Succeed())
		granted := eventuallyHeldBy(l, "ci-run-1")
		stop := renewing(l, 500*time.Millisecond)
		DeferCleanup(func() { stop() })

		By("holding the same grant past two leases while the holder renews")
		Consistently(func(g Gomega) {
			// The grant, not the validity shown: a refresh may run late on
			// a loaded machine, which is no end of the lease.
			cur := fetch(l)
			g.Expect(cur.Status.Holder).NotTo(BeNil(), "holder of lock freeze")
			g.Expect(cur.Status.Holder.Identity).To(Equal("ci-run-1"), "holder of lock freeze")
			g.Expect(cur.Status.GrantID).To(Equal(granted.Status.GrantID), "the grant of lock freeze")
			g.Expect(eventReasons(ns, "freeze")).NotTo(ContainElement(v1alpha1.ReasonLeaseExpired), "events of lock freeze")
		}, 7*time.Second, 200*time.Millisecond).Should(Succeed(), "lock %s/freeze to stay with ci-run-1 while it renews", ns)
		Expect(stop()).To(BeNumerically(">=", 5), "renewals written")

		By("ending the grant and the request once the renewals stop")
		Eventually(func(g Gomega) {
			cur := fetch(l)
			g.Expect(heldReason(cur)).To(Equal(v1alpha1.ReasonLeaseExpired), "Held reason of lock freeze")
			g.Expect(cur.Status.Holder).To(BeNil(), "holder of lock freeze")
			g.Expect(cur.Status.EndedRequest).NotTo(BeNil(), "status.endedRequest of lock freeze")
			g.Expect(cur.Status.EndedRequest.Identity).To(Equal("ci-run-1"))
			g.Expect(cur.Status.EndedRequest.Reason).To(Equal(v1alpha1.ReasonLeaseExpired))
			g.Expect(eventReasons(ns, "freeze")).To(ContainElement(v1alpha1.ReasonLeaseExpired), "events of lock freeze")
		}).WithTimeout(15*time.Second).Should(Succeed(), "lock %s/freeze to end ci-run-1's lease", ns)
		Consistently(func() *v1alpha1.LockHolder { return fetch(l).Status.Holder }, 3*time.Second).Should(BeNil(),
			"lock %s/freeze not to grant the ended request again", ns)

		By("granting a new request, with a larger token")
		Eventually(func() error {
			cur := fetch(l)
			cur.Spec.HolderIdentity = "ci-run-2"
			return k8s.Update(suiteCtx, cur)
		}).Should(Succeed(), "lock %s/freeze to take holderIdentity ci-run-2", ns)
		next := eventuallyHeldBy(l, "ci-run-2")
		Expect(next.Status.FencingToken).To(BeNumerically(">", granted.Status.FencingToken))
		Expect(next.Status.EndedRequest).To(BeNil(), "the record of the ended request goes with it")
	})

	It("ends a static holder's grant held past maxHoldDuration", func() {
		l := newLock(ms, "bounded", "", "console", 2*time.Second)
		l.Spec.MaxHoldDuration = &metav1.Duration{Duration: 3 * time.Second}
		Expect(k8s.Create(suiteCtx, l)).To(Succeed())
		granted := eventuallyHeldBy(l, "console")
		Eventually(func(g Gomega) {
			cur := fetch(l)
			g.Expect(heldReason(cur)).To(Equal(v1alpha1.ReasonMaxHoldExceeded), "Held reason of lock bounded")
			g.Expect(cur.Status.EndedRequest).NotTo(BeNil())
			g.Expect(cur.Status.EndedRequest.Reason).To(Equal(v1alpha1.ReasonMaxHoldExceeded))
		}).WithTimeout(15*time.Second).Should(Succeed(), "lock %s/bounded to end the grant held past 3s", ns)
		ended := fetch(l).Status.EndedRequest.At
		Expect(ended).NotTo(BeNil())
		Expect(ended.Sub(granted.Status.AcquiredAt.Time)).To(BeNumerically(">=", 3*time.Second), "not before maxHoldDuration")
	})
})
