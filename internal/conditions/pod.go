package conditions

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
