//go:build e2e

package e2e

import (
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var _ = Describe("the in-cluster manager's metrics", func() {
	It("are served over HTTPS to a ServiceAccount bound to the shipped metrics-reader role, with the manager's own RBAC doing the checks", func() {
		By("binding a fresh ServiceAccount to redlock-operator-metrics-reader")
		Expect(k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "scraper"}})).To(Succeed())
		Expect(k8s.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-scraper"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "redlock-operator-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "scraper"}},
		})).To(Succeed())
		token, err := exec.Command(os.Getenv("KUBECTL"), "create", "token", "scraper", "-n", ns).Output()
		Expect(err).NotTo(HaveOccurred())

		By("scraping the host-network manager on 127.0.0.1:18443 (config/local-cluster)")
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the manager's self-signed certificate
		}}
		scrape := func(bearer string) (int, string) {
			req, err := http.NewRequest(http.MethodGet, "https://127.0.0.1:18443/metrics", nil)
			Expect(err).NotTo(HaveOccurred())
			if bearer != "" {
				req.Header.Set("Authorization", "Bearer "+bearer)
			}
			resp, err := c.Do(req)
			if err != nil {
				return 0, err.Error()
			}
			defer func() { _ = resp.Body.Close() }()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(body)
		}
		Eventually(func(g Gomega) {
			code, body := scrape(strings.TrimSpace(string(token)))
			g.Expect(code).To(Equal(http.StatusOK), body)
			g.Expect(body).To(ContainSubstring("redlock_locks_held"), "metrics of the manager")
		}, time.Minute, time.Second).Should(Succeed(), "the manager's metrics on https://127.0.0.1:18443/metrics to be served to ServiceAccount %s/scraper", ns)
		code, _ := scrape("")
		Expect(code).To(Equal(http.StatusUnauthorized))
	})
})
