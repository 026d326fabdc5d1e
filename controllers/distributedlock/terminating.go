package distributedlock

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

// A holder pod being deleted whose app the agent runs hands the lock over
// on its agent's word. Status stops showing its grant (HolderTerminating),
// and its keys stay. The agent stops the app and every other process in
// its container, then writes the grant ID to the LockHeartbeat's
// spec.stoppedGrant. That word counts as the pod's end (saidStopped): the
// keys are released (settleStopped) and the next pod is granted at once.
// Without the word, the keys go when the kubelet reports the containers
// stopped, or expire with the ttl.
// The reasoning: docs/design/grant-life.md#a-holder-pod-being-deleted-the-agents-word.

// afterDeletions sees to the pod of the last grant when it is being
// deleted: its agent's word read, the grant's keys released once it can
// no longer act on it (settleStopped), the pod marked on a lock with a
// heartbeat timeout (markDeleted). It returns pods without the pod whose
// agent said it stopped, which takes no part any more, as if it had
// ended.
func (r *Reconciler) afterDeletions(ctx context.Context, s *scope, pods []*corev1.Pod) ([]*corev1.Pod, error) {
	lock := s.lock
	word, err := r.stoppedWord(ctx, s, pods)
	if err != nil {
		return nil, err
	}
	said := func(p *corev1.Pod) bool { return saidStopped(lock.Status, word, lock.RedisKey(), p) }
	r.settleStopped(ctx, s, pods, said)
	if err := r.markDeleted(ctx, lock, pods); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(slices.Clone(pods), said), nil
}

// holderTerminating reports whether h's holder pod, as the cache shows it,
// is being deleted, may still run, and its agent's word would count
// (wordCounts): its grant is to be handed over on that word.
func (r *Reconciler) holderTerminating(ctx context.Context, s *scope, h *grants.Grant) (bool, error) {
	if h.Pod == nil || r.Pods == nil {
		return false, nil
	}
	pod := &corev1.Pod{}
	if err := r.Pods.Get(ctx, types.NamespacedName{Namespace: s.lock.Namespace, Name: h.Pod.Name}, pod); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return pod.UID == h.Pod.UID && !pod.DeletionTimestamp.IsZero() && wordCounts(pod) && !podlock.Ended(pod), nil
}

// wordCounts reports whether the agent's word can stand for all of pod:
// its app runs through the agent, and nothing else in the pod could act
// on the grant (podagent.Sole: the pod's only container, no sidecar nor
// ephemeral container, a PID namespace of its own, so that the agent is
// its first process). Only for such a pod is its grant hidden at its
// deletion: for any other, the lock waits for the kubelet's report, and
// the app keeps its grant, and the pod's whole termination grace period,
// until then.
func wordCounts(pod *corev1.Pod) bool { return podagent.RunsApp(pod) && podagent.Sole(pod) }

// hideForDeletion stops showing h's grant because its pod is being deleted
// (step 1 above): given up like a shed grant, and remembered until its
// keys are released.
func (r *Reconciler) hideForDeletion(s *scope, h *grants.Grant) {
	r.shedGrant(s, h, endTerminating,
		"its pod is being deleted: the grant is released once its agent says the app stopped, or its containers have stopped")
	lock := s.lock
	s.afterCommit = append(s.afterCommit, func(context.Context) { r.keys.stopping(lock, h) })
}

// markDeleted marks the pod of the last grant unresponsive (as a holder
// given up for its silence is) on a lock that sets heartbeatTimeout, once
// status no longer shows that grant, and the pod is being deleted, may
// still run and its agent could stop the app (wordCounts), however the
// grant ended (hidden for the deletion, shed, lost). A pod being deleted
// on a node that stopped reporting never ends, nor does its agent's word
// come: the mark lets the lock pass it once its last grant can no longer
// be acted on (markPassable), as holder liveness would have done had the
// grant stayed shown. A merge patch of the one annotation, with the pod's
// UID as precondition: the kubelet and the pod gate write the pod too as
// it goes, and a pod being deleted never comes back.
func (r *Reconciler) markDeleted(ctx context.Context, lock *v1alpha1.DistributedLock, pods []*corev1.Pod) error {
	st := lock.Status
	if lock.Spec.HeartbeatTimeout == nil || st.Holder != nil || st.GrantID == "" || st.LastHolderPod == nil {
		return nil
	}
	i := slices.IndexFunc(pods, func(p *corev1.Pod) bool { return podlock.Is(p, st.LastHolderPod) })
	if i < 0 {
		return nil
	}
	pod := pods[i]
	if pod.DeletionTimestamp.IsZero() || !wordCounts(pod) || podlock.Ended(pod) || pod.Annotations[v1alpha1.UnresponsiveAnnotation] != "" {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": pod.UID, "annotations": map[string]string{v1alpha1.UnresponsiveAnnotation: st.GrantID},
	}})
	if err != nil {
		return err
	}
	if err := r.Patch(ctx, pod, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("mark pod %s, being deleted, unresponsive: %w", pod.Name, err)
	}
	return nil
}

// saidStopped reports whether pod, by status st of the lock of key, is
// the pod of the last grant, that grant is no longer shown, and the
// agent's word (the LockHeartbeat's stoppedGrant) names it, while pod is
// being deleted and its word stands for all of it (wordCounts): nothing
// in it acts on the grant, and nothing will (the kubelet never restarts
// the containers of a pod being deleted). The pod of the last grant is status's
// lastHolderPod, or a pod the pod gate annotated with that grant's token.
func saidStopped(st v1alpha1.DistributedLockStatus, word, key string, pod *corev1.Pod) bool {
	return word != "" && st.Holder == nil && st.GrantID == word &&
		!pod.DeletionTimestamp.IsZero() && wordCounts(pod) &&
		(podlock.Is(pod, st.LastHolderPod) ||
			podlock.HeldBefore(pod, key) && pod.Annotations[v1alpha1.FencingTokenAnnotation] == strconv.FormatInt(st.FencingToken, 10))
}

// stoppedWord is the agent's word on the lock's LockHeartbeat, read only
// when it could count: status shows no holder and a pod is being deleted
// that runs its app through the agent.
func (r *Reconciler) stoppedWord(ctx context.Context, s *scope, pods []*corev1.Pod) (string, error) {
	lock := s.lock
	if lock.Status.Holder != nil || lock.Status.GrantID == "" || !slices.ContainsFunc(pods, func(p *corev1.Pod) bool {
		return !p.DeletionTimestamp.IsZero() && wordCounts(p)
	}) {
		return "", nil
	}
	hb, err := r.heartbeat(ctx, s)
	switch {
	case err != nil:
		return "", fmt.Errorf("read the agents' word: %w", err)
	case hb == nil:
		return "", nil
	}
	if !metav1.IsControlledBy(hb, lock) {
		return "", nil // not the one the operator keeps for this lock (agentaccess)
	}
	return hb.Spec.StoppedGrant, nil
}

// settleStopped releases in Redis the keys of the last grant, which
// status no longer shows and no Session here renews, once its pod can no
// longer act on it: its agent said so (said), or this manager hid it for
// the pod's deletion and the pod is gone or its containers have stopped.
// The next grant need not wait for the keys to expire.
func (r *Reconciler) settleStopped(ctx context.Context, s *scope, pods []*corev1.Pod, said func(*corev1.Pod) bool) {
	lock := s.lock
	st := lock.Status
	if st.Holder != nil || st.GrantID == "" || s.client == nil {
		return
	}
	if h := s.grant(); h != nil && h.ID == st.GrantID {
		return // still renewed here: released by the paths that end a Session
	}
	rec, _ := r.keys.record(lock.UID)
	stop := rec.stop
	if stop.grantID == st.GrantID && stop.settled {
		return
	}
	how, cause := "", endCause(0)
	switch {
	case slices.ContainsFunc(pods, said):
		how, cause = "its agent said the app stopped", endAgentWord
	case stop.grantID == st.GrantID && stop.pod != "":
		if i := slices.IndexFunc(pods, func(p *corev1.Pod) bool { return p.UID == stop.pod }); i < 0 || podlock.Ended(pods[i]) {
			how, cause = "its containers stopped", endPodEnded
		}
	}
	if how == "" {
		return
	}
	err := r.keys.settle(ctx, lock, nil, refOf(lock, st.GrantID), s.client, time.Time{}, cause)
	r.keys.setStop(lock.UID, client.ObjectKeyFromObject(lock), stopRecord{grantID: st.GrantID, settled: true})
	logf.FromContext(ctx).V(1).Info("released a grant whose pod is being deleted", "grantID", st.GrantID, "how", how, "error", errString(err))
	r.tellEnd(ctx, lock, grantName(st.FencingToken, ""), cause, "", "released: "+how, err)
}
