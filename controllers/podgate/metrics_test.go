package podgate_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// scrape is testenv.Samples, failing g on an error.
func scrape(g Gomega, reg prometheus.Gatherer, name string, want map[string]string) []*dto.Metric {
	ms, err := testenv.Samples(reg, name, want)
	g.Expect(err).NotTo(HaveOccurred(), "gather the manager's registry")
	return ms
}

// value is the single gauge or counter sample of name with the labels
// want.
func value(g Gomega, reg prometheus.Gatherer, name string, want map[string]string) float64 {
	v, ok, err := testenv.Value(reg, name, want)
	g.Expect(err).NotTo(HaveOccurred(), "gather the manager's registry")
	g.Expect(ok).To(BeTrue(), "one gauge or counter sample of %s%v", name, want)
	return v
}

// histogramCount is the sample count of the histogram name.
func histogramCount(g Gomega, reg prometheus.Gatherer, name string) uint64 {
	ms := scrape(g, reg, name, nil)
	g.Expect(ms).To(HaveLen(1), "one histogram %s", name)
	return ms[0].GetHistogram().GetSampleCount()
}

var _ = Describe("Metrics an on-call engineer pages on", Ordered, func() {
	var (
		mgr  *testenv.Manager
		ns   string
		ms   *testenv.MasterSet
		lock map[string]string
		set  map[string]string
		pods []*corev1.Pod
	)
	BeforeAll(func() {
		ns = env.NewNamespace()
		// Only this namespace: redlock_pod_wait_seconds has no labels, and
		// a manager watching every namespace could also ungate a pod an
		// earlier spec left waiting (envtest never deletes namespaces).
		mgr = env.StartScopedManager(testenv.Scope{WatchNamespaces: []string{ns}}, nil)
		ms = env.NewServingMasters(ns, "masters", 3, 4*time.Second)
		lock = map[string]string{"namespace": ns, "name": "paged"}
		set = map[string]string{"namespace": ns, "name": ms.Name}
	})
	AfterAll(func() {
		for _, s := range ms.Servers {
			_ = s.Cont()
		}
		mgr.Stop()
	})

	It("reports a held lock, the pods waiting for it and the oldest wait, and the set's quorum and members", func() {
		Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "paged"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: ms.Name, TTL: metav1.Duration{Duration: 2 * time.Second}},
		})).To(Succeed())
		pods = []*corev1.Pod{gatedPod(ns, "paged-1", "paged", false), gatedPod(ns, "paged-2", "paged", false)}
		for _, p := range pods {
			Expect(k8s.Create(suiteCtx, p)).To(Succeed())
		}
		By("the first pod is ungated, the second waits at the gate")
		Eventually(func(g Gomega) {
			g.Expect(runnable(getPod(pods[0]))).To(BeTrue(), "pod %s ungated", pods[0].Name)
			g.Expect(value(g, mgr.Registry, "redlock_manager_leading", nil)).To(Equal(1.0))
			g.Expect(value(g, mgr.Registry, "redlock_lock_held", lock)).To(Equal(1.0))
			g.Expect(value(g, mgr.Registry, "redlock_lock_pods_waiting", lock)).To(Equal(1.0))
			g.Expect(value(g, mgr.Registry, "redlock_lock_oldest_wait_seconds", lock)).To(BeNumerically(">", 0))
			g.Expect(value(g, mgr.Registry, "redlock_lock_grants_total", lock)).To(Equal(1.0))
			g.Expect(histogramCount(g, mgr.Registry, "redlock_pod_wait_seconds")).To(BeEquivalentTo(1))
		}).Should(Succeed(), "lock %s/paged to be reported held by %s with %s waiting", ns, pods[0].Name, pods[1].Name)

		By("the set reports its quorum and every member serving")
		Eventually(func(g Gomega) {
			g.Expect(value(g, mgr.Registry, "redlock_master_set_quorum", set)).To(Equal(2.0))
			g.Expect(value(g, mgr.Registry, "redlock_master_set_members", set)).To(Equal(3.0))
			g.Expect(value(g, mgr.Registry, "redlock_master_set_serving", set)).To(Equal(3.0))
			g.Expect(value(g, mgr.Registry, "redlock_master_set_available", set)).To(Equal(1.0))
			for _, s := range ms.Servers {
				for _, state := range []string{v1alpha1.MemberServing, v1alpha1.MemberDown} {
					want := 0.0
					if state == v1alpha1.MemberServing {
						want = 1
					}
					g.Expect(value(g, mgr.Registry, "redlock_master_state", map[string]string{"namespace": ns, "name": ms.Name, "master": s.Addr(), "state": state})).
						To(Equal(want), "master %s in state %s", s.Addr(), state)
				}
			}
		}).Should(Succeed(), "master set %s/%s to report quorum 2 of 3 members, all serving", ns, ms.Name)
	})

	It("counts a lost grant by its reason, and reports members down and the lock not held while a pod waits", func() {
		By("stopping two of the three masters: the grant cannot be renewed")
		Expect(ms.Servers[0].Stop()).To(Succeed())
		Expect(ms.Servers[1].Stop()).To(Succeed())
		Eventually(func(g Gomega) {
			lost := scrape(g, mgr.Registry, "redlock_lock_grants_lost_total", lock)
			g.Expect(lost).NotTo(BeEmpty(), "a lost grant counted")
			g.Expect(lost[0].GetCounter().GetValue()).To(BeNumerically(">=", 1))
			at := scrape(g, mgr.Registry, "redlock_lock_grant_lost_timestamp_seconds", lock)
			g.Expect(at).NotTo(BeEmpty(), "the time of the loss")
			g.Expect(at[0].GetGauge().GetValue()).To(BeNumerically("~", float64(time.Now().Unix()), 60), "the loss happened in the last minute")
			g.Expect(value(g, mgr.Registry, "redlock_lock_held", lock)).To(Equal(0.0))
			g.Expect(value(g, mgr.Registry, "redlock_lock_pods_waiting", lock)).To(BeNumerically(">=", 1))
			g.Expect(value(g, mgr.Registry, "redlock_master_set_serving", set)).To(Equal(1.0))
			g.Expect(value(g, mgr.Registry, "redlock_master_set_available", set)).To(Equal(0.0))
			for _, s := range ms.Servers[:2] {
				g.Expect(value(g, mgr.Registry, "redlock_master_state", map[string]string{"namespace": ns, "name": ms.Name, "master": s.Addr(), "state": v1alpha1.MemberDown})).
					To(Equal(1.0), "master %s down", s.Addr())
			}
		}).Should(Succeed(), "lock %s/paged to be reported lost and not held, masters %s and %s down", ns, ms.Servers[0].Addr(), ms.Servers[1].Addr())
		Expect(ms.Servers[0].Cont()).To(Succeed())
		Expect(ms.Servers[1].Cont()).To(Succeed())
	})

	It("counts the handover to the next pod and observes its wait", func() {
		By("the first pod finishing once the lock is held again")
		Eventually(func(g Gomega) {
			g.Expect(value(g, mgr.Registry, "redlock_lock_held", lock)).To(Equal(1.0))
		}).Should(Succeed(), "lock %s/paged to be held again once its masters serve", ns)
		kubeletStops(pods[0], corev1.PodSucceeded)
		Eventually(func(g Gomega) {
			g.Expect(runnable(getPod(pods[1]))).To(BeTrue(), "pod %s ungated", pods[1].Name)
			g.Expect(value(g, mgr.Registry, "redlock_lock_grants_total", lock)).To(BeNumerically(">=", 2))
			g.Expect(value(g, mgr.Registry, "redlock_lock_pods_waiting", lock)).To(Equal(0.0))
			g.Expect(value(g, mgr.Registry, "redlock_lock_oldest_wait_seconds", lock)).To(Equal(0.0))
			g.Expect(histogramCount(g, mgr.Registry, "redlock_pod_wait_seconds")).To(BeEquivalentTo(2))
		}).Should(Succeed(), "lock %s/paged to be handed to pod %s, nobody left waiting", ns, pods[1].Name)
	})

	It("reports none of the per-lock or per-set series on a standby", func() {
		standby := env.StartManager()
		defer standby.Stop()
		Consistently(func(g Gomega) {
			g.Expect(value(g, standby.Registry, "redlock_manager_leading", nil)).To(Equal(0.0))
			g.Expect(scrape(g, standby.Registry, "redlock_lock_held", nil)).To(BeEmpty())
			g.Expect(scrape(g, standby.Registry, "redlock_master_state", nil)).To(BeEmpty())
		}, 2*time.Second, 200*time.Millisecond).Should(Succeed(), "the standby manager to report itself not leading and no lock or set series")
	})

	It("forgets a deleted lock's series", func() {
		Expect(k8s.Delete(suiteCtx, &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "paged"}})).To(Succeed())
		Eventually(func(g Gomega) {
			for _, name := range []string{"redlock_lock_held", "redlock_lock_pods_waiting", "redlock_lock_grants_total", "redlock_lock_grants_lost_total", "redlock_lock_grant_lost_timestamp_seconds", "redlock_lock_fencing_token"} {
				g.Expect(scrape(g, mgr.Registry, name, lock)).To(BeEmpty(), "%s of the deleted lock", name)
			}
		}).Should(Succeed(), "the series of deleted lock %s/paged to be gone", ns)
	})
})
