package distributedsemaphore

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/conditions"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

// computeStatus returns the semaphore's status from what the reconcile
// gathered and planned: the slots' holders as their locks show them, the
// pods waiting, and the conditions.
func computeStatus(in inputs, p plan) v1alpha1.DistributedSemaphoreStatus {
	sem := in.sem
	st := *sem.Status.DeepCopy()
	st.ObservedGeneration = sem.Generation
	st.Key = sem.RedisKey()
	slots, _ := ownedSlots(in)

	st.Slots = sem.Spec.Slots
	holders := []v1alpha1.SemaphoreHolder{}
	holding := map[string]bool{} // pod names that hold a slot
	previous := 0                // slots of another number
	for _, s := range slots {
		so := s.lock.Spec.SlotOf
		if so.Slots != sem.Spec.Slots {
			previous++
			st.Slots = so.Slots
		}
		h := s.lock.Status.Holder
		if h == nil {
			continue
		}
		holders = append(holders, v1alpha1.SemaphoreHolder{
			Slot: so.Index, Lock: s.lock.Name, Holder: *h.DeepCopy(),
			FencingToken: s.lock.Status.FencingToken, AcquiredAt: s.lock.Status.AcquiredAt.DeepCopy(),
		})
		if h.Pod != nil {
			holding[h.Pod.Name] = true
		}
	}
	st.Holders = holders
	st.Held = int32(len(holders)) //nolint:gosec // at most 1000 slots, twice over while resizing

	// In line: the pods given a slot that is not theirs yet, then the
	// others in queue order.
	var given []*corev1.Pod
	for _, pod := range in.pods {
		if !holding[pod.Name] && pod.Labels[v1alpha1.LockLabel] != "" && podlock.SemaphoreCandidate(pod) && allowed(sem, pod) {
			given = append(given, pod)
		}
	}
	podlock.Order(given)
	st.Queue = podlock.Queue(append(given, waiting(sem, in.pods)...))

	if previous > 0 {
		set(&st, sem.Generation, v1alpha1.ConditionResizing, metav1.ConditionTrue, v1alpha1.ReasonDraining,
			fmt.Sprintf("%d slot(s) of the previous %d remain until their holders finish; the %d slots of the spec are served after that, and nobody new is granted meanwhile",
				previous, st.Slots, sem.Spec.Slots))
	} else {
		set(&st, sem.Generation, v1alpha1.ConditionResizing, metav1.ConditionFalse, v1alpha1.ReasonResized,
			fmt.Sprintf("every slot is one of the spec's %d", sem.Spec.Slots))
	}
	status, reason, msg := readiness(slots, p.taken)
	set(&st, sem.Generation, v1alpha1.ConditionReady, status, reason, msg)
	return st
}

// readiness is the Ready condition: False with the first slot's reason
// when a slot's lock is not ready, or its masters store another number of
// slots (SlotsConflict) or hold the key as a plain lock's
// (KeyKindConflict), or a slot's name is taken; True otherwise.
func readiness(slots []slot, taken []string) (metav1.ConditionStatus, string, string) {
	if len(taken) > 0 {
		return metav1.ConditionFalse, v1alpha1.ReasonSlotNameTaken,
			fmt.Sprintf("DistributedLock(s) %v have the names of slots but are not this semaphore's: rename or delete them", taken)
	}
	for _, s := range slots {
		if c := meta.FindStatusCondition(s.lock.Status.Conditions, v1alpha1.ConditionHeld); c != nil &&
			(c.Reason == v1alpha1.ReasonSlotsConflict || c.Reason == v1alpha1.ReasonKeyKindConflict) {
			return metav1.ConditionFalse, c.Reason, fmt.Sprintf("slot %s: %s", s.lock.Name, c.Message)
		}
	}
	for _, s := range slots {
		if c := meta.FindStatusCondition(s.lock.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.Status == metav1.ConditionFalse {
			return metav1.ConditionFalse, c.Reason, fmt.Sprintf("slot %s: %s", s.lock.Name, c.Message)
		}
	}
	if len(slots) == 0 {
		return metav1.ConditionFalse, v1alpha1.ReasonCreatingSlots, "the slots' DistributedLocks are being created"
	}
	return metav1.ConditionTrue, v1alpha1.ReasonValid, "the spec is valid and every slot's lock is ready"
}

func set(st *v1alpha1.DistributedSemaphoreStatus, generation int64, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: conditions.Message(msg), ObservedGeneration: generation,
	})
}
