package holding_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/pkg/holding"
)

// The suite runs a real kube-apiserver and etcd (internal/harness/testenv) and
// writes DistributedLock status as the operator would: what the watcher
// reads is the status alone. Deadlines run on a fake clock the specs step.

var env *testenv.Env

func TestHolding(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Holding a lock, seen from the pod")
}

var _ = BeforeSuite(func() { env = testenv.Start() })

var _ = AfterSuite(func() { env.Stop() })

var me = holding.Holder{Name: "worker-0", UID: "uid-worker-0"}

// newLock creates a DistributedLock and returns it.
func newLock(ns, name string) *v1alpha1.DistributedLock {
	l := &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.DistributedLockSpec{MasterSet: "masters", TTL: metav1.Duration{Duration: 10 * time.Second}},
	}
	Expect(env.Client.Create(env.Ctx, l)).To(Succeed())
	return l
}

// show writes status as the operator does for a grant to pod holder.
func show(l *v1alpha1.DistributedLock, holder holding.Holder, grantID string, token int64, validUntil time.Time) {
	Eventually(func() error {
		cur := &v1alpha1.DistributedLock{}
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(l), cur); err != nil {
			return err
		}
		cur.Status.Holder = &v1alpha1.LockHolder{Identity: holder.Name, Pod: &v1alpha1.PodReference{Name: holder.Name, UID: holder.UID}}
		cur.Status.GrantID, cur.Status.FencingToken, cur.Status.Key = grantID, token, "key"
		cur.Status.ValidUntil = v1alpha1.NewPreciseTime(validUntil)
		cur.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAcquired,
			Message: "held", LastTransitionTime: metav1.Now()}}
		return env.Client.Status().Update(env.Ctx, cur)
	}).Should(Succeed(), "status of lock %s shows grant %s to %s", l.Name, grantID, holder.Name)
}

func watchClient(cfg *rest.Config) client.WithWatch {
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

func closed(ch <-chan struct{}) func() bool {
	return func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
}

var _ = Describe("A pod's view of its lock", func() {
	var (
		ns  string
		clk *testingclock.FakeClock
		ctx context.Context
	)
	BeforeEach(func() {
		ns = env.NewNamespace()
		clk = testingclock.NewFakeClock(time.Now())
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(env.Ctx)
		DeferCleanup(cancel)
	})

	It("learns of its grant, follows its refreshes, and ends it as soon as status shows another holder", func() {
		l := newLock(ns, "follow")
		w := holding.Watch(ctx, watchClient(env.Cfg), client.ObjectKeyFromObject(l), me, holding.Options{SkewAllowance: 500 * time.Millisecond, Clock: clk})
		Expect(w.Current()).To(BeNil(), "nothing shown yet")

		By("showing a grant to worker-0")
		show(l, me, "g1", 7, clk.Now().Add(5*time.Second))
		var g *holding.Grant
		Eventually(func() *holding.Grant { g = w.Current(); return g }).ShouldNot(BeNil(), "grant g1 seen by worker-0")
		Expect(g.Token).To(Equal(int64(7)))
		Expect(g.GrantID).To(Equal("g1"))
		Expect(g.Deadline).To(BeTemporally("~", clk.Now().Add(4500*time.Millisecond), time.Millisecond), "validity less the allowance")
		done := w.Done(ctx, g)

		By("refreshing its validity: the deadline moves on and the grant goes on")
		show(l, me, "g1", 7, clk.Now().Add(9*time.Second))
		Eventually(func() time.Time { return w.Deadline("g1") }).Should(BeTemporally("~", clk.Now().Add(8500*time.Millisecond), time.Millisecond), "deadline of grant g1 of lock %s/%s to follow its refreshed validity", l.Namespace, l.Name)
		clk.Step(6 * time.Second) // past the first deadline, before the refreshed one
		Consistently(closed(done), 200*time.Millisecond).Should(BeFalse(), "grant g1 ended at its old deadline after a refresh")

		By("showing the lock granted to another pod")
		show(l, holding.Holder{Name: "worker-1", UID: "uid-worker-1"}, "g2", 8, clk.Now().Add(9*time.Second))
		Eventually(closed(done)).Should(BeTrue(), "grant g1 ended once another holder is shown")
		Expect(w.Current()).To(BeNil())
	})

	It("ends its grant at the deadline when it can no longer reach the API server", func() {
		l := newLock(ns, "cut-off")
		u, err := url.Parse(env.Cfg.Host)
		Expect(err).NotTo(HaveOccurred())
		proxy := redistest.NewProxy(GinkgoT(), u.Host)
		cfg := rest.CopyConfig(env.Cfg)
		cfg.Host = "https://" + proxy.Addr()
		w := holding.Watch(ctx, watchClient(cfg), client.ObjectKeyFromObject(l), me, holding.Options{SkewAllowance: 500 * time.Millisecond, Clock: clk})
		show(l, me, "g1", 7, clk.Now().Add(5*time.Second))
		var g *holding.Grant
		Eventually(func() *holding.Grant { g = w.Current(); return g }).ShouldNot(BeNil(), "grant g1 seen through the proxy")
		done := w.Done(ctx, g)

		By("cutting the watcher off, then refreshing the validity where it cannot see it")
		Expect(proxy.Stall()).To(Succeed())
		DeferCleanup(proxy.Resume)
		show(l, me, "g1", 7, clk.Now().Add(60*time.Second))
		clk.Step(4400 * time.Millisecond) // 100ms before the deadline
		Consistently(closed(done), 200*time.Millisecond).Should(BeFalse(), "grant g1 ended before its deadline")
		Expect(w.Current()).NotTo(BeNil())
		clk.Step(100 * time.Millisecond)
		Eventually(closed(done)).Should(BeTrue(), "grant g1 ended at its deadline, unrefreshed")
		Expect(w.Current()).To(BeNil(), "no grant held past the deadline")
	})

	It("waits in Next until the pod is granted the lock", func() {
		l := newLock(ns, "next")
		w := holding.Watch(ctx, watchClient(env.Cfg), types.NamespacedName{Namespace: ns, Name: "next"}, me, holding.Options{Clock: clk})
		got := make(chan *holding.Grant, 1)
		go func() {
			defer GinkgoRecover()
			g, err := w.Next(ctx)
			Expect(err).NotTo(HaveOccurred())
			got <- g
		}()
		show(l, holding.Holder{Name: "worker-1", UID: "uid-worker-1"}, "g1", 3, clk.Now().Add(5*time.Second))
		Consistently(got, 300*time.Millisecond).ShouldNot(Receive(), "Next on lock %s/next returned while worker-1 holds it", ns)
		show(l, me, "g2", 4, clk.Now().Add(5*time.Second))
		var g *holding.Grant
		Eventually(got).Should(Receive(&g), "Next on lock %s/next to return grant g2 to worker-0", ns)
		Expect(g.GrantID).To(Equal("g2"))
		Expect(g.Token).To(Equal(int64(4)))
	})
})
