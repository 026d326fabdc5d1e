package report

import (
	"fmt"
	"io"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

// Gates a pod waits with, as the commands name them.
const (
	GateScheduling = "scheduling"
	GateReadiness  = "readiness"
	GateBoth       = "scheduling+readiness"
	GateLabel      = "label"
	GateNone       = "none"
)

// gateNames name the operator's gates (internal/podlock, which decides
// them) as the plugin prints them.
var gateNames = map[podlock.Gate]string{
	podlock.GateScheduling: GateScheduling,
	podlock.GateReadiness:  GateReadiness,
	podlock.GateBoth:       GateBoth,
	podlock.GateLabel:      GateLabel,
	podlock.GateNone:       GateNone,
}

// GateOf names the gate pod waits with, as the operator reads it: the
// scheduling gate redlock.dev/lock, the readiness gate
// redlock.dev/lock-held, both, no gate by request (redlock.dev/gate:
// label), or none.
func GateOf(pod *corev1.Pod) string { return gateNames[podlock.GateOf(pod)] }

// Gated reports whether pod is held back by its lock's gate now: its
// scheduling gate is still in place, or its readiness gate's condition is
// not True.
func Gated(pod *corev1.Pod) bool {
	if slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == v1alpha1.SchedulingGate }) {
		return true
	}
	if !slices.ContainsFunc(pod.Spec.ReadinessGates, func(g corev1.PodReadinessGate) bool { return g.ConditionType == v1alpha1.ReadinessGate }) {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == v1alpha1.ReadinessGate {
			return c.Status != corev1.ConditionTrue
		}
	}
	return true
}

// PhaseGone is the phase shown for a pod that status lists but that no
// longer exists (or was re-created under its name: another pod).
const PhaseGone = "Gone"

// QueueEntry is one pod in a lock's queue.
type QueueEntry struct {
	// Position is the pod's place in line, from 1.
	Position int    `json:"position"`
	Pod      string `json:"pod"`
	// Phase is the pod's phase, or "Gone".
	Phase string `json:"phase"`
	// Gate is the gate it waits with (see GateOf); empty when gone.
	Gate string `json:"gate,omitempty"`
	// Priority is the pod's queue priority as status shows it: higher is
	// served first.
	Priority int32 `json:"priority"`
	// Created is the pod's creation time: within one priority, the queue
	// is first come, first served.
	Created *time.Time `json:"created"`
	// Age is the table's AGE.
	Age string `json:"age"`
}

// Queue is the output of `queue LOCK`.
type Queue struct {
	Kind      string  `json:"kind"`
	Namespace string  `json:"namespace"`
	Lock      string  `json:"lock"`
	Holder    *Holder `json:"holder"`
	// Count is how many pods wait (status.queue.count); Waiting lists the
	// first of them (status shows at most 10).
	Count   int32        `json:"count"`
	Waiting []QueueEntry `json:"waiting"`
}

// QueueOf describes lock's queue at now. pods are the pods of the lock's
// namespace by name, as far as they were read; a pod missing from it, or
// with another UID than status lists, is gone.
func QueueOf(lock *v1alpha1.DistributedLock, pods map[string]*corev1.Pod, now time.Time) Queue {
	q := Queue{Kind: "LockQueue", Namespace: lock.Namespace, Lock: lock.Name, Holder: holderOf(lock.Status), Waiting: []QueueEntry{}}
	if lock.Status.Queue == nil {
		return q
	}
	q.Count = lock.Status.Queue.Count
	for i, ref := range lock.Status.Queue.Waiting {
		e := QueueEntry{Position: i + 1, Pod: ref.Name, Phase: PhaseGone, Priority: ref.Priority, Age: none}
		if p := pods[ref.Name]; p != nil && p.UID == ref.UID {
			e.Phase, e.Gate = phase(p), GateOf(p)
			c := p.CreationTimestamp.UTC()
			e.Created, e.Age = &c, Age(c, now)
		}
		q.Waiting = append(q.Waiting, e)
	}
	return q
}

func phase(p *corev1.Pod) string {
	switch {
	case p.DeletionTimestamp != nil:
		return "Terminating"
	case p.Status.Phase == "":
		return string(corev1.PodPending)
	default:
		return string(p.Status.Phase)
	}
}

// QueueHeaders are the columns of `queue`.
var QueueHeaders = []string{"#", "POD", "PRIORITY", "PHASE", "GATE", "AGE"}

// WriteQueue prints the table of `queue`, with a line after it when status
// lists only the first of the pods that wait; errOut gets the note that
// nobody waits.
func WriteQueue(w, errOut io.Writer, q Queue) error {
	if q.Count == 0 && len(q.Waiting) == 0 {
		_, err := fmt.Fprintf(errOut, "No pods wait for lock %s/%s.\n", q.Namespace, q.Lock)
		return err
	}
	rows := make([][]string, 0, len(q.Waiting))
	for _, e := range q.Waiting {
		gate := e.Gate
		if gate == "" {
			gate = none
		}
		rows = append(rows, []string{itoa(int32(e.Position)), e.Pod, itoa(e.Priority), e.Phase, gate, e.Age}) //nolint:gosec // at most 10 entries
	}
	if err := table(w, QueueHeaders, rows); err != nil {
		return err
	}
	if more := int(q.Count) - len(q.Waiting); more > 0 {
		_, err := fmt.Fprintf(w, "... and %d more: status lists the first %d of the %d pods that wait.\n", more, len(q.Waiting), q.Count)
		return err
	}
	return nil
}
