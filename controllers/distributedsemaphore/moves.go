package distributedsemaphore

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

// Moves of pods waiting for a slot another cluster holds to a slot free on
// the masters: the fence on the slot lock a pod leaves, the take-back of a
// pod a move left behind, and the clearing of a fence. decide.go plans
// them (moves, leftBehind).

// EventSlotMoved is the reason of the event on a pod moved from a slot
// another cluster holds to one free on the masters.
const EventSlotMoved = "SlotMoved"

// moveRecheck is how soon a semaphore whose pods wait for slots other
// clusters hold looks again for a slot free on the masters: its slots'
// locks' longest retry delay, min(ttl/4, 5s).
func moveRecheck(sem *v1alpha1.DistributedSemaphore) time.Duration {
	return min(sem.Spec.TTL.Duration/4, 5*time.Second)
}

// move labels a pod that waits for a slot another cluster holds for a
// slot free on the masters, and reports whether it did. First it fences
// the slot lock the pod waited for (MovingPodAnnotation, on the version of
// the lock read, which showed the pod not granted): a grant to the pod
// that lock made meanwhile fails to commit (its status write is
// conditional on the version it read, see distributedlock's noRetry), and
// the lock grants the pod nothing from then on. Then it relabels the pod
// on the version read: a pod granted since (its token written) is left
// where it is, and the admission policy lets the operator change the
// label only while the pod waits behind the scheduling gate and was never
// granted. The fence stays: a relabel that failed, or whose fate is not
// known, is settled by taking the pod back (plan.leftBehind), never by
// unfencing.
func (r *Reconciler) move(ctx context.Context, sem *v1alpha1.DistributedSemaphore, a assignment) (bool, error) {
	was := a.from.Name
	if ok, err := r.clearFence(ctx, a.to); err != nil || !ok {
		return false, wrapIf(err, "clear slot %s to move pod %s to it", a.lock, a.pod.Name)
	}
	fenced, err := r.setMoving(ctx, a.from, string(a.pod.UID))
	if err != nil || !fenced {
		return false, wrapIf(err, "fence slot %s to move pod %s", was, a.pod.Name)
	}
	written, err := r.labelAsRead(ctx, a.pod, v1alpha1.LockLabel, a.lock)
	if err != nil || !written {
		return false, wrapIf(err, "move pod %s from slot %s to %s", a.pod.Name, was, a.lock)
	}
	r.expect(client.ObjectKeyFromObject(sem), a.lock, a.pod.UID)
	r.Recorder.Eventf(a.pod, sem, corev1.EventTypeNormal, EventSlotMoved, "MoveSlot",
		"waited for slot %s, which another holder of key %s has (in another cluster sharing the masters): moved to slot %s, free on the masters", was, sem.RedisKey(), a.lock)
	logf.FromContext(ctx).V(1).Info("slot moved", "pod", a.pod.Name, "from", was, "lock", a.lock)
	return true, nil
}

// takeBackLeft takes back into the queue a pod a move left labelled for a
// slot whose lock is fenced against it, on the version of the pod read,
// once a fresh read of the lock shows the fence still standing: the
// caches of pods and locks keep no order between them, and a pod given
// its slot again after the fence was cleared must not lose it while that
// lock grants it.
func (r *Reconciler) takeBackLeft(ctx context.Context, sem *v1alpha1.DistributedSemaphore, pod *corev1.Pod) error {
	slot := pod.Labels[v1alpha1.LockLabel]
	if r.APIReader == nil {
		return nil
	}
	lock := &v1alpha1.DistributedLock{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: slot}, lock); err != nil {
		return client.IgnoreNotFound(err)
	}
	if lock.MovingPod() != string(pod.UID) {
		return nil
	}
	written, err := r.labelAsRead(ctx, pod, v1alpha1.LockLabel, "")
	if written {
		r.Recorder.Eventf(pod, sem, corev1.EventTypeNormal, EventSlotTakenBack, "Queue",
			"its move from slot %s, which another cluster holds, did not land: waits for a slot again", slot)
	}
	return err
}

// clearFence removes the fence of a slot's lock about to be given a pod
// (a move's), on the version read, and reports whether the lock is
// unfenced. A fresh list must show the fenced pod not labelled for the
// lock, or unable to hold it (finished, being deleted: the lock never
// grants it); the caches of pods and locks keep no order between them. A
// pod left behind is taken back first.
func (r *Reconciler) clearFence(ctx context.Context, l *v1alpha1.DistributedLock) (bool, error) {
	if l == nil {
		return true, nil
	}
	uid := l.MovingPod()
	if uid == "" {
		return true, nil
	}
	if r.APIReader == nil {
		return false, nil
	}
	var list corev1.PodList
	if err := r.APIReader.List(ctx, &list, client.InNamespace(l.Namespace), client.MatchingLabels{v1alpha1.LockLabel: l.Name}); err != nil {
		return false, fmt.Errorf("list the pods of slot %s: %w", l.Name, err)
	}
	if slices.ContainsFunc(list.Items, func(p corev1.Pod) bool { return string(p.UID) == uid && podlock.MayHold(&p) }) {
		return false, nil // taken back first (plan.leftBehind)
	}
	return r.setMoving(ctx, l, "")
}

// wrapIf wraps err with the formatted context, or returns nil.
func wrapIf(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// setMoving sets the slot lock l's MovingPodAnnotation to uid ("" removes
// it) on the version of l read, and reports whether l carries it now.
func (r *Reconciler) setMoving(ctx context.Context, l *v1alpha1.DistributedLock, uid string) (bool, error) {
	if l.MovingPod() == uid {
		return true, nil
	}
	return r.patchAsRead(ctx, l, func(o client.Object) {
		o.SetAnnotations(withEntry(o.GetAnnotations(), v1alpha1.MovingPodAnnotation, uid))
	})
}
