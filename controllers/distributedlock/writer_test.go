package distributedlock_test

import (
	"fmt"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/distributedlock"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// shownValidity is one validity status showed, and when the watch saw it.
type shownValidity struct {
	validUntil, renewedAt, seen time.Time
	grantID                     string
	token                       int64
}

// watchValidity records every validity lock's status shows for d, from a
// watch on the API server.
func watchValidity(lock *v1alpha1.DistributedLock, d time.Duration) []shownValidity {
	wc, err := client.NewWithWatch(env.Cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	w, err := wc.Watch(suiteCtx, &v1alpha1.DistributedLockList{}, client.InNamespace(lock.Namespace),
		client.MatchingFields{"metadata.name": lock.Name})
	Expect(err).NotTo(HaveOccurred())
	defer w.Stop()
	var out []shownValidity
	end := time.After(d)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			Expect(ok).To(BeTrue(), "the watch ended")
			l, isLock := ev.Object.(*v1alpha1.DistributedLock)
			if ev.Type == watch.Error || !isLock || l.Status.ValidUntil == nil || l.Status.RenewedAt == nil {
				continue
			}
			if n := len(out); n > 0 && out[n-1].validUntil.Equal(l.Status.ValidUntil.Time) {
				continue
			}
			out = append(out, shownValidity{
				validUntil: l.Status.ValidUntil.Time, renewedAt: l.Status.RenewedAt.Time, seen: time.Now(),
				grantID: l.Status.GrantID, token: l.Status.FencingToken,
			})
		case <-end:
			return out
		}
	}
}

var _ = Describe("The status writer", Ordered, func() {
	var (
		mgr *testenv.Manager
		ms  *testenv.MasterSet
	)
	BeforeAll(func() {
		mgr = env.StartManager()
		ms = env.NewServingMasters(env.NewNamespace(), "masters", 3, 4*time.Second)
	})
	AfterAll(func() { mgr.Stop() })

	It("refreshes a held lock's validity from a renewal made just before the refresh fell due, before the shown validity passes", func() {
		const ttl = 4 * time.Second
		lock := newLock(ms, "refreshed", "", "team-a", ttl)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		granted := eventuallyHeldBy(lock, "team-a")

		By("watching the validity status shows for four ttls")
		shown := watchValidity(lock, 4*ttl)
		Expect(len(shown)).To(BeNumerically(">=", 4), "refreshes seen: %+v", shown)

		By("seeing every refresh keep the grant and land before the validity it replaced passed")
		for i := 1; i < len(shown); i++ {
			Expect(shown[i].grantID).To(Equal(granted.Status.GrantID))
			Expect(shown[i].token).To(Equal(granted.Status.FencingToken))
			// The watch sees a refresh after it landed: on a loaded machine
			// the manager's own count of late refreshes tells a late
			// refresh from a late delivery.
			Expect(shown[i].seen).To(BeTemporally("<", shown[i-1].validUntil), "refresh %d landed after the validity it replaced had passed (the manager counted %v late refreshes; seen: %+v)",
				i, testutil.ToFloat64(mgr.Metrics.StatusWritesLate), shown)
		}

		By("seeing a refresh extend the shown validity by nearly a whole ttl, not by two renew intervals")
		// A refresh shows a renewal made renewLead before it fell due,
		// statusLead before the shown validity passes; writing the
		// renewal that happened to come last (every ttl/3) would extend
		// it by 2/3 of the ttl.
		var gains []time.Duration
		for i := 1; i < len(shown); i++ {
			gains = append(gains, shown[i].validUntil.Sub(shown[i-1].validUntil))
		}
		slices.Sort(gains)
		least := ttl - grants.StatusLead(ttl) - 2*grants.RenewLead(ttl) - redlock.Drift(ttl)
		Expect(gains[len(gains)/2]).To(BeNumerically(">=", least), "median gain of %v", gains)

		By("counting the refreshes as the status writer's, none of them late")
		Expect(testutil.ToFloat64(mgr.Metrics.StatusWrites.WithLabelValues("renewal"))).To(BeNumerically(">=", len(shown)-1))
		Expect(testutil.ToFloat64(mgr.Metrics.StatusWritesLate)).To(BeZero())
		Expect(testutil.ToFloat64(mgr.Metrics.StatusWriteDemand)).To(BeNumerically("~", grants.WritesPerTTL(ttl)/ttl.Seconds(), 0.01))
		Expect(k8s.Delete(suiteCtx, lock)).To(Succeed())
	})
})

var _ = Describe("The status writer on a budget the held locks exceed", Ordered, func() {
	var (
		mgr *testenv.Manager
		ms  *testenv.MasterSet
	)
	const budget = 2.0 // refreshes per second
	BeforeAll(func() {
		// Its own namespace only: locks other specs leave behind would
		// take the budget's room.
		ns := env.NewNamespace()
		mgr = env.StartScopedManager(testenv.Scope{StatusWriteQPS: budget, WatchNamespaces: []string{ns}}, nil)
		ms = env.NewServingMasters(ns, "masters", 3, 4*time.Second)
	})
	AfterAll(func() { mgr.Stop() })

	It("grants no more than it can keep refreshed, then sheds the youngest grants, shown Shed, and keeps the oldest lapse-free", func() {
		const (
			slow, fast = 4 * time.Second, 2 * time.Second
			n          = 6
		)
		perLock := func(ttl time.Duration) float64 { return grants.WritesPerTTL(ttl) / ttl.Seconds() }
		// Admitted while demand stays within 80 % of the budget (1.6/s):
		// five locks at ttl 4s (0.3/s each), not six.
		admitted := int(0.8 * budget / perLock(slow))
		Expect(admitted).To(Equal(5), "the setup's arithmetic")

		By("granting the locks one at a time, oldest first, until the next would need more writes than the budget leaves")
		var locks []*v1alpha1.DistributedLock
		for i := range n {
			l := newLock(ms, fmt.Sprintf("loaded-%d", i), "", "team-a", slow)
			Expect(k8s.Create(suiteCtx, l)).To(Succeed())
			locks = append(locks, l)
			if i < admitted {
				eventuallyHeldBy(l, "team-a")
			}
		}
		last := locks[n-1]
		Eventually(func(g Gomega) {
			cond := meta.FindStatusCondition(fetch(last).Status.Conditions, v1alpha1.ConditionHeld)
			g.Expect(cond).NotTo(BeNil(), "Held condition of lock %s", last.Name)
			g.Expect(cond.Reason).To(Equal(v1alpha1.ReasonStatusWritesBehind))
			g.Expect(cond.Message).To(ContainSubstring("go first"))
		}).Should(Succeed(), "lock %s waits for room in the status writes", last.Name)
		Consistently(func() *v1alpha1.LockHolder { return fetch(last).Status.Holder }, 3*time.Second).Should(BeNil(), "lock %s was granted beyond the budget", last.Name)
		Expect(k8s.Delete(suiteCtx, last)).To(Succeed())
		locks = locks[:admitted]

		By("halving every held lock's ttl: the held locks now need more refreshes than the budget")
		// Every grant is read before the first patch: once the held
		// locks need more than the budget, the youngest may be shed while
		// the loop below still patches the others.
		granted := map[string]*v1alpha1.DistributedLock{}
		for _, l := range locks {
			granted[l.Name] = fetch(l)
			Expect(granted[l.Name].Status.AcquiredAt).NotTo(BeNil(), "lock %s is held before the ttl is halved", l.Name)
		}
		for _, l := range locks {
			// A merge patch of the spec: status refreshes move the
			// resourceVersion meanwhile.
			patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"ttl":%q}}`, fast.String()))
			Expect(k8s.Patch(suiteCtx, l, patch)).To(Succeed())
		}
		Expect(float64(admitted)*perLock(fast)).To(BeNumerically(">", budget), "the setup's arithmetic")

		By("shedding grants until the overload ends: Held=False with reason Shed, their keys released in Redis")
		Eventually(func() float64 { return testutil.ToFloat64(mgr.Metrics.LocksShed) }, 20*time.Second).Should(BeNumerically(">", 0), "some of locks loaded-0..%d in %s to be shed under the status-write overload", n-1, ms.NS)
		Eventually(func() float64 { return testutil.ToFloat64(mgr.Metrics.StatusWriterOverloaded) }, 20*time.Second).Should(BeZero(), "the status writer to end its overload by shedding locks of %s", ms.NS)
		var kept, shed []*v1alpha1.DistributedLock
		Eventually(func(g Gomega) {
			kept, shed = nil, nil
			for _, l := range locks {
				cur := fetch(l)
				if cur.Status.Holder != nil {
					g.Expect(cur.Status.GrantID).To(Equal(granted[l.Name].Status.GrantID), "lock %s was granted again", l.Name)
					kept = append(kept, cur)
					continue
				}
				cond := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionHeld)
				g.Expect(cond).NotTo(BeNil(), "Held condition of lock %s", l.Name)
				g.Expect(cond.Reason).To(Equal(v1alpha1.ReasonShed), "lock %s is not held for another reason", l.Name)
				g.Expect(testenv.CountEqual(ms.ValuesOn(cur.Status.Key), expectedValue(granted[l.Name]))).To(BeZero(), "the shed grant's keys of lock %s", l.Name)
				g.Expect(eventReasons(l.Namespace, l.Name)).To(ContainElement(distributedlock.EventShed), "events of shed lock %s", l.Name)
				shed = append(shed, cur)
			}
			g.Expect(float64(len(shed))).To(Equal(testutil.ToFloat64(mgr.Metrics.LocksShed)), "shed locks against the counter")
		}, 20*time.Second).Should(Succeed(), "locks loaded-0..%d in %s each kept with its grant, or shed with its keys released, as counted", n-1, ms.NS)
		By(fmt.Sprintf("finding the %d oldest grants kept (%d shed), within what the budget refreshes", len(kept), len(shed)))
		Expect(kept).NotTo(BeEmpty())
		Expect(float64(len(kept)) * perLock(fast)).To(BeNumerically("<=", 0.8*budget))
		for _, k := range kept {
			for _, sh := range shed {
				Expect(granted[k.Name].Status.AcquiredAt.Before(granted[sh.Name].Status.AcquiredAt.Time)).To(BeTrue(),
					"kept %s was granted after shed %s", k.Name, sh.Name)
			}
		}

		By("refreshing the kept grants in time from now on, while the shed ones wait")
		late := testutil.ToFloat64(mgr.Metrics.StatusWritesLate)
		shown := watchValidity(kept[0], 4*fast)
		Expect(len(shown)).To(BeNumerically(">=", 3), "refreshes seen: %+v", shown)
		for i := 1; i < len(shown); i++ {
			Expect(shown[i].grantID).To(Equal(granted[kept[0].Name].Status.GrantID))
			Expect(shown[i].validUntil).To(BeTemporally(">", shown[i-1].validUntil))
		}
		Expect(testutil.ToFloat64(mgr.Metrics.StatusWritesLate)).To(Equal(late), "a refresh landed after the validity it replaced had passed")
		for _, l := range shed {
			cur := fetch(l)
			Expect(cur.Status.Holder).To(BeNil(), "lock %s was granted again beyond the budget", l.Name)
			held := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionHeld)
			Expect(held.Reason).To(Equal(v1alpha1.ReasonShed))
			// Its reconciles while it waits for room write no message of
			// their own: a second status write per shed grant.
			Expect(held.Message).To(ContainSubstring("the youngest grants are shed, and granted again once status writes leave room"),
				"the Held message of shed lock %s, waiting", l.Name)
		}
		Expect(testutil.CollectAndCount(mgr.Metrics.RenewFailures)).To(BeZero(), "a renewal failed")
		for _, l := range locks {
			Expect(k8s.Delete(suiteCtx, l)).To(Succeed())
		}
	})
})

var _ = Describe("A grant waiting for room in the status writes", func() {
	It("is made when a held lock is released, woken by the writer rather than a poll", func() {
		const (
			budget = 2.0 // refreshes per second
			ttl    = 4 * time.Second
		)
		// No reconcile of the waiting lock but the writer's wake-up comes
		// within the test; its own namespace only, as above.
		ns := env.NewNamespace()
		mgr := env.StartScopedManager(testenv.Scope{StatusWriteQPS: budget, GrantRecheck: time.Hour, WatchNamespaces: []string{ns}}, nil)
		DeferCleanup(mgr.Stop)
		ms := env.NewServingMasters(ns, "masters", 3, ttl)
		admitted := int(0.8 * budget / (grants.WritesPerTTL(ttl) / ttl.Seconds()))
		Expect(admitted).To(Equal(5), "the setup's arithmetic")

		By("granting five locks, and making the sixth wait")
		var locks []*v1alpha1.DistributedLock
		for i := range admitted + 1 {
			l := newLock(ms, fmt.Sprintf("room-%d", i), "", "team-a", ttl)
			Expect(k8s.Create(suiteCtx, l)).To(Succeed())
			locks = append(locks, l)
			if i < admitted {
				eventuallyHeldBy(l, "team-a")
			}
		}
		waiting := locks[admitted]
		Eventually(func(g Gomega) {
			cond := meta.FindStatusCondition(fetch(waiting).Status.Conditions, v1alpha1.ConditionHeld)
			g.Expect(cond).NotTo(BeNil(), "Held condition of lock %s", waiting.Name)
			g.Expect(cond.Reason).To(Equal(v1alpha1.ReasonStatusWritesBehind))
		}).Should(Succeed(), "lock %s waits for room in the status writes", waiting.Name)
		Eventually(func() float64 { return testutil.ToFloat64(mgr.Metrics.GrantsWaiting) }).Should(Equal(1.0), "lock %s to be counted as waiting in the manager's metrics", waiting.Name)
		// The reconciles its own writes caused (the finalizer) come and go
		// meanwhile: after this, only a wake-up reconciles it.
		Consistently(func() *v1alpha1.LockHolder { return fetch(waiting).Status.Holder }, 2*time.Second).Should(BeNil(), "lock %s was granted beyond the budget", waiting.Name)

		By("deleting a held lock: its release makes room, and the writer wakes the waiting lock")
		Expect(k8s.Delete(suiteCtx, locks[0])).To(Succeed())
		eventuallyHeldBy(waiting, "team-a")
		Expect(testutil.ToFloat64(mgr.Metrics.GrantsWaiting)).To(BeZero(), "locks counted as waiting once granted")
		for _, l := range locks[1:] {
			Expect(k8s.Delete(suiteCtx, l)).To(Succeed())
		}
	})
})

var _ = Describe("A stopping manager that a standby takes over from", func() {
	It("refreshes, before it stops leading, every held lock whose shown validity passes within the failover slack", func() {
		// ttl 4s is less than twice the slack (3s): refreshes are due half
		// a second ahead (statusLead), and a standby taking the released
		// Lease a few retry periods later would find some lapsed.
		const (
			ttl   = 4 * time.Second
			slack = 3 * time.Second
			locks = 20
		)
		mgr := env.StartScopedManager(testenv.Scope{FailoverSlack: slack}, nil)
		stopped := false
		DeferCleanup(func() {
			if !stopped {
				mgr.Stop()
			}
		})
		ms := env.NewServingMasters(env.NewNamespace(), "masters", 3, ttl)

		By("granting the locks one by one over a ttl, so that their shown validities spread over the refresh cycle")
		tick := time.NewTicker(ttl / locks)
		defer tick.Stop()
		var created []*v1alpha1.DistributedLock
		for i := range locks {
			l := newLock(ms, fmt.Sprintf("handed-over-%d", i), "", "h", ttl)
			Expect(k8s.Create(suiteCtx, l)).To(Succeed())
			created = append(created, l)
			<-tick.C // spreading the grants is the setup, not a wait for anything
		}
		for _, l := range created {
			Eventually(func(g Gomega) {
				cur := fetch(l)
				g.Expect(cur.Status.Holder).NotTo(BeNil(), "holder of lock %s", l.Name)
				g.Expect(cur.Status.RenewedAt.After(cur.Status.AcquiredAt.Time)).To(BeTrue(), "not refreshed yet")
			}, 20*time.Second).Should(Succeed(), "lock %s/%s refreshed once", l.Namespace, l.Name)
		}

		By("stopping the manager, and finding every lock showing its latest renewal: well over the lead ahead")
		at := time.Now()
		mgr.Stop()
		stopped = true
		// The Sessions renew every ttl/3: the latest renewal shows at least
		// ttl − ttl/3 − drift (2.6s) ahead of the stop; a lock the stopping
		// manager did not refresh may show as little as the lead (0.5s).
		for _, l := range created {
			cur := fetch(l)
			Expect(cur.Status.Holder).NotTo(BeNil(), "lock %s/%s is not held", cur.Namespace, cur.Name)
			Expect(cur.Status.ValidUntil.Sub(at)).To(BeNumerically(">=", 1500*time.Millisecond),
				"lock %s/%s shows less validity ahead of the stop than its latest renewal", cur.Namespace, cur.Name)
		}
	})
})
