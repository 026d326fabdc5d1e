package distributedsemaphore

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

// EventSlotTakenBack is the reason of the event on a pod whose slot's lock
// no longer exists, taken back into the semaphore's queue.
const EventSlotTakenBack = "SlotTakenBack"

// strandedPod is a pod labelled for a slot's lock that no longer exists.
type strandedPod struct {
	pod  *corev1.Pod
	lock string
}

// stranded returns the pods labelled for a slot's lock of another number
// of slots than the semaphore's, which no gathered lock has: a deposed
// leader, waking after a resize, labelled them from its old view. Only
// pods never granted (no fencing token) that still wait behind the
// scheduling gate count: nothing of them may run. The admission policy
// keeps the label while they wait, and that slot comes back only if
// spec.slots does, so the semaphore takes them back (takeBack) once a
// read confirms the lock does not exist.
func stranded(in inputs) []strandedPod {
	gathered := map[string]bool{}
	for _, l := range in.locks {
		gathered[l.Name] = true
	}
	var out []strandedPod
	for _, p := range in.pods {
		name := p.Labels[v1alpha1.LockLabel]
		slots, ok := slotsOfName(in.sem, name)
		if !ok || slots == in.sem.Spec.Slots || gathered[name] ||
			p.Annotations[v1alpha1.FencingTokenAnnotation] != "" || podlock.GateOf(p) != podlock.GateScheduling ||
			podlock.Finished(p) || !p.DeletionTimestamp.IsZero() {
			continue
		}
		out = append(out, strandedPod{pod: p, lock: name})
	}
	return out
}

// slotsOfName returns the number of slots whose slot lock of the
// semaphore is named name (<semaphore>-<slots>-<index>).
func slotsOfName(sem *v1alpha1.DistributedSemaphore, name string) (int32, bool) {
	rest, ok := strings.CutPrefix(name, sem.Name+"-")
	if !ok {
		return 0, false
	}
	n, i, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	slots, err := strconv.ParseInt(n, 10, 32)
	if err != nil || slots < 1 || slots > v1alpha1.MaxSemaphoreSlots {
		return 0, false
	}
	index, err := strconv.ParseInt(i, 10, 32)
	if err != nil || index < 0 || index >= slots || sem.SlotLockName(int32(slots), int32(index)) != name {
		return 0, false
	}
	return int32(slots), true
}

// takeBack removes the label redlock.dev/lock from the stranded pods whose
// slot's lock a read confirms gone, on the version of the pod read (a pod
// changed since, e.g. granted, is left to the next reconcile): they wait
// in the semaphore's queue again, for a live slot.
func (r *Reconciler) takeBack(ctx context.Context, in inputs) []error {
	var errs []error
	for _, s := range stranded(in) {
		err := r.Get(ctx, client.ObjectKey{Namespace: in.sem.Namespace, Name: s.lock}, &v1alpha1.DistributedLock{})
		switch {
		case err == nil:
			continue // it exists, unlabelled: not stranded
		case !apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("read slot %s of pod %s: %w", s.lock, s.pod.Name, err))
			continue
		}
		written, err := r.labelAsRead(ctx, s.pod, v1alpha1.LockLabel, "")
		if err != nil {
			errs = append(errs, fmt.Errorf("take pod %s back from slot %s: %w", s.pod.Name, s.lock, err))
			continue
		}
		if written {
			logf.FromContext(ctx).Info("pod taken back from a slot that no longer exists", "pod", s.pod.Name, "lock", s.lock)
			r.Recorder.Eventf(s.pod, in.sem, corev1.EventTypeNormal, EventSlotTakenBack, "Queue",
				"its slot's lock %s no longer exists (the semaphore has %d slots): waits for a slot again", s.lock, in.sem.Spec.Slots)
		}
	}
	return errs
}
