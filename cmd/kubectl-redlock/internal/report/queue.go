package report

import (
	"fmt"
	"io"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// Queue is the output of `queue LOCK` (kind LockQueue) and of `queue
// dsem/NAME` (kind SemaphoreQueue: the pods waiting for a slot, before
// each is given one).
type Queue struct {
	metav1.TypeMeta `json:",inline"`
	Namespace       string `json:"namespace"`
	Lock            string `json:"lock,omitempty"`
	// Semaphore, Slots and Held are a semaphore's.
	Semaphore string  `json:"semaphore,omitempty"`
	Slots     int32   `json:"slots,omitempty"`
	Held      int32   `json:"held,omitempty"`
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
	q := Queue{TypeMeta: typeMeta("LockQueue"), Namespace: lock.Namespace, Lock: lock.Name, Holder: holderOf(lock.Status)}
	q.list(lock.Status.Queue, pods, now)
	return q
}

// SemaphoreQueueOf describes the pods waiting for a slot of sem at now,
// as QueueOf does a lock's.
func SemaphoreQueueOf(sem *v1alpha1.DistributedSemaphore, pods map[string]*corev1.Pod, now time.Time) Queue {
	q := Queue{TypeMeta: typeMeta("SemaphoreQueue"), Namespace: sem.Namespace, Semaphore: sem.Name, Slots: sem.Spec.Slots, Held: sem.Status.Held}
	q.list(sem.Status.Queue, pods, now)
	return q
}

// list fills q's count and entries from status queue sq.
func (q *Queue) list(sq *v1alpha1.LockQueue, pods map[string]*corev1.Pod, now time.Time) {
	q.Waiting = []QueueEntry{}
	if sq == nil {
		return
	}
	q.Count = sq.Count
	for i, ref := range sq.Waiting {
		e := QueueEntry{Position: i + 1, Pod: ref.Name, Phase: PhaseGone, Priority: ref.Priority, Age: none}
		if p := pods[ref.Name]; p != nil && p.UID == ref.UID {
			e.Phase, e.Gate = phase(p), GateOf(p)
			c := p.CreationTimestamp.UTC()
			e.Created, e.Age = &c, Age(c, now)
		}
		q.Waiting = append(q.Waiting, e)
	}
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

// QueueWideHeaders are the columns `queue -o wide` adds.
var QueueWideHeaders = []string{"CREATED"}

// WriteQueue prints the table of `queue`, with a line after it when status
// lists only the first of the pods that wait; errOut gets the note that
// nobody waits. wide adds QueueWideHeaders.
func WriteQueue(w, errOut io.Writer, q *Queue, wide bool) error {
	if q.Count == 0 && len(q.Waiting) == 0 {
		what := "lock " + q.Namespace + "/" + q.Lock
		if q.Semaphore != "" {
			what = fmt.Sprintf("a slot of semaphore %s/%s (%d of %d slots held)", q.Namespace, q.Semaphore, q.Held, q.Slots)
		}
		_, err := fmt.Fprintf(errOut, "No pods wait for %s.\n", what)
		return err
	}
	if q.Semaphore != "" {
		if _, err := fmt.Fprintf(w, "Semaphore %s/%s: %d of %d slots held.\n", q.Namespace, q.Semaphore, q.Held, q.Slots); err != nil {
			return err
		}
	}
	headers := QueueHeaders
	if wide {
		headers = slices.Concat(QueueHeaders, QueueWideHeaders)
	}
	rows := make([][]string, 0, len(q.Waiting))
	for _, e := range q.Waiting {
		row := []string{itoa(int32(e.Position)), e.Pod, itoa(e.Priority), e.Phase, orNone(e.Gate), e.Age} //nolint:gosec // at most 10 entries
		if wide {
			created := none
			if e.Created != nil {
				created = e.Created.UTC().Format(time.RFC3339)
			}
			row = append(row, created)
		}
		rows = append(rows, row)
	}
	if err := table(w, headers, rows); err != nil {
		return err
	}
	if more := int(q.Count) - len(q.Waiting); more > 0 {
		_, err := fmt.Fprintf(w, "... and %d more: status lists the first %d of the %d pods that wait.\n", more, len(q.Waiting), q.Count)
		return err
	}
	return nil
}
