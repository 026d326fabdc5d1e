//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/managed"
)

// growBasePort is where the growing set's members listen (host network).
const growBasePort = 17300

// growNodeTimeout is the growing set's per-master timeout. While the change
// lasts the two new members do not vote yet, so every extension needs all
// three old members (a quorum of three in the list of five): with the
// timeout derived from the 4s ttl (50ms), one slow answer on a loaded CI
// machine, where two members are starting, fails an extension, and a few
// seconds of them lapsed the lock. The spec is about the change, not about
// answering within 50ms.
const growNodeTimeout = 200 * time.Millisecond

var _ = Describe("a managed set growing from 3 to 5 members", func() {
	It("keeps a lock held with the same token through the membership change, then serves on five", func() {
		grow := &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "grow"},
			Spec: v1alpha1.RedisMasterSetSpec{
				MaxLockTTL:  metav1.Duration{Duration: ttl},
				NodeTimeout: &metav1.Duration{Duration: growNodeTimeout},
				Managed:     &v1alpha1.ManagedMasters{Replicas: 3, Image: "redis:7-local", Port: growBasePort, HostNetwork: true},
			},
		}
		Expect(k8s.Create(ctx, grow)).To(Succeed())
		removeAfterSpec(grow)
		fetchSet := func() *v1alpha1.RedisMasterSet {
			cur := &v1alpha1.RedisMasterSet{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(grow), cur)).To(Succeed())
			return cur
		}
		Eventually(func(g Gomega) {
			cur := fetchSet()
			g.Expect(cur.Status.Serving).To(BeEquivalentTo(3), "set %s/grow serving", ns)
		}, 3*time.Minute, time.Second).Should(Succeed(), "master set %s/grow to serve with its 3 members", ns)

		By("holding a lock on the three members")
		l := &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "grown"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: "grow", Key: "e2e/grow", TTL: metav1.Duration{Duration: ttl}, HolderIdentity: "static"},
		}
		Expect(k8s.Create(ctx, l)).To(Succeed())
		var token int64
		Eventually(func(g Gomega) {
			cur := get(l)
			g.Expect(held(cur)).To(BeTrue(), "lock %s/grown held", ns)
			token = cur.Status.FencingToken
		}, time.Minute, 100*time.Millisecond).Should(Succeed(), "lock %s/grown to be held on the three members", ns)

		By("growing the set to five members")
		Eventually(func() error {
			cur := fetchSet()
			cur.Spec.Managed.Replicas = 5
			return k8s.Update(ctx, cur)
		}).Should(Succeed(), "master set %s/grow to take 5 replicas", ns)

		By("sampling the lock until the change has ended and five members serve: the same grant throughout")
		var sawChange bool
		deadline := time.Now().Add(3 * time.Minute)
		for {
			Expect(time.Now().Before(deadline)).To(BeTrue(), "set %s/grow did not end its change with five serving: %+v", ns, fetchSet().Status.Conditions)
			cur := get(l)
			Expect(held(cur)).To(BeTrue(), "lock %s/grown not held: %+v", ns, cur.Status.Conditions)
			Expect(cur.Status.FencingToken).To(Equal(token), "lock %s/grown granted again: its first grant lapsed", ns)
			set := fetchSet()
			sawChange = sawChange || set.Status.MembershipChange != nil
			c := meta.FindStatusCondition(set.Status.Conditions, v1alpha1.ConditionMembershipChanging)
			if sawChange && set.Status.MembershipChange == nil && len(set.Status.Addresses) == 5 && set.Status.Serving == 5 &&
				c != nil && c.Reason == v1alpha1.ReasonMembershipStable {
				Expect(slices.Compact(slices.Sorted(slices.Values(set.Status.Addresses)))).To(HaveLen(5), "set %s/grow's status.addresses", ns)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}

		By("renewing on the five: every member, the new ones included, holds the lock's key")
		s := &corev1.Secret{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: managed.NamesOf(grow).Secret}, s)).To(Succeed())
		holding := func() (n int) {
			for i := range 5 {
				c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", growBasePort+i), Username: managed.ManagedUser,
					Password: string(s.Data[managed.PasswordKey]), DisableIdentity: true, MaxRetries: -1})
				if v, err := c.Get(ctx, "e2e/grow").Result(); err == nil && v != "" {
					n++
				}
				_ = c.Close()
			}
			return n
		}
		Eventually(holding, 2*ttl, 100*time.Millisecond).Should(Equal(5), "members of set %s/grow holding the lock's key", ns)
		Expect(get(l).Status.FencingToken).To(Equal(token))
	})
})
