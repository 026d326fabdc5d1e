package conditions

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// PodHas reports whether pod shows the condition typ with status and
// reason.
func PodHas(pod *corev1.Pod, typ string, status corev1.ConditionStatus, reason string) bool {
	for _, c := range pod.Status.Conditions {
		if string(c.Type) == typ && c.Status == status && c.Reason == reason {
			return true
		}
	}
	return false
}

// PodTrue reports whether pod shows the condition typ True.
func PodTrue(pod *corev1.Pod, typ string) bool {
	for _, c := range pod.Status.Conditions {
		if string(c.Type) == typ && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// SetPod sets the condition typ of pod (status, reason, message, the
// transition at now) with a strategic merge patch of pods/status that
// carries only that condition, so that the kubelet's conditions are never
// touched. A condition already shown with that status and reason is left
// alone. A pod gone is no error.
func SetPod(ctx context.Context, c client.Client, pod *corev1.Pod, typ string, status corev1.ConditionStatus, reason, msg string, now time.Time) error {
	if PodHas(pod, typ, status, reason) {
		return nil
	}
	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q,"reason":%q,"message":%q,"lastTransitionTime":%q}]}}`,
		typ, status, reason, Message(msg), now.UTC().Format(time.RFC3339))
	if err := c.Status().Patch(ctx, pod, client.RawPatch(types.StrategicMergePatchType, []byte(patch))); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("set the pod condition %s: %w", typ, err))
	}
	return nil
}

// WithdrawPod turns pod's condition typ False (reason, msg, at now) when
// it shows it True, and leaves it alone otherwise.
func WithdrawPod(ctx context.Context, c client.Client, pod *corev1.Pod, typ, reason, msg string, now time.Time) error {
	if !PodTrue(pod, typ) {
		return nil
	}
	return SetPod(ctx, c, pod, typ, corev1.ConditionFalse, reason, msg, now)
}

// ReportProblem records on pod why it cannot take part: the annotation
// redlock.dev/problem, and one event (reason, action) per new problem; a
// problem of "" removes the annotation. pod is updated in place.
func ReportProblem(ctx context.Context, c client.Client, rec events.EventRecorder, pod *corev1.Pod, reason, action, problem string) error {
	if pod.Annotations[v1alpha1.ProblemAnnotation] == problem {
		return nil
	}
	base := pod.DeepCopy()
	if problem == "" {
		delete(pod.Annotations, v1alpha1.ProblemAnnotation)
	} else {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[v1alpha1.ProblemAnnotation] = problem
	}
	if err := c.Patch(ctx, pod, client.MergeFrom(base)); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("annotate pod %s: %w", pod.Name, err))
	}
	if problem != "" {
		rec.Eventf(pod, nil, corev1.EventTypeWarning, reason, action, "%s", Message(problem))
	}
	return nil
}
