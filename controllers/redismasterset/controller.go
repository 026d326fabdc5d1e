// Package redismasterset is the RedisMasterSet controller: it probes the
// masters of every set and reports each member's state and whether a quorum
// serves; for managed sets it also runs the members (StatefulSet, Service,
// configuration, PodDisruptionBudget, generated Secret) and admits
// replacement member pods only after their restart delay.
package redismasterset

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/managed"
	"github.com/redlock-operator/redlock-operator/internal/masters"
	"github.com/redlock-operator/redlock-operator/pkg/metrics"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Event reasons of RedisMasterSets.
const (
	EventQuarantined = "MemberQuarantined"
	EventRejoined    = "MemberRejoined"
	EventDown        = "MemberDown"
)

// Reconciler probes the masters of a RedisMasterSet and
// reports each member's state and whether a quorum serves.
type Reconciler struct {
	client.Client
	// APIReader reads without the cache (member history for admissions).
	APIReader client.Reader
	Recorder  events.EventRecorder
	Masters   *masters.Registry
	Metrics   *metrics.Metrics
	Clock     clock.PassiveClock
	// ProbeInterval is how often the masters are probed (default 10s).
	ProbeInterval time.Duration
	// GateImage is the operator's own image, which carries the gate that
	// managed Redis pods run.
	GateImage string
}

// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=redismastersets,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=redismastersets/status,verbs=get;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile implements reconcile.Reconciler: it runs the managed members
// (when the set is managed), probes the masters and writes status in one
// deferred patch, conditional on the status it read.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	ms := &v1alpha1.RedisMasterSet{}
	if err := r.Get(ctx, req.NamespacedName, ms); err != nil {
		if apierrors.IsNotFound(err) {
			r.Masters.Forget(req.NamespacedName)
			r.Metrics.MastersServing.DeleteLabelValues(req.Namespace, req.Name)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	base := ms.DeepCopy()
	defer func() {
		ms.Status.ObservedGeneration = ms.Generation
		if equality.Semantic.DeepEqual(base.Status, ms.Status) {
			return
		}
		// Member records (lastServingAt, restarts) decide admissions: never
		// write them from a stale view.
		if err := r.Status().Patch(ctx, ms, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
			retErr = kerrors.NewAggregate([]error{retErr, fmt.Errorf("patch status: %w", err)})
		}
		if retErr != nil {
			result = ctrl.Result{}
		}
	}()
	interval := r.ProbeInterval
	if interval <= 0 {
		interval = managed.DefaultProbeInterval
	}
	now := r.Clock.Now()
	next := interval

	if ms.Spec.Managed != nil {
		recorded, err := r.reconcileManaged(ctx, ms, now)
		if err != nil || recorded {
			return ctrl.Result{RequeueAfter: time.Millisecond}, err
		}
	}
	c, err := r.Masters.Refresh(ctx, ms)
	if err != nil {
		reason := v1alpha1.ReasonUnsupportedSpec
		if errors.Is(err, masters.ErrAuthSecret) {
			reason = v1alpha1.ReasonAuthSecretError
		}
		setSetCondition(ms, v1alpha1.ConditionAvailable, metav1.ConditionFalse, reason, truncate(err.Error()))
	} else {
		results, perr := c.Probe(ctx)
		if perr != nil {
			return ctrl.Result{}, perr
		}
		next = min(next, r.applyProbe(ms, results, now))
	}
	return ctrl.Result{RequeueAfter: next}, nil
}

// truncate keeps messages within what a condition comfortably shows.
func truncate(s string) string {
	const limit = 1024
	if len(s) > limit {
		return s[:limit-3] + "..."
	}
	return s
}

// applyProbe turns probe results into member states and conditions, emits
// events for changes, and returns how soon to probe again (when a
// quarantine ends before the next regular probe).
func (r *Reconciler) applyProbe(ms *v1alpha1.RedisMasterSet, results []redlock.ProbeResult, now time.Time) time.Duration {
	prev := map[string]v1alpha1.MemberStatus{}
	for _, m := range ms.Status.Members {
		prev[m.Address] = m
	}
	next := time.Duration(0)
	members := make([]v1alpha1.MemberStatus, 0, len(results))
	var serving int32
	for _, res := range results {
		old, seen := prev[res.Addr]
		m := memberState(res, now)
		m.Restarts, m.LastServingAt, m.NeverServed = old.Restarts, old.LastServingAt, old.NeverServed
		if m.State == v1alpha1.MemberServing {
			m.LastServingAt, m.NeverServed = &metav1.Time{Time: now}, false
		}
		if seen && old.RunID != "" && m.RunID != "" && m.RunID != old.RunID {
			m.Restarts++
		}
		if m.RunID == "" {
			m.RunID = old.RunID
		}
		switch {
		case m.State == v1alpha1.MemberServing:
			serving++
			if seen && old.State != v1alpha1.MemberServing {
				r.Recorder.Eventf(ms, nil, corev1.EventTypeNormal, EventRejoined, "Probe", "member %s serves and votes again", m.Address)
			}
		case m.State == v1alpha1.MemberQuarantined:
			if !seen || old.State != v1alpha1.MemberQuarantined || old.RunID != m.RunID {
				r.Recorder.Eventf(ms, nil, corev1.EventTypeWarning, EventQuarantined, "Probe",
					"member %s restarted recently (run_id %s): it does not vote until %s", m.Address, m.RunID, m.QuarantinedUntil.UTC().Format(time.RFC3339))
			}
			if d := m.QuarantinedUntil.Sub(now); d > 0 && (next == 0 || d < next) {
				next = d + 100*time.Millisecond
			}
		case m.State == v1alpha1.MemberDown && seen && old.State != v1alpha1.MemberDown:
			r.Recorder.Eventf(ms, nil, corev1.EventTypeWarning, EventDown, "Probe", "member %s does not answer: %s", m.Address, m.Message)
		}
		members = append(members, m)
	}
	total := int32(len(results)) //nolint:gosec // at most 15 members
	quorum := total/2 + 1
	ms.Status.Members, ms.Status.Serving, ms.Status.Total, ms.Status.Quorum = members, serving, total, quorum
	r.Metrics.MastersServing.WithLabelValues(ms.Namespace, ms.Name).Set(float64(serving))
	if serving >= quorum {
		setSetCondition(ms, v1alpha1.ConditionAvailable, metav1.ConditionTrue, v1alpha1.ReasonQuorumServing,
			fmt.Sprintf("%d of %d masters serve; a lock needs %d", serving, total, quorum))
	} else {
		setSetCondition(ms, v1alpha1.ConditionAvailable, metav1.ConditionFalse, v1alpha1.ReasonQuorumLost,
			fmt.Sprintf("only %d of %d masters serve; a lock needs %d", serving, total, quorum))
	}
	if serving == total {
		setSetCondition(ms, v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.ReasonAllServing, "every master serves")
	} else {
		setSetCondition(ms, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonMembersDown,
			fmt.Sprintf("%d of %d masters down or quarantined", total-serving, total))
	}
	if next == 0 {
		return time.Hour
	}
	return next
}

// memberState maps one probe result to a member's status.
func memberState(res redlock.ProbeResult, now time.Time) v1alpha1.MemberStatus {
	m := v1alpha1.MemberStatus{Address: res.Addr, RunID: res.RunID, Reachable: res.Err == nil}
	switch {
	case res.Err != nil:
		m.State, m.Message = v1alpha1.MemberDown, truncate(res.Err.Error())
	case now.Before(res.QuarantinedUntil):
		m.State = v1alpha1.MemberQuarantined
		m.QuarantinedUntil = &metav1.Time{Time: res.QuarantinedUntil}
	default:
		m.State = v1alpha1.MemberServing
	}
	return m
}

func setSetCondition(ms *v1alpha1.RedisMasterSet, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&ms.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: ms.Generation,
	})
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		// Spec changes only: the status writes of probes must not trigger
		// probes. Probes run on RequeueAfter.
		For(&v1alpha1.RedisMasterSet{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&appsv1.StatefulSet{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// New member pods need their admission at once.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(setsOfPod), builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(event.UpdateEvent) bool { return false },
			DeleteFunc: func(event.DeleteEvent) bool { return false },
		})).
		Named("redismasterset").
		Complete(r)
}
