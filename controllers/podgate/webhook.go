package podgate

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

// WebhookPath is where the mutating webhook that gates labelled pods is
// served.
const WebhookPath = "/mutate-v1-pod-lock-gate"

// +kubebuilder:webhook:path=/mutate-v1-pod-lock-gate,mutating=true,failurePolicy=fail,sideEffects=None,groups="",resources=pods,verbs=create,versions=v1,name=gate.pods.redlock.dev,admissionReviewVersions=v1,reinvocationPolicy=IfNeeded,timeoutSeconds=10
// +kubebuilder:webhook:path=/mutate-v1-pod-lock-gate,mutating=true,failurePolicy=fail,sideEffects=None,groups="",resources=pods,verbs=create,versions=v1,name=semaphore-gate.pods.redlock.dev,admissionReviewVersions=v1,reinvocationPolicy=IfNeeded,timeoutSeconds=10

// Gater is the mutating admission webhook that makes a label enough: a pod
// created with the label redlock.dev/lock (or redlock.dev/semaphore: the
// webhook configuration has one entry for each, with an objectSelector
// each) and neither gate gets the scheduling gate (or, with
// redlock.dev/gate: readiness, the readiness gate). Both gates can only be set at creation. Pods that carry a gate
// already are left as they are; so is every pod without the label (the
// webhook configuration's objectSelector keeps them from being sent), and
// every pod of a namespace the operator does not watch: nobody would ever
// remove its gate. A pod annotated redlock.dev/agent also gets the in-pod
// agent (internal/podagent), or is refused with the reason when the
// annotations cannot be followed.
type Gater struct {
	Decoder admission.Decoder
	// Namespaces the operator watches; empty: all.
	Namespaces []string
	// Agent is how the in-pod agent is added to a pod that asks for it
	// (redlock.dev/agent).
	Agent podagent.Options
	// Locks reads a pod's lock, to warn when its agent's timing does not
	// fit the lock's ttl; nil: no such warning.
	Locks client.Reader
}

// Handle implements admission.Handler.
func (g *Gater) Handle(ctx context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	if err := g.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	what := requested(pod)
	if what == "" {
		return admission.Allowed("nothing to add")
	}
	if problem := podlock.AnnotationProblem(pod); problem != "" {
		return admission.Denied(problem)
	}
	if pod.Labels[v1alpha1.LockLabel] == "" {
		if problem := podlock.SemaphoreProblem(pod); problem != "" {
			return admission.Denied(problem)
		}
	}
	if len(g.Namespaces) > 0 && !slices.Contains(g.Namespaces, req.Namespace) {
		if podagent.Wanted(pod) {
			return admission.Denied(fmt.Sprintf("redlock-operator does not watch namespace %q: the pod asks for the agent (%s), which would never see %s granted",
				req.Namespace, v1alpha1.AgentAnnotation, what))
		}
		return admission.Allowed("namespace not watched").WithWarnings(fmt.Sprintf(
			"redlock-operator does not watch namespace %q: the pod gets no gate from it and will never be granted %s", req.Namespace, what))
	}
	gated := addGate(pod)
	agent, err := podagent.Inject(pod, g.Agent)
	if err != nil {
		return admission.Denied(err.Error())
	}
	if !gated && !agent {
		return admission.Allowed("nothing to add")
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	resp := admission.PatchResponseFromRaw(req.Object.Raw, raw)
	if agent {
		resp = resp.WithWarnings(g.leadWarnings(ctx, req.Namespace, pod)...)
	}
	return resp
}

// requested names what pod's labels request ("lock x", "semaphore y"),
// or "" when they request nothing.
func requested(pod *corev1.Pod) string {
	if name := pod.Labels[v1alpha1.LockLabel]; name != "" {
		return fmt.Sprintf("lock %q", name)
	}
	if name := pod.Labels[v1alpha1.SemaphoreLabel]; name != "" {
		return fmt.Sprintf("semaphore %q", name)
	}
	return ""
}

// leadWarnings warns when the pod's agent would stop its app before every
// refresh of its lock's validity (the lock read from the cache; none when
// it is not there yet).
func (g *Gater) leadWarnings(ctx context.Context, namespace string, pod *corev1.Pod) []string {
	if g.Locks == nil || pod.Labels[v1alpha1.LockLabel] == "" {
		return nil
	}
	var l v1alpha1.DistributedLock
	if err := g.Locks.Get(ctx, types.NamespacedName{Namespace: namespace, Name: pod.Labels[v1alpha1.LockLabel]}, &l); err != nil {
		return nil
	}
	grace, skew := podagent.Timing(pod)
	if !podagent.LeadShort(l.Spec.TTL.Duration, grace, skew) {
		return nil
	}
	return []string{fmt.Sprintf("the agent's grace (%v) and skew allowance (%v) reach past a tenth of lock %q's ttl (%v): the agent will stop the app before the validity is refreshed; set %s lower, or raise the ttl",
		grace, skew, l.Name, l.Spec.TTL.Duration, v1alpha1.AgentGraceAnnotation)}
}

// addGate adds the gate pod's labels ask for, unless it carries one, and
// reports whether it did.
func addGate(pod *corev1.Pod) bool {
	if podlock.GateOf(pod) != podlock.GateNone {
		return false
	}
	if pod.Labels[v1alpha1.GateModeLabel] == v1alpha1.GateModeReadiness {
		pod.Spec.ReadinessGates = append(pod.Spec.ReadinessGates, corev1.PodReadinessGate{ConditionType: v1alpha1.ReadinessGate})
	} else {
		pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: v1alpha1.SchedulingGate})
	}
	return true
}
