package distributedlock_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Issue 42, waiting lines: locks of one key in two clusters sharing the
// masters take turns first come, first served, also through a master
// restarted empty; a waiter that stops attempting, or that its own
// cluster's rules hold back, never holds the others up, and one whose
// manager stopped only until the key has been free for the bound.
var _ = Describe("Waiting lines across two API servers", Ordered, func() {
	const ttl, maxTTL = 4 * time.Second, 4 * time.Second
	// lineBound is the operator's (lines.go): a waiter ahead holds a free
	// key up for no longer.
	const lineBound = 6 * time.Second
	two := twoClusters()

	// inLine is the waiters (lock UIDs) key's line holds on a majority of
	// servers, lapsed or not.
	inLine := func(g Gomega, servers []*redistest.Server, key string) []string {
		seen, err := redistest.LineWaiters(suiteCtx, servers, redlock.LineKey(key), time.Minute)
		g.Expect(err).NotTo(HaveOccurred(), "the line of %s", key)
		var out []string
		for w, n := range seen {
			if 2*n > len(servers) {
				out = append(out, w)
			}
		}
		return out
	}
	fetchB := func(l *v1alpha1.DistributedLock) *v1alpha1.DistributedLock {
		cur := &v1alpha1.DistributedLock{}
		ExpectWithOffset(1, two.other.Client.Get(suiteCtx, client.ObjectKeyFromObject(l), cur)).To(Succeed())
		return cur
	}
	// unrequestB asks cluster B's lock l for no holder.
	unrequestB := func(l *v1alpha1.DistributedLock) {
		Eventually(func() error {
			cur := fetchB(l)
			cur.Spec.HolderIdentity = ""
			return two.other.Client.Update(suiteCtx, cur)
		}).Should(Succeed(), "lock %s/%s of cluster B to be updated to request no holder", l.Namespace, l.Name)
	}
	// startB starts cluster B's manager for a spec: it hears no release
	// notice and tries again every retry.
	startB := func(retry time.Duration) {
		mgrB := two.other.StartScopedManager(testenv.Scope{RetryDelay: retry, NoReleaseNotices: true}, nil)
		DeferCleanup(mgrB.Stop)
	}
	// bounds counts cluster A's checks that let a lock attempt at the
	// bound (redlock_lock_line_checks_total{result=bound}).
	bounds := func() float64 { return testutil.ToFloat64(two.mgrA.Metrics.LineChecks.WithLabelValues("bound")) }
	// nextInTurn releases the key in cluster A and expects its later lock
	// granted in its turn, with no check waiting for the bound.
	nextInTurn := func(holder, later *v1alpha1.DistributedLock, bounded float64) {
		By("releasing the key in cluster A: its later lock goes in its turn, not at the bound")
		update(holder, func(cur *v1alpha1.DistributedLock) { cur.Spec.HolderIdentity = "" })
		eventuallyHeldBy(later, "a2")
		Expect(bounds()).To(Equal(bounded), "checks that let a lock attempt at the bound (redlock_lock_line_checks_total{result=bound})")
	}
	// queue makes key held in cluster A, and cluster B's lock, then
	// cluster A's later one, wait for it in its line, in that order.
	queue := func(key string) (holder, waiterB, later *v1alpha1.DistributedLock, a *testenv.MasterSet) {
		a, b := two.shared(maxTTL)

		By("holding the key from cluster A")
		holder = newLock(a, "holder", key, "a", ttl)
		Expect(k8s.Create(suiteCtx, holder)).To(Succeed())
		eventuallyHeldBy(holder, "a")

		By("cluster B's lock finding it held: it takes a ticket")
		waiterB = newLock(b, "waiter", key, "b", ttl)
		Expect(two.other.Client.Create(suiteCtx, waiterB)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(inLine(g, a.Servers, key)).To(ContainElement(string(fetchB(waiterB).UID)))
		}).Should(Succeed(), "lock %s/waiter of cluster B to be in key %s's line", waiterB.Namespace, key)

		By("a later lock in cluster A: it waits behind, in the line")
		later = newLock(a, "later", key, "a2", ttl)
		Expect(k8s.Create(suiteCtx, later)).To(Succeed())
		Eventually(func(g Gomega) {
			cur := fetch(later)
			g.Expect(inLine(g, a.Servers, key)).To(ContainElement(string(cur.UID)))
			g.Expect(heldReason(cur)).To(Equal(v1alpha1.ReasonHeldElsewhere), "Held reason")
		}).Should(Succeed(), "lock %s/later of cluster A to wait in key %s's line", later.Namespace, key)
		return holder, waiterB, later, a
	}

	It("serves cluster B's earlier waiter first, though cluster A's later one is woken first", func() {
		// Cluster B hears no notice and tries again every 2 s: without the
		// line, cluster A's later lock, woken at once by the release
		// notice, would take the key first.
		startB(2 * time.Second)
		holder, waiterB, later, a := queue("line-fcfs")
		waits := testutil.ToFloat64(two.mgrA.Metrics.LineChecks.WithLabelValues("wait"))
		woken := testutil.ToFloat64(two.mgrA.Metrics.Wakeups.WithLabelValues("release"))

		By("releasing the key in cluster A: its later lock is woken by the notice")
		update(holder, func(cur *v1alpha1.DistributedLock) { cur.Spec.HolderIdentity = "" })
		Eventually(func() float64 { return testutil.ToFloat64(two.mgrA.Metrics.Wakeups.WithLabelValues("release")) }).Should(BeNumerically(">", woken),
			"lock %s/later of cluster A to be woken by the release notice", later.Namespace)
		var gotB *v1alpha1.DistributedLock
		Eventually(func(g Gomega) {
			gotB = fetchB(waiterB)
			expectHeldBy(g, gotB, "b")
		}).Should(Succeed(), "lock %s/waiter of cluster B to be granted first", waiterB.Namespace)
		Expect(fetch(later).Status.Holder).To(BeNil(), "lock %s/later of cluster A, behind in the line, holds the key", later.Namespace)
		Expect(testutil.ToFloat64(two.mgrA.Metrics.LineChecks.WithLabelValues("wait"))).To(BeNumerically(">", waits),
			"cluster A's later lock to have checked its turn and waited (redlock_lock_line_checks_total{result=wait})")
		Eventually(func(g Gomega) {
			g.Expect(inLine(g, a.Servers, "line-fcfs")).NotTo(ContainElement(string(gotB.UID)))
		}).Should(Succeed(), "lock %s/waiter of cluster B, granted, to leave the line", waiterB.Namespace)

		By("releasing it in cluster B: cluster A's later lock is next")
		unrequestB(waiterB)
		gotA := eventuallyHeldBy(later, "a2")
		Expect(gotA.Status.AcquiredAt.After(gotB.Status.AcquiredAt.Time)).To(BeTrue(), "cluster A's later lock granted at %v, cluster B's at %v", gotA.Status.AcquiredAt, gotB.Status.AcquiredAt)
	})

	It("lets the next go at the release once a waiter ahead stops attempting", func() {
		// Cluster B's registration stands for 51 s (twice its retry delay
		// and a second): gone within the suite's patience, it left.
		startB(25 * time.Second)
		holder, waiterB, later, a := queue("line-leave")
		bounded := bounds()

		By("cluster B's lock no longer requested: it leaves the line")
		uidB := string(fetchB(waiterB).UID)
		unrequestB(waiterB)
		Eventually(func(g Gomega) {
			g.Expect(inLine(g, a.Servers, "line-leave")).NotTo(ContainElement(uidB))
		}).Should(Succeed(), "lock %s/waiter of cluster B to leave the line", waiterB.Namespace)

		nextInTurn(holder, later, bounded)
	})

	It("keeps the line's order through a master restarted empty", func() {
		// As in the first spec, cluster B hears no notice and tries again
		// every 2 s: without the line, cluster A's later lock would go
		// first.
		startB(2 * time.Second)
		holder, waiterB, later, a := queue("line-restart")
		uidB, uidLater := string(fetchB(waiterB).UID), string(fetch(later).UID)
		bounded := bounds()

		By("restarting one master with its data lost: the line stays on the other two")
		Expect(a.Servers[0].Restart(false)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(inLine(g, a.Servers[1:], "line-restart")).To(ContainElements(uidB, uidLater))
		}).Should(Succeed(), "both waiters of key line-restart to stay in the line on the masters that kept it")

		By("releasing the key in cluster A: cluster B's lock, first in the line, is granted first")
		update(holder, func(cur *v1alpha1.DistributedLock) { cur.Spec.HolderIdentity = "" })
		Eventually(func(g Gomega) {
			expectHeldBy(g, fetchB(waiterB), "b")
		}).Should(Succeed(), "lock %s/waiter of cluster B to be granted first", waiterB.Namespace)
		Expect(fetch(later).Status.Holder).To(BeNil(), "lock %s/later of cluster A, behind in the line, holds the key", later.Namespace)

		By("releasing it in cluster B: cluster A's later lock is next, in its turn")
		unrequestB(waiterB)
		eventuallyHeldBy(later, "a2")
		Expect(bounds()).To(Equal(bounded),
			"checks that let a lock attempt at the bound (redlock_lock_line_checks_total{result=bound}): the line held its order")
	})

	It("lets the next go at the release when its own cluster's rules hold a waiter ahead back", func() {
		// Cluster B's registration would stand for 51 s: only leaving the
		// line lets the next go at the release.
		startB(25 * time.Second)
		holder, waiterB, later, a := queue("line-refused")
		bounded := bounds()

		By("allowing key line-refused in cluster B only to another namespace: cluster B's lock is refused and leaves the line")
		uidB := string(fetchB(waiterB).UID)
		rule := newLock(&testenv.MasterSet{Name: waiterB.Spec.MasterSet, NS: waiterB.Namespace}, "rule", "line-refused", "", ttl)
		rule.Spec.AllowedHolders = &v1alpha1.AllowedHolders{Namespaces: []string{"elsewhere"}}
		Expect(two.other.Client.Create(suiteCtx, rule)).To(Succeed())
		Eventually(func(g Gomega) {
			ready := meta.FindStatusCondition(fetchB(waiterB).Status.Conditions, v1alpha1.ConditionReady)
			g.Expect(ready).NotTo(BeNil(), "Ready condition")
			g.Expect(ready.Reason).To(Equal(v1alpha1.ReasonNamespaceNotAllowed), "Ready reason")
			g.Expect(inLine(g, a.Servers, "line-refused")).NotTo(ContainElement(uidB))
		}).Should(Succeed(), "lock %s/waiter of cluster B to be refused and to leave key line-refused's line", waiterB.Namespace)

		nextInTurn(holder, later, bounded)
		Expect(fetchB(waiterB).Status.Holder).To(BeNil(), "lock %s/waiter of cluster B, refused, holds the key", waiterB.Namespace)
	})

	It("holds the next up only until the key has been free for the bound when a waiter ahead's manager stopped", func() {
		// Cluster B's registration stands for twice its retry delay and a
		// second: 51 s, far beyond the bound.
		mgrB := two.other.StartScopedManager(testenv.Scope{RetryDelay: 25 * time.Second, NoReleaseNotices: true}, nil)
		stopped := false
		DeferCleanup(func() {
			if !stopped {
				mgrB.Stop()
			}
		})
		holder, _, later, _ := queue("line-bound")
		bounded := bounds()

		By("stopping cluster B's manager: its ticket stays in the line")
		mgrB.Stop()
		stopped = true

		By("releasing the key in cluster A")
		released := time.Now()
		update(holder, func(cur *v1alpha1.DistributedLock) { cur.Spec.HolderIdentity = "" })
		got := eventuallyHeldByWithin(later, "a2", lineBound+testenv.Timeout)
		Expect(got.Status.AcquiredAt.Sub(released)).To(BeNumerically(">=", lineBound),
			"cluster A's later lock granted before the key had been free for the bound, with a live ticket ahead")
		Expect(bounds()).To(BeNumerically(">", bounded),
			"checks that let a lock attempt at the bound (redlock_lock_line_checks_total{result=bound})")
		AddReportEntry("a stopped waiter ahead held the next up for", fmt.Sprint(got.Status.AcquiredAt.Sub(released)))
	})
})

// eventuallyHeldByWithin is eventuallyHeldBy with its own timeout.
func eventuallyHeldByWithin(l *v1alpha1.DistributedLock, holder string, timeout time.Duration) *v1alpha1.DistributedLock {
	var cur *v1alpha1.DistributedLock
	Eventually(func(g Gomega) {
		cur = fetch(l)
		expectHeldBy(g, cur, holder)
	}, timeout).Should(Succeed(), "lock %s/%s to be held by %s", l.Namespace, l.Name, holder)
	return cur
}
