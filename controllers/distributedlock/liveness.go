package distributedlock

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
)

// Holder liveness (spec.heartbeatTimeout). A holder pod that runs the
// agent renews the lock's heartbeat Lease with its grant ID; this manager
// notes, on its own clock, when it sees each renewal (heartbeats, fed by
// the Lease informer, no reconcile per renewal), and when the holder's
// containers crash-loop (from the pod as the cache shows it at each
// reconcile). A grant whose holder shows neither a renewal nor a stable
// container for the timeout is given up like a shed one: status stops
// showing it (reason HolderUnresponsive), its keys are left to expire and
// released once the shown validity has passed — by then the agent has
// stopped the app — and the pod, marked redlock.dev/unresponsive, is
// skipped from then on (podlock.Choose).
//
// Everything is counted from this manager's own observations: a new
// leader starts the count when it first looks at the grant, so a
// failover only ever delays the verdict.

// heartbeats records when this manager saw each heartbeat Lease renewed,
// per holder identity (grant ID).
type heartbeats struct {
	clock clock.PassiveClock
	mu    sync.Mutex
	seen  map[types.NamespacedName]map[string]time.Time
}

// maxHoldersSeen bounds the identities kept per Lease: the current grant's
// and a few stale writers'.
const maxHoldersSeen = 4

func newHeartbeats(clk clock.PassiveClock) *heartbeats {
	return &heartbeats{clock: clk, seen: map[types.NamespacedName]map[string]time.Time{}}
}

// observe records a version of a Lease (old is nil for one newly listed):
// a new version naming a holder is a renewal by that holder, seen now.
func (b *heartbeats) observe(old, l *coordinationv1.Lease) {
	if l == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return
	}
	if old != nil && old.ResourceVersion == l.ResourceVersion {
		return // a resync, not a write
	}
	key := types.NamespacedName{Namespace: l.Namespace, Name: l.Name}
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.seen[key]
	if m == nil {
		m = map[string]time.Time{}
		b.seen[key] = m
	}
	m[*l.Spec.HolderIdentity] = b.clock.Now()
	for len(m) > maxHoldersSeen {
		oldest := slices.MinFunc(slices.Collect(maps.Keys(m)), func(a, c string) int { return m[a].Compare(m[c]) })
		delete(m, oldest)
	}
}

// forget drops a deleted Lease.
func (b *heartbeats) forget(l *coordinationv1.Lease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.seen, types.NamespacedName{Namespace: l.Namespace, Name: l.Name})
}

// last is when this manager last saw holder renew Lease key (zero: never).
func (b *heartbeats) last(key types.NamespacedName, holder string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seen[key][holder]
}

// handler feeds b from a Lease informer.
func (b *heartbeats) handler() toolscache.ResourceEventHandler {
	lease := func(o any) *coordinationv1.Lease {
		if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			o = t.Obj
		}
		l, _ := o.(*coordinationv1.Lease)
		return l
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { b.observe(nil, lease(o)) },
		UpdateFunc: func(o, n any) { b.observe(lease(o), lease(n)) },
		DeleteFunc: func(o any) {
			if l := lease(o); l != nil {
				b.forget(l)
			}
		},
	}
}

// liveness is what this manager has seen of one grant's holder pod; it
// lives with the grant's held.
type liveness struct {
	// since is when this manager first looked at the grant with its pod
	// running: the heartbeat is counted from then at the earliest.
	since time.Time
	// restarts is the pod's container restarts as last seen.
	restarts int32
	// troubleSince and troubleLast bound the current spell of crashes:
	// first and latest look that found a container down or restarted
	// (zero: none).
	troubleSince, troubleLast time.Time
}

// livenessInputs are what a verdict on a holder's liveness rests on.
type livenessInputs struct {
	Now     time.Time
	Timeout time.Duration
	// Marked: the pod carries the mark for this grant (an earlier verdict,
	// perhaps another manager's, whose status patch did not commit).
	Marked bool
	// Since, LastBeat: when the count started, and the latest renewal seen
	// for this grant (zero: none).
	Since, LastBeat time.Time
	// Down: a container is down now (terminated, or in CrashLoopBackOff);
	// TroubleSince: the start of the current spell of crashes.
	Down         bool
	TroubleSince time.Time
}

// livenessVerdict says why the holder is to be treated as finished ("":
// it is not), and when to look again.
func livenessVerdict(in livenessInputs) (why string, recheck time.Duration) {
	if in.Marked {
		return "the pod is marked " + v1alpha1.UnresponsiveAnnotation + " for this grant", 0
	}
	last := in.Since
	if in.LastBeat.After(last) {
		last = in.LastBeat
	}
	if quiet := in.Now.Sub(last); quiet >= in.Timeout {
		return fmt.Sprintf("no heartbeat seen for %s (heartbeatTimeout %s)", quiet.Round(time.Millisecond), in.Timeout), 0
	}
	recheck = last.Add(in.Timeout).Sub(in.Now)
	if in.Down && !in.TroubleSince.IsZero() {
		if spell := in.Now.Sub(in.TroubleSince); spell >= in.Timeout {
			return fmt.Sprintf("its containers have crash-looped for %s (heartbeatTimeout %s)", spell.Round(time.Millisecond), in.Timeout), 0
		}
		recheck = min(recheck, in.TroubleSince.Add(in.Timeout).Sub(in.Now))
	}
	return "", recheck
}

// observePod updates lv from the holder pod as seen now: a spell of
// crashes starts at the first look that finds a container down or
// restarted, and goes on while looks (at least one per timeout, the
// verdict's recheck) keep finding that.
func (lv *liveness) observePod(pod *corev1.Pod, now time.Time, timeout time.Duration) (down bool) {
	if lv.since.IsZero() {
		lv.since = now
	}
	var restarts int32
	for _, st := range containerStatuses(pod) {
		restarts += st.RestartCount
		if st.State.Terminated != nil || (st.State.Waiting != nil && st.State.Waiting.Reason == "CrashLoopBackOff") {
			down = true
		}
	}
	if down || restarts > lv.restarts {
		if lv.troubleSince.IsZero() || now.Sub(lv.troubleLast) > timeout {
			lv.troubleSince = now
		}
		lv.troubleLast = now
	}
	lv.restarts = restarts
	return down
}

// containerStatuses are the statuses of pod's app containers and of its
// sidecars (restartable init containers, the agent's among them).
func containerStatuses(pod *corev1.Pod) []corev1.ContainerStatus {
	out := slices.Clone(pod.Status.ContainerStatuses)
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			continue
		}
		if i := slices.IndexFunc(pod.Status.InitContainerStatuses, func(s corev1.ContainerStatus) bool { return s.Name == c.Name }); i >= 0 {
			out = append(out, pod.Status.InitContainerStatuses[i])
		}
	}
	return out
}

// checkLiveness judges the liveness of h's holder pod when the lock asks
// for it: why it is to be treated as finished ("": it is not, and a
// recheck is asked for). It applies only to a running pod that runs the
// agent, and only while the lock's heartbeat Lease exists (the agents
// could not renew it otherwise).
func (r *Reconciler) checkLiveness(ctx context.Context, s *scope, h *held) (string, *corev1.Pod, error) {
	lock := s.lock
	timeout := lock.Spec.HeartbeatTimeout
	if timeout == nil || h.pod == nil || r.Pods == nil {
		return "", nil, nil
	}
	pod := &corev1.Pod{}
	if err := r.Pods.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: h.pod.Name}, pod); err != nil {
		return "", nil, client.IgnoreNotFound(err)
	}
	if pod.UID != h.pod.UID || !podagent.Injected(pod) || pod.Status.Phase != corev1.PodRunning {
		return "", nil, nil // not started yet, or not one the verdict applies to: looked at again on its next change
	}
	key := types.NamespacedName{Namespace: lock.Namespace, Name: v1alpha1.HeartbeatLeaseName(lock.Name)}
	if err := r.Get(ctx, key, &coordinationv1.Lease{}); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil, nil
		}
		return "", nil, fmt.Errorf("read heartbeat lease: %w", err)
	}
	lv := &h.liveness
	down := lv.observePod(pod, s.now, timeout.Duration)
	why, recheck := livenessVerdict(livenessInputs{
		Now: s.now, Timeout: timeout.Duration,
		Marked: pod.Annotations[v1alpha1.UnresponsiveAnnotation] == h.grantID,
		Since:  lv.since, LastBeat: r.beats.last(key, h.grantID),
		Down: down, TroubleSince: lv.troubleSince,
	})
	if why == "" {
		s.requeueAfter(recheck + time.Millisecond)
	}
	return why, pod, nil
}

// markUnresponsive marks pod as unresponsive in grant grantID, on the
// version of it read: from then on it keeps nobody from the lock.
func (r *Reconciler) markUnresponsive(ctx context.Context, pod *corev1.Pod, grantID string) error {
	if pod.Annotations[v1alpha1.UnresponsiveAnnotation] == grantID {
		return nil
	}
	base := pod.DeepCopy()
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[v1alpha1.UnresponsiveAnnotation] = grantID
	if err := r.Patch(ctx, pod, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("mark pod %s unresponsive: %w", pod.Name, err)
	}
	return nil
}
