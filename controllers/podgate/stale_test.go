package podgate_test

import (
	"net/url"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// Issue 18, case 7: a grant lost while the manager's cache of pods is stale
// (a manager paused for longer than the ttl wakes up to old watch events)
// must not be given again to the former holder that finished meanwhile. The
// manager's cache of gated pods watches through a proxy the test stalls;
// the lock controller's fresh reads go straight to the API server.
var _ = Describe("A grant lost while the pod cache is stale", Ordered, func() {
	var (
		ns    string
		ms    *testenv.MasterSet
		proxy *redistest.Proxy
	)
	BeforeAll(func() {
		u, err := url.Parse(env.Cfg.Host)
		Expect(err).NotTo(HaveOccurred())
		proxy = redistest.NewProxy(GinkgoT(), u.Host)
		cfg := rest.CopyConfig(env.Cfg)
		cfg.Host = "https://" + proxy.Addr()
		mgr := env.StartScopedManager(testenv.Scope{PodCacheCfg: cfg}, nil)
		DeferCleanup(mgr.Stop)
		ns = env.NewNamespace()
		ms = env.NewServingMasters(ns, "masters", 3, 4*time.Second)
	})

	It("is not given again to its former holder that finished meanwhile", func() {
		createLock(ns, "job", ms.Name, "")
		pod := gatedPod(ns, "finisher", "job", false)
		Expect(k8s.Create(suiteCtx, pod)).To(Succeed())
		Eventually(func(g Gomega) { expectHolds(g, ns, "job", pod) }).Should(Succeed(), "lock %s/job to be held by pod %s", ns, pod.Name)
		kubeletRuns(pod)
		token := tokenOf(pod)
		first := fetchLock(ns, "job").Status
		key := first.Key

		By("stalling the manager's cache of pods, then finishing the holder: the cache still shows it running")
		Expect(proxy.Stall()).To(Succeed())
		DeferCleanup(proxy.Resume)
		kubeletStops(pod, corev1.PodSucceeded)

		By("losing the grant on every master, as its expiry during a pause would")
		for _, s := range ms.Servers {
			c := s.Client()
			Expect(c.Del(suiteCtx, key).Err()).To(Succeed())
			_ = c.Close()
		}
		Eventually(func() bool {
			l := fetchLock(ns, "job")
			return !meta.IsStatusConditionTrue(l.Status.Conditions, v1alpha1.ConditionHeld) || l.Status.GrantID != first.GrantID
		}).Should(BeTrue(), "lock %s/job to see its grant lost (not held, or granted again)", ns)

		By("never granting the lock to the finished pod again while the cache is stale")
		check := func(g Gomega) {
			l := fetchLock(ns, "job")
			if l.Status.Holder != nil && l.Status.Holder.Pod != nil {
				g.Expect(l.Status.Holder.Pod.Name).NotTo(Equal(pod.Name), "lock %s/job granted again to the finished pod %s (token %d → %d)", ns, pod.Name, token, l.Status.FencingToken)
			}
			g.Expect(tokenOf(pod)).To(Equal(token), "the finished pod %s was annotated with a new token", pod.Name)
		}
		check(Default)
		Consistently(check, 4*time.Second, 50*time.Millisecond).Should(Succeed(), "lock %s/job never to be granted again to finished pod %s while the cache is stale", ns, pod.Name)
		Expect(meta.IsStatusConditionTrue(fetchLock(ns, "job").Status.Conditions, v1alpha1.ConditionHeld)).To(BeFalse(), "lock %s/job held with no pod left to run", ns)
	})
})
