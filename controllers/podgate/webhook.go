package podgate

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

// WebhookPath is where the mutating webhook that gates labelled pods is
// served.
const WebhookPath = "/mutate-v1-pod-lock-gate"

// +kubebuilder:webhook:path=/mutate-v1-pod-lock-gate,mutating=true,failurePolicy=fail,sideEffects=None,groups="",resources=pods,verbs=create,versions=v1,name=gate.pods.redlock.dev,admissionReviewVersions=v1,reinvocationPolicy=IfNeeded

// Gater is the mutating admission webhook that makes a label enough: a pod
// created with the label redlock.dev/lock and neither gate gets the
// scheduling gate (or, with redlock.dev/gate: readiness, the readiness
// gate). Both gates can only be set at creation. Pods that carry a gate
// already are left as they are; so is every pod without the label (the
// webhook configuration's objectSelector keeps them from being sent), and
// every pod of a namespace the operator does not watch: nobody would ever
// remove its gate.
type Gater struct {
	Decoder admission.Decoder
	// Namespaces the operator watches; empty: all.
	Namespaces []string
}

// Handle implements admission.Handler.
func (g *Gater) Handle(_ context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	if err := g.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if pod.Labels[v1alpha1.LockLabel] == "" || podlock.GateOf(pod) != podlock.GateNone {
		return admission.Allowed("nothing to add")
	}
	if len(g.Namespaces) > 0 && !slices.Contains(g.Namespaces, req.Namespace) {
		return admission.Allowed("namespace not watched").WithWarnings(fmt.Sprintf(
			"redlock-operator does not watch namespace %q: the pod is not gated and will not get lock %q", req.Namespace, pod.Labels[v1alpha1.LockLabel]))
	}
	if pod.Labels[v1alpha1.GateModeLabel] == v1alpha1.GateModeReadiness {
		pod.Spec.ReadinessGates = append(pod.Spec.ReadinessGates, corev1.PodReadinessGate{ConditionType: v1alpha1.ReadinessGate})
	} else {
		if slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == v1alpha1.SchedulingGate }) {
			return admission.Allowed("gated")
		}
		pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: v1alpha1.SchedulingGate})
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, raw)
}
