package redismasterset_test

import (
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

func fetchSet(ns, name string) *v1alpha1.RedisMasterSet {
	out := &v1alpha1.RedisMasterSet{}
	Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, out)).To(Succeed())
	return out
}

func memberStates(set *v1alpha1.RedisMasterSet) []string {
	out := make([]string, len(set.Status.Members))
	for i, m := range set.Status.Members {
		out[i] = m.State
	}
	return out
}

func availability(set *v1alpha1.RedisMasterSet) string {
	if c := meta.FindStatusCondition(set.Status.Conditions, v1alpha1.ConditionAvailable); c != nil {
		return string(c.Status) + "/" + c.Reason
	}
	return ""
}

var _ = Describe("RedisMasterSet", Ordered, func() {
	var (
		mgr     *testenv.Manager
		ns      string
		ms      *testenv.MasterSet
		started time.Time // before the masters started
	)
	// probedTTL is longer than the suite's: a master is fresh (quarantined
	// by its uptime) only until its window passed since it started, and the
	// first spec must see status before that.
	const probedTTL = 5 * time.Second
	BeforeAll(func() {
		mgr = startManager()
		ns = newNamespace()
		started = time.Now()
		ms = env.NewMasters(ns, "probed", 3, probedTTL)
	})
	AfterAll(func() { mgr.Stop() })

	It("reports fresh masters as quarantined, then serving and available", func() {
		// A master that just started may have lost keys: it sits out until
		// its window passed since it started (judged by its uptime).
		var set *v1alpha1.RedisMasterSet
		Eventually(func(g Gomega) {
			set = fetchSet(ns, ms.Name)
			g.Expect(set.Status.Members).To(HaveLen(3), "members in status")
			g.Expect(set.Status.QuarantineWindow).NotTo(BeNil(), "the quarantine window in status")
		}).Should(Succeed(), "master set %s/%s to show its members", ns, ms.Name)
		fresh := started.Add(set.Status.QuarantineWindow.Duration)
		seenFresh := time.Now().Before(fresh)
		if seenFresh {
			// Every probe before now found each master up for less than
			// the window, so each sits out at least until fresh.
			Expect(memberStates(set)).To(HaveEach(v1alpha1.MemberQuarantined), "every member of master set %s/%s to be quarantined at first", ns, ms.Name)
			for _, m := range set.Status.Members {
				Expect(m.QuarantinedUntil).NotTo(BeNil(), "member %s's end of quarantine", m.Address)
				Expect(m.QuarantinedUntil.Time).To(BeTemporally(">=", fresh.Add(-time.Second)), "member %s sits out its window from its start (status keeps whole seconds)", m.Address)
				Expect(m.RunID).NotTo(BeEmpty(), "member %s's run_id", m.Address)
			}
			Expect(availability(set)).To(Equal("False/" + v1alpha1.ReasonQuorumLost))
		} else {
			// The probes may all have found the masters up longer than the
			// window: serving is then right, and nothing fresh is left to see.
			AddReportEntry("fresh masters not seen", fmt.Sprintf("status was first read %v after the masters started, past their window %v", time.Since(started), set.Status.QuarantineWindow.Duration))
		}

		By("turning available once a quorum (2 of 3) serves")
		Eventually(func() string { return availability(fetchSet(ns, ms.Name)) }).
			Should(Equal("True/"+v1alpha1.ReasonQuorumServing), "master set %s/%s to be available once a quorum serves", ns, ms.Name)
		set = fetchSet(ns, ms.Name)
		Expect(set.Status.Serving).To(BeNumerically(">=", 2), "available means a quorum serves")
		Expect(set.Status.Total).To(Equal(int32(3)))
		Expect(set.Status.Quorum).To(Equal(int32(2)))

		By("serving with every member once each one's window has passed")
		// The members' windows end a few milliseconds apart: availability
		// may turn True with the third member still in its window.
		Eventually(func(g Gomega) {
			set := fetchSet(ns, ms.Name)
			g.Expect(set.Status.Serving).To(Equal(int32(3)), "serving members of master set %s", ms.Name)
			g.Expect(memberStates(set)).To(HaveEach(v1alpha1.MemberServing))
		}).Should(Succeed(), "every member of master set %s/%s to serve", ns, ms.Name)
		if seenFresh {
			Eventually(func() []string { return eventReasons(ns, ms.Name) }).Should(ContainElements("MemberQuarantined", "MemberRejoined"), "master set %s/%s to get events MemberQuarantined and MemberRejoined", ns, ms.Name)
		}
	})

	It("marks dead members Down and loses availability with the quorum", func() {
		for _, s := range ms.Servers[:2] {
			Expect(s.Kill()).To(Succeed())
		}
		Eventually(func() string { return availability(fetchSet(ns, ms.Name)) }).
			Should(Equal("False/"+v1alpha1.ReasonQuorumLost), "master set %s/%s to lose availability with two of three members killed", ns, ms.Name)
		set := fetchSet(ns, ms.Name)
		Expect(memberStates(set)).To(Equal([]string{v1alpha1.MemberDown, v1alpha1.MemberDown, v1alpha1.MemberServing}))
		Expect(set.Status.Members[0].Message).NotTo(BeEmpty())
		Expect(meta.IsStatusConditionTrue(set.Status.Conditions, v1alpha1.ConditionDegraded)).To(BeTrue())
		Eventually(func() []string { return eventReasons(ns, ms.Name) }).Should(ContainElement("MemberDown"), "master set %s/%s to get event MemberDown", ns, ms.Name)
		Eventually(func(g Gomega) float64 {
			v, ok, err := testenv.Value(mgr.Registry, "redlock_master_set_serving", map[string]string{"namespace": ns, "name": ms.Name})
			g.Expect(err).NotTo(HaveOccurred(), "gather the manager's registry")
			g.Expect(ok).To(BeTrue(), "one sample of redlock_master_set_serving")
			return v
		}).Should(Equal(1.0), "redlock_master_set_serving of master set %s/%s to report the one member left", ns, ms.Name)
	})

	It("counts a restart and quarantines the restarted member until its window passed", func() {
		runID := fetchSet(ns, ms.Name).Status.Members[0].RunID
		for _, s := range ms.Servers[:2] {
			Expect(s.Restart(false)).To(Succeed())
		}
		Eventually(func() string { return fetchSet(ns, ms.Name).Status.Members[0].State }).
			Should(Equal(v1alpha1.MemberQuarantined), "member 0 of master set %s/%s to be quarantined after its restart", ns, ms.Name)
		set := fetchSet(ns, ms.Name)
		Expect(set.Status.Members[0].RunID).NotTo(Equal(runID))
		Expect(set.Status.Members[0].Restarts).To(Equal(int32(1)))
		Expect(set.Status.Members[0].QuarantinedUntil.Time).To(BeTemporally(">", time.Now().Add(-time.Second)))
		Eventually(func() string { return availability(fetchSet(ns, ms.Name)) }).
			Should(Equal("True/"+v1alpha1.ReasonQuorumServing), "master set %s/%s to be available again once the restarted members' windows passed", ns, ms.Name)
	})

	It("reads the password from the auth Secret and reports a missing one", func() {
		dir := GinkgoT().TempDir()
		var addrs []string
		for i := range 3 {
			s, err := redistest.Start(filepath.Join(dir, fmt.Sprint(i)), redistest.Options{Password: "s3cret"})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(s.Close)
			addrs = append(addrs, s.Addr())
		}
		Expect(k8s.Create(suiteCtx, &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "authed"},
			Spec: v1alpha1.RedisMasterSetSpec{
				External:      &v1alpha1.ExternalMasters{Addresses: addrs},
				MaxLockTTL:    metav1.Duration{Duration: maxLockTTL},
				AuthSecretRef: &v1alpha1.SecretKeyRef{Name: "redis-auth"},
			},
		})).To(Succeed())
		Eventually(func() string { return availability(fetchSet(ns, "authed")) }).
			Should(Equal("False/"+v1alpha1.ReasonAuthSecretError), "master set %s/authed to be unavailable without Secret redis-auth", ns)

		Expect(k8s.Create(suiteCtx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "redis-auth", Labels: map[string]string{v1alpha1.RedisCredentialsLabel: "true"}},
			StringData: map[string]string{"password": "s3cret"},
		})).To(Succeed())
		Eventually(func() string { return availability(fetchSet(ns, "authed")) }).
			Should(Equal("True/"+v1alpha1.ReasonQuorumServing), "master set %s/authed to be available with Secret redis-auth", ns)
		// The password appears nowhere in status or events.
		set := fetchSet(ns, "authed")
		Expect(fmt.Sprintf("%+v", set.Status)).NotTo(ContainSubstring("s3cret"))
		var list eventsv1.EventList
		Expect(k8s.List(suiteCtx, &list, client.InNamespace(ns))).To(Succeed())
		for _, e := range list.Items {
			Expect(e.Note).NotTo(ContainSubstring("s3cret"))
		}
	})

	It("sends a Secret to no address unless the Secret opts in as Redis credentials", func() {
		By("listening on three addresses that record every byte they receive")
		var mu sync.Mutex
		var received []byte
		var addrs []string
		for range 3 {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(l.Close)
			addrs = append(addrs, l.Addr().String())
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					go func() {
						defer func() { _ = c.Close() }()
						buf := make([]byte, 4096)
						for {
							n, err := c.Read(buf)
							mu.Lock()
							received = append(received, buf[:n]...)
							mu.Unlock()
							if err != nil {
								return
							}
						}
					}()
				}
			}()
		}
		got := func() string {
			mu.Lock()
			defer mu.Unlock()
			return string(received)
		}

		By("pointing a master set at them with a Secret that does not opt in")
		Expect(k8s.Create(suiteCtx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "someone-elses"},
			StringData: map[string]string{"password": "not-for-redis"},
		})).To(Succeed())
		Expect(k8s.Create(suiteCtx, &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deputy"},
			Spec: v1alpha1.RedisMasterSetSpec{
				External:      &v1alpha1.ExternalMasters{Addresses: addrs},
				MaxLockTTL:    metav1.Duration{Duration: maxLockTTL},
				AuthSecretRef: &v1alpha1.SecretKeyRef{Name: "someone-elses"},
			},
		})).To(Succeed())
		expectCondition(ns, "deputy", v1alpha1.ConditionAvailable, metav1.ConditionFalse, v1alpha1.ReasonAuthSecretNotOptedIn, v1alpha1.RedisCredentialsLabel)
		Consistently(got, 3*time.Second).Should(BeEmpty(), "master set %s/deputy sent bytes to its addresses before Secret someone-elses opted in", ns)

		By("labelling the Secret: now, and only now, the operator talks to the addresses")
		secret := &corev1.Secret{}
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "someone-elses"}, secret)).To(Succeed())
		secret.Labels = map[string]string{v1alpha1.RedisCredentialsLabel: "true"}
		Expect(k8s.Update(suiteCtx, secret)).To(Succeed())
		updated := fetchSet(ns, "deputy")
		updated.Spec.NodeTimeout = &metav1.Duration{Duration: 100 * time.Millisecond} // the next reconcile reads the Secret again
		Expect(k8s.Update(suiteCtx, updated)).To(Succeed())
		Eventually(got, 30*time.Second).Should(ContainSubstring("not-for-redis"), "master set %s/deputy to send the password of Secret someone-elses once it is labelled", ns)
	})
})
