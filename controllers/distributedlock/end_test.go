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

// latestValidity polls lock l's status until stop is called, and returns
// the latest validity it saw shown for grant grantID: no later than the
// latest the lock showed.
func latestValidity(l *v1alpha1.DistributedLock, grantID string) (stop func() time.Time) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var latest time.Time
	wg.Go(func() {
		defer GinkgoRecover()
		for {
			cur := &v1alpha1.DistributedLock{}
			if k8s.Get(suiteCtx, client.ObjectKeyFromObject(l), cur) == nil && cur.Status.GrantID == grantID &&
				cur.Status.Holder != nil && cur.Status.ValidUntil != nil && cur.Status.ValidUntil.After(latest) {
				latest = cur.Status.ValidUntil.Time
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	return sync.OnceValue(func() time.Time { close(done); wg.Wait(); return latest })
}

var _ = Describe("How a grant ends", Ordered, func() {
	var (
		mgr *testenv.Manager
		ns  string
		ms  *testenv.MasterSet
	)
	BeforeAll(func() {
		mgr = env.StartManager()
		ns = env.NewNamespace()
		ms = env.NewServingMasters(ns, "masters", 3, 10*time.Second)
	})
	AfterAll(func() { mgr.Stop() })

	It("keeps the keys of a grant given up when its lock is deleted until the validity it showed has passed", func() {
		a := newLock(ms, "given-up", "given-up-key", "ci-run-1", 9*time.Second)
		a.Spec.HolderLease = &metav1.Duration{Duration: 3 * time.Second}
		Expect(k8s.Create(suiteCtx, a)).To(Succeed())
		granted := eventuallyHeldBy(a, "ci-run-1")
		shown := latestValidity(a, granted.Status.GrantID)

		By("letting the lease run out unrenewed: the grant is given up, its keys left")
		Eventually(func(g Gomega) {
			g.Expect(heldReason(fetch(a))).To(Equal(v1alpha1.ReasonLeaseExpired), "Held reason of lock given-up")
		}).WithTimeout(20*time.Second).Should(Succeed(), "lock %s/given-up to give up ci-run-1's grant", ns)
		v := shown()
		Expect(v).NotTo(BeZero(), "a validity was seen shown")

		By("deleting the lock, and asking for the key with another lock")
		Expect(k8s.Delete(suiteCtx, a)).To(Succeed())
		keptOnQuorum(ms, "given-up-key", expectedValue(granted), v)
		b := newLock(ms, "next", "given-up-key", "ci-run-2", 6*time.Second)
		Expect(k8s.Create(suiteCtx, b)).To(Succeed())
		next := eventuallyHeldBy(b, "ci-run-2")
		Expect(next.Status.AcquiredAt.Time).To(BeTemporally(">=", v),
			"the key was granted again only after the validity the given-up grant showed (%s)", v.Format(time.RFC3339Nano))

		By("letting the deleted lock go once its keys went")
		Eventually(func() bool {
			return k8s.Get(suiteCtx, client.ObjectKeyFromObject(a), &v1alpha1.DistributedLock{}) != nil
		}).WithTimeout(20*time.Second).Should(BeTrue(), "lock %s/given-up to be gone", ns)
	})

	It("keeps the keys and the object of a held lock being deleted until the validity it showed has passed", func() {
		l := newLock(ms, "deleted-held", "deleted-held-key", "report-cron", 6*time.Second)
		Expect(k8s.Create(suiteCtx, l)).To(Succeed())
		granted := eventuallyHeldBy(l, "report-cron")
		shown := latestValidity(l, granted.Status.GrantID)
		Expect(k8s.Delete(suiteCtx, l)).To(Succeed())
		var v time.Time
		Eventually(func(g Gomega) {
			cur := fetch(l)
			g.Expect(cur.Status.Holder).To(BeNil(), "holder of lock deleted-held")
			g.Expect(heldReason(cur)).To(Equal(v1alpha1.ReasonDeleting), "Held reason of lock deleted-held")
		}).Should(Succeed(), "lock %s/deleted-held to end its grant for the deletion", ns)
		v = shown()
		keptOnQuorum(ms, "deleted-held-key", expectedValue(granted), v)
		Eventually(func() bool {
			return k8s.Get(suiteCtx, client.ObjectKeyFromObject(l), &v1alpha1.DistributedLock{}) != nil
		}).WithTimeout(15*time.Second).Should(BeTrue(), "lock %s/deleted-held to be gone once its keys went", ns)
		Expect(testenv.CountEqual(ms.ValuesOn("deleted-held-key"), expectedValue(granted))).To(BeZero(), "its keys released")
	})

	It("keeps the keys when someone else clears a leased holder's request, and releases them at once on the holder's own word", func() {
		l := newLock(ms, "leased", "", "job-1", 6*time.Second)
		l.Spec.HolderLease = &metav1.Duration{Duration: 30 * time.Second}
		Expect(k8s.Create(suiteCtx, l)).To(Succeed())
		first := eventuallyHeldBy(l, "job-1")
		shown := latestValidity(l, first.Status.GrantID)
		DeferCleanup(func() { shown() })
		Eventually(func() error {
			return holding.Beat(suiteCtx, k8s, client.ObjectKeyFromObject(l), first.Status.GrantID, time.Now())
		}).Should(Succeed(), "the LockHeartbeat of lock %s/leased to take a renewal", ns)

		By("clearing job-1's request as someone else would, with no word from job-1, and asking for job-2")
		update(l, func(cur *v1alpha1.DistributedLock) { cur.Spec.HolderIdentity = "" })
		Eventually(func(g Gomega) {
			g.Expect(fetch(l).Status.Holder).To(BeNil(), "holder of lock leased")
		}).Should(Succeed(), "lock %s/leased to stop showing job-1's grant", ns)
		v := shown()
		Expect(heldReason(fetch(l))).To(Equal(v1alpha1.ReasonRequestChanged), "Held reason of lock leased")
		keptOnQuorum(ms, first.Status.Key, expectedValue(first), v)
		update(l, func(cur *v1alpha1.DistributedLock) { cur.Spec.HolderIdentity = "job-2" })
		second := eventuallyHeldBy(l, "job-2")
		Expect(second.Status.AcquiredAt.Time).To(BeTemporally(">=", v),
			"job-2 was granted only after the validity job-1's grant showed (%s)", v.Format(time.RFC3339Nano))

		By("releasing job-2's grant by its word: the keys go at once and its request ends")
		shown = latestValidity(l, second.Status.GrantID)
		Expect(holding.SayReleased(suiteCtx, k8s, client.ObjectKeyFromObject(l), second.Status.GrantID)).To(Succeed())
		Eventually(func(g Gomega) {
			cur := fetch(l)
			g.Expect(cur.Status.Holder).To(BeNil(), "holder of lock leased")
			g.Expect(heldReason(cur)).To(Equal(v1alpha1.ReasonReleased), "Held reason of lock leased")
			g.Expect(cur.Status.EndedRequest).NotTo(BeNil(), "status.endedRequest of lock leased")
			g.Expect(cur.Status.EndedRequest.Identity).To(Equal("job-2"))
			g.Expect(cur.Status.EndedRequest.Reason).To(Equal(v1alpha1.ReasonReleased))
		}).Should(Succeed(), "lock %s/leased to end job-2's grant and request on its word", ns)
		v = shown()
		update(l, func(cur *v1alpha1.DistributedLock) { cur.Spec.HolderIdentity = "job-3" })
		third := eventuallyHeldBy(l, "job-3")
		Expect(third.Status.AcquiredAt.Time).To(BeTemporally("<", v),
			"job-3 was granted before the validity job-2's released grant showed (%s): its keys went at once", v.Format(time.RFC3339Nano))
	})
})

// keptOnQuorum asserts that value stays on a quorum of ms's masters at key
// until shortly before v, the validity a reader saw: the end that hid its
// grant is no proof that the holder stopped.
func keptOnQuorum(ms *testenv.MasterSet, key, value string, v time.Time) {
	if d := time.Until(v) - 200*time.Millisecond; d > 0 {
		Consistently(func() int { return testenv.CountEqual(ms.ValuesOn(key), value) }, d, 50*time.Millisecond).Should(BeNumerically(">=", 2),
			"the keys of the ended grant %s to stay on a quorum until the validity it showed (%s)", key, v.Format(time.RFC3339Nano))
	}
}

// update changes lock l with change, on the version read.
func update(l *v1alpha1.DistributedLock, change func(*v1alpha1.DistributedLock)) {
	Eventually(func() error {
		cur := fetch(l)
		change(cur)
		return k8s.Update(suiteCtx, cur)
	}).Should(Succeed(), "lock %s/%s to take the change", l.Namespace, l.Name)
}
