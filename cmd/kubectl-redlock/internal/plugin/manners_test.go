package plugin_test

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/cmd/kubectl-redlock/internal/report"
	"github.com/redlock-operator/redlock-operator/controllers/podgate"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/internal/operator"
)

// The plugin behaves as kubectl does: its output formats, its completion,
// its version and its check.

var _ = Describe("kubectl redlock's output formats", func() {
	var ns string
	BeforeEach(func() {
		ns = namespace("")
		lock := newLock(ns, "jobs", nil)
		writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) {
			grant(st, "cron", nil, "g1", 7, 30*time.Second)
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: "Acquired", Message: "held"})
		})
		waiter := waitingPod(ns, "job-b", "jobs")
		writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) { queue(st, waiter) })
	})

	It("prints -o wide, name, jsonpath and go-template as kubectl does", func() {
		By("adding the Held condition, the grant and the end of the validity with -o wide")
		r := kubectlRedlock("status", "-n", ns, "-o", "wide")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(MatchRegexp(`^NAMESPACE +NAME +KEY +HOLDER +VALID-FOR +TOKEN +WAITING +HELD +GRANT +VALID-UNTIL\n` +
			ns + ` +jobs +redlock:` + ns + `/jobs +cron +[0-9]+s +7 +1 +True/Acquired +g1 +20[0-9-]+T[0-9:]+Z\n$`))

		By("naming the objects listed with -o name")
		r = kubectlRedlock("status", "-n", ns, "-o", "name")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(Equal("distributedlock.coordination.redlock.dev/jobs\n"))
		r = kubectlRedlock("queue", "jobs", "-n", ns, "-o", "name")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(Equal("pod/job-b\n"))

		By("evaluating -o jsonpath and -o go-template over the documented shape")
		r = kubectlRedlock("status", "-n", ns, "-o", "jsonpath={.items[0].holder.identity} {.items[0].fencingToken}")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(Equal("cron 7"))
		r = kubectlRedlock("queue", "jobs", "-n", ns, "-o", `go-template={{range .waiting}}{{.pod}}:{{.position}}{{"\n"}}{{end}}`)
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(Equal("job-b:1\n"))
		r = kubectlRedlock("token", "job-b", "-n", ns, "--template", "{{.kind}} {{.apiVersion}}")
		Expect(r.err).NotTo(HaveOccurred(), "--template alone means -o go-template")
		Expect(r.out).To(Equal("PodToken " + report.APIVersion))

		By("refusing a format the command does not print, naming those it does")
		r = kubectlRedlock("why", "job-b", "-n", ns, "-o", "name")
		Expect(r.err).To(MatchError(MatchRegexp(`^unable to match a printer suitable for the output format "name", allowed formats are: [a-z,-]*jsonpath,`)))
		Expect(r.err.Error()).NotTo(MatchRegexp(`[:,]name[,]`), "why prints a description: no -o name")
		Expect(r.out).To(BeEmpty())
		r = kubectlRedlock("status", "-n", ns, "-o", "custom")
		Expect(r.err).To(MatchError(MatchRegexp(`allowed formats are: .*,name,.*,wide,`)))
	})

	It("completes lock, semaphore, pod and key names, namespaces and formats", func() {
		sem := &v1alpha1.DistributedSemaphore{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reports"},
			Spec: v1alpha1.DistributedSemaphoreSpec{MasterSet: "masters", Slots: 2, TTL: metav1.Duration{Duration: 30 * time.Second}}}
		Expect(k8s.Create(ctx, sem)).To(Succeed())
		newLock(ns, "backup", nil)
		Expect(k8s.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unrelated"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}})).To(Succeed())

		complete := func(args ...string) []string {
			r := kubectlRedlock(append([]string{"__complete"}, args...)...)
			Expect(r.err).NotTo(HaveOccurred())
			lines := strings.Split(strings.TrimSpace(r.out), "\n")
			Expect(lines[len(lines)-1]).To(Equal(":4"), "cobra's directive: no file completion")
			return lines[:len(lines)-1]
		}
		Expect(complete("queue", "-n", ns, "")).To(Equal([]string{"backup", "dsem/reports", "jobs"}))
		Expect(complete("queue", "-n", ns, "j")).To(Equal([]string{"jobs"}))
		Expect(complete("handover", "-n", ns, "")).To(Equal([]string{"backup", "jobs"}))
		Expect(complete("why", "-n", ns, "")).To(Equal([]string{"job-b"}), "pods that ask for a lock or a slot only")
		Expect(complete("who", "redlock:"+ns)).To(Equal([]string{"redlock:" + ns + "/backup", "redlock:" + ns + "/jobs", "redlock:" + ns + "/reports"}))
		Expect(complete("queue", "-n", ns, "jobs", "")).To(BeEmpty(), "one argument only")
		Expect(complete("status", "-n", ns[:len(ns)-1])).To(ContainElement(ns))
		Expect(complete("status", "-o", "")).To(ContainElements("wide", "name", "json", "yaml", "jsonpath"))
	})
})

var _ = Describe("kubectl redlock version", func() {
	It("prints the version the plugin was built as, as --version does", func() {
		r := kubectlRedlock("version")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(Equal(kubectlRedlock("--version").out))
		Expect(r.out).NotTo(BeEmpty())
	})
})

var _ = Describe("kubectl redlock check", func() {
	It("checks the CRDs, the leader, the webhook and the master sets, and waits for them with --wait", func() {
		ns := namespace("")
		opNS := namespace("")
		resultOf := func(r result, name string) string {
			for _, line := range strings.Split(r.out, "\n") {
				if f := strings.Fields(line); len(f) > 1 && f[0] == name {
					return f[1]
				}
			}
			return ""
		}

		By("failing on the missing leader and webhook, with the CRDs served and no master set")
		r := kubectlRedlock("check", "-n", ns, "--operator-namespace", opNS)
		Expect(r.err).To(MatchError(ContainSubstring("not every check passed")))
		Expect(r.out).To(HavePrefix("CHECK "))
		Expect(resultOf(r, "crds")).To(Equal(report.CheckOK), r.out)
		Expect(resultOf(r, "leader")).To(Equal(report.CheckFailed), r.out)
		Expect(r.out).To(ContainSubstring("no Lease " + opNS + "/" + v1alpha1.LeaderLease))
		Expect(resultOf(r, "webhook")).To(Equal(report.CheckFailed), r.out)
		Expect(resultOf(r, "mastersets")).To(Equal(report.CheckOK), r.out)

		By("failing on a master set below its quorum")
		set := &v1alpha1.RedisMasterSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "masters"},
			Spec: v1alpha1.RedisMasterSetSpec{MaxLockTTL: metav1.Duration{Duration: time.Minute},
				External: &v1alpha1.ExternalMasters{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}}}}
		Expect(k8s.Create(ctx, set)).To(Succeed())
		set.Status.Serving, set.Status.Total, set.Status.Quorum = 1, 3, 2
		Expect(k8s.Status().Update(ctx, set)).To(Succeed())
		r = kubectlRedlock("check", "-n", ns, "--operator-namespace", opNS)
		Expect(resultOf(r, "mastersets")).To(Equal(report.CheckFailed), r.out)
		Expect(r.out).To(ContainSubstring(ns + "/masters serves 1 of 3 masters, below its quorum 2"))

		By("passing once the set serves a quorum and is Available")
		set.Status.Serving = 3
		meta.SetStatusCondition(&set.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionAvailable, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonQuorumServing, Message: "serving"})
		Expect(k8s.Status().Update(ctx, set)).To(Succeed())
		r = kubectlRedlock("check", "-n", ns, "--operator-namespace", opNS)
		Expect(resultOf(r, "mastersets")).To(Equal(report.CheckOK), r.out)
		Expect(r.out).To(ContainSubstring(ns + "/masters 3/3"))

		Expect(k8s.Delete(ctx, set)).To(Succeed(), "the operator about to run would find its masters unreachable")

		By("waiting with --wait while a leader appears and the webhook starts answering")
		_, done := session{}.start("check", "-n", ns, "--operator-namespace", opNS, "--wait", "2m", "-o", "json")
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: opNS, Name: v1alpha1.LeaderLease},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: new("redlock-operator-7d9f8-x2k4q"), LeaseDurationSeconds: new(int32(3600)), RenewTime: &metav1.MicroTime{Time: time.Now()}}}
		Expect(k8s.Create(ctx, lease)).To(Succeed())
		stop := serveWebhook(ns)
		DeferCleanup(stop)
		var end result
		// check exits by itself once --wait has passed.
		Eventually(done, 3*time.Minute).Should(Receive(&end), "check --wait to end")
		Expect(end.err).NotTo(HaveOccurred(), end.out)
		Expect(end.out).To(ContainSubstring(`"kind": "CheckList"`))
		Expect(end.out).To(ContainSubstring(`"ok": true`))

		By("failing on a Lease not renewed within its duration")
		lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-2 * time.Hour)}
		Expect(k8s.Update(ctx, lease)).To(Succeed())
		r = kubectlRedlock("check", "-n", ns, "--operator-namespace", opNS)
		Expect(resultOf(r, "leader")).To(Equal(report.CheckFailed), r.out)
		Expect(r.out).To(ContainSubstring("the leader stopped renewing"))
		Expect(resultOf(r, "webhook")).To(Equal(report.CheckOK), r.out)

		By("saying Unknown where RBAC refuses access, and failing: nothing was checked")
		r = kubectlRedlock("check", "-n", ns, "--operator-namespace", opNS, "--as", "mallory")
		Expect(resultOf(r, "leader")).To(Equal(report.CheckUnknown), r.out)
		Expect(resultOf(r, "webhook")).To(Equal(report.CheckUnknown), r.out)
		Expect(resultOf(r, "mastersets")).To(Equal(report.CheckUnknown), r.out)
		Expect(r.err).To(MatchError(ContainSubstring("not every check passed")), "Unknown is not a pass")

		By("failing, not Unknown, where admission refuses the dry-run pod")
		deny := &admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-pods-" + ns},
			Spec: admissionv1.ValidatingAdmissionPolicySpec{
				FailurePolicy:    new(admissionv1.Fail),
				MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{RuleWithOperations: admissionv1.RuleWithOperations{Operations: []admissionv1.OperationType{admissionv1.Create}, Rule: admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}}}},
				Validations:      []admissionv1.Validation{{Expression: "false", Message: "no pods here"}},
			}}
		Expect(k8s.Create(ctx, deny)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, deny))).To(Succeed()) })
		binding := &admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "deny-pods-" + ns},
			Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: deny.Name, ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
				MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}}}}
		Expect(k8s.Create(ctx, binding)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, binding))).To(Succeed()) })
		Eventually(func(g Gomega) {
			r := kubectlRedlock("check", "-n", ns, "--operator-namespace", opNS)
			g.Expect(resultOf(r, "webhook")).To(Equal(report.CheckFailed), r.out)
			g.Expect(r.out).To(ContainSubstring("no pods here"))
		}).Should(Succeed(), "check to fail the webhook once policy %s refuses pods in %s", deny.Name, ns)
	})
})

// serveWebhook runs the operator's mutating webhook for pods of ns only
// (a manager of its own), and returns what stops it and removes its
// configuration.
func serveWebhook(ns string) func() {
	port, err := redistest.FreePort()
	Expect(err).NotTo(HaveOccurred())
	name := "check-" + ns
	url := fmt.Sprintf("https://localhost:%d%s", port, podgate.WebhookPath)
	conf := &admissionv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionv1.MutatingWebhook{{
			Name:                    "gate.pods.redlock.dev",
			ClientConfig:            admissionv1.WebhookClientConfig{URL: &url},
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             new(admissionv1.SideEffectClassNone),
			FailurePolicy:           new(admissionv1.Fail),
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
			Rules: []admissionv1.RuleWithOperations{{
				Operations: []admissionv1.OperationType{admissionv1.Create},
				Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
		}},
	}
	Expect(k8s.Create(ctx, conf)).To(Succeed())
	opts := operator.WebhookOptions{ //nolint:gosec // names, not credentials
		Namespace: ns, ServiceName: "webhook", ExtraDNSNames: []string{"localhost"}, SecretName: "webhook-cert",
		ConfigurationName: name, CertDir: GinkgoT().TempDir(), AgentImage: "redlock-operator:test",
	}
	mgr := env.StartManagerWith(&testenv.Webhook{Port: port, Options: opts})
	return func() {
		mgr.Stop()
		Expect(client.IgnoreNotFound(k8s.Delete(ctx, conf))).To(Succeed())
	}
}
