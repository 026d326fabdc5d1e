// Package podsim plays the scheduler and the kubelet for pods on envtest,
// which has neither: it builds gated pods, binds them to a node and writes
// the status a kubelet would.
package podsim

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// Gated returns a pod with the given labels, one container "work", waiting
// behind the operator's scheduling gate (what the webhook adds).
func Gated(ns, name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			Containers:      []corev1.Container{{Name: "work", Image: "busybox"}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGate}},
			RestartPolicy:   corev1.RestartPolicyNever,
		},
	}
}

// Run binds pod to node and reports its container running, with the
// kubelet's own conditions.
func Run(ctx context.Context, c client.Client, pod *corev1.Pod, node string) error {
	if err := c.SubResource("binding").Create(ctx, pod, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}); err != nil {
		return fmt.Errorf("bind pod %s to %s: %w", pod.Name, node, err)
	}
	return updateStatus(ctx, c, pod, func(cur *corev1.Pod) {
		cur.Status.Phase = corev1.PodRunning
		cur.Status.Conditions = append(cur.Status.Conditions, corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
		cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "work", Image: "busybox", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	})
}

// Finish reports pod's container exited with code and the pod finished
// (Succeeded for 0, Failed otherwise).
func Finish(ctx context.Context, c client.Client, pod *corev1.Pod, code int32) error {
	return updateStatus(ctx, c, pod, func(cur *corev1.Pod) {
		cur.Status.Phase = corev1.PodSucceeded
		if code != 0 {
			cur.Status.Phase = corev1.PodFailed
		}
		cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "work", Image: "busybox", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}}
	})
}

// updateStatus applies change to the current pod's status, again on a
// conflict (the operator patches pods too).
func updateStatus(ctx context.Context, c client.Client, pod *corev1.Pod, change func(*corev1.Pod)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &corev1.Pod{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(pod), cur); err != nil {
			return err
		}
		change(cur)
		return c.Status().Update(ctx, cur)
	})
}

// NodeReady creates the node name when it does not exist and reports its
// Ready condition status, as its kubelet would.
func NodeReady(ctx context.Context, c client.Client, name string, status corev1.ConditionStatus) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(node), cur); err != nil {
			return err
		}
		cur.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		return c.Status().Update(ctx, cur)
	})
}
