//go:build e2e

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/test/demo"
)

var _ = Describe("make demo", func() {
	It("runs bounded: a lock granted to an identity, handed over between pods, held with the same token through a member crash", func() {
		dir := GinkgoT().TempDir()
		bin, report := filepath.Join(dir, "demo"), filepath.Join(dir, "report.json")
		run("go", "build", "-o", bin, "./hack/demo")

		By("running the demo program as `make demo DEMO_DURATION=4m` does, in its own namespace and ports, on the operator the suite installed from the release")
		cmd := exec.Command(bin, "--deploy=false", "--duration", "4m", "--report", report, "--namespace", "demo", "--base-port", "17100")
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
		runErr := cmd.Run()
		removeAfterSpec(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}})
		data, err := os.ReadFile(report) //nolint:gosec // the test's own file
		Expect(err).NotTo(HaveOccurred(), "the demo wrote no report (it exited with %v)", runErr)
		rep := &demo.Report{}
		Expect(json.Unmarshal(data, rep)).To(Succeed())
		// The failures first: a CI log keeps the summary, not the demo's output.
		Expect(rep.Failures()).To(BeEmpty(), "the demo's failures (done: %q)", rep.Done)
		Expect(runErr).NotTo(HaveOccurred(), "the demo exited with an error (see its output)")

		By("a lock granted to its static identity, which a rival of the same key never got")
		Expect(rep.IdentityHolder).To(Equal(demo.Identity))
		Expect(rep.IdentityToken).To(BeNumerically(">", 0))

		By("the Jobs' lock handed from pod to pod, one run after another with rising tokens")
		Expect(rep.Jobs).To(HaveLen(3))
		for i := 1; i < len(rep.Jobs); i++ {
			Expect(rep.Jobs[i].Pod).NotTo(Equal(rep.Jobs[i-1].Pod))
			Expect(rep.Jobs[i].Start).NotTo(BeTemporally("<", rep.Jobs[i-1].Finish))
			Expect(rep.Jobs[i].Token).To(BeNumerically(">", rep.Jobs[i-1].Token))
		}
		Expect(len(rep.HolderPods)).To(BeNumerically(">=", 2), "the holder mark moved between the Deployment's pods")

		By("the crashed member out for its restart delay, the lock held with the same token throughout")
		c := rep.Crash
		Expect(c).NotTo(BeNil())
		Expect(c.OutOfService).To(BeNumerically(">=", c.RestartDelay))
		Expect(c.States).To(ContainElement("Quarantined"))
		Expect(c.TokenBefore).To(Equal(rep.IdentityToken))
		Expect(c.TokenAfter).To(Equal(rep.IdentityToken))
	})

	It("runs the in-cluster manager with exactly the RBAC the release ships (its install.yaml), not cluster-admin", func() {
		const sa = "redlock-operator-controller-manager"
		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace("redlock-system"))).To(Succeed())
		Expect(pods.Items).NotTo(BeEmpty())
		for _, p := range pods.Items {
			Expect(p.Spec.ServiceAccountName).To(Equal(sa))
		}

		By("every binding of the manager's ServiceAccount, and its role, being the one the release's install.yaml ships")
		shipped := map[string]*unstructured.Unstructured{}
		for _, u := range decodeObjects(releaseFile("install.yaml")) {
			shipped[u.GetKind()+"/"+u.GetNamespace()+"/"+u.GetName()] = u
		}
		var crbs rbacv1.ClusterRoleBindingList
		var rbs rbacv1.RoleBindingList
		Expect(k8s.List(ctx, &crbs)).To(Succeed())
		Expect(k8s.List(ctx, &rbs)).To(Succeed())
		bound := func(subjects []rbacv1.Subject) bool {
			return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
				return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == "redlock-system"
			})
		}
		checkRole := func(kind, ns, name string) {
			want, ok := shipped[kind+"/"+ns+"/"+name]
			Expect(ok).To(BeTrue(), "%s %s/%s is bound to the manager but not shipped in install.yaml", kind, ns, name)
			var live []rbacv1.PolicyRule
			if kind == "ClusterRole" {
				r := &rbacv1.ClusterRole{}
				Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, r)).To(Succeed())
				live = r.Rules
			} else {
				r := &rbacv1.Role{}
				Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, r)).To(Succeed())
				live = r.Rules
			}
			typed := &rbacv1.ClusterRole{}
			Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(want.Object, typed)).To(Succeed())
			Expect(live).To(Equal(typed.Rules), "%s %s differs from install.yaml", kind, name)
		}
		n := 0
		for _, b := range crbs.Items {
			if bound(b.Subjects) {
				n++
				Expect(shipped).To(HaveKey("ClusterRoleBinding//"+b.Name), "binding %s not shipped in install.yaml", b.Name)
				checkRole(b.RoleRef.Kind, "", b.RoleRef.Name)
			}
		}
		for _, b := range rbs.Items {
			if bound(b.Subjects) {
				n++
				Expect(shipped).To(HaveKey("RoleBinding/"+b.Namespace+"/"+b.Name), "binding %s/%s not shipped in install.yaml", b.Namespace, b.Name)
				ns := b.Namespace
				if b.RoleRef.Kind == "ClusterRole" {
					ns = ""
				}
				checkRole(b.RoleRef.Kind, ns, b.RoleRef.Name)
			}
		}
		Expect(n).To(BeNumerically(">", 0))

		By("the API server refusing the manager what it was not granted")
		as := "--as=system:serviceaccount:redlock-system:" + sa
		for _, q := range [][]string{{"*", "*"}, {"create", "clusterrolebindings"}, {"list", "secrets", "--all-namespaces"}, {"update", "deployments", "-n", "kube-system"}, {"delete", "nodes"}} {
			out, err := exec.Command(os.Getenv("KUBECTL"), append([]string{"auth", "can-i", as}, q...)...).Output()
			Expect(err).To(HaveOccurred(), "the manager may %v: %s", q, out)
			Expect(strings.TrimSpace(string(out))).To(Equal("no"), "kubectl auth can-i %v", q)
		}
	})
})
