// Package redismasterset is the RedisMasterSet controller: it probes the
// masters of every set and reports each member's state and whether a quorum
// serves; for managed sets it also runs the members (StatefulSet, Service,
// configuration, PodDisruptionBudget, generated Secret) and admits
// replacement member pods only after their restart delay. It adopts the
// spec's list of masters through membership changes with joint quorums
// (membership.go).
//
// Status has one writer, this controller's deferred patch (optimistic
// concurrency against the status the reconcile read); by file:
//
//	field                                        computed in
//	addresses, membershipChange, membershipEpoch membership.go
//	members, serving, total, quorum, conditions  status.go (probe results)
//	  Available, Degraded
//	quarantineWindow(Until), OwnQuarantineWindow status.go (setWindow)
//	MembershipChanging condition                 membership.go
//	members[].zone, SurvivesZoneLoss condition   zones.go
//	gateImage, tls, member records of new sets   managed.go, tls.go
//	observedGeneration                           controller.go
package redismasterset

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
	"github.com/redlock-operator/redlock-operator/internal/conditions"
	"github.com/redlock-operator/redlock-operator/internal/managed"
	"github.com/redlock-operator/redlock-operator/internal/masters"
	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/semantic"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Event reasons of RedisMasterSets.
const (
	EventQuarantined = "MemberQuarantined"
	EventRejoined    = "MemberRejoined"
	EventDown        = "MemberDown"
	// EventWindowShared: a set sharing the masters registered a longer
	// quarantine window, which this set's clients now use.
	EventWindowShared = "LongerQuarantineWindow"
)

// MasterClients gives the pkg/redlock client of each RedisMasterSet.
type MasterClients interface {
	// Refresh returns the client of ms, reading its auth Secret again.
	Refresh(ctx context.Context, ms *v1alpha1.RedisMasterSet) (*redlock.Client, error)
	// Forget closes and drops the client of a deleted master set.
	Forget(name types.NamespacedName)
	// ProbeTimeout is the timeout of one probe of one master of ms.
	ProbeTimeout(ms *v1alpha1.RedisMasterSet) time.Duration
	// Password returns the password of ms's auth Secret, when it may be used.
	Password(ctx context.Context, ms *v1alpha1.RedisMasterSet) (string, error)
	// JointFor returns for how long the set's client has been the joint
	// client of the membership change of epoch, and only that kind.
	JointFor(name types.NamespacedName, uid types.UID, epoch int64) (time.Duration, bool)
}

// rollInterval is how often a set with a rolling update under way is
// reconciled (and probed): the next member may go once the last one votes.
const rollInterval = 2 * time.Second

// Reconciler probes the masters of a RedisMasterSet and
// reports each member's state and whether a quorum serves.
type Reconciler struct {
	client.Client
	// APIReader reads without the cache (member history for admissions).
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Masters gives (and rebuilds) the Redlock client of each master set.
	Masters MasterClients
	Metrics *metrics.Metrics
	Clock   clock.PassiveClock
	// ProbeInterval is how often the masters are probed (default 10s).
	ProbeInterval time.Duration
	// GateImage is the operator's own image, which carries the gate that
	// managed Redis pods run.
	GateImage string
	// OperatorNamespace is where the operator runs (members' NetworkPolicy).
	OperatorNamespace string
	// ReadNodes: the cache serves Nodes (--watch-nodes), and managed
	// members' zones are read from them.
	ReadNodes bool

	// applied remembers the last apply of each owned object (see apply).
	applied sync.Map
	// probed holds the sets this process has probed (a rolling update
	// waits for that), replaced the UID of the member pod each set's
	// rolling update replaced last (the next waits until the cache shows
	// it going).
	probed, replaced sync.Map
	// rollTurns holds, per set with external members, this cluster's turn
	// to replace a voting member (rollturn.go).
	rollTurns sync.Map // types.NamespacedName → *redlock.Lock
	// served holds, per set, when this process last saw each member
	// serving, on its own clock (see ownServing).
	served sync.Map // types.NamespacedName → servedBy
}

// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=redismastersets,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=redismastersets/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile implements reconcile.Reconciler: it runs the managed members
// (when the set is managed), probes the masters and writes status in one
// deferred patch, conditional on the status it read.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	ms := &v1alpha1.RedisMasterSet{}
	if err := r.Get(ctx, req.NamespacedName, ms); err != nil {
		if apierrors.IsNotFound(err) {
			r.endRollTurn(ctx, req.NamespacedName) // before its client closes
			r.Masters.Forget(req.NamespacedName)
			r.probed.Delete(req.NamespacedName)
			r.replaced.Delete(req.NamespacedName)
			r.served.Delete(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	base := ms.DeepCopy()
	defer func() {
		ms.Status.ObservedGeneration = ms.Generation
		if retErr != nil {
			result = ctrl.Result{} // an error is retried with backoff
		}
		if semantic.Equal(base.Status, ms.Status) {
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
		out, err := r.reconcileManaged(ctx, ms, now)
		if masters.SecretUnusable(err) || errors.Is(err, errUnsupportedSpec) {
			// The members' ACL or certificate comes from a Secret that may
			// not serve, or the spec cannot run: nothing is written until
			// that changes. (A transient failure to read a Secret is
			// retried as an error, and says nothing about the set's
			// availability.)
			setCredentialsCondition(ms, err)
			return ctrl.Result{RequeueAfter: next}, nil
		}
		if err != nil || out.recorded {
			return ctrl.Result{RequeueAfter: time.Millisecond}, err
		}
		if out.rolling {
			next = min(next, rollEvery(ms))
		}
		if out.problem != nil {
			defer r.reportProblem(ms, out.problem) // after the probe's conditions
		}
	}
	if desired, err := masters.Addresses(ms); err == nil {
		changed, wait := r.reconcileMembership(ms, desired, now)
		if changed {
			// No client is built from a list status does not show yet.
			return ctrl.Result{RequeueAfter: wait}, nil
		}
		if wait > 0 {
			next = min(next, wait)
		}
	}
	probeNext, err := r.probe(ctx, ms, now)
	return ctrl.Result{RequeueAfter: min(next, probeNext)}, err
}

// probe probes the set's masters through its client and writes what it
// found into status, with a managed set's member zones; it returns how
// soon to probe again.
func (r *Reconciler) probe(ctx context.Context, ms *v1alpha1.RedisMasterSet, now time.Time) (time.Duration, error) {
	c, err := r.Masters.Refresh(ctx, ms)
	if err != nil {
		setCredentialsCondition(ms, err)
		return time.Hour, nil
	}
	results, err := c.Probe(ctx)
	if err != nil {
		return 0, err
	}
	next := r.applyProbe(ms, results, now)
	wasShared := meta.IsStatusConditionFalse(ms.Status.Conditions, v1alpha1.ConditionOwnWindow)
	if setWindow(ms, masters.Quarantine(ms), c.Masters(), now) && !wasShared {
		r.Recorder.Eventf(ms, nil, corev1.EventTypeWarning, EventWindowShared, "Probe", "%s", meta.FindStatusCondition(ms.Status.Conditions, v1alpha1.ConditionOwnWindow).Message)
	}
	r.probed.Store(client.ObjectKeyFromObject(ms), true)
	if ms.Spec.Managed != nil {
		placements, err := r.memberPlacements(ctx, ms)
		if err != nil {
			return 0, err
		}
		setZones(ms, placements, r.ReadNodes)
	}
	return next, nil
}

// applyProbe writes the members' states and the conditions computed from
// probe results into status (status.go), emits an event for every member
// that changed state, and returns how soon to probe again.
func (r *Reconciler) applyProbe(ms *v1alpha1.RedisMasterSet, results []redlock.ProbeResult, now time.Time) time.Duration {
	members, changes, next := membersFromProbe(ms.Status.Members, results, now)
	r.recordServing(ms, members, now)
	for _, c := range changes {
		r.Recorder.Eventf(ms, nil, c.eventType, c.reason, "Probe", "%s", c.note)
	}
	setMembers(ms, members)
	return next
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

// reportProblem shows on a running set that its spec could not be applied
// in full — Degraded=True with the reason (Available keeps telling whether
// a quorum serves) and a Warning event.
func (r *Reconciler) reportProblem(ms *v1alpha1.RedisMasterSet, err error) {
	reason, msg := reasonOf(err), conditions.Message(err.Error()+"; the members keep serving the certificate they have")
	setSetCondition(ms, v1alpha1.ConditionDegraded, metav1.ConditionTrue, reason, msg)
	r.Recorder.Eventf(ms, nil, corev1.EventTypeWarning, reason, "Apply", "%s", msg)
}

// reasonOf is the condition reason of an error that keeps a set's spec from
// being applied or its client from being built.
func reasonOf(err error) string {
	switch {
	case errors.Is(err, masters.ErrTLSSecret):
		return v1alpha1.ReasonTLSSecretError
	case errors.Is(err, masters.ErrNotOptedIn):
		return v1alpha1.ReasonAuthSecretNotOptedIn
	case errors.Is(err, masters.ErrAuthSecret):
		return v1alpha1.ReasonAuthSecretError
	default:
		return v1alpha1.ReasonUnsupportedSpec
	}
}

// setCredentialsCondition shows why no client could be built: the auth
// Secret is not opted in, missing or unusable, or the spec is unsupported.
func setCredentialsCondition(ms *v1alpha1.RedisMasterSet, err error) {
	setSetCondition(ms, v1alpha1.ConditionAvailable, metav1.ConditionFalse, reasonOf(err), conditions.Message(err.Error()))
}
