package distributedlock_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/internal/masters"
)

// Issue 18, case 1: two RedisMasterSets with different maxLockTTLs name the
// same servers (by different address strings). After a majority of the
// servers restarts empty, the short-TTL side must not grant the key while
// the long-TTL holder's validity stands — in one cluster (two namespaces)
// and across two API servers.
var _ = Describe("Sets of different maxLockTTLs sharing servers", Ordered, func() {
	const longTTL, shortTTL = 6 * time.Second, 2 * time.Second
	BeforeAll(func() {
		mgr := env.StartManager()
		DeferCleanup(mgr.Stop)
	})

	// share runs the scenario with the long set in env and the short one in
	// other (env again for one cluster).
	share := func(other *testenv.Env, key string) {
		nsLong, nsShort := env.NewNamespace(), other.NewNamespace()
		long := env.NewServingMasters(nsLong, "long", 3, longTTL)
		aliases := redistest.Aliases(long.Servers)
		shortSet := &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: nsShort, Name: "short"},
			Spec: v1alpha1.RedisMasterSetSpec{
				External:    &v1alpha1.ExternalMasters{Addresses: aliases},
				MaxLockTTL:  metav1.Duration{Duration: shortTTL},
				NodeTimeout: &metav1.Duration{Duration: testenv.MasterNodeTimeout},
			},
		}
		Expect(other.Client.Create(suiteCtx, shortSet)).To(Succeed())
		short := &testenv.MasterSet{Servers: long.Servers, Name: "short", NS: nsShort}

		By("holding the key with a 5s ttl through the long set")
		holder := newLock(long, "holder", key, "long", 5*time.Second)
		Expect(k8s.Create(suiteCtx, holder)).To(Succeed())
		eventuallyHeldBy(holder, "long")

		By("waiting on the same key through the short set")
		waiter := newLock(short, "waiter", key, "short", 1500*time.Millisecond)
		Expect(other.Client.Create(suiteCtx, waiter)).To(Succeed())
		fetchWaiter := func() *v1alpha1.DistributedLock {
			out := &v1alpha1.DistributedLock{}
			Expect(other.Client.Get(suiteCtx, client.ObjectKeyFromObject(waiter), out)).To(Succeed())
			return out
		}
		Eventually(func() string { return heldReason(fetchWaiter()) }).Should(Equal(v1alpha1.ReasonHeldElsewhere), "lock %s/waiter to wait", nsShort)

		By("the short set learning the long set's window from the servers, and saying so")
		longWindow := masters.Quarantine(&v1alpha1.RedisMasterSet{Spec: v1alpha1.RedisMasterSetSpec{MaxLockTTL: metav1.Duration{Duration: longTTL}}})
		Eventually(func(g Gomega) {
			cur := &v1alpha1.RedisMasterSet{}
			g.Expect(other.Client.Get(suiteCtx, client.ObjectKeyFromObject(shortSet), cur)).To(Succeed())
			g.Expect(cur.Status.QuarantineWindow).NotTo(BeNil(), "set %s/short's status.quarantineWindow", nsShort)
			g.Expect(cur.Status.QuarantineWindow.Duration).To(Equal(longWindow), "set %s/short's status.quarantineWindow", nsShort)
			g.Expect(cur.Status.QuarantineWindowUntil).NotTo(BeNil(), "set %s/short's status.quarantineWindowUntil", nsShort)
			c := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionOwnWindow)
			g.Expect(c).NotTo(BeNil(), "set %s/short's %s condition", nsShort, v1alpha1.ConditionOwnWindow)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonWindowShared))
		}).Should(Succeed(), "set %s/short to learn the long set's quarantine window %s from the servers", nsShort, longWindow)

		By("restarting two of the three servers without their keys, just after a renewal of the holder's grant")
		// The grant's real validity, not the one status shows (refreshed
		// only near its end): the key's remaining life on a master, read
		// just after a renewal.
		admin := long.Servers[0].Client()
		DeferCleanup(admin.Close)
		var lastValid time.Time
		Eventually(func(g Gomega) {
			left, err := admin.PTTL(suiteCtx, key).Result()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(left).To(BeNumerically(">", 4500*time.Millisecond), "key %s on %s just renewed", key, long.Servers[0].Addr())
			lastValid = time.Now().Add(left - time.Second) // the drift and the renewal's own time, generously
		}, 10*time.Second, 10*time.Millisecond).Should(Succeed(), "key %s on %s to be just renewed for lock %s/holder", key, long.Servers[0].Addr(), holder.Namespace)
		for _, s := range long.Servers[1:] {
			Expect(s.Restart(false)).To(Succeed())
		}

		By("sampling both locks: the waiter is not granted while the holder's grant is valid")
		deadline := time.Now().Add(longWindow + 2*time.Second)
		for time.Now().Before(deadline) {
			if h := fetch(holder); h.Status.ValidUntil != nil && h.Status.ValidUntil.After(lastValid) {
				lastValid = h.Status.ValidUntil.Time
			}
			w := fetchWaiter()
			Expect(heldBy(w, "short") && time.Now().Before(lastValid)).To(BeFalse(),
				"lock %s/waiter granted at %v while the grant of lock %s/holder was valid until %v", nsShort, w.Status.AcquiredAt, nsLong, lastValid)
			time.Sleep(50 * time.Millisecond)
		}
	}

	It("in one cluster: the short-TTL set quarantines the restarted servers by the longest window", func() {
		share(env, "shared-window-one")
	})

	It("across two API servers: the window registered on the servers reaches the other cluster", func() {
		other := testenv.Start()
		DeferCleanup(other.Stop)
		mgr := other.StartManager()
		DeferCleanup(mgr.Stop)
		share(other, "shared-window-two")
	})
})
