package distributedlock_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/distributedlock"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/harness/apiproxy"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// lapseWatch lists the locks of a namespace, straight from the API server,
// until stopped, and records every lock whose status showed it held with a
// validity that had passed before the list began: a lapse, which no reader
// can tell from a lost grant. Each is later told apart as a kept lock's or
// a shed one's (sort).
type lapseWatch struct {
	ns string
	*poll

	mu     sync.Mutex
	lapsed map[string]int // by lock: lists that found it lapsed
	lists  int
}

func watchLapses(ns string, every time.Duration) *lapseWatch {
	w := &lapseWatch{ns: ns, lapsed: map[string]int{}}
	w.poll = startPoll(every, func() {
		var list v1alpha1.DistributedLockList
		start := time.Now()
		if err := k8s.List(suiteCtx, &list, client.InNamespace(ns)); err != nil {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.lists++
		for _, l := range list.Items {
			c := meta.FindStatusCondition(l.Status.Conditions, v1alpha1.ConditionHeld)
			if c != nil && c.Status == metav1.ConditionTrue && l.Status.ValidUntil != nil && l.Status.ValidUntil.Before(start) {
				w.lapsed[l.Name]++
			}
		}
	})
	return w
}

// watchKept watches the locks of ns over d, in which the writer keeps up,
// and asserts that none is shown held past its validity, nor, with
// shedOnTime, shed after it passed, unless the writer was overloaded
// meanwhile or within two load windows after: the machine's own API
// server then took less than the kept locks need (a loaded machine), a
// drop faster than a lead, and what lapses is bounded by the writes due
// within those windows and a lead (a refresh, or the write showing a
// grant chosen then Shed), not ruled out.
func watchKept(mgr *testenv.Manager, ns string, d time.Duration, keptDemand float64, ttl time.Duration, shedOnTime bool) {
	lapses := watchLapses(ns, 250*time.Millisecond)
	var overloaded atomic.Bool
	overloadedNow := func() bool {
		if testutil.ToFloat64(mgr.Metrics.StatusWriterOverloaded) == 1 {
			overloaded.Store(true)
		}
		return true
	}
	bound := int(math.Ceil(keptDemand * (2*time.Second + grants.StatusLead(ttl)).Seconds()))
	Consistently(func() int { overloadedNow(); return len(lapses.found()) }, d, 100*time.Millisecond).Should(BeNumerically("<=", bound),
		"locks of %s shown held past their validity while the writer keeps up", ns)
	Consistently(overloadedNow, 2*time.Second, 100*time.Millisecond).Should(BeTrue(), "the writer's overload flag, read over two load windows after the watch of %s", ns)
	shedLate, keptLapsed, lists := lapses.end()
	if !shedOnTime {
		shedLate = nil
	}
	if overloaded.Load() {
		By(fmt.Sprintf("the writer was overloaded while watched (the machine's API server took less than the kept locks need): %d kept locks lapsed and %d shed after their validity, at most %d", len(keptLapsed), len(shedLate), bound))
		Expect(len(keptLapsed)+len(shedLate)).To(BeNumerically("<=", bound), "locks of %s kept and lapsed, or shed after their validity passed, while the writer was overloaded (%d lists)", ns, lists)
		return
	}
	Expect(keptLapsed).To(BeEmpty(), "locks of %s kept and shown held past their validity (%d lists)", ns, lists)
	Expect(shedLate).To(BeEmpty(), "locks of %s shown Shed after their validity passed (%d lists)", ns, lists)
}

// poll calls a function every so often until ended.
type poll struct {
	stop chan struct{}
	done chan struct{}
}

func startPoll(every time.Duration, f func()) *poll {
	p := &poll{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			case <-time.After(every):
			}
			f()
		}
	}()
	return p
}

// halt stops the polling and waits for the last call to return.
func (p *poll) halt() {
	close(p.stop)
	<-p.done
}

// found is the locks the watch found lapsed so far, with how many lists
// found each.
func (w *lapseWatch) found() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.lapsed)
}

// end stops the watch and returns, of the locks it found lapsed, those
// status shows Shed now and the others (a kept lock's lapse), with the
// number of lists.
func (w *lapseWatch) end() (shedLate, keptLapsed []string, lists int) {
	w.halt()
	w.mu.Lock()
	defer w.mu.Unlock()
	for name := range w.lapsed {
		cur := &v1alpha1.DistributedLock{}
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: w.ns, Name: name}, cur)).To(Succeed())
		if heldReason(cur) == v1alpha1.ReasonShed {
			shedLate = append(shedLate, name)
			continue
		}
		keptLapsed = append(keptLapsed, fmt.Sprintf("%s (in %d lists)", name, w.lapsed[name]))
	}
	return shedLate, keptLapsed, w.lists
}

// settledShed waits until no lock of ms shows a held validity that has
// passed: each lock a drop of capacity left lapsed was shown Shed or
// refreshed again.
func settledShed(ms *testenv.MasterSet, within time.Duration) {
	Eventually(func(g Gomega) {
		var list v1alpha1.DistributedLockList
		start := time.Now()
		g.Expect(k8s.List(suiteCtx, &list, client.InNamespace(ms.NS))).To(Succeed())
		for _, l := range list.Items {
			c := meta.FindStatusCondition(l.Status.Conditions, v1alpha1.ConditionHeld)
			lapsed := c != nil && c.Status == metav1.ConditionTrue && l.Status.ValidUntil != nil && l.Status.ValidUntil.Before(start)
			g.Expect(lapsed).To(BeFalse(), "lock %s shows held until %v, passed", l.Name, l.Status.ValidUntil)
		}
	}, within, 250*time.Millisecond).Should(Succeed(), "every lock of %s held and valid, or shown not held", ms.NS)
}

var _ = Describe("The status writer behind an API server of known capacity", Ordered, func() {
	// The manager's writes go through an apiproxy that lets capacity of
	// them begin a second (its reads pass). The locks need more than that:
	// the writer must keep what it can, every refresh in time, and shed the
	// rest visibly. A refresh can wait at the API server behind the
	// writer's least in flight (4), two grants being shed, the manager's
	// two workers and an Event: 0.2 s at 44 writes/s, 0.36 s at 25, within
	// the 0.5 s lead of a ttl of 5s (the product's bound,
	// docs/design/overload.md#a-drop-of-capacity); more below 18, the drop
	// on a machine slower than the proxy, where the lead floor takes it.
	const (
		ttl      = 5 * time.Second
		capacity = 44.0 // the manager's writes a second
		dropped  = 25.0 // ... after the step, at most (below)
		n        = 230
		workers  = 2
	)
	var (
		mgr   *testenv.Manager
		ms    *testenv.MasterSet
		proxy *apiproxy.Proxy
	)
	perLock := grants.WritesPerTTL(ttl) / ttl.Seconds()
	BeforeAll(func() {
		Expect(float64(n)*perLock).To(BeNumerically(">", capacity), "the setup's arithmetic: the locks need more writes than the API server takes")
		ns := env.NewNamespace()
		var err error
		proxy, err = apiproxy.Start(env.Cfg, apiproxy.Limits{WritesPerSecond: capacity})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(proxy.Close)
		mgr = env.StartScopedManager(testenv.Scope{Cfg: proxy.Config(), WatchNamespaces: []string{ns}, Workers: workers, StatusReportNamespace: ns}, nil)
		ms = env.NewServingMasters(ns, "masters", 3, ttl)
	})
	AfterAll(func() {
		if mgr == nil || ms == nil {
			return // BeforeAll failed: its failure is the one to see
		}
		mgr.Stop()
		By("deleting the locks once their manager stopped: the next spec's manager, which serves every namespace, must not take them on")
		var list v1alpha1.DistributedLockList
		Expect(k8s.List(suiteCtx, &list, client.InNamespace(ms.NS))).To(Succeed())
		for i := range list.Items {
			l := &list.Items[i]
			Expect(k8s.Patch(suiteCtx, l, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))).To(Succeed(), "finalizer of lock %s", l.Name)
			Expect(client.IgnoreNotFound(k8s.Delete(suiteCtx, l))).To(Succeed(), "lock %s", l.Name)
		}
	})

	It("keeps every kept lock's status refreshed in time, sheds the rest Shed before their validity passes, and through a drop of capacity keeps the oldest", func() {
		By(fmt.Sprintf("creating %d locks at ttl %v at once: %.1f writes/s of refreshes, on an API server that takes %v", n, ttl, float64(n)*perLock, capacity))
		for i := range n {
			l := newLock(ms, fmt.Sprintf("load-%03d", i), "", "team-a", ttl)
			// With the operator's finalizer from the start: the API
			// server's writes go to grants and refreshes, not to a
			// finalizer on each lock first.
			l.Finalizers = []string{distributedlock.Finalizer}
			Expect(k8s.Create(suiteCtx, l)).To(Succeed())
		}
		Eventually(func() float64 { return testutil.ToFloat64(mgr.Metrics.StatusWriteCapacity) }, 30*time.Second).Should(BeNumerically("<", capacity),
			"the writer of %s to measure the API server's capacity", ms.NS)

		// Until its first saturated second the writer assumes its budget:
		// the grants made in the first burst, beyond what the API server
		// takes, are shed from then on, and may lapse before their Shed
		// shows (docs/design/overload.md#what-a-new-manager-does-not-know).
		By("granting what fits and shedding what does not, until the writer keeps up")
		Eventually(func() float64 { return testutil.ToFloat64(mgr.Metrics.StatusWriterOverloaded) }, 60*time.Second, 250*time.Millisecond).Should(BeZero(),
			"the status writer of %s to keep up with the locks it kept", ms.NS)
		Eventually(func(g Gomega) {
			var list v1alpha1.DistributedLockList
			g.Expect(k8s.List(suiteCtx, &list, client.InNamespace(ms.NS))).To(Succeed())
			for i := range list.Items {
				l := &list.Items[i]
				g.Expect(l.Status.Holder != nil || heldReason(l) == v1alpha1.ReasonShed || heldReason(l) == v1alpha1.ReasonStatusWritesBehind).To(BeTrue(),
					"lock %s is neither held, shed nor waiting for room: %+v", l.Name, condition(l, v1alpha1.ConditionHeld))
			}
		}, 60*time.Second, 250*time.Millisecond).Should(Succeed(), "every lock of %s granted, shed or waiting for room", ms.NS)
		settledShed(ms, 60*time.Second)
		held := heldLocks(ms)
		Expect(held).NotTo(BeEmpty())
		Expect(float64(len(held))*perLock).To(BeNumerically("<=", capacity), "more locks held than %v writes/s refresh", capacity)
		By(fmt.Sprintf("watching the %d locks held, %d shed, over two refreshes of each", len(held), int(testutil.ToFloat64(mgr.Metrics.LocksShed))))
		watchKept(mgr, ms.NS, 2*ttl, float64(len(held))*perLock, ttl, true)
		// A shed's event is written after the shed, and Events wait in
		// the manager behind the refreshes (internal/writegate).
		for _, l := range shedLocks(ms) {
			Eventually(func() []string { return eventReasons(ms.NS, l) }, 30*time.Second, 250*time.Millisecond).Should(ContainElement(distributedlock.EventShed), "events of shed lock %s", l)
		}
		// The grants, Events and waiting messages of 230 locks, at most a
		// quarter of the refreshes' limit at once (docs/design/overload.md).
		Expect(testutil.ToFloat64(mgr.Metrics.APIWritesWaited)).To(BeNumerically(">", 0),
			"writes of the manager of %s other than refreshes waited in the manager while the refreshes needed the API server", ms.NS)

		before := heldLocks(ms)
		// A drop is one below what the kept locks need. Beside other
		// suites the machine's own API server may take less than the
		// proxy lets begin: the writer measures that, keeps less, and
		// 25 writes/s would be no drop (make test: 86 kept, needing 19.8).
		dropTo := min(dropped, 0.8*float64(len(before))*perLock)
		By(fmt.Sprintf("dropping the API server's capacity to %.1f writes/s, below the %.1f the %d kept locks need", dropTo, float64(len(before))*perLock, len(before)))
		acquired := map[string]time.Time{} // of the locks held before the drop
		for _, name := range before {
			l := &v1alpha1.DistributedLock{}
			Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ms.NS, Name: name}, l)).To(Succeed())
			if l.Status.AcquiredAt != nil {
				acquired[name] = l.Status.AcquiredAt.Time
			}
		}
		shedBefore := testutil.ToFloat64(mgr.Metrics.LocksShed)
		demand := float64(len(before)) * perLock
		lapses := watchLapses(ms.NS, 250*time.Millisecond)
		reports := watchReports(ms.NS, 100*time.Millisecond)
		proxy.Set(apiproxy.Limits{WritesPerSecond: dropTo})
		stepAt := time.Now()
		// Until the writer measures the drop (its first saturated
		// seconds), its refreshes queue at the API server in the order
		// they were sent: kept grants whose validity passes within that
		// time and a lead may lapse (docs/design/overload.md#a-drop-of-capacity).
		Eventually(func() float64 { return testutil.ToFloat64(mgr.Metrics.StatusWriterOverloaded) }, 2*ttl, 100*time.Millisecond).Should(Equal(1.0),
			"the status writer of %s to measure the drop", ms.NS)
		measured := time.Since(stepAt)
		// The writer publishes at once when the overload begins: the
		// report, read until then, shows it (it may end within seconds).
		By("reading the writer's report while it sheds: overloaded, at the capacity it measured")
		Eventually(reports.overloaded, 30*time.Second, 100*time.Millisecond).ShouldNot(BeNil(), "the status writer of %s to publish its overload", ms.NS)
		r := reports.end()
		Expect(r.OverloadedSince).NotTo(BeNil(), "overloaded since")
		Expect(r.Measured).To(BeTrue(), "capacity measured")
		Expect(r.CapacityPerSecond).To(BeNumerically("<", capacity), "capacity after the drop")
		Expect(r.BudgetPerSecond).To(Equal(float64(grants.DefaultWritesPerSecond)), "budget")
		Expect(r.Manager).To(Equal("testenv"), "manager")
		Eventually(func(g Gomega) {
			g.Expect(time.Since(stepAt)).To(BeNumerically(">", measured+ttl), "one refresh period since the drop was measured")
			g.Expect(testutil.ToFloat64(mgr.Metrics.StatusWriterOverloaded)).To(BeZero(), "the status writer overloaded")
		}, 90*time.Second, 250*time.Millisecond).Should(Succeed(), "the status writer of %s to keep up again after the drop", ms.NS)
		settledShed(ms, 60*time.Second)
		Expect(testutil.ToFloat64(mgr.Metrics.LocksShed)).To(BeNumerically(">", shedBefore), "no grant shed after the drop: the test shows nothing")
		shedLate, keptLapsed, lists := lapses.end()
		kept := heldLocks(ms)
		Expect(float64(len(kept))*perLock).To(BeNumerically("<=", dropTo), "more locks of %s held than %.1f writes/s refresh", ms.NS, dropTo)
		bound := int(math.Ceil(demand * (measured + grants.StatusLead(ttl)).Seconds()))
		By(fmt.Sprintf("%d of %d kept; the drop measured after %v; kept locks lapsed meanwhile: %d (at most the %d whose validity passed within that and a lead); %d shown Shed after their validity passed (%d lists)",
			len(kept), len(before), measured.Round(time.Millisecond), len(keptLapsed), bound, len(shedLate), lists))
		Expect(len(keptLapsed)).To(BeNumerically("<=", bound), "locks of %s kept through the drop and shown held past their validity: %v", ms.NS, keptLapsed)

		By("reading the writer's report once it keeps up: the locks kept, and the grants shed")
		Eventually(func(g Gomega) {
			r := writerReport(g, ms.NS)
			g.Expect(r.Overloaded).To(BeFalse(), "overloaded")
			g.Expect(r.Shedding).To(BeZero(), "grants being shed")
			g.Expect(r.Kept).To(Equal(len(heldLocks(ms))), "grants kept, against the locks shown held")
			g.Expect(r.Shed).To(BeEquivalentTo(testutil.ToFloat64(mgr.Metrics.LocksShed)), "grants shed, against redlock_locks_shed_total")
			// A raised lead floor raises a grant's writes, never lowers them.
			g.Expect(r.DemandPerSecond).To(BeNumerically(">=", 0.99*float64(r.Kept)*perLock), "demand of the kept grants")
			g.Expect(r.DemandPerSecond).To(BeNumerically("<=", r.CapacityPerSecond), "demand within capacity")
		}, 3*v1alpha1.StatusWriterReportBeat, time.Second).Should(Succeed(), "the status writer of %s to publish what it keeps", ms.NS)

		By("watching the locks kept after the drop, over two refreshes of each")
		watchKept(mgr, ms.NS, 2*ttl, float64(len(heldLocks(ms)))*perLock, ttl, false)
		// A lock held now that was not held before the drop was granted
		// once the writer had room again (admitted, not kept through it).
		var keptThrough []string
		for _, k := range kept {
			l := &v1alpha1.DistributedLock{}
			Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ms.NS, Name: k}, l)).To(Succeed())
			Expect(l.Status.AcquiredAt).NotTo(BeNil(), "lock %s held", k)
			if at, ok := acquired[k]; ok && l.Status.AcquiredAt.Equal(at) {
				keptThrough = append(keptThrough, k)
				continue
			}
			Expect(l.Status.AcquiredAt.Time.Before(stepAt)).To(BeFalse(), "lock %s, held now and not before the drop, granted at %v, before it", k, l.Status.AcquiredAt)
		}
		Expect(keptThrough).NotTo(BeEmpty(), "no lock of %s kept through the drop", ms.NS)
		for _, name := range shedLocks(ms) {
			if _, ok := acquired[name]; !ok {
				continue // shed before the drop
			}
			for _, k := range keptThrough {
				Expect(acquired[k].Before(acquired[name])).To(BeTrue(), "kept %s was granted after %s, shed", k, name)
			}
		}
	})
})

// heldLocks returns the names of the locks of ms whose status shows them
// held and valid when the list began: a list served slowly (a loaded
// machine) does not make a validity that passed while it was served look
// like a lock not held (the rule of lapseWatch).
func heldLocks(ms *testenv.MasterSet) []string {
	var list v1alpha1.DistributedLockList
	start := time.Now()
	Expect(k8s.List(suiteCtx, &list, client.InNamespace(ms.NS))).To(Succeed())
	var out []string
	for i := range list.Items {
		l := &list.Items[i]
		c := meta.FindStatusCondition(l.Status.Conditions, v1alpha1.ConditionHeld)
		if c != nil && c.Status == metav1.ConditionTrue && l.Status.Holder != nil && l.Status.ValidUntil != nil && !l.Status.ValidUntil.Before(start) {
			out = append(out, l.Name)
		}
	}
	return out
}

// shedLocks returns the names of the locks of ms whose status shows them
// Shed.
func shedLocks(ms *testenv.MasterSet) []string {
	var list v1alpha1.DistributedLockList
	Expect(k8s.List(suiteCtx, &list, client.InNamespace(ms.NS))).To(Succeed())
	var out []string
	for i := range list.Items {
		if heldReason(&list.Items[i]) == v1alpha1.ReasonShed {
			out = append(out, list.Items[i].Name)
		}
	}
	return out
}

// writerReport reads the status writer's report the manager published in
// ns.
func writerReport(g Gomega, ns string) v1alpha1.StatusWriterReport {
	r, err := readReport(ns)
	g.Expect(err).NotTo(HaveOccurred(), "the status writer's report in %s", ns)
	return r
}

// readReport reads the status writer's report the manager published in
// ns.
func readReport(ns string) (v1alpha1.StatusWriterReport, error) {
	var r v1alpha1.StatusWriterReport
	cm := &corev1.ConfigMap{}
	if err := k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: v1alpha1.StatusConfigMap}, cm); err != nil {
		return r, err
	}
	return r, json.Unmarshal([]byte(cm.Data[v1alpha1.StatusWriterKey]), &r)
}

// reportWatch reads the status writer's report of a namespace until
// stopped, and keeps the first that shows the writer overloaded.
type reportWatch struct {
	*poll

	mu    sync.Mutex
	first *v1alpha1.StatusWriterReport
}

func watchReports(ns string, every time.Duration) *reportWatch {
	w := &reportWatch{}
	w.poll = startPoll(every, func() {
		r, err := readReport(ns)
		if err != nil || !r.Overloaded {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.first == nil {
			w.first = &r
		}
	})
	return w
}

// overloaded is the first report read that shows the writer overloaded
// (nil: none yet).
func (w *reportWatch) overloaded() *v1alpha1.StatusWriterReport {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.first
}

// end stops the watch and returns the first overloaded report read.
func (w *reportWatch) end() *v1alpha1.StatusWriterReport {
	w.halt()
	return w.overloaded()
}
