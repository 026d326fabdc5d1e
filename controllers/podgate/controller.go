// Package podgate is the controller that lets pods wait on a
// DistributedLock: it puts the grant's fencing token and key on the holder
// pod, then removes its scheduling gate, sets its readiness gate True, or
// (holder-label mode) marks it with the label redlock.dev/holds; it keeps
// the readiness condition False and the mark off every other labelled pod,
// and evicts a holder whose lock was lost when the lock asks for it.
//
// It owns, on pods labelled for a lock: the grant annotations, the
// readiness-gate condition, the condition redlock.dev/HolderNotAllowed
// (the lock's spec.allowedHolders refuses the pod), the scheduling gate's
// removal, the label redlock.dev/holds and the holder's
// pod-deletion-cost, and the problem annotation.
//
// The DistributedLock controller decides who holds a lock
// (docs/concepts/queue-order.md) and commits it to the lock's status; this controller only
// acts on committed grants, in the order acquire → commit → annotate →
// check → ungate, so that the token is on the pod before it runs, and a
// pod is ungated only while a fresh read of the lock, after its annotation
// committed, still shows the grant it was annotated for.
package podgate

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/conditions"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
	"github.com/redlock-operator/redlock-operator/internal/seen"
	"github.com/redlock-operator/redlock-operator/internal/waitlimit"
)

// Event reasons on pods.
const (
	EventUngated     = "LockGranted"
	EventLockLost    = "LockLost"
	EventEvicted     = "EvictedOnLockLoss"
	EventBadLockSpec = "LockRequestInvalid"
	EventNoLock      = "LockNotFound"
	// EventEvictionRefused: the Eviction API refused to evict a pod whose
	// lock was lost (a PodDisruptionBudget does not allow it now).
	EventEvictionRefused = "EvictionRefused"
)

// ReasonLockDeleted is the readiness condition's reason on a pod whose lock
// was deleted while it held it.
const ReasonLockDeleted = "LockDeleted"

// ProblemAnnotation on a labelled pod says why it cannot take part.
const ProblemAnnotation = v1alpha1.ProblemAnnotation

// Reconciler ungates holder pods.
type Reconciler struct {
	// Client writes pods and reads DistributedLocks (cached).
	client.Client
	// Pods caches the pods labelled redlock.dev/lock.
	Pods cache.Cache
	// APIReader reads pods the cache does not show (their label removed).
	APIReader client.Reader
	Recorder  events.EventRecorder
	Clock     clock.PassiveClock
	lost      seen.Set // pod namespace/name → pod UID/token whose loss was reported

	// Evictions posts evictions (a core/v1 REST client) without the
	// client's retries: a PodDisruptionBudget's refusal (429, retry after
	// 10s) returns at once, is reported, and is retried with the
	// controller's backoff rather than blocking a worker. nil: the
	// controller-runtime client, which retries.
	Evictions rest.Interface

	// Waits observes how long each pod waited at the scheduling gate, from
	// its creation to the gate's removal (redlock_pod_wait_seconds); nil:
	// not observed.
	Waits prometheus.Observer
}

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=distributedlocks,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile implements reconcile.Reconciler for one labelled pod.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pod := &corev1.Pod{}
	if err := r.Pods.Get(ctx, req.NamespacedName, pod); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.lost.Forget(req.String())
		if r.APIReader == nil {
			return ctrl.Result{}, nil
		}
		if err := r.APIReader.Get(ctx, req.NamespacedName, pod); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
	}
	name := pod.Labels[v1alpha1.LockLabel]
	if name == "" { // the label was removed, or is empty
		return ctrl.Result{}, r.unlabelled(ctx, pod)
	}
	// A pod that was granted a lock has no gate left: its request stood.
	if problem := podlock.Problem(pod); problem != "" && pod.Annotations[v1alpha1.FencingTokenAnnotation] == "" {
		return ctrl.Result{}, r.report(ctx, pod, EventBadLockSpec, problem)
	}
	lock := &v1alpha1.DistributedLock{}
	err := r.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: name}, lock)
	switch {
	case apierrors.IsNotFound(err):
		return ctrl.Result{}, r.lockGone(ctx, pod, name)
	case err != nil:
		return ctrl.Result{}, err
	}
	if podlock.GrantedElsewhere(pod, lock.RedisKey()) && !podlock.Ended(pod) {
		msg := fmt.Sprintf("the pod was granted lock key %q (fencing token %s) and then labelled for %s: it is not queued for %s; re-create the pod to wait for it",
			pod.Annotations[v1alpha1.LockKeyAnnotation], pod.Annotations[v1alpha1.FencingTokenAnnotation], name, name)
		if err := r.standDown(ctx, pod, "LabelChanged", msg); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.report(ctx, pod, EventBadLockSpec, msg)
	}
	refused, err := r.tellAllowed(ctx, pod, lock)
	switch {
	case err != nil:
		return ctrl.Result{}, err
	case refused:
		return r.enforceWait(ctx, pod, lock, false, 0)
	}
	d := decide(pod, lock, r.Clock.Now())
	if d.grant {
		if _, err := r.enforceWait(ctx, pod, lock, true, 0); err != nil {
			return ctrl.Result{}, err
		}
		return r.grant(ctx, pod, lock, d)
	}
	return r.notHolding(ctx, pod, lock, d)
}

// notHolding shows a pod that does not hold its lock as such, tells it of
// a lost grant, evicts it when the lock asks for that, and enforces its
// wait limit.
func (r *Reconciler) notHolding(ctx context.Context, pod *corev1.Pod, lock *v1alpha1.DistributedLock, d decision) (ctrl.Result, error) {
	if err := r.standDown(ctx, pod, d.reason, d.message); err != nil {
		return ctrl.Result{}, err
	}
	if d.lost != "" && r.lost.First(pod.Namespace+"/"+pod.Name, string(pod.UID)+"/"+strconv.FormatInt(lock.Status.FencingToken, 10)) {
		r.Recorder.Eventf(pod, lock, corev1.EventTypeWarning, EventLockLost, "Hold", "%s", d.message)
	}
	if d.evict {
		return ctrl.Result{}, r.evict(ctx, pod, lock.Name, lock)
	}
	return r.enforceWait(ctx, pod, lock, false, d.recheck)
}

// enforceWait applies pod's wait limit (waitlimit.Enforce) and asks to be
// called again by the earlier of recheck and the limit's deadline. A pod
// status shows granted, valid or not, is not timed; nor is one a fresh
// read of the lock shows granted, just before it would be set Failed.
func (r *Reconciler) enforceWait(ctx context.Context, pod *corev1.Pod, lock *v1alpha1.DistributedLock, granted bool, recheck time.Duration) (ctrl.Result, error) {
	limit, _ := podlock.WaitLimitOf(pod, lock.Spec.WaitTimeout, lock.Spec.OnWaitTimeout)
	stillWaiting := func(ctx context.Context) (bool, error) {
		if r.APIReader == nil {
			return true, nil
		}
		fresh := &v1alpha1.DistributedLock{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(lock), fresh); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return fresh.UID == lock.UID && !showsGrantOf(fresh.Status, pod), nil
	}
	granted = granted || showsGrantOf(lock.Status, pod)
	at, err := waitlimit.Enforce(ctx, r.Client, r.Recorder, pod, "DistributedLock "+lock.Name, lock, limit, granted, r.Clock.Now(), stillWaiting)
	if at > 0 && (recheck == 0 || at < recheck) {
		recheck = at
	}
	return ctrl.Result{RequeueAfter: recheck}, err
}

// standDown shows a pod that does not hold its lock as such: its
// readiness-gate condition False (reason, msg) and no holder mark.
func (r *Reconciler) standDown(ctx context.Context, pod *corev1.Pod, reason, msg string) error {
	if err := r.setReady(ctx, pod, false, reason, msg); err != nil {
		return err
	}
	return r.unmark(ctx, pod)
}

// unlabelled handles a pod whose label no longer names a lock (removed,
// so that it left the label-selected cache, or emptied). A pod that shows
// its readiness gate True holds a lock no more as far as its readiness
// says: the lock controller keeps others waiting until it ends, but it is
// not Ready. A gated pod with an empty label is told so.
func (r *Reconciler) unlabelled(ctx context.Context, pod *corev1.Pod) error {
	if err := r.unmark(ctx, pod); err != nil {
		return err
	}
	if pod.Annotations[v1alpha1.FencingTokenAnnotation] == "" || podlock.Stopped(pod) {
		if podlock.GateOf(pod) != podlock.GateNone && pod.Labels != nil {
			if _, ok := pod.Labels[v1alpha1.LockLabel]; ok { // labelled, but with no lock name
				return r.report(ctx, pod, EventBadLockSpec, fmt.Sprintf("the label %s is empty: it names no DistributedLock", v1alpha1.LockLabel))
			}
		}
		return nil
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == v1alpha1.ReadinessGate && c.Status == corev1.ConditionTrue {
			msg := fmt.Sprintf("the label %s was removed after the pod was granted %s: it is no longer Ready; the lock stays with it until it ends", v1alpha1.LockLabel, pod.Annotations[v1alpha1.LockNameAnnotation])
			r.Recorder.Eventf(pod, nil, corev1.EventTypeWarning, EventBadLockSpec, "Gate", "%s", msg)
			return r.setReady(ctx, pod, false, "LabelRemoved", msg)
		}
	}
	return nil
}

// lockGone handles a pod whose lock does not exist: it waits for it, or,
// when it held the lock when it was deleted and may still run, it is told
// (readiness False, an event, the problem annotation) and the lock's
// onLost policy, recorded on the pod at the grant, applies.
func (r *Reconciler) lockGone(ctx context.Context, pod *corev1.Pod, name string) error {
	if err := r.unmark(ctx, pod); err != nil {
		return err
	}
	token := pod.Annotations[v1alpha1.FencingTokenAnnotation]
	if token == "" || podlock.Stopped(pod) || !podlock.GrantedBy(pod, name) {
		// Not granted by the lock its label names: it waits for it.
		if err := r.setReady(ctx, pod, false, "LockNotFound", fmt.Sprintf("DistributedLock %q does not exist (yet)", name)); err != nil {
			return err
		}
		return r.report(ctx, pod, EventNoLock, fmt.Sprintf("DistributedLock %q not found: the pod waits until it exists", name))
	}
	msg := fmt.Sprintf("DistributedLock %q was deleted; this pod held it last (fencing token %s) and holds no lock now", name, token)
	if err := r.setReady(ctx, pod, false, ReasonLockDeleted, msg); err != nil {
		return err
	}
	if err := r.report(ctx, pod, EventLockLost, msg); err != nil {
		return err
	}
	if v1alpha1.LostPolicy(pod.Annotations[v1alpha1.OnLostAnnotation]) == v1alpha1.LostEvict && pod.DeletionTimestamp.IsZero() {
		return r.evict(ctx, pod, name, nil)
	}
	return nil
}

// notAllowed says why lock never grants pod (reason, message): its
// spec.allowedHolders does not name the pod's ServiceAccount, or the
// locks of its key refuse its namespace; "" when it may be granted. A pod
// the lock shows as its holder, or that holds or held its key, is not
// told: it keeps its grant until it ends.
func notAllowed(pod *corev1.Pod, lock *v1alpha1.DistributedLock) (reason, msg string) {
	if showsGrantOf(lock.Status, pod) || podlock.HeldBefore(pod, lock.RedisKey()) {
		return "", ""
	}
	if msg := podlock.NotAllowed(lock.Spec.AllowedHolders, "DistributedLock "+lock.Name, pod); msg != "" {
		return v1alpha1.ReasonServiceAccountNotAllowed, msg
	}
	if refusedNamespace(lock.Status) {
		return v1alpha1.ReasonNamespaceNotAllowed, meta.FindStatusCondition(lock.Status.Conditions, v1alpha1.ConditionReady).Message
	}
	return "", ""
}

// refusedNamespace reports whether st shows the lock refused by the
// namespaces rule of its key.
func refusedNamespace(st v1alpha1.DistributedLockStatus) bool {
	c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
	return c != nil && c.Reason == v1alpha1.ReasonNamespaceNotAllowed
}

// tellAllowed tells pod whether lock may grant it, and reports refused
// when it never does: then the pod shows the condition
// redlock.dev/HolderNotAllowed True, the problem annotation and an event,
// and stays waiting should the lock allow it later. Otherwise that
// condition turns False if it was True, and the problem annotation goes.
func (r *Reconciler) tellAllowed(ctx context.Context, pod *corev1.Pod, lock *v1alpha1.DistributedLock) (refused bool, err error) {
	if reason, msg := notAllowed(pod, lock); reason != "" {
		if err := conditions.SetPod(ctx, r.Client, pod, v1alpha1.ConditionHolderNotAllowed, corev1.ConditionTrue, reason, msg, r.Clock.Now()); err != nil {
			return true, err
		}
		if err := r.standDown(ctx, pod, reason, msg); err != nil {
			return true, err
		}
		return true, r.report(ctx, pod, reason, msg)
	}
	if err := conditions.WithdrawPod(ctx, r.Client, pod, v1alpha1.ConditionHolderNotAllowed, "Allowed", "the lock allows this pod now", r.Clock.Now()); err != nil {
		return false, err
	}
	return false, r.report(ctx, pod, "", "")
}

// decision is what to do with one pod.
type decision struct {
	grant           bool   // the pod holds a committed, valid grant
	ready           bool   // its readiness condition should be True
	mark            bool   // it should carry the label redlock.dev/holds (holds, runs, not being deleted)
	evict           bool   // its lock was lost and the lock asks for eviction
	lost            string // why the pod's grant ended without it finishing, or ""
	reason, message string
	recheck         time.Duration // when the grant's shown validity passes
}

// decide is the pure decision for pod given its lock.
func decide(pod *corev1.Pod, lock *v1alpha1.DistributedLock, now time.Time) decision {
	st := lock.Status
	// A pod that finished never acts on a grant: it is not annotated.
	shown := showsGrantOf(st, pod)
	holds := shown && meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionHeld) && st.ValidUntil != nil && now.Before(st.ValidUntil.Time)
	if holds {
		d := decision{grant: true, ready: pod.DeletionTimestamp.IsZero(), reason: "LockHeld",
			message: fmt.Sprintf("holds %s with fencing token %d", lock.Name, st.FencingToken), recheck: st.ValidUntil.Sub(now)}
		if !d.ready {
			d.reason, d.message = "Terminating", "the pod is being deleted"
		}
		// A pod whose containers stopped for good no longer acts on its
		// grant: its mark goes before the lock can pass on.
		d.mark = d.ready && !podlock.Ended(pod)
		return d
	}
	wasHolder := pod.Annotations[v1alpha1.FencingTokenAnnotation] != "" && pod.Annotations[v1alpha1.FencingTokenAnnotation] == strconv.FormatInt(st.FencingToken, 10)
	held := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHeld)
	d := decision{reason: "Waiting", message: "waiting for " + lock.Name}
	if shown {
		// Status still shows this pod's grant, past its validity: a
		// refresh is late. It is looked at again, whether or not the
		// refresh's event reaches it (a clock step can make it look
		// like no change).
		d.recheck = lapseRecheck
	}
	switch {
	case !wasHolder || st.Holder != nil || podlock.Stopped(pod):
	case !lock.DeletionTimestamp.IsZero():
		d.lost, d.reason, d.message = ReasonLockDeleted, ReasonLockDeleted, fmt.Sprintf("DistributedLock %q is being deleted; this pod held it last (fencing token %d) and holds no lock now", lock.Name, st.FencingToken)
	case !pod.DeletionTimestamp.IsZero() && podagent.RunsApp(pod) && held != nil && !lossReasons[held.Reason]:
		// Its grant was handed back because the pod is being deleted
		// (HolderTerminating, or what the lock waits for since): not
		// lost.
		d.reason, d.message = "Terminating", "the pod is being deleted; its grant is handed over"
	default:
		// The grant to this pod ended while the pod may still run: lost
		// (renewals failed past the validity, or another grant superseded
		// it). Later attempts to grant it again change the Held reason,
		// not this.
		d.lost, d.reason, d.message = "LockLost", "LockLost", fmt.Sprintf("lost %s (fencing token %d) while the pod runs", lock.Name, st.FencingToken)
		if held != nil {
			d.message += ": " + held.Reason
		}
	}
	d.evict = d.lost != "" && lock.Spec.OnLost == v1alpha1.LostEvict && pod.DeletionTimestamp.IsZero()
	return d
}

// lossReasons are the Held reasons of a grant that ended without its
// holder's doing.
var lossReasons = map[string]bool{
	v1alpha1.ReasonLost: true, v1alpha1.ReasonValidityExpired: true, v1alpha1.ReasonRenewFailed: true,
	v1alpha1.ReasonShed: true, v1alpha1.ReasonSuperseded: true, v1alpha1.ReasonHolderUnresponsive: true,
	v1alpha1.ReasonMaxHoldExceeded: true,
}

// showsGrantOf reports whether st shows a grant to pod, which has not
// finished (valid or not).
func showsGrantOf(st v1alpha1.DistributedLockStatus, pod *corev1.Pod) bool {
	return st.Holder != nil && st.Holder.Pod != nil && st.Holder.Pod.UID == pod.UID && !podlock.Finished(pod)
}

// lapseRecheck is how often a holder pod whose shown validity passed
// looks at its lock again.
const lapseRecheck = time.Second

// staleGrantRecheck is how soon a pod whose grant the cache showed but the
// API server no longer does is looked at again (the lock's own events
// also bring it back).
const staleGrantRecheck = 100 * time.Millisecond

// grant annotates the holder pod with its token and key, then ungates it.
func (r *Reconciler) grant(ctx context.Context, pod *corev1.Pod, lock *v1alpha1.DistributedLock, d decision) (ctrl.Result, error) {
	r.lost.Forget(pod.Namespace + "/" + pod.Name)
	token := strconv.FormatInt(lock.Status.FencingToken, 10)
	onLost := string(lock.Spec.OnLost)
	if onLost == "" {
		onLost = string(v1alpha1.LostKeep)
	}
	annotate := pod.Annotations[v1alpha1.FencingTokenAnnotation] != token || pod.Annotations[v1alpha1.LockKeyAnnotation] != lock.Status.Key ||
		pod.Annotations[v1alpha1.OnLostAnnotation] != onLost || pod.Annotations[v1alpha1.LockNameAnnotation] != lock.Name
	gate := podlock.GateOf(pod)
	grants := annotate || gate == podlock.GateScheduling || (gate == podlock.GateReadiness && d.ready && !conditions.PodHas(pod, v1alpha1.ReadinessGate, corev1.ConditionTrue, d.reason)) ||
		(gate == podlock.GateLabel && d.mark && !marked(pod, lock.Name))
	if grants {
		stands, err := r.grantStands(ctx, pod, lock)
		if err == nil && stands && annotate {
			stands, err = r.annotate(ctx, pod, lock, token, onLost)
		}
		switch {
		case err != nil:
			return ctrl.Result{}, err
		case !stands:
			return ctrl.Result{RequeueAfter: staleGrantRecheck}, nil
		}
	}
	return r.lift(ctx, pod, lock, d, token)
}

// lift acts on the holder pod's gate once its grant stands and its
// annotations are written: the scheduling gate removed, the readiness
// condition set, or the holder mark put on (and checked again).
func (r *Reconciler) lift(ctx context.Context, pod *corev1.Pod, lock *v1alpha1.DistributedLock, d decision, token string) (ctrl.Result, error) {
	switch podlock.GateOf(pod) {
	case podlock.GateScheduling:
		base := pod.DeepCopy()
		pod.Spec.SchedulingGates = slices.DeleteFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == v1alpha1.SchedulingGate })
		if err := r.Patch(ctx, pod, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, fmt.Errorf("remove the scheduling gate: %w", err)
		}
		if r.Waits != nil {
			r.Waits.Observe(r.Clock.Since(pod.CreationTimestamp.Time).Seconds())
		}
		r.Recorder.Eventf(pod, lock, corev1.EventTypeNormal, EventUngated, "Ungate", "holds %s with fencing token %s: scheduling gate removed", lock.Name, token)
	case podlock.GateReadiness:
		if err := r.setReady(ctx, pod, d.ready, d.reason, d.message); err != nil {
			return ctrl.Result{}, err
		}
	case podlock.GateLabel:
		if !d.mark {
			return ctrl.Result{RequeueAfter: d.recheck}, r.unmark(ctx, pod)
		}
		if marked(pod, lock.Name) {
			break
		}
		if err := r.setMark(ctx, pod, lock.Name); err != nil {
			return ctrl.Result{}, err
		}
		// The grant may have ended while the mark was written: checked
		// again, and the mark taken back at once if so.
		switch stands, err := r.grantStands(ctx, pod, lock); {
		case err != nil:
			return ctrl.Result{}, err
		case !stands:
			return ctrl.Result{RequeueAfter: staleGrantRecheck}, r.unmark(ctx, pod)
		}
		r.Recorder.Eventf(pod, lock, corev1.EventTypeNormal, EventUngated, "Mark", "holds %s with fencing token %s: labelled %s=%s", lock.Name, token, v1alpha1.HoldsLabel, lock.Name)
	}
	return ctrl.Result{RequeueAfter: d.recheck}, nil
}

// marked reports whether pod carries the label redlock.dev/holds naming
// lock.
func marked(pod *corev1.Pod, lock string) bool { return pod.Labels[v1alpha1.HoldsLabel] == lock }

// holderDeletionCost is the pod-deletion-cost the holder of a lock in
// holder-label mode carries with its mark: a ReplicaSet scaling down (a
// rollout step, fewer replicas) removes its passive pods first, so a
// rollout hands the lock over once, when the holder is the last old pod.
const holderDeletionCost = "10000"

// setMark labels the holder pod redlock.dev/holds=lock and gives it the
// holder's pod-deletion-cost (optimistic lock: a pod changed meanwhile is
// read again). The lock can only pass from a pod once the pod's object has
// changed (its deletion began, its containers stopped, its label changed):
// a mark decided on an older view of the pod conflicts instead of landing
// after the next grant.
func (r *Reconciler) setMark(ctx context.Context, pod *corev1.Pod, lock string) error {
	base := pod.DeepCopy()
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[v1alpha1.HoldsLabel] = lock
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[corev1.PodDeletionCost] = holderDeletionCost
	if err := r.Patch(ctx, pod, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("label the holder pod %s: %w", v1alpha1.HoldsLabel, err)
	}
	return nil
}

// unmark removes the label redlock.dev/holds, and the holder's
// pod-deletion-cost, from a pod that no longer holds its lock; the lock
// controller grants nobody else until the label is gone.
func (r *Reconciler) unmark(ctx context.Context, pod *corev1.Pod) error {
	return Unmark(ctx, r.Client, pod)
}

// Unmark removes the label redlock.dev/holds, and the holder's
// pod-deletion-cost, from pod. A removal can never land harmfully late, so
// it carries no precondition: a pod the kubelet is writing meanwhile (its
// termination) does not make it retry.
func Unmark(ctx context.Context, c client.Client, pod *corev1.Pod) error {
	if _, ok := pod.Labels[v1alpha1.HoldsLabel]; !ok {
		return nil
	}
	base := pod.DeepCopy()
	delete(pod.Labels, v1alpha1.HoldsLabel)
	if pod.Annotations[corev1.PodDeletionCost] == holderDeletionCost {
		delete(pod.Annotations, corev1.PodDeletionCost)
	}
	if err := c.Patch(ctx, pod, client.MergeFrom(base)); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("remove the label %s: %w", v1alpha1.HoldsLabel, err))
	}
	return nil
}

// annotate puts the grant's token, key, onLost policy and lock name on the
// holder pod, then reports whether the API server still shows the grant it
// was made for: it may have ended while the annotation was written (a slow
// write), and the pod is ungated only while it stands. From the annotation
// on, the lock controller grants nobody else while the pod may run.
func (r *Reconciler) annotate(ctx context.Context, pod *corev1.Pod, lock *v1alpha1.DistributedLock, token, onLost string) (bool, error) {
	base := pod.DeepCopy()
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[v1alpha1.FencingTokenAnnotation] = token
	pod.Annotations[v1alpha1.LockKeyAnnotation] = lock.Status.Key
	pod.Annotations[v1alpha1.OnLostAnnotation] = onLost
	pod.Annotations[v1alpha1.LockNameAnnotation] = lock.Name
	if err := r.Patch(ctx, pod, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return false, fmt.Errorf("annotate the holder pod: %w", err)
	}
	return r.grantStands(ctx, pod, lock)
}

// grantStands reports whether the API server still shows the grant the
// cached lock shows to pod: the cache may name this pod after the lock
// moved on to another, and what follows lets the pod act on its grant.
func (r *Reconciler) grantStands(ctx context.Context, pod *corev1.Pod, lock *v1alpha1.DistributedLock) (bool, error) {
	fresh := &v1alpha1.DistributedLock{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(lock), fresh); err != nil {
		return false, fmt.Errorf("read the lock: %w", err)
	}
	return decide(pod, fresh, r.Clock.Now()).grant && fresh.Status.FencingToken == lock.Status.FencingToken && fresh.Status.GrantID == lock.Status.GrantID, nil
}

// setReady sets the pod's readiness-gate condition (conditions.SetPod).
// Pods without the readiness gate are left alone.
func (r *Reconciler) setReady(ctx context.Context, pod *corev1.Pod, ready bool, reason, msg string) error {
	if podlock.GateOf(pod) != podlock.GateReadiness {
		return nil
	}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return conditions.SetPod(ctx, r.Client, pod, v1alpha1.ReadinessGate, status, reason, msg, r.Clock.Now())
}

// evict evicts a holder pod whose lock (named name; lock is nil when it is
// gone) was lost, through the Eviction API. PodDisruptionBudgets apply: a
// refused eviction is an event and is retried with backoff.
func (r *Reconciler) evict(ctx context.Context, pod *corev1.Pod, name string, lock *v1alpha1.DistributedLock) error {
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
	var err error
	if r.Evictions != nil {
		err = r.Evictions.Post().Namespace(pod.Namespace).Resource("pods").Name(pod.Name).SubResource("eviction").
			Body(ev).MaxRetries(0).Do(ctx).Error()
	} else {
		err = r.SubResource("eviction").Create(ctx, pod, ev)
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		if apierrors.IsTooManyRequests(err) {
			r.Recorder.Eventf(pod, lock, corev1.EventTypeWarning, EventEvictionRefused, "Evict",
				"eviction after losing %s refused (a PodDisruptionBudget?): retrying: %v", name, err)
		}
		return fmt.Errorf("evict the pod of a lost lock: %w", err)
	}
	r.Recorder.Eventf(pod, lock, corev1.EventTypeWarning, EventEvicted, "Evict", "evicted: it held %s, which was lost (onLost: Evict)", name)
	return nil
}

// report records on the pod why it cannot take part (an annotation and one
// event per new problem), or clears the annotation when reason is "".
func (r *Reconciler) report(ctx context.Context, pod *corev1.Pod, reason, problem string) error {
	return conditions.ReportProblem(ctx, r.Client, r.Recorder, pod, reason, "Gate", problem)
}

// SetupWithManager registers the controller: it reconciles labelled pods,
// and the pods of a lock whenever the lock changes, except for a refresh of
// its shown validity (grantChanged).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("podgate").
		WatchesRawSource(source.Kind(r.Pods, &corev1.Pod{}, &handler.TypedEnqueueRequestForObject[*corev1.Pod]{})).
		Watches(&v1alpha1.DistributedLock{}, handler.EnqueueRequestsFromMapFunc(r.podsOfLock),
			builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				old, okOld := e.ObjectOld.(*v1alpha1.DistributedLock)
				cur, okNew := e.ObjectNew.(*v1alpha1.DistributedLock)
				return !okOld || !okNew || grantChanged(old, cur, r.Clock.Now())
			}})).
		Complete(r)
}

// grantChanged says whether a new version of a lock can change what its
// pods should do: anything but a refresh of the same grant's shown
// validity. A refresh wakes none of the waiting pods (with 100 pods queued
// on a lock, every refresh re-queued all of them); the holder requeues
// itself at the validity it was last shown (decision.recheck), and then
// reads the refreshed one. A refresh that follows a shown validity that had
// passed is passed on: the holder may have acted on the lapse (readiness
// False) and must see the validity again.
func grantChanged(old, cur *v1alpha1.DistributedLock, now time.Time) bool {
	if old.UID != cur.UID || old.Generation != cur.Generation || !old.DeletionTimestamp.Equal(cur.DeletionTimestamp) {
		return true
	}
	o, c := old.Status, cur.Status
	if o.ValidUntil != nil && c.ValidUntil != nil && c.ValidUntil.Before(o.ValidUntil.Time) {
		return true // validity only moves forward within a grant: not a refresh
	}
	if o.GrantID != c.GrantID || o.FencingToken != c.FencingToken || o.Key != c.Key ||
		!equality.Semantic.DeepEqual(o.Holder, c.Holder) || (o.ValidUntil == nil) != (c.ValidUntil == nil) {
		return true
	}
	oh := meta.FindStatusCondition(o.Conditions, v1alpha1.ConditionHeld)
	ch := meta.FindStatusCondition(c.Conditions, v1alpha1.ConditionHeld)
	if (oh == nil) != (ch == nil) || oh != nil && (oh.Status != ch.Status || oh.Reason != ch.Reason) {
		return true
	}
	if refusedNamespace(o) != refusedNamespace(c) {
		return true // its pods are told, or no longer
	}
	return o.ValidUntil != nil && !now.Before(o.ValidUntil.Time)
}

// podsOfLock enqueues the pods labelled for a lock.
func (r *Reconciler) podsOfLock(ctx context.Context, o client.Object) []reconcile.Request {
	var list corev1.PodList
	if err := r.Pods.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingLabels{v1alpha1.LockLabel: o.GetName()}); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}
