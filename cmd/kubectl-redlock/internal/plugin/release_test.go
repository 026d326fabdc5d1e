package plugin_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

var _ = Describe("kubectl redlock release", func() {
	var ns string
	BeforeEach(func() { ns = namespace("") })

	leased := func(name, identity string) *v1alpha1.DistributedLock {
		lock := staticLock(ns, name, identity)
		Eventually(func() error {
			cur := read(lock)
			cur.Spec.HolderLease = &metav1.Duration{Duration: time.Minute}
			return k8s.Update(ctx, cur)
		}).Should(Succeed(), "lock %s/%s to take a holderLease", ns, name)
		return lock
	}

	It("writes the holder's word for the grant status shows, then withdraws its request", func() {
		lock := leased("freeze", "ci-run-1")
		Expect(k8s.Create(ctx, &v1alpha1.LockHeartbeat{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "freeze"}})).To(Succeed())

		By("refusing to release for another name than the spec's")
		r := kubectlRedlock("release", "freeze", "-n", ns, "--holder", "someone-else")
		Expect(r.err).To(MatchError(ContainSubstring(`requested for "ci-run-1", not "someone-else"`)))
		Expect(read(lock).Spec.HolderIdentity).To(Equal("ci-run-1"), "the request stays")

		By("releasing as the holder")
		r = kubectlRedlock("release", "freeze", "-n", ns, "--holder", "ci-run-1")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(ContainSubstring("ci-run-1 on lock " + ns + "/freeze: released grant 100 and withdrew its request."))
		hb := &v1alpha1.LockHeartbeat{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "freeze"}, hb)).To(Succeed())
		Expect(hb.Spec.ReleasedGrant).To(Equal("grant-ci-run-1"), "the word names the grant status shows")
		Expect(read(lock).Spec.HolderIdentity).To(BeEmpty(), "the request is withdrawn")
	})

	It("fails on a leased lock without a LockHeartbeat and leaves the request, and only withdraws a request not granted yet", func() {
		lock := leased("no-heartbeat", "ci-run-2")
		Expect(kubectlRedlock("release", "no-heartbeat", "-n", ns).err).To(MatchError(ContainSubstring(`"holder" not set`)), "--holder is required")
		Expect(kubectlRedlock("release", "no-heartbeat", "-n", ns, "--holder", "ci-run-2").err).To(MatchError(ContainSubstring("write the release of " + ns + "/no-heartbeat")))
		Expect(read(lock).Spec.HolderIdentity).To(Equal("ci-run-2"), "the request stays")

		waiting := newLock(ns, "waiting", func(s *v1alpha1.DistributedLockSpec) { s.HolderIdentity = "ci-run-3" })
		r := kubectlRedlock("release", "waiting", "-n", ns, "--holder", "ci-run-3")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(ContainSubstring("ci-run-3 on lock " + ns + "/waiting: withdrew its request."))
		Expect(read(waiting).Spec.HolderIdentity).To(BeEmpty())

		Expect(kubectlRedlock("release", "waiting", "-n", ns, "--holder", "ci-run-3").err).To(MatchError(ContainSubstring("has no static holder")))

		By("only withdrawing the request of a lock without a lease, which is its release")
		unleased := staticLock(ns, "unleased", "report-cron")
		Expect(k8s.Create(ctx, &v1alpha1.LockHeartbeat{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unleased"}})).To(Succeed())
		r = kubectlRedlock("release", "unleased", "-n", ns, "--holder", "report-cron")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(ContainSubstring("report-cron on lock " + ns + "/unleased: withdrew its request."))
		hb := &v1alpha1.LockHeartbeat{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "unleased"}, hb)).To(Succeed())
		Expect(hb.Spec.ReleasedGrant).To(BeEmpty(), "no word on a lock without a lease")
		Expect(read(unleased).Spec.HolderIdentity).To(BeEmpty())
	})
})

var _ = Describe("kubectl's --as on the plugin's commands", func() {
	It("impersonates the user it names, on the read commands and on release alike", func() {
		ns := namespace("")
		lock := staticLock(ns, "freeze", "ci-run-1")

		By("refusing mallory, who may not read locks, on status")
		r := kubectlRedlock("status", "-n", ns, "--as", "mallory")
		Expect(r.err).To(MatchError(ContainSubstring(`User "mallory" cannot list resource "distributedlocks"`)))

		By("refusing mallory on release, and leaving the request")
		r = kubectlRedlock("release", "freeze", "-n", ns, "--holder", "ci-run-1", "--as", "mallory")
		Expect(r.err).To(MatchError(ContainSubstring(`User "mallory" cannot get resource "distributedlocks"`)))
		Expect(read(lock).Spec.HolderIdentity).To(Equal("ci-run-1"), "the request stays")

		By("letting mallory read locks once a Role allows it")
		env.Allow(ns, "mallory", "lock-reader", rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"distributedlocks", "distributedsemaphores"}, Verbs: []string{"get", "list"}})
		Eventually(func(g Gomega) {
			r := kubectlRedlock("status", "-n", ns, "--as", "mallory", "-o", "name")
			g.Expect(r.err).NotTo(HaveOccurred())
			g.Expect(r.out).To(Equal("distributedlock.coordination.redlock.dev/freeze\n"))
		}).Should(Succeed(), "status as mallory to list lock %s/freeze once the Role is bound", ns)
	})
})
