//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
)

// promAlert is an alert as Prometheus' /api/v1/alerts lists it.
type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
	Value  string            `json:"value"`
}

var _ = Describe("the shipped alerts on a real Prometheus", Ordered, func() {
	const setName = "alerting-masters"
	var (
		servers []*redistest.Server
		promURL string
	)

	// alerts returns Prometheus' alerts named name for the spec's set
	// (every alert of the set when name is "").
	alerts := func(g Gomega, name string) []promAlert {
		resp, err := http.Get(promURL + "/api/v1/alerts")
		g.Expect(err).NotTo(HaveOccurred(), "Prometheus' alerts API")
		defer func() { _ = resp.Body.Close() }()
		var body struct {
			Data struct {
				Alerts []promAlert `json:"alerts"`
			} `json:"data"`
		}
		g.Expect(json.NewDecoder(resp.Body).Decode(&body)).To(Succeed(), "Prometheus' alerts as JSON")
		var out []promAlert
		for _, a := range body.Data.Alerts {
			if (name == "" || a.Labels["alertname"] == name) && a.Labels["name"] == setName {
				out = append(out, a)
			}
		}
		return out
	}

	// servingIs reports whether Prometheus' latest sample of the set's
	// serving masters is value.
	servingIs := func(g Gomega, value string) bool {
		resp, err := http.Get(promURL + "/api/v1/query?query=" + "max%20by%20(name)%20(redlock_master_set_serving%7Bname%3D%22" + setName + "%22%7D)")
		g.Expect(err).NotTo(HaveOccurred(), "Prometheus' query API")
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return regexp.MustCompile(`"value":\[[0-9.]+,"` + value + `"\]`).Match(body)
	}

	BeforeAll(func() {
		if _, err := exec.LookPath("prometheus"); err != nil {
			Fail("prometheus is missing: run make prometheus (hack/install-prometheus.sh)")
		}
		By("starting three redis-server masters on the host and an external RedisMasterSet naming them")
		servers = redistest.StartN(GinkgoTB(), 3, redistest.Options{})
		ms := &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: setName},
			Spec: v1alpha1.RedisMasterSetSpec{
				External:   &v1alpha1.ExternalMasters{Addresses: redistest.Addrs(servers)},
				MaxLockTTL: metav1.Duration{Duration: ttl},
			},
		}
		Expect(k8s.Create(ctx, ms)).To(Succeed())
		removeAfterSpec(ms)

		By("binding ServiceAccount prometheus to the shipped metrics-reader role")
		Expect(k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "prometheus"}})).To(Succeed())
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-prometheus"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "redlock-operator-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "prometheus"}},
		}
		Expect(k8s.Create(ctx, binding)).To(Succeed())
		removeAfterSpec(binding)
		token, err := exec.Command(os.Getenv("KUBECTL"), "create", "token", "prometheus", "-n", ns, "--duration=1h").Output()
		Expect(err).NotTo(HaveOccurred(), "a token of ServiceAccount %s/prometheus", ns)

		By("reading the CA of the metrics certificate the manager issued (Secret redlock-system/redlock-operator-metrics-server-cert)")
		certSecret := &corev1.Secret{}
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "redlock-system", Name: "redlock-operator-metrics-server-cert"}, certSecret)).To(Succeed())
			g.Expect(certSecret.Data).To(HaveKey("ca.crt"))
		}, time.Minute, time.Second).Should(Succeed(), "secret redlock-system/redlock-operator-metrics-server-cert to hold ca.crt")

		By("writing a test copy of config/prometheus/rules.yaml whose every for is 2s, and the scrape of the in-cluster manager")
		dir := GinkgoT().TempDir()
		rules, err := os.ReadFile(filepath.Join(root, "config", "prometheus", "rules.yaml"))
		Expect(err).NotTo(HaveOccurred())
		short := regexp.MustCompile(`(?m)^(\s+for:) \S+$`).ReplaceAll(rules, []byte("$1 2s"))
		Expect(os.WriteFile(filepath.Join(dir, "rules.yaml"), short, 0o600)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(dir, "token"), []byte(strings.TrimSpace(string(token))), 0o600)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(dir, "ca.crt"), certSecret.Data["ca.crt"], 0o600)).To(Succeed())
		config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
- job_name: redlock-operator
  scheme: https
  authorization:
    credentials_file: %q
  tls_config: # as config/prometheus/monitor.yaml: the manager's certificate, verified
    ca_file: %q
    server_name: redlock-operator-controller-manager-metrics-service.redlock-system.svc
  static_configs:
  - targets: ["127.0.0.1:18443"] # the host-network manager (config/local-cluster)
`, filepath.Join(dir, "rules.yaml"), filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt"))
		Expect(os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o600)).To(Succeed())

		By("running prometheus on a free loopback port")
		port, err := redistest.FreePort()
		Expect(err).NotTo(HaveOccurred())
		promURL = fmt.Sprintf("http://127.0.0.1:%d", port)
		cmd := exec.Command("prometheus", "--config.file="+filepath.Join(dir, "prometheus.yml"),
			"--storage.tsdb.path="+filepath.Join(dir, "data"), fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port))
		log, err := os.Create(filepath.Join(dir, "prometheus.log")) //nolint:gosec // the spec's own temporary directory
		Expect(err).NotTo(HaveOccurred())
		cmd.Stdout, cmd.Stderr = log, log
		Expect(cmd.Start()).To(Succeed())
		DeferCleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if CurrentSpecReport().Failed() {
				out, _ := os.ReadFile(log.Name())
				GinkgoWriter.Printf("--- prometheus log:\n%s\n", out)
			}
		})

		By("Prometheus verifying the manager's certificate, scraping it and seeing every member of the set serve")
		// The manager serves the certificate once the kubelet mounted its
		// Secret: up to its sync period (1m) after the manager filled it.
		// The alert may be pending from before the members were probed:
		// the rules are evaluated a second apart from the scrapes, so the
		// wait is for both the sample and the rule's state.
		Eventually(func(g Gomega) {
			g.Expect(servingIs(g, "3")).To(BeTrue(), "three members serving")
			g.Expect(alerts(g, "RedlockMasterSetUnavailable")).To(BeEmpty(), "RedlockMasterSetUnavailable, evaluated after the members served")
		}, 3*time.Minute, time.Second).Should(Succeed(), "Prometheus to scrape master set %s/%s with its three members serving, verifying the manager's certificate", ns, setName)
		// Longer than the test rules' for (2s) and two evaluations: a rule
		// that matched serving members would fire within it.
		Consistently(func(g Gomega) []promAlert { return alerts(g, "RedlockMasterSetUnavailable") }, 5*time.Second, time.Second).
			Should(BeEmpty(), "RedlockMasterSetUnavailable to stay quiet for master set %s/%s while its members serve", ns, setName)
	})

	It("fires RedlockMasterSetUnavailable when the set's masters stop below quorum, and resolves it once they are back", func() {
		By("stopping two of the three masters (SIGSTOP)")
		stopped := time.Now()
		Expect(servers[0].Stop()).To(Succeed())
		Expect(servers[1].Stop()).To(Succeed())
		DeferCleanup(func() { _ = servers[0].Cont(); _ = servers[1].Cont() })
		var firing []promAlert
		Eventually(func(g Gomega) {
			firing = alerts(g, "RedlockMasterSetUnavailable")
			g.Expect(firing).To(ContainElement(HaveField("State", "firing")), "alerts: %+v", firing)
		}, 2*time.Minute, time.Second).Should(Succeed(), "RedlockMasterSetUnavailable to fire for master set %s/%s with two of its three masters stopped", ns, setName)
		out, _ := json.MarshalIndent(firing, "", "  ")
		GinkgoWriter.Printf("masters stopped → RedlockMasterSetUnavailable firing: %v\n%s\n", time.Since(stopped).Round(100*time.Millisecond), out)
		var pages []promAlert
		for _, a := range alerts(Default, "") {
			if a.State == "firing" && a.Labels["severity"] == "critical" {
				pages = append(pages, a)
			}
		}
		Expect(pages).To(HaveLen(1), "one outage of master set %s/%s (below quorum and not Available) to page once: %+v", ns, setName, pages)
		Expect(firing[0].Labels).To(HaveKeyWithValue("namespace", ns))
		Expect(firing[0].Labels).To(HaveKeyWithValue("severity", "critical"))

		By("continuing the masters")
		Expect(servers[0].Cont()).To(Succeed())
		Expect(servers[1].Cont()).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(alerts(g, "RedlockMasterSetUnavailable")).To(BeEmpty(), "RedlockMasterSetUnavailable")
			// Resolved because the masters serve, not because the series
			// went away.
			g.Expect(servingIs(g, "3")).To(BeTrue(), "three members serving again")
		}, 2*time.Minute, time.Second).Should(Succeed(), "RedlockMasterSetUnavailable to resolve for master set %s/%s once Prometheus sees its masters serve again", ns, setName)
	})
})
