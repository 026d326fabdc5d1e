package report

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// Reasons of a PodLockExplanation: the machine-readable half of its answer.
const (
	WhyLockNotFound       = "LockNotFound"
	WhyPodFinished        = "PodFinished"
	WhyPodTerminating     = "PodTerminating"
	WhyHolds              = "Holds"
	WhyBeingUngated       = "HoldsBeingUngated"
	WhyHolderExpired      = "HolderValidityPassed"
	WhyStaticHolder       = "StaticHolder"
	WhyWaitingForHolder   = "WaitingForHolder"
	WhyHolderTerminating  = "HolderTerminating"
	WhyHolderGone         = "HolderGone"
	WhyReleasing          = "Releasing"
	WhyFormerHolderRuns   = "FormerHolderMayRun"
	WhyLockNotReady       = "LockNotReady"
	WhyLockNotHeld        = "LockNotHeld"
	WhyNotQueued          = "NotQueued"
	WhyPodRefused         = "PodRefused"
	WhyBehindOthers       = "BehindOthers"
	WhyNext               = "Next"
	WhyNotGatedNotHolding = "NotGated"
	// A pod waiting for a semaphore's slot, before it is given one.
	WhySemaphoreNotFound = "SemaphoreNotFound"
	WhySemaphoreNotReady = "SemaphoreNotReady"
	WhyAllSlotsHeld      = "AllSlotsHeld"
)

// ErrNoLockLabel is returned for a pod that asks for no lock and no
// semaphore.
var ErrNoLockLabel = errors.New("no label " + v1alpha1.LockLabel + " nor " + v1alpha1.SemaphoreLabel)

// HolderState is the holder of a lock, as far as the pod that waits is
// concerned.
type HolderState struct {
	Holder
	// Static: spec.holderIdentity asks for this holder.
	Static       bool       `json:"static"`
	FencingToken int64      `json:"fencingToken"`
	ValidUntil   *time.Time `json:"validUntil"`
	ValidFor     string     `json:"validFor"`
	// PodPhase is the holder pod's phase ("Terminating" while it is being
	// deleted, "Gone" once its object is).
	PodPhase string `json:"podPhase,omitempty"`
	// PodDeletingSince is when the holder pod's deletion was asked for.
	PodDeletingSince *time.Time `json:"podDeletingSince,omitempty"`
}

// Condition is a lock condition as `why` shows it.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

// Event is a recent event of the pod or its lock.
type Event struct {
	Time time.Time `json:"time"`
	Age  string    `json:"age"`
	Type string    `json:"type"`
	// Object is "pod/NAME" or "distributedlock/NAME".
	Object  string `json:"object"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Why is the output of `why POD`.
type Why struct {
	metav1.TypeMeta `json:",inline"`
	Namespace       string `json:"namespace"`
	Pod             string `json:"pod"`
	Phase           string `json:"phase"`
	// Lock is the name in the pod's label redlock.dev/lock: for a pod of a
	// semaphore, its slot's lock once it was given one.
	Lock string `json:"lock"`
	// Semaphore is the name in the pod's label redlock.dev/semaphore;
	// Slots and SlotsHeld are that semaphore's, for a pod not given a slot.
	Semaphore string `json:"semaphore,omitempty"`
	Slots     int32  `json:"slots,omitempty"`
	SlotsHeld int32  `json:"slotsHeld,omitempty"`
	LockFound bool   `json:"lockFound"`
	Key       string `json:"key,omitempty"`
	// Gate is the gate the pod waits with (see GateOf); Gated whether it
	// holds the pod back now.
	Gate  string `json:"gate"`
	Gated bool   `json:"gated"`
	Holds bool   `json:"holds"`
	// Position is the pod's place in the lock's queue from 1; 0 when
	// status does not list it (status lists the first 10).
	Position int   `json:"position"`
	Waiting  int32 `json:"waiting"`
	// Ahead are the pods before it in line.
	Ahead      []string     `json:"ahead,omitempty"`
	Holder     *HolderState `json:"holder"`
	Conditions []Condition  `json:"conditions,omitempty"`
	// Reason is one of the Why* constants; Explanation says it in a
	// sentence.
	Reason      string  `json:"reason"`
	Explanation string  `json:"explanation"`
	Events      []Event `json:"events"`
}

// WhyInput is what `why` reads.
type WhyInput struct {
	Pod *corev1.Pod
	// Lock is the pod's lock; nil when it does not exist.
	Lock *v1alpha1.DistributedLock
	// Semaphore is the pod's semaphore, for a pod not given a slot yet;
	// nil when it does not exist.
	Semaphore *v1alpha1.DistributedSemaphore
	// HolderPod is the pod status shows as holder, when a pod holds the
	// lock and that pod (same UID) exists; nil otherwise.
	HolderPod *corev1.Pod
	// LastHolderPod is status.lastHolderPod, when set and that pod exists.
	LastHolderPod *corev1.Pod
	// Events of the pod and of the lock, in any order.
	Events []corev1.Event
	// MaxEvents bounds the events shown (the most recent); 0: 10.
	MaxEvents int
	Now       time.Time
}

// Explain answers "why is this pod (still) gated?".
func Explain(in WhyInput) (Why, error) {
	pod := in.Pod
	name := pod.Labels[v1alpha1.LockLabel]
	w := Why{
		TypeMeta: typeMeta("PodLockExplanation"), Namespace: pod.Namespace, Pod: pod.Name, Phase: phase(pod),
		Lock: name, Semaphore: pod.Labels[v1alpha1.SemaphoreLabel], Gate: GateOf(pod), Gated: Gated(pod),
		Events: RecentEvents(in.Events, in.Now, in.MaxEvents),
	}
	if name == "" && w.Semaphore != "" {
		explainSemaphore(&w, in)
		return w, nil
	}
	if name == "" {
		msg := fmt.Sprintf("pod %s/%s asks for no lock", pod.Namespace, pod.Name)
		if granted := pod.Annotations[v1alpha1.LockNameAnnotation]; granted != "" {
			msg += fmt.Sprintf(" (its annotation %s says lock %s granted it a token: see `kubectl redlock token %s`)", v1alpha1.LockNameAnnotation, granted, pod.Name)
		}
		return Why{}, fmt.Errorf("%s: %w", msg, ErrNoLockLabel)
	}
	lock := in.Lock
	if lock == nil {
		w.Reason = WhyLockNotFound
		w.Explanation = fmt.Sprintf("no DistributedLock %q exists in namespace %s: the pod waits until it is created (or its label %s names another lock)",
			name, pod.Namespace, v1alpha1.LockLabel)
		return w, nil
	}
	st := lock.Status
	w.LockFound, w.Key = true, Key(lock)
	w.conditions(st.Conditions, v1alpha1.ConditionHeld, v1alpha1.ConditionReady, v1alpha1.ConditionHolderReachable)
	w.place(st.Queue, pod.UID)
	w.Holder = holderState(lock, in.HolderPod, in.Now)
	w.Holds = st.Holder != nil && st.Holder.Pod != nil && st.Holder.Pod.UID == pod.UID
	w.Reason, w.Explanation = explain(&w, in)
	return w, nil
}

// conditions adds the conditions of types that conds has, in that order.
func (w *Why) conditions(conds []metav1.Condition, types ...string) {
	for _, t := range types {
		if c := meta.FindStatusCondition(conds, t); c != nil {
			w.Conditions = append(w.Conditions, Condition{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message})
		}
	}
}

// place sets the pod uid's place in status queue q: how many wait, its
// position, and the pods ahead of it (none when q does not list it).
func (w *Why) place(q *v1alpha1.LockQueue, uid types.UID) {
	if q == nil {
		return
	}
	w.Waiting = q.Count
	for i, ref := range q.Waiting {
		if ref.UID == uid {
			w.Position = i + 1
			break
		}
		w.Ahead = append(w.Ahead, ref.Name)
	}
	if w.Position == 0 {
		w.Ahead = nil
	}
}

// aheadText says which pods are ahead of the pod in line, as the end of a
// sentence ("" when none is).
func (w *Why) aheadText() string {
	if len(w.Ahead) == 0 {
		return ""
	}
	return fmt.Sprintf("; %s ahead of it in line (%s)", plural(len(w.Ahead), "pod is", "pods are"), strings.Join(w.Ahead, ", "))
}

// explainSemaphore answers for a pod of a semaphore that was not given a
// slot yet: the semaphore gives slots first come, first served, and the
// pod is then labelled for its slot's lock.
func explainSemaphore(w *Why, in WhyInput) {
	pod, sem := in.Pod, in.Semaphore
	switch {
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		w.Reason, w.Explanation = WhyPodFinished, fmt.Sprintf("the pod has finished (%s): it no longer takes part in the semaphore", pod.Status.Phase)
		return
	case pod.DeletionTimestamp != nil:
		w.Reason, w.Explanation = WhyPodTerminating, "the pod is being deleted: it is no longer a candidate for a slot"
		return
	case sem == nil:
		w.Reason = WhySemaphoreNotFound
		w.Explanation = fmt.Sprintf("no DistributedSemaphore %q exists in namespace %s: the pod waits until it is created (or its label %s names another semaphore)",
			w.Semaphore, pod.Namespace, v1alpha1.SemaphoreLabel)
		return
	}
	st := sem.Status
	w.LockFound, w.Key, w.Slots, w.SlotsHeld = true, sem.RedisKey(), sem.Spec.Slots, st.Held
	w.conditions(st.Conditions, v1alpha1.ConditionReady)
	w.place(st.Queue, pod.UID)
	ahead := w.aheadText()
	var holders []string
	for _, h := range st.Holders {
		holders = append(holders, holderOfSlot(h))
	}
	ready := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
	switch {
	case pod.Annotations[v1alpha1.ProblemAnnotation] != "":
		w.Reason, w.Explanation = WhyPodRefused, fmt.Sprintf("the operator refuses the pod (annotation %s): %s; it is never given a slot until that is fixed",
			v1alpha1.ProblemAnnotation, pod.Annotations[v1alpha1.ProblemAnnotation])
	case ready != nil && ready.Status == metav1.ConditionFalse:
		w.Reason, w.Explanation = WhySemaphoreNotReady, fmt.Sprintf("the operator cannot give out the semaphore's slots: Ready=False, reason %s: %s", ready.Reason, ready.Message)
	case st.Held >= sem.Spec.Slots:
		w.Reason, w.Explanation = WhyAllSlotsHeld, fmt.Sprintf("all %d slots are held (%s): a slot passes on when one of its holders finishes or its object is gone%s",
			sem.Spec.Slots, strings.Join(holders, ", "), ahead)
	case w.Position == 1:
		w.Reason, w.Explanation = WhyNext, fmt.Sprintf("%d of %d slots are held and the pod is first in line: the semaphore gives it a slot next", st.Held, sem.Spec.Slots)
	case w.Position > 1:
		w.Reason, w.Explanation = WhyBehindOthers, fmt.Sprintf("%d of %d slots are held and the pod is number %d in line%s", st.Held, sem.Spec.Slots, w.Position, ahead)
	default:
		w.Reason, w.Explanation = WhyNotQueued, "the semaphore's status does not list the pod in its queue: the operator has not seen it yet, or status lists only the first pods (is the operator running? see the semaphore's conditions and events)"
	}
}

// holderOfSlot says who holds a semaphore's slot.
func holderOfSlot(h v1alpha1.SemaphoreHolder) string {
	who := h.Holder.Identity
	if h.Holder.Pod != nil {
		who = "pod " + h.Holder.Pod.Name
	}
	return fmt.Sprintf("slot %d: %s", h.Slot, who)
}

func holderState(lock *v1alpha1.DistributedLock, holderPod *corev1.Pod, now time.Time) *HolderState {
	st := lock.Status
	if st.Holder == nil {
		return nil
	}
	until, _, shown := Validity(st, now)
	h := &HolderState{Holder: *holderOf(st), FencingToken: st.FencingToken, ValidUntil: until, ValidFor: shown,
		Static: st.Holder.Pod == nil && lock.StaticRequest() == st.Holder.Identity}
	if st.Holder.Pod != nil {
		h.PodPhase = PhaseGone
		if holderPod != nil {
			h.PodPhase = phase(holderPod)
			if d := holderPod.DeletionTimestamp; d != nil {
				t := d.UTC()
				h.PodDeletingSince = &t
			}
		}
	}
	return h
}

// explain is the verdict: the first case that applies, from the pod's own
// state through the holder to the lock's conditions and the queue.
func explain(w *Why, in WhyInput) (reason, text string) {
	ahead := w.aheadText()
	for _, f := range []func(*Why, WhyInput, string) (string, string){explainPod, explainHolder, explainFree} {
		if reason, text = f(w, in, ahead); reason != "" {
			return reason, text
		}
	}
	return WhyNotQueued, "the lock's status does not list the pod in its queue: the operator has not seen it yet (is the operator running? see the lock's conditions and events)"
}

// explainPod covers a pod that no longer asks for the lock, or holds it.
func explainPod(w *Why, in WhyInput, _ string) (reason, text string) {
	pod, st := in.Pod, in.Lock.Status
	switch {
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return WhyPodFinished, fmt.Sprintf("the pod has finished (%s): it no longer takes part in the lock", pod.Status.Phase)
	case pod.DeletionTimestamp != nil && !w.Holds:
		return WhyPodTerminating, "the pod is being deleted: it is no longer a candidate for the lock"
	case pod.Annotations[v1alpha1.ProblemAnnotation] != "" && !w.Holds:
		return WhyPodRefused, fmt.Sprintf("the operator refuses the pod (annotation %s): %s; it never holds the lock until that is fixed",
			v1alpha1.ProblemAnnotation, pod.Annotations[v1alpha1.ProblemAnnotation])
	case !w.Holds:
		return "", ""
	}
	_, valid, shown := Validity(st, in.Now)
	switch {
	case !valid:
		return WhyHolderExpired, fmt.Sprintf("status shows the pod as the holder, but the validity it shows has passed (%s): take the lock as not held until the operator renews it; %s",
			st.ValidUntil.UTC().Format(time.RFC3339), conditionText(in.Lock, v1alpha1.ConditionHeld))
	case w.Gated:
		return WhyBeingUngated, fmt.Sprintf("the pod holds the lock (fencing token %d, valid for %s): the operator writes the token annotation %s, then lifts its %s gate",
			st.FencingToken, shown, v1alpha1.FencingTokenAnnotation, w.Gate)
	default:
		return WhyHolds, fmt.Sprintf("the pod holds the lock (fencing token %d, valid for %s, renewed while it runs)", st.FencingToken, shown)
	}
}

// explainHolder covers a pod that waits for another holder: static, a pod,
// or a former holder pod that may still run.
func explainHolder(w *Why, in WhyInput, ahead string) (reason, text string) {
	lock, st := in.Lock, in.Lock.Status
	hp := w.Holder
	switch {
	case lock.StaticRequest() != "":
		return WhyStaticHolder, fmt.Sprintf("the lock is reserved for the static holder %q (spec.holderIdentity): pods wait until that field is cleared, e.g. with `kubectl redlock handover %s`%s",
			lock.StaticRequest(), lock.Name, ahead)
	case st.Holder != nil && st.Holder.Pod == nil:
		return WhyReleasing, fmt.Sprintf("the lock is still held by %q, which the spec no longer asks for: the operator is releasing it%s", st.Holder.Identity, ahead)
	case st.Holder != nil && in.HolderPod == nil:
		return WhyHolderGone, fmt.Sprintf("it waits for pod %s, which status shows as the holder but which no longer exists: the operator hands the lock on once it sees that%s", hp.Pod, ahead)
	case st.Holder != nil && in.HolderPod.DeletionTimestamp != nil:
		return WhyHolderTerminating, fmt.Sprintf("it waits for pod %s, which holds the lock and is being deleted (for %s): the lock passes on once that pod's containers have stopped%s",
			hp.Pod, Age(in.HolderPod.DeletionTimestamp.Time, in.Now), ahead)
	case st.Holder != nil && hp.ValidFor == "expired":
		return WhyWaitingForHolder, fmt.Sprintf("it waits for pod %s (%s), which status shows as the holder though the validity shown has passed: %s%s",
			hp.Pod, hp.PodPhase, conditionText(lock, v1alpha1.ConditionHeld), ahead)
	case st.Holder != nil:
		return WhyWaitingForHolder, fmt.Sprintf("it waits for pod %s (%s), which holds the lock (valid for %s, renewed while it runs): the lock passes on only when that pod finishes or its object is gone%s",
			hp.Pod, hp.PodPhase, hp.ValidFor, ahead)
	case st.LastHolderPod != nil && st.LastHolderPod.UID != in.Pod.UID && in.LastHolderPod != nil:
		return WhyFormerHolderRuns, fmt.Sprintf("nobody holds the lock, but its last holder, pod %s (%s), may still run: nobody is granted the lock before that pod has stopped%s",
			st.LastHolderPod.Name, phase(in.LastHolderPod), ahead)
	}
	return "", ""
}

// explainFree covers a lock that nobody holds: why it is not granted, or
// where the pod stands in line.
func explainFree(w *Why, in WhyInput, ahead string) (reason, text string) {
	lock, st := in.Lock, in.Lock.Status
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); c != nil && c.Status == metav1.ConditionFalse {
		return WhyLockNotReady, fmt.Sprintf("the operator cannot act on the lock: %s", conditionText(lock, v1alpha1.ConditionReady))
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHeld); c != nil && c.Status == metav1.ConditionFalse && c.Reason != v1alpha1.ReasonNotRequested && c.Reason != v1alpha1.ReasonReleased {
		text := "nobody holds the lock: " + conditionText(lock, v1alpha1.ConditionHeld)
		if c.Reason == v1alpha1.ReasonHeldElsewhere {
			text += fmt.Sprintf("; another holder of key %q has it (see `kubectl redlock who %s`)", w.Key, w.Key)
		}
		return WhyLockNotHeld, text + ahead
	}
	switch {
	case w.Position > 1:
		return WhyBehindOthers, fmt.Sprintf("nobody holds the lock and the pod is number %d in line%s", w.Position, ahead)
	case w.Position == 1:
		return WhyNext, "the lock is free and the pod is first in line: the operator grants it next"
	case !w.Gated && w.Gate == GateNone:
		return WhyNotGatedNotHolding, fmt.Sprintf("the pod has no gate of the lock (neither scheduling gate %s nor readiness gate %s) and does not hold it", v1alpha1.SchedulingGate, v1alpha1.ReadinessGate)
	case st.Queue != nil && int(st.Queue.Count) > len(st.Queue.Waiting):
		return WhyBehindOthers, fmt.Sprintf("nobody holds the lock; %d pods wait and status lists only the first %d, which do not include this pod", st.Queue.Count, len(st.Queue.Waiting))
	}
	return "", ""
}

func conditionText(lock *v1alpha1.DistributedLock, t string) string {
	c := meta.FindStatusCondition(lock.Status.Conditions, t)
	if c == nil {
		return "its status shows no " + t + " condition"
	}
	s := fmt.Sprintf("%s=%s, reason %s", c.Type, c.Status, c.Reason)
	if c.Message != "" {
		s += ": " + c.Message
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// RecentEvents are the maxEvents most recent of events (10 when maxEvents
// is not positive), oldest first.
func RecentEvents(events []corev1.Event, now time.Time, maxEvents int) []Event {
	if maxEvents <= 0 {
		maxEvents = 10
	}
	out := make([]Event, 0, len(events))
	for i := range events {
		e := &events[i]
		t := eventTime(e)
		out = append(out, Event{Time: t, Age: Age(t, now), Type: e.Type, Reason: e.Reason, Message: e.Message,
			Object: strings.ToLower(e.InvolvedObject.Kind) + "/" + e.InvolvedObject.Name})
	}
	slices.SortStableFunc(out, func(a, b Event) int { return a.Time.Compare(b.Time) })
	if len(out) > maxEvents {
		out = out[len(out)-maxEvents:]
	}
	return out
}

// eventTime is when e last happened, in whichever field its writer (the
// core or the events.k8s.io API) filled; its creation when none is.
func eventTime(e *corev1.Event) time.Time {
	var t time.Time
	for _, c := range []time.Time{e.FirstTimestamp.Time, e.LastTimestamp.Time, e.EventTime.Time} {
		if c.After(t) {
			t = c
		}
	}
	if e.Series != nil && e.Series.LastObservedTime.After(t) {
		t = e.Series.LastObservedTime.Time
	}
	if t.IsZero() {
		t = e.CreationTimestamp.Time
	}
	return t.UTC()
}

// WriteWhy prints `why` as a description.
func WriteWhy(w io.Writer, y *Why) error {
	var b strings.Builder
	line := func(k, format string, a ...any) { fmt.Fprintf(&b, "%-10s %s\n", k+":", fmt.Sprintf(format, a...)) }
	line("Pod", "%s/%s (%s)", y.Namespace, y.Pod, y.Phase)
	if y.Semaphore != "" && y.Lock == "" {
		return writeWhySemaphore(w, &b, line, y)
	}
	if y.Semaphore != "" {
		line("Semaphore", "%s/%s (the pod was given slot lock %s)", y.Namespace, y.Semaphore, y.Lock)
	}
	if y.LockFound {
		line("Lock", "%s/%s (key %s)", y.Namespace, y.Lock, y.Key)
	} else {
		line("Lock", "%s/%s (not found)", y.Namespace, y.Lock)
	}
	gated := "not gated"
	if y.Gated {
		gated = "gated"
	}
	line("Gate", "%s: %s", gateText(y.Gate), gated)
	switch {
	case !y.LockFound:
	case y.Holds:
		line("Queue", "holds the lock; %d waiting", y.Waiting)
	case y.Position > 0:
		line("Queue", "number %d of %d waiting", y.Position, y.Waiting)
	default:
		line("Queue", "not listed in status (%d waiting)", y.Waiting)
	}
	if y.LockFound {
		line("Holder", "%s", holderText(y.Holder))
	}
	return writeWhyEnd(w, &b, line, y)
}

// writeWhySemaphore prints `why` for a pod not given a slot yet.
func writeWhySemaphore(w io.Writer, b *strings.Builder, line func(k, format string, a ...any), y *Why) error {
	if y.LockFound {
		line("Semaphore", "%s/%s (key %s, %d of %d slots held)", y.Namespace, y.Semaphore, y.Key, y.SlotsHeld, y.Slots)
	} else {
		line("Semaphore", "%s/%s (not found)", y.Namespace, y.Semaphore)
	}
	gated := "not gated"
	if y.Gated {
		gated = "gated"
	}
	line("Gate", "%s: %s", gateText(y.Gate), gated)
	switch {
	case !y.LockFound:
	case y.Position > 0:
		line("Queue", "number %d of %d waiting for a slot", y.Position, y.Waiting)
	default:
		line("Queue", "not listed in status (%d waiting for a slot)", y.Waiting)
	}
	return writeWhyEnd(w, b, line, y)
}

// writeWhyEnd prints the conditions, the verdict and the events.
func writeWhyEnd(w io.Writer, b *strings.Builder, line func(k, format string, a ...any), y *Why) error {
	for _, c := range y.Conditions {
		s := fmt.Sprintf("%s (%s)", c.Status, c.Reason)
		if c.Message != "" {
			s += " " + c.Message
		}
		line(c.Type, "%s", s)
	}
	line("Why", "%s", y.Explanation)
	b.WriteString("\nEvents:")
	if len(y.Events) == 0 {
		b.WriteString(" <none>\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	b.WriteString("\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	rows := make([][]string, 0, len(y.Events))
	for _, e := range y.Events {
		rows = append(rows, []string{e.Type, e.Reason, e.Age, e.Object, e.Message})
	}
	var t strings.Builder
	if err := table(&t, EventHeaders, rows); err != nil {
		return err
	}
	_, err := io.WriteString(w, "  "+strings.ReplaceAll(strings.TrimSuffix(t.String(), "\n"), "\n", "\n  ")+"\n")
	return err
}

// EventHeaders are the columns of the events `why` shows, indented by two
// spaces as kubectl describe indents them.
var EventHeaders = []string{"TYPE", "REASON", "AGE", "OBJECT", "MESSAGE"}

func gateText(g string) string {
	switch g {
	case GateScheduling:
		return "scheduling gate " + v1alpha1.SchedulingGate
	case GateReadiness:
		return "readiness gate " + v1alpha1.ReadinessGate
	case GateBoth:
		return "scheduling gate " + v1alpha1.SchedulingGate + " and readiness gate " + v1alpha1.ReadinessGate
	case GateLabel:
		return "none (" + v1alpha1.GateModeLabel + ": label; the holder is labelled " + v1alpha1.HoldsLabel + ")"
	default:
		return "none"
	}
}

func holderText(h *HolderState) string {
	if h == nil {
		return "nobody"
	}
	s := h.String()
	switch {
	case h.Static:
		s += " (static, spec.holderIdentity)"
	case h.Pod != "" && h.PodDeletingSince != nil:
		s += " (Terminating)"
	case h.Pod != "":
		s += " (" + h.PodPhase + ")"
	}
	return fmt.Sprintf("%s, token %d, %s", s, h.FencingToken, validityText(h.ValidFor))
}

// validityText says a ValidFor in words.
func validityText(validFor string) string {
	switch validFor {
	case "expired":
		return "the validity status shows has passed"
	case none:
		return "no validity shown"
	default:
		return "valid for " + validFor
	}
}
