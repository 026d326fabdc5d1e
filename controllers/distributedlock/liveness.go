package distributedlock

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Holder liveness (spec.heartbeatTimeout). This manager notes, on its own
// clock, each renewal of the LockHeartbeat by the grant it watches
// (heartbeats) and the holder's container crashes (observePod). A holder
// with neither a renewal nor a stable container for the timeout is given
// up like a shed grant: the pod is marked redlock.dev/unresponsive, status
// stops showing the grant (HolderUnresponsive), and its keys go after the
// shown validity. The mark lets the lock pass the pod only once its last
// grant can no longer be acted on (markPassable). A mark on a holder this
// manager judges alive is removed.
// The reasoning: docs/design/grant-life.md#an-unresponsive-holder.

// heartbeats records when this manager last saw each lock's heartbeat
// renewed by the grant it watches there.
type heartbeats struct {
	clock clock.PassiveClock
	// stopped is told of a LockHeartbeat whose stoppedGrant or
	// releasedGrant changed (an agent's or a holder's word: terminating.go,
	// end.go); nil: nobody.
	stopped func(types.NamespacedName)
	mu      sync.Mutex
	seen    map[types.NamespacedName]*beat
}

// beat is what heartbeats keeps of one LockHeartbeat.
type beat struct {
	grant string    // the grant watched (watch)
	at    time.Time // when a renewal by it was last seen (zero: none yet)
}

func newHeartbeats(clk clock.PassiveClock) *heartbeats {
	return &heartbeats{clock: clk, seen: map[types.NamespacedName]*beat{}}
}

// watch starts counting the renewals of grant on lock key, and returns
// when the latest was seen (zero: none since it started). Writes by other
// grants (a former holder's late renewal) are not counted, nor remembered.
func (b *heartbeats) watch(key types.NamespacedName, grant string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.seen[key]; e != nil && e.grant == grant {
		return e.at
	}
	b.seen[key] = &beat{grant: grant}
	return time.Time{}
}

// observe records a version of a LockHeartbeat (old is nil for one newly
// listed): a new version naming the grant watched is its renewal, seen
// now.
func (b *heartbeats) observe(old, hb *v1alpha1.LockHeartbeat) {
	if hb == nil || (old != nil && old.ResourceVersion == hb.ResourceVersion) {
		return // a resync, not a write
	}
	said := func(hb *v1alpha1.LockHeartbeat) [2]string {
		return [2]string{hb.Spec.StoppedGrant, hb.Spec.ReleasedGrant}
	}
	if b.stopped != nil && said(hb) != [2]string{} && (old == nil || said(old) != said(hb)) {
		b.stopped(types.NamespacedName{Namespace: hb.Namespace, Name: hb.Name})
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.seen[types.NamespacedName{Namespace: hb.Namespace, Name: hb.Name}]; e != nil && e.grant != "" && e.grant == hb.Spec.HolderIdentity {
		e.at = b.clock.Now()
	}
}

// forget drops what is kept of lock key.
func (b *heartbeats) forget(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.seen, key)
}

// handler feeds b from a LockHeartbeat informer.
func (b *heartbeats) handler() toolscache.ResourceEventHandler {
	heartbeat := func(o any) *v1alpha1.LockHeartbeat {
		if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			o = t.Obj
		}
		hb, _ := o.(*v1alpha1.LockHeartbeat)
		return hb
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { b.observe(nil, heartbeat(o)) },
		UpdateFunc: func(o, n any) { b.observe(heartbeat(o), heartbeat(n)) },
	}
}

// livenessInputs are what a verdict on a holder's liveness rests on.
type livenessInputs struct {
	Now     time.Time
	Timeout time.Duration
	// Since, LastBeat: when the count started, and the latest renewal seen
	// for this grant (zero: none).
	Since, LastBeat time.Time
	// Down: a container is down now (exited to be restarted, or in
	// CrashLoopBackOff); TroubleSince: the start of the current spell of
	// crashes.
	Down         bool
	TroubleSince time.Time
	// Limit names the field Timeout comes from, in the verdict's words
	// ("": heartbeatTimeout).
	Limit string
}

// livenessVerdict says why the holder is to be treated as finished ("":
// it is not), and when to look again.
func livenessVerdict(in livenessInputs) (why string, recheck time.Duration) {
	limit := in.Limit
	if limit == "" {
		limit = "heartbeatTimeout"
	}
	last := in.Since
	if in.LastBeat.After(last) {
		last = in.LastBeat
	}
	if quiet := in.Now.Sub(last); quiet >= in.Timeout {
		return fmt.Sprintf("no heartbeat seen for %s (%s %s)", quiet.Round(time.Millisecond), limit, in.Timeout), 0
	}
	recheck = last.Add(in.Timeout).Sub(in.Now)
	if in.Down && !in.TroubleSince.IsZero() {
		if spell := in.Now.Sub(in.TroubleSince); spell >= in.Timeout {
			return fmt.Sprintf("its containers have crash-looped for %s (%s %s)", spell.Round(time.Millisecond), limit, in.Timeout), 0
		}
		recheck = min(recheck, in.TroubleSince.Add(in.Timeout).Sub(in.Now))
	}
	return "", recheck
}

// observePod updates lv from the holder pod as seen now, counting with
// timeout, and reports whether a container is down now. A spell of
// crashes starts at the first look that finds a container down or
// restarted since the look before, and goes on while looks (at least one
// per timeout: the verdict's recheck) keep finding that. The first look,
// and a new timeout, start the count afresh: restarts from before count
// for nothing.
func observePod(lv *grants.Liveness, pod *corev1.Pod, now time.Time, timeout time.Duration) (down bool) {
	var restarts int32
	for _, st := range containerStatuses(pod) {
		restarts += st.RestartCount
		if t := st.State.Terminated; (t != nil && podlock.WillRestart(pod, t.ExitCode)) ||
			(st.State.Waiting != nil && st.State.Waiting.Reason == "CrashLoopBackOff") {
			down = true
		}
	}
	if lv.Since.IsZero() || lv.Timeout != timeout {
		*lv = grants.Liveness{Since: now, Timeout: timeout, Restarts: restarts}
	}
	if down || restarts > lv.Restarts {
		if lv.TroubleSince.IsZero() || now.Sub(lv.TroubleLast) > timeout {
			lv.TroubleSince = now
		}
		lv.TroubleLast = now
	}
	lv.Restarts = restarts
	return down
}

// containerStatuses are the statuses of pod's app containers and of its
// sidecars (restartable init containers).
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
// recheck is asked for). It judges only a running pod whose app the agent
// runs (one being deleted on its heartbeat only), and only while the
// lock's LockHeartbeat exists (the agents could not renew it otherwise).
func (r *Reconciler) checkLiveness(ctx context.Context, s *scope, h *grants.Grant) (string, *corev1.Pod, error) {
	lock := s.lock
	timeout := lock.Spec.HeartbeatTimeout
	if timeout == nil || h.Pod == nil || r.Pods == nil {
		return "", nil, nil
	}
	pod := &corev1.Pod{}
	if err := r.Pods.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: h.Pod.Name}, pod); err != nil {
		return "", nil, client.IgnoreNotFound(err)
	}
	if pod.UID != h.Pod.UID || !podagent.RunsApp(pod) || pod.Status.Phase != corev1.PodRunning {
		// Not started yet, or not one the verdict applies to: looked at
		// again on its next change.
		return "", nil, nil
	}
	key := client.ObjectKeyFromObject(lock)
	switch hb, err := r.heartbeat(ctx, s); {
	case err != nil:
		return "", nil, err
	case hb == nil:
		s.requeueAfter(timeout.Duration) // not made yet, or deleted: nothing to count
		return "", nil, nil
	}
	lv := &h.Liveness
	down := observePod(lv, pod, s.now, timeout.Duration)
	if !pod.DeletionTimestamp.IsZero() {
		// Stopping: its containers end for good, which is no crash. Its
		// heartbeat still counts (a pod on a node that stopped reporting
		// stays Terminating for ever).
		down, lv.TroubleSince = false, time.Time{}
	}
	why, recheck := livenessVerdict(livenessInputs{
		Now: s.now, Timeout: timeout.Duration,
		Since: lv.Since, LastBeat: r.beats.watch(key, h.ID),
		Down: down, TroubleSince: lv.TroubleSince,
	})
	logf.FromContext(ctx).V(1).Info("holder liveness", "pod", pod.Name, "down", down, "since", lv.Since, "troubleSince", lv.TroubleSince, "verdict", why, "recheck", recheck)
	if why != "" {
		return why, pod, nil
	}
	s.requeueAfter(recheck + time.Millisecond)
	if pod.Annotations[v1alpha1.UnresponsiveAnnotation] != "" {
		// Marked in an earlier grant, or by a manager whose verdict did
		// not commit (a deposed leader): alive by this one's count.
		return "", nil, r.setMark(ctx, pod, "")
	}
	return "", nil, nil
}

// markPassable returns whether a pod marked unresponsive may be passed
// over, by status st of a lock with ttl at now: its last grant can no
// longer be acted on. The pod of the last grant status committed is
// passable once status has shown no holder for the ttl and the drift
// allowance (any validity it showed of that grant ended by then: it was
// at most a ttl past a write made before releasedAt). Any other marked
// pod held the lock before someone was granted it since: that grant came
// only once this pod kept nobody waiting. On a lock that never granted
// (a new object under an old key), no marked pod is passable.
func markPassable(st v1alpha1.DistributedLockStatus, ttl time.Duration, now time.Time) func(*corev1.Pod) bool {
	at := lastGrantSettlesAt(st, ttl)
	lastSettled := !at.IsZero() && !now.Before(at)
	return func(p *corev1.Pod) bool {
		if last := st.LastHolderPod; last != nil && podlock.Is(p, last) {
			return lastSettled
		}
		return st.GrantID != ""
	}
}

// lastGrantSettlesAt is when the last grant status showed can no longer
// be acted on: the ttl and the drift allowance after status stopped
// showing it (zero while status shows a holder, or no release).
func lastGrantSettlesAt(st v1alpha1.DistributedLockStatus, ttl time.Duration) time.Time {
	if st.Holder != nil || st.ReleasedAt == nil {
		return time.Time{}
	}
	return st.ReleasedAt.Add(ttl + redlock.Drift(ttl))
}

// setMark marks pod as unresponsive in grant grantID ("": removes the
// mark), on the version of it read (podlock.Choose, markPassable).
func (r *Reconciler) setMark(ctx context.Context, pod *corev1.Pod, grantID string) error {
	if pod.Annotations[v1alpha1.UnresponsiveAnnotation] == grantID {
		return nil
	}
	base := pod.DeepCopy()
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	if grantID == "" {
		delete(pod.Annotations, v1alpha1.UnresponsiveAnnotation)
	} else {
		pod.Annotations[v1alpha1.UnresponsiveAnnotation] = grantID
	}
	if err := r.Patch(ctx, pod, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("mark pod %s unresponsive (%q): %w", pod.Name, grantID, err)
	}
	return nil
}

// lastMarkPassableAt is when the pod of the last grant status committed,
// if pods show it marked unresponsive, becomes passable (markPassable);
// zero if it is not marked, or status shows a holder or no release.
func lastMarkPassableAt(st v1alpha1.DistributedLockStatus, ttl time.Duration, pods []*corev1.Pod) time.Time {
	if st.LastHolderPod == nil || !slices.ContainsFunc(pods, func(p *corev1.Pod) bool { return podlock.Is(p, st.LastHolderPod) && podlock.Unresponsive(p) }) {
		return time.Time{}
	}
	return lastGrantSettlesAt(st, ttl)
}
