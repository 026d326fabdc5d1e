// Package waitlimit enforces how long a pod may wait for a lock or a
// semaphore's slot (spec.waitTimeout, spec.onWaitTimeout, and the pod's
// annotations redlock.dev/wait-timeout and redlock.dev/on-wait-timeout):
// past its limit a waiting pod gets the condition
// redlock.dev/LockWaitTimeout and an event, and, with Fail, a pod that
// waits behind the scheduling gate is set to phase Failed in the same
// write, so that its Job's podFailurePolicy can match the condition.
//
// The pod gate controller enforces it on pods labelled for a lock, the
// semaphore controller on pods waiting for a slot; each owns the
// condition on its own pods.
package waitlimit

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/conditions"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

// EventLockWaitTimeout is the reason of the event on a pod past its wait
// limit.
const EventLockWaitTimeout = "LockWaitTimeout"

// Action is what a pod's wait limit asks for now.
type Action int

// Actions.
const (
	// Nothing: no limit, or not passed yet, or already shown.
	Nothing Action = iota
	// Tell: show the condition True (the pod keeps waiting).
	Tell
	// Fail: set the pod to phase Failed, with the condition.
	Fail
	// Clear: a pod shown past its limit was granted: the condition goes
	// False.
	Clear
)

// Decide is what to do about pod's wait limit at now. granted: the pod
// holds its lock, as far as the caller's view shows. recheck is when to
// look again (0: no need).
func Decide(pod *corev1.Pod, limit podlock.WaitLimit, granted bool, now time.Time) (action Action, recheck time.Duration) {
	shown := conditions.PodTrue(pod, v1alpha1.ConditionLockWaitTimeout)
	switch {
	case granted:
		if shown {
			return Clear, 0
		}
		return Nothing, 0
	case podlock.Finished(pod) || !pod.DeletionTimestamp.IsZero() || pod.Annotations[v1alpha1.FencingTokenAnnotation] != "":
		// Gone, going, or it held a lock: its wait is over (a former
		// holder that lost its lock waits to be granted again; its
		// first wait is what the limit is about).
		return Nothing, 0
	}
	deadline := limit.WaitDeadline(pod)
	switch {
	case deadline.IsZero():
		return Nothing, 0
	case now.Before(deadline):
		return Nothing, deadline.Sub(now)
	case limit.Fail && podlock.GateOf(pod) == podlock.GateScheduling && pod.Spec.RestartPolicy == corev1.RestartPolicyNever:
		// Never ran, and nothing re-creates it in its place but a Job,
		// whose podFailurePolicy decides (a Deployment's or
		// StatefulSet's pod would only be replaced by one at the back of
		// the line): the others keep waiting, told.
		return Fail, 0
	case shown:
		return Nothing, 0
	default:
		return Tell, 0
	}
}

// Enforce carries out what Decide says for pod, which waits for what (a
// lock or a semaphore, for messages), related to object (for the event).
// It returns when to look again. Telling the pod, and setting it Failed,
// are writes conditional on the version of the pod read: a pod changed
// since (granted: its token annotation written; or told already by an
// earlier write the view missed) is looked at again, without a second
// event. stillWaiting, when not nil, is asked just before a pod is set
// Failed, and a false answer (its grant shown after all) leaves it alone.
func Enforce(ctx context.Context, c client.Client, rec events.EventRecorder, pod *corev1.Pod, what string, related client.Object,
	limit podlock.WaitLimit, granted bool, now time.Time, stillWaiting func(context.Context) (bool, error)) (time.Duration, error) {
	action, recheck := Decide(pod, limit, granted, now)
	switch action {
	case Nothing:
		return recheck, nil
	case Clear:
		return 0, conditions.SetPod(ctx, c, pod, v1alpha1.ConditionLockWaitTimeout, corev1.ConditionFalse, v1alpha1.ReasonGranted, "granted after waiting longer than its wait limit", now)
	case Fail:
		if stillWaiting != nil {
			if waits, err := stillWaiting(ctx); err != nil || !waits {
				return time.Second, err
			}
		}
	}
	msg := fmt.Sprintf("waited %s for %s, longer than its wait limit %s", now.Sub(pod.CreationTimestamp.Time).Round(time.Second), what, limit.Timeout)
	note := "Wait"
	if action == Tell {
		msg += "; it keeps waiting"
	} else {
		msg, note = msg+"; set to Failed (onWaitTimeout: Fail)", "Fail"
	}
	if err := write(ctx, c, pod, action == Fail, msg, now); err != nil {
		if apierrors.IsConflict(err) {
			return time.Second, nil // the pod changed: decide again on its new version
		}
		return 0, client.IgnoreNotFound(err)
	}
	rec.Eventf(pod, related, corev1.EventTypeWarning, EventLockWaitTimeout, note, "%s", conditions.Message(msg))
	return 0, nil
}

// write sets the condition True on pod, and with failed its phase Failed,
// in one patch of pods/status conditional on the pod's resourceVersion, so
// that a Job's podFailurePolicy sees the condition when it sees the phase.
func write(ctx context.Context, c client.Client, pod *corev1.Pod, failed bool, msg string, now time.Time) error {
	status := map[string]any{
		"conditions": []map[string]any{{
			"type": v1alpha1.ConditionLockWaitTimeout, "status": corev1.ConditionTrue, "reason": v1alpha1.ReasonWaitTimeout,
			"message": conditions.Message(msg), "lastTransitionTime": now.UTC().Format(time.RFC3339),
		}},
	}
	if failed {
		status["phase"], status["reason"], status["message"] = corev1.PodFailed, EventLockWaitTimeout, conditions.Message(msg)
	}
	patch := map[string]any{"metadata": map[string]any{"resourceVersion": pod.ResourceVersion}, "status": status}
	body, err := json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("encode the patch: %w", err)
	}
	if err := c.Status().Patch(ctx, pod, client.RawPatch(types.StrategicMergePatchType, body)); err != nil {
		return fmt.Errorf("show the pod's wait past its limit (failed: %v): %w", failed, err)
	}
	return nil
}
