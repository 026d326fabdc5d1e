package podgate_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/podgate"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/internal/operator"
)

func freePort() int {
	port, err := redistest.FreePort()
	Expect(err).NotTo(HaveOccurred())
	return port
}

var _ = Describe("The gate webhook", Ordered, func() {
	const configName = "redlock-test-gate-webhook"
	var (
		mgr  *testenv.Manager
		ns   string
		conf *admissionv1.MutatingWebhookConfiguration
	)
	BeforeAll(func() {
		ns = env.NewNamespace()
		port := freePort()
		By("installing the webhook configuration with no CA bundle, and the empty certificate Secret")
		fail, none := admissionv1.Fail, admissionv1.SideEffectClassNone
		url := fmt.Sprintf("https://localhost:%d%s", port, podgate.WebhookPath)
		conf = &admissionv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: configName},
			Webhooks: []admissionv1.MutatingWebhook{{
				Name:                    "gate.pods.redlock.dev",
				ClientConfig:            admissionv1.WebhookClientConfig{URL: &url},
				FailurePolicy:           &fail,
				SideEffects:             &none,
				AdmissionReviewVersions: []string{"v1"},
				ObjectSelector:          &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: v1alpha1.LockLabel, Operator: metav1.LabelSelectorOpExists}}},
				NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
				Rules: []admissionv1.RuleWithOperations{{
					Operations: []admissionv1.OperationType{admissionv1.Create},
					Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
				}},
			}},
		}
		Expect(k8s.Create(suiteCtx, conf)).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(suiteCtx, conf) })
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "webhook-cert"}}
		Expect(k8s.Create(suiteCtx, secret)).To(Succeed())

		opts := operator.WebhookOptions{ //nolint:gosec // names, not credentials
			Namespace: ns, ServiceName: "webhook", ExtraDNSNames: []string{"localhost"}, SecretName: "webhook-cert",
			ConfigurationName: configName, CertDir: GinkgoT().TempDir(), AgentImage: "redlock-operator:test",
		}
		mgr = env.StartManagerWith(&testenv.Webhook{Port: port, Options: opts})
	})
	AfterAll(func() { mgr.Stop() })

	caBundle := func() []byte {
		cur := &admissionv1.MutatingWebhookConfiguration{}
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Name: configName}, cur)).To(Succeed())
		return cur.Webhooks[0].ClientConfig.CABundle
	}
	create := func(p *corev1.Pod) *corev1.Pod {
		Eventually(func() error { return k8s.Create(suiteCtx, p) }).Should(Succeed(), "webhook %s to admit pod %s/%s once its certificate is in place", configName, p.Namespace, p.Name)
		return getPod(p)
	}
	plain := func(name string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "work", Image: "busybox"}}},
		}
	}

	It("gates labelled pods with the gate they ask for and leaves other pods alone", func() {
		Eventually(caBundle).ShouldNot(BeEmpty(), "the rotator to inject its CA into webhook %s", configName)
		p := create(plain("labelled", map[string]string{v1alpha1.LockLabel: "some-lock"}))
		Expect(gated(p)).To(BeTrue())
		Expect(p.Spec.ReadinessGates).To(BeEmpty())

		r := create(plain("readiness", map[string]string{v1alpha1.LockLabel: "some-lock", v1alpha1.GateModeLabel: v1alpha1.GateModeReadiness}))
		Expect(gated(r)).To(BeFalse())
		Expect(r.Spec.ReadinessGates).To(ContainElement(corev1.PodReadinessGate{ConditionType: v1alpha1.ReadinessGate}))

		u := create(plain("unlabelled", nil))
		Expect(gated(u)).To(BeFalse())
		Expect(u.Spec.ReadinessGates).To(BeEmpty())
	})

	It("adds the agent to a pod that asks for it, and refuses a pod whose agent annotations cannot be followed", func() {
		Eventually(caBundle).ShouldNot(BeEmpty(), "the rotator to inject its CA into webhook %s", configName)
		By("creating a pod with redlock.dev/agent: run")
		a := plain("agent-run", map[string]string{v1alpha1.LockLabel: "some-lock", v1alpha1.GateModeLabel: v1alpha1.GateModeHolderLabel})
		a.Annotations = map[string]string{v1alpha1.AgentAnnotation: v1alpha1.AgentRun, v1alpha1.AgentGraceAnnotation: "2s"}
		a.Spec.Containers[0].Command = []string{"sh", "-c", "exec app"}
		a = create(a)
		Expect(a.Spec.InitContainers).To(ContainElement(HaveField("Image", "redlock-operator:test")), "pod %s copies the agent from the operator's image", a.Name)
		Expect(a.Spec.Containers[0].Command).To(HaveExactElements(
			"/redlock/bin/agent", "run", "--state-dir=/redlock/state", "--lock=$(REDLOCK_LOCK)", "--namespace=$(REDLOCK_POD_NAMESPACE)",
			"--pod-name=$(REDLOCK_POD_NAME)", "--pod-uid=$(REDLOCK_POD_UID)", "--grace=2s", "--"), "pod %s starts its app through the agent", a.Name)
		Expect(a.Spec.Containers[0].Args).To(HaveExactElements("sh", "-c", "exec app"))
		Expect(gated(a)).To(BeFalse(), "label mode adds no gate")

		By("creating a pod with redlock.dev/agent: watch and the scheduling gate")
		w := plain("agent-watch", map[string]string{v1alpha1.LockLabel: "some-lock"})
		w.Annotations = map[string]string{v1alpha1.AgentAnnotation: v1alpha1.AgentWatch}
		w = create(w)
		Expect(gated(w)).To(BeTrue())
		Expect(w.Spec.InitContainers).To(ContainElement(HaveField("Name", "redlock-agent")), "pod %s has the agent as a native sidecar", w.Name)

		By("creating a pod whose container has no command")
		bad := plain("agent-no-command", map[string]string{v1alpha1.LockLabel: "some-lock"})
		bad.Annotations = map[string]string{v1alpha1.AgentAnnotation: v1alpha1.AgentRun}
		err := k8s.Create(suiteCtx, bad)
		Expect(err).To(MatchError(ContainSubstring(`container "work" has no command`)), "the API server refuses pod %s with the reason", bad.Name)
		Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(bad), &corev1.Pod{})).To(MatchError(ContainSubstring("not found")))
	})

	It("keeps serving after its certificate is rotated", func() {
		before := caBundle()
		By("emptying the Secret, as an expired or lost certificate would")
		secret := &corev1.Secret{}
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "webhook-cert"}, secret)).To(Succeed())
		secret.Data = nil
		Expect(k8s.Update(suiteCtx, secret)).To(Succeed())
		Eventually(caBundle, 30*time.Second).ShouldNot(Equal(before), "a new CA to be injected into webhook %s", configName)
		Eventually(func(g Gomega) {
			p := plain(fmt.Sprintf("after-rotation-%d", time.Now().UnixNano()), map[string]string{v1alpha1.LockLabel: "some-lock"})
			g.Expect(k8s.Create(suiteCtx, p)).To(Succeed(), "creation of pod %s after the rotation", p.Name)
			g.Expect(gated(getPod(p))).To(BeTrue(), "gate of pod %s", p.Name)
		}, 30*time.Second).Should(Succeed(), "webhook %s to gate a pod in %s after its certificate is rotated", configName, ns)
	})
})
