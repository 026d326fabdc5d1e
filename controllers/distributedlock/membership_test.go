package distributedlock_test

import (
	"fmt"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// Issue 18, case 2: editing spec.external.addresses under held locks goes
// through a membership change with joint quorums.
var _ = Describe("Editing a set's list of masters under held locks", Ordered, func() {
	const maxTTL, ttl = 3 * time.Second, 2 * time.Second
	BeforeAll(func() {
		mgr := env.StartManager()
		DeferCleanup(mgr.Stop)
	})

	fetchSet := func(ms *testenv.MasterSet) *v1alpha1.RedisMasterSet {
		cur := &v1alpha1.RedisMasterSet{}
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ms.NS, Name: ms.Name}, cur)).To(Succeed())
		return cur
	}
	edit := func(ms *testenv.MasterSet, addrs []string) {
		Eventually(func() error {
			cur := fetchSet(ms)
			cur.Spec.External.Addresses = addrs
			return k8s.Update(suiteCtx, cur)
		}).Should(Succeed(), "editing set %s/%s's addresses", ms.NS, ms.Name)
	}
	// changed reports whether the set's change to addrs has ended.
	changed := func(ms *testenv.MasterSet, addrs []string) bool {
		cur := fetchSet(ms)
		c := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionMembershipChanging)
		return cur.Status.MembershipChange == nil && slices.Equal(cur.Status.Addresses, addrs) &&
			c != nil && c.Reason == v1alpha1.ReasonMembershipStable
	}

	It("replaces one dead server of five with locks held: the same grants throughout, then held on the new list alone", func() {
		ns := env.NewNamespace()
		set := env.NewServingMasters(ns, "five", 5, maxTTL)
		spare := testenv.StartServers(1, redistest.Options{})[0]
		previous := redistest.Addrs(set.Servers)
		current := append(slices.Clone(previous[:4]), spare.Addr())

		By("holding three locks")
		locks := map[string]int64{} // name → token
		for _, name := range []string{"a", "b", "c"} {
			l := newLock(set, name, "replace-"+name, "static", ttl)
			Expect(k8s.Create(suiteCtx, l)).To(Succeed())
			locks[name] = eventuallyHeldBy(l, "static").Status.FencingToken
		}
		same := func(g Gomega) {
			for name, token := range locks {
				l := &v1alpha1.DistributedLock{}
				g.Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, l)).To(Succeed())
				g.Expect(l.Status.FencingToken).To(Equal(token), "lock %s/%s's token: a new grant, so the first one lapsed", ns, name)
				g.Expect(heldReason(l)).To(BeEmpty(), "lock %s/%s not held", ns, name)
			}
		}

		By("killing the fifth server and naming a fresh one in its place")
		Expect(set.Servers[4].Kill()).To(Succeed())
		edit(set, current)
		Eventually(func(g Gomega) {
			cur := fetchSet(set)
			g.Expect(cur.Status.MembershipChange).NotTo(BeNil(), "set %s/five's status.membershipChange", ns)
			g.Expect(cur.Status.MembershipChange.Previous).To(Equal(previous), "set %s/five's previous addresses", ns)
			g.Expect(cur.Status.Addresses).To(Equal(current), "set %s/five's addresses", ns)
			c := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionMembershipChanging)
			g.Expect(c).NotTo(BeNil(), "set %s/five's %s condition", ns, v1alpha1.ConditionMembershipChanging)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonJointQuorums))
		}).Should(Succeed(), "set %s/five to show its membership change to the fresh server, with joint quorums", ns)

		By("keeping every grant through the change, until the set says it ended")
		for !changed(set, current) {
			same(Default)
			time.Sleep(100 * time.Millisecond)
		}
		same(Default)

		By("killing two of the servers both lists share: a quorum of the new list still holds every lock")
		killed := time.Now()
		for _, s := range set.Servers[:2] {
			Expect(s.Kill()).To(Succeed())
		}
		for name := range locks {
			l := &v1alpha1.DistributedLock{}
			Eventually(func(g Gomega) {
				g.Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, l)).To(Succeed())
				g.Expect(l.Status.ValidUntil).NotTo(BeNil(), "lock %s/%s's validity", ns, name)
				g.Expect(l.Status.ValidUntil.Time).To(BeTemporally(">", killed.Add(ttl)), "lock %s/%s renewed after the kills", ns, name)
			}, 4*ttl, 50*time.Millisecond).Should(Succeed(), "lock %s/%s to be renewed by a quorum of the new list after two shared servers are killed", ns, name)
		}
		same(Default)
	})

	It("swaps every server under a held lock without a second valid holder of its key", func() {
		ns := env.NewNamespace()
		// Started first, the other servers have been up for longer than
		// the window once the set serves: like long-running servers, they
		// are not quarantined for their youth.
		fresh := testenv.StartServers(3, redistest.Options{})
		set := env.NewServingMasters(ns, "swap", 3, maxTTL)

		By("holding the key, and a second lock waiting on it")
		first := newLock(set, "first", "swap", "first", ttl)
		Expect(k8s.Create(suiteCtx, first)).To(Succeed())
		eventuallyHeldBy(first, "first")
		second := newLock(set, "second", "swap", "second", ttl)
		Expect(k8s.Create(suiteCtx, second)).To(Succeed())
		Eventually(func() string { return heldReason(fetch(second)) }).Should(Equal(v1alpha1.ReasonHeldElsewhere), "lock %s/second to wait", ns)

		// The first grant is valid while a majority of the previous servers
		// holds its value (Redis returns no expired key).
		var olds []*redis.Client
		for _, s := range set.Servers {
			olds = append(olds, s.Client())
			DeferCleanup(olds[len(olds)-1].Close)
		}
		firstValue, err := olds[0].Get(suiteCtx, "swap").Result()
		Expect(err).NotTo(HaveOccurred())
		firstValid := func() int {
			n := 0
			for _, c := range olds {
				if v, err := c.Get(suiteCtx, "swap").Result(); err == nil && v == firstValue {
					n++
				}
			}
			return n
		}

		By("naming three other servers, and sampling both locks until one holds the key on them")
		current := redistest.Addrs(fresh)
		edit(set, current)
		deadline := time.Now().Add(time.Minute)
		for {
			Expect(time.Now().Before(deadline)).To(BeTrue(), "neither lock held after the change")
			var held []string
			for _, l := range []*v1alpha1.DistributedLock{first, second} {
				if cur := fetch(l); heldBy(cur, l.Name) {
					held = append(held, fmt.Sprintf("%s (token %d)", l.Name, cur.Status.FencingToken))
				}
			}
			if slices.ContainsFunc(held, func(h string) bool { return strings.HasPrefix(h, "second") }) {
				n := firstValid()
				Expect(n).To(BeNumerically("<", 2), "lock %s/second shown held (%v) while %d of the 3 previous servers still hold lock %s/first's grant", ns, held, n, ns)
			}
			if len(held) == 1 && changed(set, current) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
})
