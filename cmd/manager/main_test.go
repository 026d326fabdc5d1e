package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/internal/operator"
)

func TestManager(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Manager command")
}

var env *testenv.Env

var _ = BeforeSuite(func() { env = testenv.Start() })

var _ = AfterSuite(func() { env.Stop() })

// freeAddr returns a loopback address nothing listens on.
func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// startManager runs the manager as main does, with secure metrics on
// metricsAddr and their certificate as cert says, until the spec ends.
// (run registers the operator's metrics in controller-runtime's global
// registry, so it runs once per process.)
func startManager(metricsAddr string, cert operator.MetricsCertOptions) {
	ctx, cancel := context.WithCancel(env.Ctx)
	done := make(chan error, 1)
	go func() {
		defer GinkgoRecover()
		// The webhook too, as main runs it: its certificate rotator and
		// the metrics endpoint's live in one manager.
		_, port, err := net.SplitHostPort(freeAddr())
		Expect(err).NotTo(HaveOccurred())
		webhookPort, err := strconv.Atoi(port)
		Expect(err).NotTo(HaveOccurred())
		webhookCert := "webhook-cert"
		done <- run(ctx, env.Cfg, config{
			metricsAddr: metricsAddr, metricsSecure: true, probeAddr: "0", metricsCert: cert,
			enableWebhook: true, webhookPort: webhookPort, webhook: operator.WebhookOptions{
				Namespace: cert.Namespace, ServiceName: "webhook", SecretName: webhookCert, CertDir: GinkgoT().TempDir(),
				ConfigurationName: "redlock-operator-mutating-webhook-configuration", AgentImage: "gate:test",
			},
			lockKeySecret: testenv.LockKeySecret, probeInterval: time.Second, workers: 1, gateImage: "gate:test",
		})
	}()
	DeferCleanup(func() {
		cancel()
		Eventually(done).WithTimeout(30*time.Second).Should(Receive(Not(HaveOccurred())), "the manager with metrics on %s to stop cleanly", metricsAddr)
	})
}

// token returns a token of a fresh ServiceAccount name in ns.
func token(ctx context.Context, clientset kubernetes.Interface, ns, name string) string {
	_, err := clientset.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	tr, err := clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}

// handshake connects to addr over TLS, verifying its certificate with the
// CA in caPEM for serverName.
func handshake(addr, serverName string, caPEM []byte) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("no CA certificate in %q", caPEM)
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12})
	if err != nil {
		return err
	}
	return conn.Close()
}

// scrape GETs /metrics with an optional bearer token.
func scrape(url, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		// The manager serves a self-signed certificate by default.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a self-signed test server
	}}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

var _ = Describe("The metrics endpoint", func() {
	It("serves HTTPS only to scrapers the API server authenticates and authorizes with the shipped metrics-reader role, with a certificate they verify once its Secret is mounted", func(ctx SpecContext) {
		addr := freeAddr()
		url := fmt.Sprintf("https://%s/metrics", addr)
		ns := env.NewNamespace()
		certName := "metrics-cert"
		cert := operator.MetricsCertOptions{Namespace: ns, ServiceName: "metrics", SecretName: certName, CertDir: GinkgoT().TempDir()}
		serverName := "metrics." + ns + ".svc"
		startManager(addr, cert)
		clientset := kubernetes.NewForConfigOrDie(env.Cfg)

		By("issuing a CA and a certificate for " + serverName + " into Secret " + ns + "/" + certName)
		secret := &corev1.Secret{}
		Eventually(func(g Gomega) {
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: cert.SecretName}, secret)).To(Succeed())
			g.Expect(secret.Data).To(And(HaveKey("ca.crt"), HaveKey("tls.crt"), HaveKey("tls.key")))
		}).Should(Succeed(), "secret %s/%s to hold the metrics certificate", ns, cert.SecretName)

		By("serving a self-signed certificate, which a verifying scraper refuses, until the Secret is mounted")
		Eventually(func() error { _, _, err := scrape(url, ""); return err }).Should(Succeed(), "metrics endpoint %s to serve", url)
		Expect(handshake(addr, serverName, secret.Data["ca.crt"])).To(MatchError(ContainSubstring("certificate")), "a scraper verifying with ca.crt before the mount")

		By("mounting the Secret as the kubelet does: the endpoint serves its certificate, which a scraper verifies with ca.crt")
		for _, k := range []string{"tls.crt", "tls.key"} {
			Expect(os.WriteFile(filepath.Join(cert.CertDir, k), secret.Data[k], 0o600)).To(Succeed())
		}
		Eventually(func() error { return handshake(addr, serverName, secret.Data["ca.crt"]) }).Should(Succeed(),
			"metrics endpoint %s to serve the certificate of secret %s/%s for %s", addr, ns, cert.SecretName, serverName)

		By("asking for tokens of two fresh ServiceAccounts, one to be bound to metrics-reader")
		// The filter caches a refusal for 30 s, so the two are distinct
		// accounts rather than one account before and after its binding.
		stranger, scraper := token(ctx, clientset, ns, "stranger"), token(ctx, clientset, ns, "scraper")

		By("binding the scraper to the ClusterRole config/rbac/metrics_reader_role.yaml ships")
		data, err := os.ReadFile("../../config/rbac/metrics_reader_role.yaml")
		Expect(err).NotTo(HaveOccurred())
		role := &rbacv1.ClusterRole{}
		Expect(yaml.Unmarshal(data, role)).To(Succeed())
		role.Name = "metrics-reader-" + ns
		Expect(env.Client.Create(ctx, role)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(env.Client.Delete(ctx, role)).To(Succeed()) })
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role.Name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "scraper", Namespace: ns}},
		}
		Expect(env.Client.Create(ctx, binding)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(env.Client.Delete(ctx, binding)).To(Succeed()) })

		By("refusing a scrape without a token (401)")
		Eventually(func(g Gomega) {
			code, _, err := scrape(url, "")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(code).To(Equal(http.StatusUnauthorized))
		}).Should(Succeed(), "metrics endpoint %s to refuse a scrape without a token (401)", url)

		By("refusing an authenticated account without the role (403)")
		code, _, err := scrape(url, stranger)
		Expect(err).NotTo(HaveOccurred())
		Expect(code).To(Equal(http.StatusForbidden))

		By("serving the operator's metrics to the bound account")
		Eventually(func(g Gomega) {
			code, body, err := scrape(url, scraper)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(code).To(Equal(http.StatusOK), body)
			g.Expect(body).To(ContainSubstring("redlock_locks_held"))
			g.Expect(body).To(ContainSubstring(`redlock_operator_build_info{version="dev"} 1`))
		}).Should(Succeed(), "metrics endpoint %s to serve the operator's metrics to service account %s/scraper", url, ns)
	})

	It("serves plain HTTP to anyone with --metrics-secure=false", func(ctx SpecContext) {
		addr := freeAddr()
		opts, err := metricsOptions(ctx, config{metricsAddr: addr})
		Expect(err).NotTo(HaveOccurred())
		mgr, err := ctrl.NewManager(env.Cfg, ctrl.Options{Metrics: opts, HealthProbeBindAddress: "0"})
		Expect(err).NotTo(HaveOccurred())
		mctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- mgr.Start(mctx) }()
		DeferCleanup(func() {
			cancel()
			Eventually(done).WithTimeout(30*time.Second).Should(Receive(Not(HaveOccurred())), "the manager with plain metrics on %s to stop cleanly", addr)
		})
		Eventually(func(g Gomega) {
			code, body, err := scrape(fmt.Sprintf("http://%s/metrics", addr), "")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(code).To(Equal(http.StatusOK))
			g.Expect(body).To(ContainSubstring("# HELP"))
		}).Should(Succeed(), "metrics endpoint http://%s/metrics to serve plain HTTP without a token", addr)
	})
})
