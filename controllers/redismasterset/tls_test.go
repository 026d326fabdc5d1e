package redismasterset_test

import (
	"crypto/x509"
	"net"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/certs"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/internal/managed"
)

func tlsSet(ns, name string, t *v1alpha1.MasterTLS) *v1alpha1.RedisMasterSet {
	return &v1alpha1.RedisMasterSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.RedisMasterSetSpec{
			MaxLockTTL: metav1.Duration{Duration: maxLockTTL},
			Managed:    &v1alpha1.ManagedMasters{Replicas: 3},
			TLS:        t,
		},
	}
}

func secret(ns, name string) *corev1.Secret {
	s := &corev1.Secret{}
	Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, s)).To(Succeed())
	return s
}

func statefulSet(g Gomega, ns, name string) *appsv1.StatefulSet {
	sts := &appsv1.StatefulSet{}
	g.Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, sts)).To(Succeed())
	return sts
}

// tlsVolume is the Secret the members mount as their certificate.
func tlsVolume(sts *appsv1.StatefulSet) string {
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Name == "tls" && v.Secret != nil {
			return v.Secret.SecretName
		}
	}
	return ""
}

// expectCondition waits until the set's condition typ has status, reason
// and a message that says say.
func expectCondition(ns, name, typ string, status metav1.ConditionStatus, reason, say string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(fetchSet(ns, name).Status.Conditions, typ)
		g.Expect(c).NotTo(BeNil(), "no %s condition", typ)
		g.Expect(c.Status).To(Equal(status), "status of condition %s", typ)
		g.Expect(c.Reason).To(Equal(reason), "reason of condition %s", typ)
		g.Expect(c.Message).To(ContainSubstring(say), "message of condition %s", typ)
	}).Should(Succeed(), "master set %s/%s to show condition %s %s/%s saying %q", ns, name, typ, status, reason, say)
}

var _ = Describe("Managed RedisMasterSet with operator-issued TLS", Ordered, func() {
	var (
		mgr *testenv.Manager
		clk *clocktesting.FakePassiveClock
		ns  string
	)
	BeforeAll(func() {
		clk = clocktesting.NewFakePassiveClock(time.Now())
		mgr = env.StartManagerAt(clk)
		ns = newNamespace()
		Expect(k8s.Create(suiteCtx, tlsSet(ns, "locks", &v1alpha1.MasterTLS{}))).To(Succeed())
	})
	AfterAll(func() { mgr.Stop() })

	It("issues a CA and a serving certificate naming every member, and runs Redis on TLS only", func() {
		var st *v1alpha1.MasterTLSStatus
		By("waiting for the certificate in status and the StatefulSet")
		Eventually(func(g Gomega) {
			st = fetchSet(ns, "locks").Status.TLS
			g.Expect(st).NotTo(BeNil(), "TLS status of master set locks")
			g.Expect(tlsVolume(statefulSet(g, ns, "locks"))).To(Equal(st.SecretName))
		}).Should(Succeed(), "master set %s/locks to show its certificate, mounted by its StatefulSet", ns)
		set := fetchSet(ns, "locks")
		Expect(st.NotAfter.Time).To(BeTemporally("~", clk.Now().Add(managed.DefaultCertificateDuration), time.Minute))
		Expect(st.RenewAt.Time).To(BeTemporally("~", clk.Now().Add(managed.DefaultCertificateDuration*2/3), time.Hour))

		By("the CA Secret: immutable, owned by the set")
		ca := secret(ns, "locks-tls-ca")
		Expect(*ca.Immutable).To(BeTrue())
		Expect(metav1.IsControlledBy(ca, set)).To(BeTrue())
		roots, err := certs.Pool(ca.Data[certs.CAKey])
		Expect(err).NotTo(HaveOccurred())

		By("the serving Secret: a certificate of that CA for every member's address")
		serving := secret(ns, st.SecretName)
		Expect(serving.Type).To(Equal(corev1.SecretTypeTLS))
		Expect(*serving.Immutable).To(BeTrue())
		leaf, err := certs.Check(certs.Pair{Cert: serving.Data[certs.CertKey], Key: serving.Data[certs.KeyKey]}, roots, clk.Now(), x509.ExtKeyUsageServerAuth)
		Expect(err).NotTo(HaveOccurred())
		for _, m := range set.Status.Members {
			host, _, _ := net.SplitHostPort(m.Address)
			Expect(leaf.VerifyHostname(host)).To(Succeed(), m.Address)
		}

		By("the members: TLS only, the probe over TLS, the certificate mounted")
		sts := statefulSet(Default, ns, "locks")
		redis := sts.Spec.Template.Spec.Containers[0]
		Expect(redis.Args).To(ContainElement("--tls"))
		Expect(redis.ReadinessProbe.Exec.Command).To(ContainElement("--tls"))
		Expect(redis.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "tls", MountPath: managed.TLSDir, ReadOnly: true}))
		Expect(sts.Spec.Template.Annotations).To(HaveKey(managed.AnnotationTLS))
		cm := &corev1.ConfigMap{}
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "locks-config"}, cm)).To(Succeed())
		Expect(cm.Data["redis.conf"]).To(ContainSubstring("port 0\ntls-port 6379\n"))
		Expect(cm.Data["redis.conf"]).NotTo(ContainSubstring("port 6379\n" + "protected"))
	})

	It("renews the certificate when due into a new Secret, which rolls the members", func() {
		before := fetchSet(ns, "locks").Status.TLS
		oldHash := statefulSet(Default, ns, "locks").Spec.Template.Annotations[managed.AnnotationTLS]
		By("moving the clock past the renewal time")
		clk.SetTime(before.RenewAt.Add(time.Minute))
		Eventually(func(g Gomega) {
			st := fetchSet(ns, "locks").Status.TLS
			g.Expect(st.SecretName).NotTo(Equal(before.SecretName), "certificate Secret of master set locks")
			g.Expect(st.NotAfter.Time).To(BeTemporally(">", before.NotAfter.Time), "certificate expiry of master set locks")
			sts := statefulSet(g, ns, "locks")
			g.Expect(tlsVolume(sts)).To(Equal(st.SecretName), "the members mount the new certificate")
			g.Expect(sts.Spec.Template.Annotations[managed.AnnotationTLS]).NotTo(Equal(oldHash), "the template changed: the members roll one at a time")
		}).Should(Succeed(), "master set %s/locks to renew its certificate into a new Secret, its members mounting it", ns)
		By("keeping the old Secret for members that have not rolled yet")
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: before.SecretName}, &corev1.Secret{})).To(Succeed())
		Eventually(func() []string { return eventReasons(ns, "locks") }).Should(ContainElement("CertificateIssued"), "master set %s/locks to get event CertificateIssued", ns)

		By("not renewing again before the new certificate is due")
		now := fetchSet(ns, "locks").Status.TLS
		clk.SetTime(clk.Now().Add(time.Hour))
		Consistently(func() string { return fetchSet(ns, "locks").Status.TLS.SecretName }, 2*time.Second).Should(Equal(now.SecretName), "master set %s/locks to keep certificate Secret %s until it is due", ns, now.SecretName)
	})

	It("refuses a certificate lifetime too short to roll the members before it expires, changing nothing", func() {
		ms := tlsSet(ns, "slow", &v1alpha1.MasterTLS{CertificateDuration: &metav1.Duration{Duration: time.Hour}})
		ms.Spec.MaxLockTTL = metav1.Duration{Duration: 10 * time.Minute}
		ms.Spec.Managed.Replicas = 5
		Expect(k8s.Create(suiteCtx, ms)).To(Succeed())
		expectCondition(ns, "slow", v1alpha1.ConditionAvailable, metav1.ConditionFalse, v1alpha1.ReasonUnsupportedSpec, "certificateDuration 1h0m0s is too short")
		err := k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "slow"}, &appsv1.StatefulSet{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no StatefulSet: %v", err)
	})
})

var _ = Describe("Managed RedisMasterSet with the user's TLS Secret", Ordered, func() {
	var (
		mgr *testenv.Manager
		ns  string
		ca  certs.Pair
	)
	// userSecret writes a cert-manager-shaped Secret: tls.crt and tls.key of
	// req, and ca.crt; labelled as credentials when optIn.
	userSecret := func(name string, pair certs.Pair, optIn bool) {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		_, err := controllerutil.CreateOrUpdate(suiteCtx, k8s, s, func() error {
			s.Type = corev1.SecretTypeTLS
			s.Labels = map[string]string{}
			if optIn {
				s.Labels[v1alpha1.RedisCredentialsLabel] = "true"
			}
			s.Data = map[string][]byte{certs.CertKey: pair.Cert, certs.KeyKey: pair.Key, certs.CAKey: ca.Cert}
			return nil
		})
		Expect(err).NotTo(HaveOccurred())
	}
	issue := func(ms *v1alpha1.RedisMasterSet, mutate func(*certs.Request)) certs.Pair {
		req := managed.ServingRequest(ms, time.Now())
		if mutate != nil {
			mutate(&req)
		}
		p, err := certs.Issue(ca, req)
		Expect(err).NotTo(HaveOccurred())
		return p
	}
	BeforeAll(func() {
		mgr = startManager()
		ns = newNamespace()
		var err error
		ca, err = certs.NewCA("user CA", time.Now())
		Expect(err).NotTo(HaveOccurred())
	})
	AfterAll(func() { mgr.Stop() })

	It("serves the user's Secret and rolls the members when its certificate is renewed in place", func() {
		ms := tlsSet(ns, "users", &v1alpha1.MasterTLS{ServerSecretRef: &v1alpha1.LocalSecretRef{Name: "users-cert"}})
		userSecret("users-cert", issue(ms, nil), true)
		Expect(k8s.Create(suiteCtx, ms)).To(Succeed())
		var hash, copied string
		Eventually(func(g Gomega) {
			sts := statefulSet(g, ns, "users")
			copied = tlsVolume(sts)
			g.Expect(copied).To(HavePrefix("users-tls-"), "the members mount a checked copy, not the user's Secret")
			hash = sts.Spec.Template.Annotations[managed.AnnotationTLS]
			g.Expect(hash).NotTo(BeEmpty(), "TLS hash of StatefulSet users")
		}).Should(Succeed(), "StatefulSet %s/users to mount a checked copy of Secret users-cert", ns)
		Expect(fetchSet(ns, "users").Status.TLS.SecretName).To(Equal(copied))
		cp := secret(ns, copied)
		Expect(*cp.Immutable).To(BeTrue())
		Expect(cp.Data[certs.CertKey]).To(Equal(secret(ns, "users-cert").Data[certs.CertKey]))
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "users-tls-ca"}, &corev1.Secret{})).NotTo(Succeed(), "no CA of the operator's")

		By("renewing the certificate in the same Secret, as cert-manager does")
		userSecret("users-cert", issue(ms, nil), true)
		Eventually(func(g Gomega) {
			sts := statefulSet(g, ns, "users")
			g.Expect(sts.Spec.Template.Annotations[managed.AnnotationTLS]).NotTo(Equal(hash), "TLS hash of StatefulSet users")
			g.Expect(tlsVolume(sts)).NotTo(Equal(copied), "a new copy")
		}).Should(Succeed(), "StatefulSet %s/users to roll to a new copy of Secret users-cert renewed in place", ns)
	})

	It("rolls nothing onto bad TLS material, says why, and keeps the set running", func() {
		By("refusing bad material for a new set: nothing is created")
		ms := tlsSet(ns, "bad", &v1alpha1.MasterTLS{ServerSecretRef: &v1alpha1.LocalSecretRef{Name: "bad-cert"}})
		good := issue(ms, nil)
		userSecret("bad-cert", good, false)
		Expect(k8s.Create(suiteCtx, ms)).To(Succeed())
		expectCondition(ns, "bad", v1alpha1.ConditionAvailable, metav1.ConditionFalse, v1alpha1.ReasonTLSSecretError, "not labelled")
		Expect(apierrors.IsNotFound(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "bad"}, &appsv1.StatefulSet{}))).To(BeTrue())

		By("running it once the material is good")
		userSecret("bad-cert", good, true)
		var hash string
		Eventually(func(g Gomega) {
			hash = statefulSet(g, ns, "bad").Spec.Template.Annotations[managed.AnnotationTLS]
			g.Expect(hash).NotTo(BeEmpty(), "TLS hash of StatefulSet bad")
		}).Should(Succeed(), "StatefulSet %s/bad to be created once Secret bad-cert is good", ns)

		other := issue(ms, nil)
		for _, tc := range []struct {
			name  string
			pair  certs.Pair
			optIn bool
			say   string
		}{
			{name: "a Secret without the opt-in label", pair: good, say: "not labelled"},
			{name: "a certificate that does not parse", pair: certs.Pair{Cert: []byte("-----BEGIN CERTIFICATE-----\nbm9wZQ==\n-----END CERTIFICATE-----\n"), Key: good.Key}, optIn: true, say: "no PEM certificate that parses"},
			{name: "a key of another certificate", pair: certs.Pair{Cert: good.Cert, Key: other.Key}, optIn: true, say: "does not match"},
			{name: "a certificate that does not name the members", pair: issue(ms, func(r *certs.Request) { r.DNSNames, r.IPs = []string{"elsewhere.example"}, nil }), optIn: true, say: "not valid for"},
			{name: "an expired certificate", pair: issue(ms, func(r *certs.Request) { r.Now, r.Validity = time.Now().Add(-3*time.Hour), time.Hour }), optIn: true, say: "expired"},
		} {
			By(tc.name)
			userSecret("bad-cert", tc.pair, tc.optIn)
			expectCondition(ns, "bad", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonTLSSecretError, tc.say)
			Expect(statefulSet(Default, ns, "bad").Spec.Template.Annotations[managed.AnnotationTLS]).To(Equal(hash), "the members keep their certificate")
		}
		Eventually(func() []string { return eventReasons(ns, "bad") }).Should(ContainElement(v1alpha1.ReasonTLSSecretError), "master set %s/bad to get event %s", ns, v1alpha1.ReasonTLSSecretError)

		By("admitting a new member pod meanwhile: the set keeps running")
		pod := memberPod(fetchSet(ns, "bad"), "1")
		Expect(k8s.Create(suiteCtx, pod)).To(Succeed())
		Eventually(admission(pod)).ShouldNot(BeZero(), "member pod %s/%s of master set bad to be admitted", ns, pod.Name)
	})
})

// connectionsReceived is a master's count of connections it accepted, this
// one included.
func connectionsReceived(s *redistest.Server) int64 {
	c := s.Client()
	defer c.Close()
	info, err := c.InfoMap(suiteCtx, "stats").Result()
	Expect(err).NotTo(HaveOccurred())
	n, err := strconv.ParseInt(info["Stats"]["total_connections_received"], 10, 64)
	Expect(err).NotTo(HaveOccurred())
	return n
}

var _ = Describe("External RedisMasterSet over TLS", func() {
	It("probes real TLS-only masters with the CA and client certificate of its Secrets, and sends nothing before they opt in", func() {
		mgr := startManager()
		defer mgr.Stop()
		ns := newNamespace()
		ca, err := certs.NewCA("external CA", time.Now())
		Expect(err).NotTo(HaveOccurred())
		server, err := certs.Issue(ca, certs.Request{CommonName: "redis", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Now: time.Now(), Validity: time.Hour})
		Expect(err).NotTo(HaveOccurred())
		client, err := certs.Issue(ca, certs.Request{CommonName: "operator", Now: time.Now(), Validity: time.Hour, Client: true})
		Expect(err).NotTo(HaveOccurred())
		servers := testenv.StartServers(3, redistest.Options{TLS: &redistest.TLS{Cert: server.Cert, Key: server.Key, CA: ca.Cert, AuthClients: true, ClientCert: client.Cert, ClientKey: client.Key}})

		before := make([]int64, len(servers))
		for i, s := range servers {
			before[i] = connectionsReceived(s)
		}
		By("creating the CA and client Secrets without the opt-in label")
		for name, data := range map[string]map[string][]byte{
			"masters-ca":    {certs.CAKey: ca.Cert},
			"operator-cert": {certs.CertKey: client.Cert, certs.KeyKey: client.Key},
		} {
			Expect(k8s.Create(suiteCtx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data})).To(Succeed())
		}
		Expect(k8s.Create(suiteCtx, &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tls"},
			Spec: v1alpha1.RedisMasterSetSpec{
				External:   &v1alpha1.ExternalMasters{Addresses: redistest.Addrs(servers)},
				MaxLockTTL: metav1.Duration{Duration: maxLockTTL},
				TLS: &v1alpha1.MasterTLS{
					CASecretRef:     &v1alpha1.CABundleRef{Name: "masters-ca"},
					ClientSecretRef: &v1alpha1.LocalSecretRef{Name: "operator-cert"},
				},
			},
		})).To(Succeed())
		expectCondition(ns, "tls", v1alpha1.ConditionAvailable, metav1.ConditionFalse, v1alpha1.ReasonTLSSecretError, "not labelled")
		for i, s := range servers {
			Expect(connectionsReceived(s)).To(Equal(before[i]+1), "no connection but this check's reached %s", s.Addr())
		}

		By("labelling them: the masters are probed over TLS and serve")
		for _, name := range []string{"masters-ca", "operator-cert"} {
			s := secret(ns, name)
			s.Labels = map[string]string{v1alpha1.RedisCredentialsLabel: "true"}
			Expect(k8s.Update(suiteCtx, s)).To(Succeed())
		}
		Eventually(func(g Gomega) {
			set := fetchSet(ns, "tls")
			g.Expect(set.Status.Total).To(BeEquivalentTo(3), "members of master set tls")
			g.Expect(memberStates(set)).To(HaveEach(Or(Equal(v1alpha1.MemberServing), Equal(v1alpha1.MemberQuarantined))), "every master answered over TLS")
		}).Should(Succeed(), "every master of set %s/tls to answer over TLS once its Secrets are labelled", ns)
	})
})
