//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/benchenv"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/managed"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

// Issue 42, masters across clusters: the local cluster runs two members of a
// set of five with delayed restart; a second control plane on this machine
// (an envtest API server with its own manager process) runs the other three
// as host redis-server processes (the test plays its kubelet) and names all
// five as external, as the local set names its three. Jobs in the local
// cluster and holders in the second take turns on one key.
var _ = Describe("masters across two clusters", Ordered, func() {
	const (
		acrossPort = 17500 // the local cluster's two host-network members
		key        = "e2e/across-clusters"
		password   = "e2e-across-clusters" //nolint:gosec // a test master's password
	)
	var (
		second *benchenv.Env
		across *v1alpha1.RedisMasterSet
		// l2 is the second cluster's lock on key.
		l2 *v1alpha1.DistributedLock
	)
	local := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", acrossPort+i) }
	authSecret := func() *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "across-auth", Labels: map[string]string{v1alpha1.RedisCredentialsLabel: "true"}},
			StringData: map[string]string{"password": password, "username": managed.ManagedUser},
		}
	}
	// setIn reads the set of a cluster's client.
	setIn := func(c client.Client, namespace, name string) *v1alpha1.RedisMasterSet {
		cur := &v1alpha1.RedisMasterSet{}
		Expect(c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cur)).To(Succeed())
		return cur
	}
	readL2 := func() *v1alpha1.DistributedLock {
		cur := &v1alpha1.DistributedLock{}
		Expect(second.Client.Get(ctx, client.ObjectKeyFromObject(l2), cur)).To(Succeed())
		return cur
	}
	// holdFromSecond asks for key as holder in the second cluster and
	// returns its grant's run once held, the start being its acquiredAt.
	// ask sets the second cluster's lock's holderIdentity (a merge patch:
	// the operator writes the object too).
	ask := func(holder string) {
		cur := readL2()
		patch := client.MergeFrom(cur.DeepCopy())
		cur.Spec.HolderIdentity = holder
		Expect(second.Client.Patch(ctx, cur, patch)).To(Succeed())
	}
	holdFromSecond := func(holder string) lockRun {
		ask(holder)
		var run lockRun
		Eventually(func(g Gomega) {
			cur := readL2()
			g.Expect(held(cur)).To(BeTrue(), "held")
			g.Expect(cur.Status.Holder.Identity).To(Equal(holder), "holder")
			// The kubelet reports the Jobs' container times in whole
			// seconds: the second cluster's are taken alike.
			run = lockRun{name: "second cluster's " + holder, start: cur.Status.AcquiredAt.Time.Truncate(time.Second), token: cur.Status.FencingToken}
		}, 3*time.Minute, 100*time.Millisecond).Should(Succeed(), "lock %s/%s in the second cluster to be held by %s", l2.Namespace, l2.Name, holder)
		return run
	}
	// releaseFromSecond has the second cluster's holder stop: its run ends
	// when it says so, before the operator releases the key.
	releaseFromSecond := func(run *lockRun) {
		run.finish = time.Now().Truncate(time.Second) // as the kubelet's times
		ask("")
	}

	BeforeAll(func() {
		By("starting the second cluster's three members: host redis-server processes with the managed members' ACL and the shared password")
		acl := strings.Split(strings.TrimSpace(managed.ACL(password, true)), "\n")
		var hosts []*redistest.Server
		for i := range 3 {
			s, err := redistest.Start(filepath.Join(GinkgoT().TempDir(), fmt.Sprint(i)), redistest.Options{ACL: acl, Username: managed.ManagedUser, Password: password})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(s.Close)
			hosts = append(hosts, s)
		}

		By("the local cluster: the password Secret, and a set running two members that names the second cluster's three")
		secret := authSecret()
		secret.Namespace = ns
		Expect(k8s.Create(ctx, secret)).To(Succeed())
		removeAfterSpec(secret)
		across = &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "across"},
			Spec: v1alpha1.RedisMasterSetSpec{
				MaxLockTTL:    metav1.Duration{Duration: ttl},
				AuthSecretRef: &v1alpha1.SecretKeyRef{Name: "across-auth"},
				Managed:       &v1alpha1.ManagedMasters{Replicas: 2, Image: "redis:7-local", Port: acrossPort, HostNetwork: true},
				External:      &v1alpha1.ExternalMasters{Addresses: redistest.Addrs(hosts)},
			},
		}
		Expect(k8s.Create(ctx, across)).To(Succeed())
		removeAfterSpec(across)

		By("the second control plane: an envtest API server and a manager process of this tree, its set naming all five as external")
		bin := filepath.Join(GinkgoT().TempDir(), "manager")
		run("go", "build", "-o", bin, "./cmd/manager")
		all := append([]string{local(0), local(1)}, redistest.Addrs(hosts)...)
		var err error
		second, err = benchenv.Start(ctx, benchenv.Options{
			Root: root, Namespace: "across", MaxLockTTL: ttl, Servers: hosts,
			ManagerBinary: bin, ManagerProcesses: 1, ManagerArgs: []string{"--probe-interval=500ms"},
			Objects: []client.Object{authSecret()},
			MasterSet: &v1alpha1.RedisMasterSetSpec{
				MaxLockTTL:    metav1.Duration{Duration: ttl},
				AuthSecretRef: &v1alpha1.SecretKeyRef{Name: "across-auth", UsernameKey: "username"},
				External:      &v1alpha1.ExternalMasters{Addresses: all},
			},
		})
		Expect(err).NotTo(HaveOccurred(), "the second control plane")
		DeferCleanup(second.Close)

		Eventually(func(g Gomega) {
			cur := setIn(k8s, ns, "across")
			g.Expect(cur.Status.Serving).To(BeEquivalentTo(5), "serving")
			g.Expect(meta.IsStatusConditionTrue(cur.Status.Conditions, v1alpha1.ConditionAvailable)).To(BeTrue(), "Available")
		}, 3*time.Minute, time.Second).Should(Succeed(), "master set %s/across in the local cluster to count five of five serving", ns)
		Eventually(func(g Gomega) {
			g.Expect(setIn(second.Client, "across", benchenv.MasterSet).Status.Serving).To(BeEquivalentTo(5), "serving")
		}, time.Minute, time.Second).Should(Succeed(), "the second cluster's set to count five of five serving")

		l2 = &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: "across", Name: "turns"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: benchenv.MasterSet, Key: key, TTL: metav1.Duration{Duration: ttl}},
		}
		Expect(second.Client.Create(ctx, l2)).To(Succeed())
	})

	It("has Jobs in the local cluster and holders in the second take turns on one key, one after another with rising tokens", func() {
		By("holding the key from the second cluster")
		first := holdFromSecond("second-1")

		By("two Jobs in the local cluster asking for it: gated while the second cluster holds it")
		lock := podLock("across-jobs", key)
		lock.Spec.MasterSet = "across"
		Expect(k8s.Create(ctx, lock)).To(Succeed())
		removeAfterSpec(lock)
		for _, name := range []string{"across-1", "across-2"} {
			job := lockJob(name, lock.Name, "sleep 2")
			Expect(k8s.Create(ctx, job)).To(Succeed())
			removeAfterSpec(job)
		}
		Eventually(func(g Gomega) {
			held := meta.FindStatusCondition(get(lock).Status.Conditions, v1alpha1.ConditionHeld)
			g.Expect(held).NotTo(BeNil(), "Held condition")
			g.Expect(held.Reason).To(Equal(v1alpha1.ReasonHeldElsewhere), "Held reason")
		}, time.Minute, 100*time.Millisecond).Should(Succeed(), "lock %s/%s to wait for the second cluster's holder", ns, lock.Name)

		By("the second cluster's holder stopping: the Jobs run, then the second cluster's next holder, which asked meanwhile")
		releaseFromSecond(&first)
		Eventually(func(g Gomega) {
			h := get(lock)
			g.Expect(held(h)).To(BeTrue(), "held")
		}, time.Minute, 100*time.Millisecond).Should(Succeed(), "lock %s/%s to pass to a local Job's pod", ns, lock.Name)
		next := holdFromSecond("second-2")
		releaseFromSecond(&next)
		waitJobsSucceeded("across-1", "across-2")

		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LockLabel: lock.Name})).To(Succeed())
		Expect(pods.Items).To(HaveLen(2), "the Jobs' pods")
		runs := []lockRun{first, next}
		for i := range pods.Items {
			runs = append(runs, runOf(&pods.Items[i]))
		}
		for _, r := range runs {
			GinkgoWriter.Printf("%s: %s → %s, token %d\n", r.name, r.start.Format(time.StampMilli), r.finish.Format(time.StampMilli), r.token)
		}
		expectOneAfterAnother(runs)
	})

	It("keeps a crashed local member out for its restart delay, and the second cluster quarantines it by its run_id", func() {
		pod := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "across-0"}, pod)).To(Succeed())
		crashed, err := demo.KillContainer(ctx, state, pod)
		Expect(err).NotTo(HaveOccurred())
		down, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		Expect(demo.AwaitDown(down, local(0), 10*time.Millisecond)).To(Succeed(), "member 0 of master set %s/across to stop answering once killed", ns)
		Eventually(func() bool { return serves(acrossPort) }, restartDelay+time.Minute, 20*time.Millisecond).Should(BeTrue(),
			"member 0 of master set %s/across to serve again", ns)
		gap := time.Since(crashed)
		GinkgoWriter.Printf("crash → first accepted connection: %v (restart delay %v)\n", gap, restartDelay)
		Expect(gap).To(BeNumerically(">=", restartDelay), "the crashed member served before its restart delay passed")

		// The member's quarantine lasts its window (5s here): polled at
		// 100ms, it cannot be missed.
		quarantined := false
		Eventually(func(g Gomega) {
			m := setIn(second.Client, "across", benchenv.MasterSet).Status.Member(local(0))
			g.Expect(m).NotTo(BeNil(), "member %s in status", local(0))
			if m.State == v1alpha1.MemberQuarantined && m.Restarts >= 1 {
				quarantined = true
			}
			g.Expect(quarantined).To(BeTrue(), "quarantined once back, by its new run_id")
			g.Expect(m.State).To(Equal(v1alpha1.MemberServing), "state once its window passed")
		}, time.Minute, 100*time.Millisecond).Should(Succeed(), "the second cluster to quarantine the restarted member %s, then count it again", local(0))
	})
})
