package distributedlock_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// The suite runs the operator in-process against a real kube-apiserver and
// etcd and real redis-server masters (internal/harness/testenv).

var (
	env      *testenv.Env
	k8s      client.Client
	suiteCtx context.Context
)

func TestDistributedLock(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "DistributedLock controller")
}

var _ = BeforeSuite(func() {
	env = testenv.Start()
	k8s, suiteCtx = env.Client, env.Ctx
})

var _ = AfterSuite(func() { env.Stop() })

// newLock returns a DistributedLock on ms.
func newLock(ms *testenv.MasterSet, name, key, holder string, ttl time.Duration) *v1alpha1.DistributedLock {
	return &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ms.NS, Name: name},
		Spec: v1alpha1.DistributedLockSpec{
			MasterSet:      ms.Name,
			Key:            key,
			TTL:            metav1.Duration{Duration: ttl},
			HolderIdentity: holder,
		},
	}
}

// fetch reads the lock from the API server.
func fetch(l *v1alpha1.DistributedLock) *v1alpha1.DistributedLock {
	out := &v1alpha1.DistributedLock{}
	Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(l), out)).To(Succeed())
	return out
}

func condition(l *v1alpha1.DistributedLock, typ string) *metav1.Condition {
	return meta.FindStatusCondition(l.Status.Conditions, typ)
}

// heldBy reports whether the status shows holder as holding the lock now.
func heldBy(l *v1alpha1.DistributedLock, holder string) bool {
	c := condition(l, v1alpha1.ConditionHeld)
	return c != nil && c.Status == metav1.ConditionTrue && l.Status.Holder != nil && l.Status.Holder.Identity == holder &&
		l.Status.ValidUntil != nil && time.Now().Before(l.Status.ValidUntil.Time)
}

// expectHeldBy is heldBy as a Gomega assertion that says what is wrong.
func expectHeldBy(g Gomega, l *v1alpha1.DistributedLock, holder string) {
	g.Expect(condition(l, v1alpha1.ConditionHeld)).NotTo(BeNil(), "no Held condition")
	g.Expect(condition(l, v1alpha1.ConditionHeld).Status).To(Equal(metav1.ConditionTrue), "Held: %+v", condition(l, v1alpha1.ConditionHeld))
	g.Expect(l.Status.Holder).NotTo(BeNil())
	g.Expect(l.Status.Holder.Identity).To(Equal(holder))
	g.Expect(l.Status.ValidUntil).NotTo(BeNil())
	g.Expect(l.Status.ValidUntil.Time).To(BeTemporally(">", time.Now()), "validity passed")
}

// eventuallyHeldBy waits until status shows holder holding the lock and
// returns the lock as read then.
func eventuallyHeldBy(l *v1alpha1.DistributedLock, holder string) *v1alpha1.DistributedLock {
	var cur *v1alpha1.DistributedLock
	Eventually(func(g Gomega) {
		cur = fetch(l)
		expectHeldBy(g, cur, holder)
	}).Should(Succeed(), "lock %s/%s to be held by %s", l.Namespace, l.Name, holder)
	return cur
}

func heldReason(l *v1alpha1.DistributedLock) string {
	if c := condition(l, v1alpha1.ConditionHeld); c != nil && c.Status == metav1.ConditionFalse {
		return c.Reason
	}
	return ""
}

func readyReason(l *v1alpha1.DistributedLock) string {
	if c := condition(l, v1alpha1.ConditionReady); c != nil {
		return string(c.Status) + "/" + c.Reason
	}
	return ""
}

// expectedValue is the Redis value of the lock's current grant.
func expectedValue(l *v1alpha1.DistributedLock) string {
	return env.Values.Value(string(l.UID), l.Status.GrantID)
}

func eventReasons(ns, name string) []string { return env.EventReasons(ns, name) }

// BeStrictlyIncreasing succeeds for a slice of tokens in which every entry
// is larger than the one before.
func BeStrictlyIncreasing() OmegaMatcher {
	return WithTransform(func(tokens []int64) []int64 {
		var bad []int64
		for i := 1; i < len(tokens); i++ {
			if tokens[i] <= tokens[i-1] {
				bad = append(bad, tokens[i-1], tokens[i])
			}
		}
		return bad
	}, BeEmpty())
}

// clusters are two clusters sharing masters: a manager on the suite's API
// server (cluster A) and a second API server (cluster B), whose managers
// specs start as they need.
type clusters struct {
	mgrA  *testenv.Manager
	other *testenv.Env
}

// twoClusters starts them before an Ordered container's specs, and stops
// them after.
func twoClusters() *clusters {
	c := &clusters{}
	BeforeAll(func() {
		c.mgrA = env.StartManager()
		DeferCleanup(c.mgrA.Stop)
		c.other = testenv.Start()
		DeferCleanup(c.other.Stop)
	})
	return c
}

// shared starts three masters named by a set in each cluster.
func (c *clusters) shared(maxTTL time.Duration) (a, b *testenv.MasterSet) {
	a = env.NewServingMasters(env.NewNamespace(), "shared", 3, maxTTL)
	b = &testenv.MasterSet{Servers: a.Servers, Name: "shared", NS: c.other.NewNamespace()}
	c.other.CreateMasterSet(b, maxTTL)
	c.other.WaitServing(b, 0)
	return a, b
}
