package plugin_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/cmd/kubectl-redlock/internal/plugin"
)

var _ = Describe("kubectl redlock renew", func() {
	var ns string
	BeforeEach(func() { ns = namespace("") })

	heartbeat := func(name string) *v1alpha1.LockHeartbeat {
		hb := &v1alpha1.LockHeartbeat{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, hb)).To(Succeed())
		return hb
	}

	It("writes the grant ID status shows and the time into the lock's LockHeartbeat, for the static holder the spec names only", func() {
		lock := staticLock(ns, "freeze", "ci-run-1")
		Eventually(func() error {
			cur := read(lock)
			cur.Spec.HolderLease = &metav1.Duration{Duration: time.Minute}
			return k8s.Update(ctx, cur)
		}).Should(Succeed(), "lock %s/freeze to take a holderLease", ns)
		Expect(k8s.Create(ctx, &v1alpha1.LockHeartbeat{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "freeze"}})).To(Succeed())

		By("refusing to renew for another name than the spec's")
		r := kubectlRedlock("renew", "freeze", "-n", ns, "--holder", "someone-else")
		Expect(r.err).To(MatchError(ContainSubstring(`requested for "ci-run-1", not "someone-else"`)))
		Expect(heartbeat("freeze").Spec.RenewTime).To(BeNil(), "nothing renewed")

		By("renewing the grant status shows")
		before := time.Now().Add(-time.Second)
		r = kubectlRedlock("renew", "freeze", "-n", ns, "--holder", "ci-run-1")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(ContainSubstring("renewed ci-run-1's lease on lock " + ns + "/freeze (fencing token 100)"))
		hb := heartbeat("freeze")
		Expect(hb.Spec.HolderIdentity).To(Equal("grant-ci-run-1"), "the grant ID status shows")
		Expect(hb.Spec.RenewTime).NotTo(BeNil())
		Expect(hb.Spec.RenewTime.Time).To(BeTemporally(">", before))

		By("failing once the request ended, naming what to do")
		writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) {
			st.Holder, st.ValidUntil = nil, nil
			st.EndedRequest = &v1alpha1.EndedRequest{Identity: "ci-run-1", Reason: v1alpha1.ReasonLeaseExpired}
		})
		r = kubectlRedlock("renew", "freeze", "-n", ns)
		Expect(r.err).To(MatchError(plugin.ErrRequestEnded))
		Expect(r.err).To(MatchError(ContainSubstring("set another spec.holderIdentity to ask again")))
	})

	It("with --every, reports a failed renewal and tries again, and exits only once renewing cannot go on", func() {
		lock := staticLock(ns, "every", "ci-run-2")
		Eventually(func() error {
			cur := read(lock)
			cur.Spec.HolderLease = &metav1.Duration{Duration: 3 * time.Second}
			return k8s.Update(ctx, cur)
		}).Should(Succeed(), "lock %s/every to take a holderLease", ns)

		By("trying again while the lock has no LockHeartbeat to renew")
		stderr, done := session{}.start("renew", "every", "-n", ns, "--every", "200ms")
		Eventually(stderr.String).Should(ContainSubstring("renewing failed, trying again in 200ms"), "kubectl redlock renew on lock %s/every to report the missing LockHeartbeat", ns)
		Expect(done).NotTo(Receive(), "the renewer still runs")

		By("renewing once the LockHeartbeat exists")
		Expect(k8s.Create(ctx, &v1alpha1.LockHeartbeat{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "every"}})).To(Succeed())
		Eventually(func(g Gomega) {
			hb := &v1alpha1.LockHeartbeat{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "every"}, hb)).To(Succeed())
			g.Expect(hb.Spec.HolderIdentity).To(Equal("grant-ci-run-2"))
			g.Expect(hb.Spec.RenewTime).NotTo(BeNil())
		}).Should(Succeed(), "LockHeartbeat %s/every to be renewed for grant-ci-run-2", ns)
		Expect(done).NotTo(Receive(), "the renewer still runs")

		By("exiting once the request ended")
		writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) {
			st.Holder, st.ValidUntil = nil, nil
			st.EndedRequest = &v1alpha1.EndedRequest{Identity: "ci-run-2", Reason: v1alpha1.ReasonLeaseExpired}
		})
		var r result
		Eventually(done).WithTimeout(10*time.Second).Should(Receive(&r), "kubectl redlock renew --every on lock %s/every to exit", ns)
		Expect(r.err).To(MatchError(plugin.ErrRequestEnded))
		Expect(r.out).To(ContainSubstring("renewed ci-run-2's lease on lock " + ns + "/every"))
	})

	It("fails on a lock without a static holder or without a lease, and when the holder does not hold it yet", func() {
		newLock(ns, "pods-only", nil)
		Expect(kubectlRedlock("renew", "pods-only", "-n", ns).err).To(MatchError(ContainSubstring("has no static holder")))
		staticLock(ns, "no-lease", "ci")
		Expect(kubectlRedlock("renew", "no-lease", "-n", ns).err).To(MatchError(ContainSubstring("sets no spec.holderLease")))
		newLock(ns, "waiting", func(s *v1alpha1.DistributedLockSpec) {
			s.HolderIdentity, s.HolderLease = "ci", &metav1.Duration{Duration: time.Minute}
		})
		Expect(kubectlRedlock("renew", "waiting", "-n", ns).err).To(MatchError(ContainSubstring(`"ci" does not hold lock`)))
	})
})
