package distributedlock

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/podgate"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

// podsOf lists the pods labelled for lock, and the current and last holder
// pods when their label no longer names the lock: a pod keeps its grant,
// and keeps others from being granted, until it ends, whatever its labels
// say, since its workload may still act on its token.
func (r *Reconciler) podsOf(ctx context.Context, lock *v1alpha1.DistributedLock, holder *v1alpha1.LockHolder) ([]*corev1.Pod, error) {
	if r.Pods == nil {
		return nil, nil
	}
	var list corev1.PodList
	if err := r.Pods.List(ctx, &list, client.InNamespace(lock.Namespace), client.MatchingLabels{v1alpha1.LockLabel: lock.Name}); err != nil {
		return nil, fmt.Errorf("list pods of the lock: %w", err)
	}
	out := make([]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	refs := []*v1alpha1.PodReference{lock.Status.LastHolderPod}
	if holder != nil {
		refs = append(refs, holder.Pod)
	}
	if lock.Status.GrantID == "" && lock.Status.LastHolderPod == nil {
		// A fresh object (perhaps re-created under the name of a deleted
		// one): a pod granted the key before and relabelled since carries
		// no label to find it by. Look once through the namespace.
		former, err := r.api().formerHolders(ctx, lock, out)
		if err != nil {
			return nil, err
		}
		out = append(out, former...)
	}
	for _, ref := range refs {
		if ref == nil || slices.ContainsFunc(out, func(p *corev1.Pod) bool { return p.UID == ref.UID }) {
			continue
		}
		pod, err := r.api().podByRef(ctx, lock.Namespace, ref)
		if err != nil {
			return nil, err
		}
		if pod == nil {
			continue
		}
		if !podlock.Ended(pod) && podlock.GrantedBy(pod, lock.Name) && r.relabelled.First(lock.Namespace+"/"+lock.Name, string(lock.UID)+"/"+string(pod.UID)) {
			r.Recorder.Eventf(pod, lock, corev1.EventTypeWarning, EventHolderRelabelled, "Hold",
				"held %s but its label %s no longer names it: nobody else is granted the lock until it ends", lock.Name, v1alpha1.LockLabel)
		}
		out = append(out, pod)
	}
	return out, nil
}

// apiReads reads pods, and the workloads and locks they belong to, from
// the API server: what the label-selected cache does not show, or shows
// late.
type apiReads struct{ client.Reader }

// formerHolders lists, from the API server, the pods of lock's namespace
// that were granted its key, may still run, and are not in known.
func (a apiReads) formerHolders(ctx context.Context, lock *v1alpha1.DistributedLock, known []*corev1.Pod) ([]*corev1.Pod, error) {
	var list corev1.PodList
	if err := a.List(ctx, &list, client.InNamespace(lock.Namespace)); err != nil {
		return nil, fmt.Errorf("list former holders: %w", err)
	}
	var out []*corev1.Pod
	for i := range list.Items {
		p := &list.Items[i]
		if !podlock.HeldBefore(p, lock.RedisKey()) || podlock.Ended(p) || slices.ContainsFunc(known, func(k *corev1.Pod) bool { return k.UID == p.UID }) {
			continue
		}
		other, err := a.grantedByOther(ctx, lock, p)
		if err != nil {
			return nil, err
		}
		if !other {
			out = append(out, p)
		}
	}
	return out, nil
}

// grantedByOther reports whether pod was granted its token by another
// DistributedLock of the same key that still exists and tracks it (its
// holder or last holder pod), read from the API server: that lock keeps
// others waiting on it, and this one must not take it for its own former
// holder (nor report it relabelled). A pod whose granting lock is gone or
// no longer tracks it is a former holder of the key, and keeps others
// waiting until it ends.
func (a apiReads) grantedByOther(ctx context.Context, lock *v1alpha1.DistributedLock, pod *corev1.Pod) (bool, error) {
	if podlock.GrantedBy(pod, lock.Name) {
		return false, nil
	}
	granter := pod.Annotations[v1alpha1.LockNameAnnotation]
	other := &v1alpha1.DistributedLock{}
	switch err := a.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: granter}, other); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read the lock %s that granted pod %s: %w", granter, pod.Name, err)
	}
	st := other.Status
	tracks := (st.Holder != nil && podlock.Is(pod, st.Holder.Pod)) || podlock.Is(pod, st.LastHolderPod)
	return other.DeletionTimestamp.IsZero() && other.RedisKey() == lock.RedisKey() && tracks, nil
}

// podByRef reads a pod the label-selected cache does not show from the API
// server: nil when it is gone (or another pod has its name). A failed read
// is no answer: the caller retries rather than hand the lock over.
func (a apiReads) podByRef(ctx context.Context, ns string, ref *v1alpha1.PodReference) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	err := a.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, pod)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read holder pod %s: %w", ref.Name, err)
	case pod.UID != ref.UID:
		return nil, nil
	}
	return pod, nil
}

// cacheCurrent reports whether the lock read from the cache is the latest
// version; if not, the reconcile continues from the fresh one.
func (r *Reconciler) cacheCurrent(ctx context.Context, s *scope) bool {
	fresh := &v1alpha1.DistributedLock{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(s.lock), fresh); err != nil || fresh.UID != s.lock.UID ||
		fresh.ResourceVersion == s.lock.ResourceVersion {
		return true
	}
	s.continueFrom(fresh)
	return false
}

// requestedPodMayHold reads the requested holder pod, if a pod is
// requested, from the API server before it is granted the lock: the cache
// may still show it running after it finished (a manager that wakes from a
// pause, a lagging watch), and a finished pod would be granted a token no
// container reads. A pod that finished, whose containers stopped, that is
// being deleted or is gone is not granted, nor one no longer labelled for
// the lock and never granted its key (moved by its semaphore); the lock
// looks again once the cache has caught up.
func (r *Reconciler) requestedPodMayHold(ctx context.Context, s *scope) bool {
	if s.requested == nil || s.requested.Pod == nil {
		return true
	}
	ref := s.requested.Pod
	pod, err := r.api().podByRef(ctx, s.lock.Namespace, ref)
	switch {
	case err != nil:
		logf.FromContext(ctx).Error(err, "read the requested pod before granting it", "pod", ref.Name)
	case podlock.MayHold(pod) && asksFor(pod, s.lock):
		return true
	default:
		logf.FromContext(ctx).V(1).Info("the requested pod has stopped, is gone or was relabelled; the cache lags", "pod", ref.Name)
	}
	s.requeueAfter(staleCacheRecheck)
	return false
}

// asksFor reports whether pod asks for lock: labelled for it, or carrying
// its key's token (a holder relabelled after its grant).
func asksFor(pod *corev1.Pod, lock *v1alpha1.DistributedLock) bool {
	return pod.Labels[v1alpha1.LockLabel] == lock.Name || podlock.HeldBefore(pod, lock.RedisKey())
}

// previousHolderMarked reports whether a pod other than the requested one
// still carries the label redlock.dev/holds naming this lock, read from the
// API server: the pod gate controller removes it from a pod that no longer
// holds the lock, and until that has committed nobody else is granted it,
// so that a Service selecting the label never has two ready endpoints. It
// sets the Held condition (PreviousHolderMarked) and a recheck when so; a
// failed read is no answer either.
//
// Only locks with a pod in holder-label mode among their pods pay for the
// read: the mode is fixed when a pod is created (the admission policy), so
// a pod that may carry the mark was in this view when it was granted.
func (r *Reconciler) previousHolderMarked(ctx context.Context, s *scope) bool {
	if r.APIReader == nil || !slices.ContainsFunc(s.pods, func(p *corev1.Pod) bool {
		return podlock.GateOf(p) == podlock.GateLabel || p.Labels[v1alpha1.HoldsLabel] != ""
	}) {
		return false
	}
	var list corev1.PodList
	err := r.APIReader.List(ctx, &list, client.InNamespace(s.lock.Namespace), client.MatchingLabels{v1alpha1.HoldsLabel: s.lock.Name})
	if err != nil {
		logf.FromContext(ctx).Error(err, "list the pods marked as holding the lock before granting it")
		s.requeueAfter(markedRecheck)
		return true
	}
	for i := range list.Items {
		p := &list.Items[i]
		if s.requested != nil && podlock.Is(p, s.requested.Pod) {
			continue
		}
		if p.Labels[v1alpha1.LockLabel] != s.lock.Name {
			// No longer labelled for the lock: the pod gate controller may
			// never see it again (its cache holds labelled pods), so its
			// mark goes here. Removing a mark is always safe; the lock
			// still waits for the pod itself as long as it may run
			// (status.lastHolderPod).
			if err := podgate.Unmark(ctx, r.Client, p); err != nil {
				logf.FromContext(ctx).Error(err, "remove the holder mark of a pod no longer labelled for the lock", "pod", p.Name)
			}
		}
		s.setHeld(metav1.ConditionFalse, v1alpha1.ReasonPreviousHolderMarked, fmt.Sprintf(
			"waiting: pod %s still carries the label %s=%s; the next grant is made once it is removed", p.Name, v1alpha1.HoldsLabel, s.lock.Name))
		s.requeueAfter(markedRecheck)
		return true
	}
	return false
}
