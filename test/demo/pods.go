package demo

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// Workload is a busybox container that reads its fencing token from its
// downward-API file as its first instruction, prints it and keeps it as its
// termination message, then runs script.
func Workload(script string) corev1.PodSpec {
	return corev1.PodSpec{
		TerminationGracePeriodSeconds: new(int64(5)),
		Containers: []corev1.Container{{
			Name: "work", Image: "busybox:local", ImagePullPolicy: corev1.PullNever,
			Command: []string{"/bin/sh", "-c",
				`t=$(cat /etc/lock/fencing-token); echo "token=$t"; echo "$t" > /dev/termination-log; ` + script},
			VolumeMounts: []corev1.VolumeMount{{Name: "lock", MountPath: "/etc/lock"}},
		}},
		Volumes: []corev1.Volume{{Name: "lock", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
			Items: []corev1.DownwardAPIVolumeFile{{Path: "fencing-token", FieldRef: &corev1.ObjectFieldSelector{
				FieldPath: "metadata.annotations['" + v1alpha1.FencingTokenAnnotation + "']",
			}}},
		}}}},
	}
}

// PrintedToken is the token a finished Workload container read from its
// downward-API file first thing and left as its termination message.
func PrintedToken(p *corev1.Pod) (int64, error) {
	if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Terminated == nil {
		return 0, fmt.Errorf("pod %s has not finished", p.Name)
	}
	msg := strings.TrimSpace(p.Status.ContainerStatuses[0].State.Terminated.Message)
	t, err := strconv.ParseInt(msg, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("pod %s left %q: %w", p.Name, msg, err)
	}
	return t, nil
}

// Gated reports whether the pod still carries the lock's scheduling gate.
func Gated(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == v1alpha1.SchedulingGate })
}

// MayRun reports whether pod's container may run now or later: it is
// ungated, not finished, and not every container has terminated (the
// kubelet reports a terminal phase only once the pod is torn down, seconds
// after its containers exited).
func MayRun(p *corev1.Pod) bool {
	if Gated(p) || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Terminated == nil {
			return true
		}
	}
	return len(p.Status.ContainerStatuses) == 0
}

// Ready reports the pod's Ready condition.
func Ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Serves reports whether the Redis server at addr accepts a connection
// and answers (NOAUTH is an answer).
func Serves(ctx context.Context, addr string) bool {
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, MaxRetries: -1, DialerRetries: 1})
	defer func() { _ = c.Close() }()
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err := c.Ping(cctx).Err()
	return err == nil || strings.Contains(err.Error(), "NOAUTH")
}

// AwaitDown polls the Redis server at addr every interval until it stops
// answering, or ctx ends. A killed process may answer for a while after
// the signal (a loaded machine tears a container's processes down late),
// so a member's return counts only once it was seen down.
func AwaitDown(ctx context.Context, addr string, every time.Duration) error {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for Serves(ctx, addr) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s still answers: %w", addr, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// KillContainer SIGKILLs the main process of the pod's first container, as
// a crash would, through the local cluster's containerd (clusterState is
// hack/local-cluster's state directory); the kubelet restarts it. It
// returns the instant just before the signal: the crash was no earlier, so
// a gap measured from it to an instant no earlier than the member's return
// is never shorter than the real one (a loaded machine cannot make a check
// that the member stayed out long enough fail wrongly; it can hide a
// violation no larger than the measuring slack).
func KillContainer(ctx context.Context, clusterState string, p *corev1.Pod) (time.Time, error) {
	if len(p.Status.ContainerStatuses) == 0 {
		return time.Time{}, fmt.Errorf("pod %s has no container yet", p.Name)
	}
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	sock := filepath.Join(clusterState, "containerd", "containerd.sock")
	out, err := exec.CommandContext(ctx, "ctr", "-a", sock, "-n", "k8s.io", "tasks", "ls").CombinedOutput() //nolint:gosec // the local cluster's socket

	if err != nil {
		return time.Time{}, fmt.Errorf("ctr tasks ls: %w: %s", err, out)
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				return time.Time{}, fmt.Errorf("ctr listed pid %q: %w", f[1], err)
			}
			at := time.Now()
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				return time.Time{}, fmt.Errorf("kill %d: %w", pid, err)
			}
			return at, nil
		}
	}
	return time.Time{}, fmt.Errorf("no task for container %s of pod %s", id, p.Name)
}
