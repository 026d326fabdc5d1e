package redismasterset_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/redismasterset"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/internal/managed"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Issue 42, masters across clusters: three clusters (API servers, each with
// its own manager) run two, two and one members of one set of five, each
// naming its own as managed (host network, the test playing the kubelets)
// and the others' as external, with one password Secret in all three.
var _ = Describe("Masters across three clusters (2, 2 and 1)", Ordered, func() {
	const ttl = 4 * time.Second // maxLockTTL, and the locks' ttl
	type cluster struct {
		name     string
		env      *testenv.Env
		mgr      *testenv.Manager
		ns       string
		replicas int
		servers  []*redistest.Server
	}
	var east, west, north *cluster
	var all []*cluster
	const password = "the-same-in-every-cluster"

	get := func(c *cluster) *v1alpha1.RedisMasterSet {
		set := &v1alpha1.RedisMasterSet{}
		Expect(c.env.Client.Get(c.env.Ctx, client.ObjectKey{Namespace: c.ns, Name: "locks"}, set)).To(Succeed())
		return set
	}
	lockIn := func(c *cluster, name, key, holder string) *v1alpha1.DistributedLock {
		l := &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: name},
			Spec: v1alpha1.DistributedLockSpec{
				MasterSet: "locks", Key: key, TTL: metav1.Duration{Duration: ttl}, HolderIdentity: holder,
			},
		}
		Expect(c.env.Client.Create(c.env.Ctx, l)).To(Succeed())
		return l
	}
	read := func(c *cluster, l *v1alpha1.DistributedLock) *v1alpha1.DistributedLock {
		cur := &v1alpha1.DistributedLock{}
		Expect(c.env.Client.Get(c.env.Ctx, client.ObjectKeyFromObject(l), cur)).To(Succeed())
		return cur
	}
	heldBy := func(c *cluster, l *v1alpha1.DistributedLock, holder string, timeout time.Duration) *v1alpha1.DistributedLock {
		var cur *v1alpha1.DistributedLock
		Eventually(func(g Gomega) {
			cur = read(c, l)
			held := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionHeld)
			g.Expect(held).NotTo(BeNil(), "no Held condition")
			g.Expect(held.Status).To(Equal(metav1.ConditionTrue), "Held: %+v", held)
			g.Expect(cur.Status.Holder).NotTo(BeNil())
			g.Expect(cur.Status.Holder.Identity).To(Equal(holder))
			g.Expect(cur.Status.ValidUntil).NotTo(BeNil())
		}, timeout).Should(Succeed(), "lock %s/%s in cluster %s to be held by %s", l.Namespace, l.Name, c.name, holder)
		return cur
	}
	serving := func(c *cluster, n int) {
		Eventually(func(g Gomega) {
			set := get(c)
			g.Expect(set.Status.Total).To(BeEquivalentTo(5), "total")
			g.Expect(set.Status.Quorum).To(BeEquivalentTo(3), "quorum")
			g.Expect(set.Status.Serving).To(BeEquivalentTo(n), "serving (fresh or restarted masters sit out their quarantine first)")
			g.Expect(meta.IsStatusConditionTrue(set.Status.Conditions, v1alpha1.ConditionAvailable)).To(BeTrue(), "Available")
		}, 30*time.Second).Should(Succeed(), "master set %s/locks in cluster %s to count %d of 5 masters serving", c.ns, c.name, n)
	}

	BeforeAll(func() {
		east = &cluster{name: "east", env: env, replicas: 2}
		west = &cluster{name: "west", env: testenv.Start(), replicas: 2}
		DeferCleanup(west.env.Stop)
		north = &cluster{name: "north", env: testenv.Start(), replicas: 1}
		DeferCleanup(north.env.Stop)
		all = []*cluster{east, west, north}

		By("starting each cluster's members where its host-network set has them listen: 127.0.0.1:port+i")
		acl := strings.Split(strings.TrimSpace(managed.ACL(password, true)), "\n")
		opts := redistest.Options{ACL: acl, Username: managed.ManagedUser, Password: password}
		for _, c := range all {
			// A port found free can be taken before the bind: try again.
			Eventually(func(g Gomega) {
				for _, s := range c.servers {
					_ = s.Close()
				}
				c.servers = nil
				port, err := redistest.FreePorts(c.replicas)
				g.Expect(err).NotTo(HaveOccurred())
				for i := range c.replicas {
					s, err := redistest.StartAt(filepath.Join(GinkgoT().TempDir(), fmt.Sprint(i)), port+i, opts)
					g.Expect(err).NotTo(HaveOccurred())
					c.servers = append(c.servers, s)
				}
			}, time.Minute).Should(Succeed(), "cluster %s's %d members to listen on consecutive ports", c.name, c.replicas)
			for _, s := range c.servers {
				DeferCleanup(s.Close)
			}
		}

		By("creating in each cluster the same password Secret, and the set: its members managed, the others' external")
		for _, c := range all {
			c.ns = c.env.NewNamespace()
			Expect(c.env.Client.Create(c.env.Ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "locks-auth", Labels: map[string]string{v1alpha1.RedisCredentialsLabel: "true"}},
				StringData: map[string]string{"password": password},
			})).To(Succeed())
			var external []string
			for _, o := range all {
				if o != c {
					external = append(external, redistest.Addrs(o.servers)...)
				}
			}
			set := &v1alpha1.RedisMasterSet{
				ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "locks"},
				Spec: v1alpha1.RedisMasterSetSpec{
					MaxLockTTL:    metav1.Duration{Duration: ttl},
					NodeTimeout:   &metav1.Duration{Duration: testenv.MasterNodeTimeout},
					AuthSecretRef: &v1alpha1.SecretKeyRef{Name: "locks-auth"},
					Managed: &v1alpha1.ManagedMasters{
						Replicas: int32(c.replicas), HostNetwork: true, Port: int32(c.servers[0].Port()),
						ExposedAddresses: redistest.Addrs(c.servers),
					},
					External: &v1alpha1.ExternalMasters{Addresses: external},
				},
			}
			if c == east {
				// Every write fsynced, and a short restart delay: alone, its
				// restarted members would vote at once. With members it
				// does not run, it quarantines them as any set does.
				set.Spec.Managed.Persistence, set.Spec.Managed.RestartDelay = v1alpha1.PersistenceAOFAlways, &metav1.Duration{Duration: time.Second}
			}
			Expect(c.env.Client.Create(c.env.Ctx, set)).To(Succeed())
			DeferCleanup(func() { Expect(client.IgnoreNotFound(c.env.Client.Delete(c.env.Ctx, set))).To(Succeed()) })
			c.mgr = c.env.StartManager()
			DeferCleanup(func() {
				if c.mgr != nil {
					c.mgr.Stop()
				}
			})
		}
	})

	It("counts five masters and a quorum of three in every cluster, each cluster's own first", func() {
		for _, c := range all {
			serving(c, 5)
			set := get(c)
			Expect(set.Status.Addresses[:c.replicas]).To(Equal(redistest.Addrs(c.servers)), "cluster %s lists its own members first", c.name)
			Expect(set.Status.MembershipChange).To(BeNil(), "cluster %s: a new set adopts its list at once", c.name)
			Expect(c.env.EventReasons(c.ns, "locks")).NotTo(ContainElement("MembershipChangeStarted"), "cluster %s: a new set starts no membership change", c.name)
		}
	})

	It("quarantines a member that restarted in one cluster in every cluster, by its run_id", func() {
		restarted := east.servers[0]
		By("restarting east's member 0 without its keys (as its pod would after a crash)")
		Expect(restarted.Restart(false)).To(Succeed())
		// One poll watches all three: the quarantine lasts about 5s, and a
		// cluster looked at after another could miss it.
		quarantined := map[string]bool{}
		Eventually(func(g Gomega) {
			for _, c := range all {
				if m := get(c).Status.Member(restarted.Addr()); m != nil && m.State == v1alpha1.MemberQuarantined && m.Restarts >= 1 {
					quarantined[c.name] = true
				}
			}
			g.Expect(quarantined).To(HaveLen(3), "clusters that quarantined it")
		}, 10*time.Second, 50*time.Millisecond).Should(Succeed(), "every cluster, east's own AOFAlways set included, to quarantine east's member %s", restarted.Addr())
		By("serving again in every cluster once its window passed")
		for _, c := range all {
			serving(c, 5)
		}
	})

	It("replaces a voting member only in its turn: another cluster replacing one holds the roll up", func() {
		By("east's two member pods Ready at an old revision, its members serving, the budget allowing one out (envtest runs no StatefulSet or disruption controller)")
		sts := &appsv1.StatefulSet{}
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: east.ns, Name: "locks"}, sts)).To(Succeed())
		set := get(east)
		for i := range east.replicas {
			pod := memberPod(set, fmt.Sprint(i))
			pod.Labels[appsv1.ControllerRevisionHashLabelKey] = "locks-old"
			pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID, Controller: new(true)}}
			Expect(k8s.Create(suiteCtx, pod)).To(Succeed())
			pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			Expect(k8s.Status().Update(suiteCtx, pod)).To(Succeed())
		}
		pdb := &policyv1.PodDisruptionBudget{}
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: east.ns, Name: "locks"}, pdb)).To(Succeed())
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 1, CurrentHealthy: 2, DesiredHealthy: 1, ExpectedPods: 2}
		Expect(k8s.Status().Update(suiteCtx, pdb)).To(Succeed())

		By("west replacing one of its members: it holds the set's roll turn on the masters")
		var addrs []string
		for _, c := range all {
			addrs = append(addrs, redistest.Addrs(c.servers)...)
		}
		rc, err := redlock.New(addrs, redlock.WithAuth(managed.ManagedUser, password), redlock.WithNodeTimeout(testenv.MasterNodeTimeout), redlock.WithTries(1))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(rc.Close)
		// Held far longer than the wait below, however slow this machine.
		turn, err := rc.Acquire(suiteCtx, redismasterset.RollKey, time.Minute)
		Expect(err).NotTo(HaveOccurred())

		By("east's StatefulSet moving to a new revision: east's roll waits for the turn")
		sts.Status = appsv1.StatefulSetStatus{ObservedGeneration: sts.Generation, Replicas: 2, CurrentRevision: "locks-old", UpdateRevision: "locks-new"}
		Expect(k8s.Status().Update(suiteCtx, sts)).To(Succeed())
		podsLeft := func() int {
			var pods corev1.PodList
			Expect(k8s.List(suiteCtx, &pods, client.InNamespace(east.ns), client.MatchingLabels(managed.Labels(set)))).To(Succeed())
			n := 0
			for _, p := range pods.Items {
				if p.DeletionTimestamp.IsZero() {
					n++
				}
			}
			return n
		}
		// Without the turn east evicts within a reconcile (a mutation that
		// skips it fails here); four of them run in this wait.
		Consistently(podsLeft, ttl/2, 100*time.Millisecond).Should(Equal(2), "east's member pods in %s to stay while west holds the roll turn", east.ns)

		By("west giving the turn back: east takes it and replaces its highest member")
		Expect(turn.Release(suiteCtx)).To(Succeed())
		Eventually(podsLeft, 10*time.Second, 100*time.Millisecond).Should(Equal(1), "east to evict one member pod in %s once the turn is free", east.ns)
		// The recorder writes events apart from the eviction.
		Eventually(func(g Gomega) {
			g.Expect(east.env.EventReasons(east.ns, "locks")).To(ContainElement(redismasterset.EventReplaced))
		}, 10*time.Second, 100*time.Millisecond).Should(Succeed(), "a %s event on set %s/locks", redismasterset.EventReplaced, east.ns)
		By("east keeping the turn while its replaced member is out, beyond the turn's own ttl (renewed)")
		Consistently(func() error {
			lk, err := rc.Acquire(suiteCtx, redismasterset.RollKey, ttl)
			if err == nil {
				_ = lk.Release(suiteCtx)
			}
			return err
		}, 2*ttl, ttl/4).Should(MatchError(redlock.ErrLockHeld), "another cluster to find the roll turn held while east's member is out")
	})

	It("keeps a quorum for east and north when west is lost, and grants west's key only after the validity west showed", func() {
		const key = "across/clusters"
		By("holding the key from west")
		holder := lockIn(west, "holder", key, "w")
		heldBy(west, holder, "w", 30*time.Second)

		By("waiting on it from east")
		waiter := lockIn(east, "waiter", key, "e")
		Eventually(func(g Gomega) {
			held := meta.FindStatusCondition(read(east, waiter).Status.Conditions, v1alpha1.ConditionHeld)
			g.Expect(held).NotTo(BeNil(), "no Held condition")
			g.Expect(held.Reason).To(Equal(v1alpha1.ReasonHeldElsewhere), "Held reason")
		}).Should(Succeed(), "lock %s/waiter in cluster east to wait for west's holder", east.ns)

		By("losing west: its manager stops and its two masters die, with the grant's keys on the others")
		west.mgr.Stop()
		west.mgr = nil
		last := read(west, holder)
		Expect(last.Status.ValidUntil).NotTo(BeNil(), "west's last status shows no validity")
		for _, s := range west.servers {
			Expect(s.Kill()).To(Succeed())
		}

		By("east and north counting three of five serving: a quorum")
		serving(east, 3)
		serving(north, 3)

		By("east's waiter granted once west's grant expired on the masters left, never before the validity west's status showed")
		granted := heldBy(east, waiter, "e", 4*ttl)
		Expect(granted.Status.AcquiredAt).NotTo(BeNil())
		Expect(granted.Status.AcquiredAt.Time).To(BeTemporally(">", last.Status.ValidUntil.Time),
			"east granted the key at %s, before the validity west showed (%s) had passed", granted.Status.AcquiredAt.Time, last.Status.ValidUntil.Time)
	})
})
