package distributedlock_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Issue 42, wake-ups: a lock waiting in one cluster for a key another
// cluster's holder has is tried for as soon as the masters tell of the
// release, and, when no notice comes, after its retry delay as before.
var _ = Describe("Release notices across two API servers", Ordered, func() {
	const ttl, maxTTL = 4 * time.Second, 4 * time.Second
	two := twoClusters()

	// shared starts three masters named by a set in each cluster, holds
	// key from cluster A and makes cluster B's lock wait for it, listening
	// for its release on every master.
	var mgrB *testenv.Manager
	shared := func(key string) (holder, waiter *v1alpha1.DistributedLock, a *testenv.MasterSet) {
		a, b := two.shared(maxTTL)

		By("holding the key from cluster A")
		holder = newLock(a, "holder", key, "a", ttl)
		Expect(k8s.Create(suiteCtx, holder)).To(Succeed())
		eventuallyHeldBy(holder, "a")

		By("waiting on it from cluster B, subscribed to its release notices on every master")
		waiter = newLock(b, "waiter", key, "b", ttl)
		Expect(two.other.Client.Create(suiteCtx, waiter)).To(Succeed())
		Eventually(func(g Gomega) {
			cur := &v1alpha1.DistributedLock{}
			g.Expect(two.other.Client.Get(suiteCtx, client.ObjectKeyFromObject(waiter), cur)).To(Succeed())
			g.Expect(heldReason(cur)).To(Equal(v1alpha1.ReasonHeldElsewhere), "Held reason")
			n, err := redistest.Subscribers(suiteCtx, a.Servers, redlock.NoticeChannel(key))
			g.Expect(err).NotTo(HaveOccurred())
			for i, s := range a.Servers {
				g.Expect(n[i]).To(BeNumerically(">=", 1), "subscribers on %s", s.Addr())
			}
		}).Should(Succeed(), "lock %s/waiter to wait for key %s, listening on every master", waiter.Namespace, key)
		// Once subscribed, the waiter is woken to try once more: a release
		// between its attempt and the subscription is not missed.
		Eventually(func() float64 { return testutil.ToFloat64(mgrB.Metrics.Wakeups.WithLabelValues("subscribed")) }).Should(BeNumerically(">=", 1),
			"lock %s/waiter to be woken once subscribed", waiter.Namespace)
		return holder, waiter, a
	}

	// grantedB waits up to timeout for cluster B's lock to be granted, and
	// returns how long after released it was.
	grantedB := func(waiter *v1alpha1.DistributedLock, released time.Time, timeout time.Duration) time.Duration {
		var cur *v1alpha1.DistributedLock
		Eventually(func(g Gomega) {
			cur = &v1alpha1.DistributedLock{}
			g.Expect(two.other.Client.Get(suiteCtx, client.ObjectKeyFromObject(waiter), cur)).To(Succeed())
			expectHeldBy(g, cur, "b")
		}, timeout, 20*time.Millisecond).Should(Succeed(), "lock %s/waiter to be granted in cluster B", waiter.Namespace)
		return cur.Status.AcquiredAt.Sub(released)
	}

	It("grants the waiter in cluster B on the notice of cluster A's release, with no retry due", func() {
		// Cluster B's locks try again after ten minutes only: a grant
		// within the spec is the notice's.
		mgrB = two.other.StartScopedManager(testenv.Scope{RetryDelay: 10 * time.Minute}, nil)
		DeferCleanup(mgrB.Stop)
		holder, waiter, _ := shared("wake-across")
		woken := testutil.ToFloat64(mgrB.Metrics.Wakeups.WithLabelValues("release"))

		By("releasing the key in cluster A (its holder's own release: the keys go at once)")
		update(holder, func(cur *v1alpha1.DistributedLock) { cur.Spec.HolderIdentity = "" })
		// No retry is due: the notice wakes it (or, had the check after
		// subscribing come after the release, that check).
		took := grantedB(waiter, time.Now(), testenv.Timeout)
		AddReportEntry("handover across clusters by a wake-up", fmt.Sprintf("%v; woken by release notices: %v",
			took, testutil.ToFloat64(mgrB.Metrics.Wakeups.WithLabelValues("release"))-woken))
	})

	It("grants the waiter after its retry delay when no notice comes", func() {
		mgrB = two.other.StartManager()
		DeferCleanup(mgrB.Stop)
		holder, waiter, a := shared("wake-lost")
		By("refusing PUBLISH on every master, as an ACL without the notice channels does")
		refused := func() (n float64) {
			for _, s := range a.Servers {
				n += testutil.ToFloat64(two.mgrA.Metrics.NoticesFailed.WithLabelValues(a.NS, a.Name, s.Addr(), string(redlock.NoticePublish)))
			}
			return n
		}
		for _, s := range a.Servers {
			c := s.Client()
			Expect(c.Do(suiteCtx, "ACL", "SETUSER", "default", "-publish").Err()).To(Succeed())
			_ = c.Close()
		}
		woken, failed := testutil.ToFloat64(mgrB.Metrics.Wakeups.WithLabelValues("release")), refused()

		By("releasing the key in cluster A: its notices are refused")
		update(holder, func(cur *v1alpha1.DistributedLock) { cur.Spec.HolderIdentity = "" })
		// The longest retry delay (ttl/4) after the release, and the
		// suite's patience.
		took := grantedB(waiter, time.Now(), ttl/4+testenv.Timeout)
		Expect(testutil.ToFloat64(mgrB.Metrics.Wakeups.WithLabelValues("release"))).To(Equal(woken), "locks cluster B's manager woke on a release notice")
		Eventually(refused).Should(BeNumerically(">", failed), "cluster A's manager to count the refused notices in redlock_release_notices_failed_total")
		AddReportEntry("handover across clusters by the retry delay", took.String())
	})
})
