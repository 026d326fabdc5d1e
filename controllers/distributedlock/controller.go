package distributedlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/podgate"
	"github.com/redlock-operator/redlock-operator/internal/conditions"
	"github.com/redlock-operator/redlock-operator/internal/lockvalue"
	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
	"github.com/redlock-operator/redlock-operator/internal/seen"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Finalizer makes deleting a DistributedLock release it in Redis first.
const Finalizer = "redlock.dev/release"

// indexMasterSet indexes DistributedLocks by spec.masterSet.
const indexMasterSet = "spec.masterSet"

// relabelledPoll is how often a lock looks at a former holder pod whose
// label no longer names it, and whose events therefore do not wake it.
const relabelledPoll = 2 * time.Second

// DefaultStatusWriteQPS is the default budget of validity refreshes per
// second.
const DefaultStatusWriteQPS = 150

// grantWait is how soon, plus jitter, a lock shown shed is looked at
// again, to wait for room as new grants do (waiters.go).
const grantWait = 250 * time.Millisecond

// opTimeout bounds one Redis operation of the controller (each master is
// bounded by the node timeout inside it).
const opTimeout = 5 * time.Second

// Event reasons of DistributedLocks.
const (
	EventGranted = "Granted"
	EventAdopted = "Adopted"
	EventShed    = "Shed"
	// EventHolderUnresponsive: the holder pod's heartbeat stopped or its
	// containers crash-looped for longer than spec.heartbeatTimeout.
	EventHolderUnresponsive = "HolderUnresponsive"
	EventReleased           = "Released"
	EventReleaseIncomplete  = "ReleaseIncomplete"
	EventLost               = "Lost"
	EventNotCommitted       = "GrantNotCommitted"
	EventSuperseded         = "Superseded"
	EventHolderRelabelled   = "HolderRelabelled"
)

// MasterClients gives the pkg/redlock client of each RedisMasterSet.
type MasterClients interface {
	// Client returns the client of ms, building it when needed.
	Client(ctx context.Context, ms *v1alpha1.RedisMasterSet) (*redlock.Client, error)
	// Lookup returns the current client of a master set, or nil.
	Lookup(name types.NamespacedName) *redlock.Client
}

// ValueDeriver derives the Redis value of a grant from the lock's UID and
// the grant's ID; a new leader must derive the same values.
type ValueDeriver interface {
	Value(uid, grantID string) string
}

// Reconciler acquires, renews and releases DistributedLocks.
type Reconciler struct {
	client.Client
	// APIReader reads without the cache, to check a status write that
	// conflicted and a grant the cache does not show yet.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Masters gives the Redlock client of each master set.
	Masters MasterClients
	// Values derives the Redis value of each grant.
	Values  ValueDeriver
	Metrics *metrics.Metrics
	// Clock is used for status times and requeue delays.
	Clock clock.PassiveClock
	// MaxConcurrentReconciles defaults to 4.
	MaxConcurrentReconciles int
	// Pods caches the pods labelled redlock.dev/lock, which request locks;
	// nil: locks serve static holders only.
	Pods cache.Cache
	// IgnoreNodes: no HolderReachable condition, and no watch of Nodes
	// (cluster-scoped), which an operator limited to some namespaces may
	// not be allowed to read.
	IgnoreNodes bool
	// StatusWriteQPS is the budget of validity refreshes per second
	// (default DefaultStatusWriteQPS), sent on a client of their own.
	StatusWriteQPS float64
	// FailoverSlack is how long after the leader's last Lease renewal a
	// standby may take to lead and adopt every held lock (0: no standby to
	// wait for): status keeps that much validity ahead when the ttl is at
	// least twice it, so that a crash of the leader lapses no lock.
	FailoverSlack time.Duration
	// GrantRecheck is how long a lock whose grant waits for room in the
	// status writes waits, plus jitter, for a reconcile the writer does
	// not ask for (0: grantRecheck).
	GrantRecheck time.Duration

	sessions   *sessions
	writer     *statusWriter
	wake       *wakeQueue
	relabelled seen.Set // lock namespace/name → lock UID/pod UID of the relabelled holder last reported
	overheld   seen.Set // lock namespace/name → grant ID of the holder pod last told it held past maxHoldDuration
	// written holds the UIDs of the locks this manager has written since
	// it started (markWritten): only their cache can lag behind a write of
	// its own.
	written sync.Map
	// beats are the heartbeat Lease renewals seen (liveness.go).
	beats *heartbeats
	// stoppings are the grants hidden because their pods are being
	// deleted, until their keys are released (terminating.go).
	stoppings stoppings
	// ends are the last grant each lock ended here and when its keys
	// may go (end.go).
	ends ends
}

// markWritten records a committed write of this manager's to lock uid.
func (r *Reconciler) markWritten(uid types.UID) { r.written.Store(uid, struct{}{}) }

// wroteBefore reports whether this manager has written lock uid since it
// started.
func (r *Reconciler) wroteBefore(uid types.UID) bool {
	_, ok := r.written.Load(uid)
	return ok
}

// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=distributedlocks,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=distributedlocks/status,verbs=patch
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=distributedlocks/finalizers,verbs=update
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=redismastersets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=lockheartbeats,verbs=get;list;watch
// Nodes are read from the cache only, for the HolderReachable condition, in
// a ClusterRole of their own that a manager limited to namespaces does
// without (IgnoreNodes):
// +kubebuilder:rbac:groups="",resources=nodes,verbs=list;watch,roleName=node-reader-role
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// scope is what one reconcile works on.
type scope struct {
	lock *v1alpha1.DistributedLock
	orig v1alpha1.DistributedLockStatus // status as read: the base and precondition of the patch
	now  time.Time
	// pending is a grant this reconcile made: it counts once the status
	// patch has committed it, and is given back otherwise.
	pending *held
	// requested is who should hold the lock (nil: nobody).
	requested *v1alpha1.LockHolder
	// pods are the pods that take part: those labelled for the lock, and
	// the holder pod if its label was changed after its grant.
	pods []*corev1.Pod
	// client is the master set's client, once resolved.
	client *redlock.Client
	// ended is the grant this reconcile ended (endGrant; "" when none):
	// it is not shown again, its keys go only after the patch that stops
	// showing it has committed (afterCommit), and no other grant is ended
	// in the same patch.
	ended string
	// givingBack is set when this reconcile stops showing a grant and
	// releases its keys once that committed (afterCommit): an acquisition
	// that meets them meanwhile tries again right after.
	givingBack bool
	// shedding is set when this reconcile shows the grant shed (shedGrant).
	shedding bool
	// refused says why the locks of this lock's key refuse its namespace
	// (checkNamespace); "" when they do not.
	refused string
	// afterCommit runs, in order, once the status patch has committed.
	afterCommit []func(context.Context)
	// stale: status shows what another manager wrote since this one's
	// view: the reconcile acts on nothing.
	stale bool
	// ownValidity is the validity this reconcile's patch shows of the
	// grant it made or adopted, from its own Session.
	ownValidity *time.Time
	requeue     time.Duration // 0: none
}

func (s *scope) requeueAfter(d time.Duration) {
	d = max(d, time.Millisecond)
	if s.requeue == 0 || d < s.requeue {
		s.requeue = d
	}
}

func (s *scope) setHeld(status metav1.ConditionStatus, reason, msg string) {
	setCondition(&s.lock.Status, s.lock.Generation, v1alpha1.ConditionHeld, status, reason, msg)
}

func (s *scope) setReady(status metav1.ConditionStatus, reason, msg string) {
	setCondition(&s.lock.Status, s.lock.Generation, v1alpha1.ConditionReady, status, reason, msg)
}

// continueFrom replaces the lock read from a lagging cache by fresh,
// keeping what this reconcile has computed of Ready and the key.
func (s *scope) continueFrom(fresh *v1alpha1.DistributedLock) {
	ready := meta.FindStatusCondition(s.lock.Status.Conditions, v1alpha1.ConditionReady)
	key := s.lock.Status.Key
	*s.lock = *fresh.DeepCopy()
	s.orig = *fresh.Status.DeepCopy()
	s.lock.Status.Key = key
	if ready != nil {
		meta.SetStatusCondition(&s.lock.Status.Conditions, *ready)
	}
}

func (s *scope) clear(reason, msg string) {
	clearGrant(&s.lock.Status, s.lock.Generation, s.now, reason, msg)
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	lock := &v1alpha1.DistributedLock{}
	if err := r.Get(ctx, req.NamespacedName, lock); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.releaseOthers(ctx, req.NamespacedName, "")
		r.Metrics.ForgetLock(req.Namespace, req.Name)
		r.relabelled.Forget(req.String())
		r.overheld.Forget(req.String())
		r.writer.stopWaiting(req.NamespacedName)
		r.beats.forget(req.NamespacedName)
		r.stoppings.forget(req.NamespacedName)
		return ctrl.Result{}, nil
	}
	r.releaseOthers(ctx, req.NamespacedName, lock.UID)
	s := &scope{lock: lock, orig: *lock.Status.DeepCopy(), now: r.Clock.Now()}
	defer func() {
		if err := r.patchStatus(ctx, s); err != nil {
			retErr = kerrors.NewAggregate([]error{retErr, err})
		}
		if retErr == nil && s.requeue > 0 {
			result.RequeueAfter = s.requeue
		}
		// A requeue goes at the default priority, whatever brought the
		// lock in (a new leader's adoption order: see adoptionPriority).
		result.Priority = ptr.To(0)
	}()

	if !lock.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.reconcileDelete(ctx, s)
	}
	return ctrl.Result{}, runPhases(ctx, s, r.phases())
}

// flow says how a reconcile goes on after a phase.
type flow int

const (
	next   flow = iota // run the next phase
	finish             // run only the phases that always run
	halt               // run no more phases
)

// phase is one step of the reconcile of a lock that is not being deleted.
type phase struct {
	name string
	// always: the phase runs also after an earlier one finished early or
	// failed.
	always bool
	run    func(context.Context, *scope) (flow, error)
}

// phases are the steps of a reconcile, in order; the status patch follows
// them (see Reconcile).
func (r *Reconciler) phases() []phase {
	return []phase{
		// The finalizer first: a grant is never made for an object that
		// could go without its release.
		{name: "finalizer", run: r.ensureFinalizer},
		// This manager's session against status: a lost grant is cleared,
		// one status no longer shows is given back. Halts when status is
		// another manager's (stale view) or could not be read.
		{name: "session", run: r.sessionPhase},
		// The master set and what only the controller can check (Ready).
		// Finishes early when the set cannot be used.
		{name: "master set", run: r.masterSetPhase},
		// Who should hold the lock, and acquire, adopt, hand over or
		// release accordingly.
		{name: "holder", run: r.holderPhase},
		// Whatever failed after the session phase, status shows only what
		// is held, and flips by itself when the shown validity passes.
		{name: "show", always: true, run: r.showPhase},
		// HolderReachable, from the holder pod's node (the pods the holder
		// phase read).
		{name: "holder node", run: r.holderNodePhase},
	}
}

// runPhases runs phases in order for s: a phase that fails or finishes
// early skips the rest but those that always run; halt stops them all.
// It returns the phases' errors, each named by its phase.
func runPhases(ctx context.Context, s *scope, phases []phase) error {
	var errs []error
	early := false
	for _, p := range phases {
		if early && !p.always {
			continue
		}
		f, err := p.run(ctx, s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.name, err))
			early = true
		}
		if f == halt {
			break
		}
		early = early || f == finish
	}
	return kerrors.NewAggregate(errs)
}

// ensureFinalizer adds the finalizer and sets status.key.
func (r *Reconciler) ensureFinalizer(ctx context.Context, s *scope) (flow, error) {
	lock := s.lock
	if controllerutil.AddFinalizer(lock, Finalizer) {
		if err := r.Update(ctx, lock); err != nil {
			return halt, fmt.Errorf("add finalizer: %w", err)
		}
		r.markWritten(lock.UID)
		s.orig = *lock.Status.DeepCopy() // the server's status came back with the update
	}
	lock.Status.Key = lock.RedisKey()
	return next, nil
}

func (r *Reconciler) sessionPhase(ctx context.Context, s *scope) (flow, error) {
	if err := r.syncSession(ctx, s); err != nil {
		return halt, err
	}
	if s.shedding {
		// Shown shed by this reconcile's patch; granted again once the
		// writer admits it.
		s.requeueAfter(grantWait + jitter(grantWait))
		return finish, nil
	}
	if s.stale {
		// Another manager renews what this one decided from: decide
		// again once the cache has caught up (or this manager has exited,
		// deposed).
		s.requeueAfter(staleCacheRecheck)
		return halt, nil
	}
	return next, nil
}

func (r *Reconciler) masterSetPhase(ctx context.Context, s *scope) (flow, error) {
	c, usable, err := r.resolveMasterSet(ctx, s)
	if err != nil || !usable {
		// A transient error, or a master set that cannot be used: renew
		// with the last good client while it works.
		return finish, err
	}
	s.client = c
	return next, nil
}

func (r *Reconciler) holderPhase(ctx context.Context, s *scope) (flow, error) {
	return next, r.reconcileHolder(ctx, s)
}

func (r *Reconciler) showPhase(_ context.Context, s *scope) (flow, error) {
	r.showHolder(s)
	return next, nil
}

func (r *Reconciler) holderNodePhase(ctx context.Context, s *scope) (flow, error) {
	r.checkHolderNode(ctx, s)
	return next, nil
}

// releaseOthers releases the grants of objects named name other than uid:
// the lock was deleted (its finalizer stripped by hand) or re-created under
// the same name. Their sessions must not outlive their objects.
func (r *Reconciler) releaseOthers(ctx context.Context, name types.NamespacedName, uid types.UID) {
	for _, h := range r.sessions.others(name, uid) {
		lock := lockRef(name, h.uid)
		lock.Spec.MasterSet = h.masterSet
		until := r.leaveKeys(lock, h, h.ref, time.Time{})
		logf.FromContext(ctx).Info("stopped renewing the grant of a lock object that is gone", "uid", h.uid, "token", h.token, "keysUntil", until)
	}
}

// syncSession reconciles the renewal session with status: a lost session is
// cleared from status, and a session whose grant status no longer shows
// (another grant was committed since) is given back.
func (r *Reconciler) syncSession(ctx context.Context, s *scope) error {
	lock := s.lock
	h := r.sessions.get(lock.UID)
	if h == nil {
		return nil
	}
	if !showsGrantOf(lock.Status, h) || lock.Status.Holder == nil {
		// The cache may not show our own commit yet: ask the API server.
		fresh := &v1alpha1.DistributedLock{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(lock), fresh); err != nil {
			return fmt.Errorf("read lock: %w", err)
		}
		if fresh.UID == lock.UID && grantIDOf(fresh.Status) == h.grantID && fresh.Status.Holder == nil && !ended(h) {
			// Status stopped showing this grant while its Session runs:
			// a release whose write timed out yet committed, or a grant
			// hidden when its validity passed (a renewal landing just
			// after). Either way it ends here: readers were told.
			s.continueFrom(fresh)
			// Hidden by a patch whose commit this manager did not see: the
			// reconcile that wrote it can no longer say what proof it had,
			// so the keys are left until the validity this manager's
			// Session gave them has passed (decideEnd).
			_ = r.settle(ctx, lock, h, refOf(lock, h.grantID), nil, lastShown(fresh.Status), endHiddenElsewhere)
			switch reason := heldConditionReason(fresh.Status); {
			case givenUp(reason):
				if reason == v1alpha1.ReasonHolderTerminating {
					r.noteStopping(lock, h)
				}
				s.shedding = true // as the reconcile that gave it up would have gone on
			case reason == v1alpha1.ReasonValidityExpired || reason == v1alpha1.ReasonLost:
				r.countLost(lock, reason)
				r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, EventLost, "Renew", "grant %d to %s lost: status showed it %s", h.token, h.holder, reason)
			}
			return nil
		}
		if fresh.UID != lock.UID {
			// Re-created under this name since: the grant's object is gone.
			_ = r.settle(ctx, lock, h, h.ref, nil, time.Time{}, endObjectGone)
			return nil
		}
		if !showsGrantOf(fresh.Status, h) {
			_ = r.settle(ctx, lock, h, h.ref, nil, time.Time{}, endSuperseded)
			r.countLost(lock, v1alpha1.ReasonSuperseded)
			r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, EventSuperseded, "Renew",
				"gave up grant %d: status shows another grant (fencing token %d)", h.token, fresh.Status.FencingToken)
			return nil
		}
		s.continueFrom(fresh)
	}
	if !ended(h) {
		return r.giveUpIfDue(ctx, s, h)
	}
	r.endSession(ctx, s, h)
	return nil
}

// giveUpIfDue stops showing h's grant, which its Session still renews,
// when it is due: the status writer sheds it, its pod is being deleted
// (terminating.go), or its holder shows no sign of life (liveness.go).
func (r *Reconciler) giveUpIfDue(ctx context.Context, s *scope, h *held) error {
	released, err := r.saidReleased(ctx, s.lock, h, false)
	if err != nil {
		return err
	}
	if released {
		// A static holder's own release (its word for the grant): the
		// keys go at once, and its request ends with it.
		s.lock.Status.EndedRequest = &v1alpha1.EndedRequest{
			Identity: h.holder, Generation: s.lock.Generation, Reason: v1alpha1.ReasonReleased, At: v1alpha1.NewPreciseTime(s.now),
		}
		r.release(s, nil, endReleased, v1alpha1.ReasonReleased, "released by its holder")
		return nil
	}
	if why, shed := r.writer.shedding(h); shed {
		r.shedGrant(s, h, endShed, v1alpha1.ReasonShed, why)
		return nil
	}
	terminating, err := r.holderTerminating(ctx, s, h)
	if err != nil {
		return err
	}
	if terminating {
		r.hideForDeletion(s, h)
		return nil
	}
	if ended, err := r.endOnItsOwn(ctx, s, h); ended || err != nil {
		return err
	}
	why, pod, err := r.checkLiveness(ctx, s, h)
	if err != nil || why == "" {
		return err
	}
	// Marked first: once status stops showing the grant, the pod must
	// keep nobody from the lock, whichever manager looks next.
	if err := r.setMark(ctx, pod, h.grantID); err != nil {
		return err
	}
	r.shedGrant(s, h, endUnresponsive, v1alpha1.ReasonHolderUnresponsive, why)
	return nil
}

// shedGrant gives up h's grant, which its Session still renews, for
// cause (endGrant): shed by the status writer (load.go), its holder
// unresponsive (liveness.go), its pod being deleted (terminating.go),
// its lease or maxHoldDuration run out (lease.go). Its holder has lost it
// (a pod gets LockLost, and onLost applies); its keys stay until the
// validity shown has passed. A shed grant is granted again when status
// writes leave room; an unresponsive holder waits behind the others
// (podlock.Choose, markPassable).
func (r *Reconciler) shedGrant(s *scope, h *held, cause endCause, reason, why string) {
	lock := s.lock
	s.shedding = true
	r.endGrant(s, h, nil, cause, reason, why, func(ctx context.Context, _ error) {
		switch cause {
		case endShed:
			r.Metrics.LocksShed.Inc()
			r.countLost(lock, reason)
			r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, EventShed, "Release", "grant %d to %s shed: %s", h.token, h.holder, why)
		case endUnresponsive, endLeaseExpired, endMaxHold:
			r.countLost(lock, reason)
			r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, reason, "Release", "grant %d to %s given up: %s", h.token, h.holder, why)
		}
		logf.FromContext(ctx).Info("gave up a grant", "lock", h.name, "token", h.token, "reason", reason)
	})
}

// givenUp reports whether reason is that of a grant given up with its keys
// left until its validity passed (shedGrant).
func givenUp(reason string) bool {
	switch reason {
	case v1alpha1.ReasonShed, v1alpha1.ReasonHolderUnresponsive, v1alpha1.ReasonHolderTerminating, v1alpha1.ReasonLeaseExpired, v1alpha1.ReasonMaxHoldExceeded:
		return true
	}
	return false
}

// endSession forgets h, whose Session ended by itself (the grant was
// lost), and hides its grant: status stops showing it and, once that
// committed, its value is removed from every master.
func (r *Reconciler) endSession(ctx context.Context, s *scope, h *held) {
	lock := s.lock
	r.sessions.drop(h)
	if st := lock.Status; st.Holder != nil && st.ValidUntil != nil && showsGrantOf(st, h) && !h.ownValidity(st.ValidUntil.Time) {
		// Status shows the grant renewed beyond anything this manager's
		// writes showed: another manager renews it now (this one was
		// deposed while paused, and its Session lapsed meanwhile). Not
		// this manager's to hide, nor to release, nor to act on further.
		logf.FromContext(ctx).Info("a lapsed session's grant is renewed by another manager", "lock", h.name, "token", h.token)
		s.stale = true
		return
	}
	err := h.session.Err()
	reason := v1alpha1.ReasonLost
	var lost *renewal.LostError
	if errors.As(err, &lost) {
		reason = lost.Reason
	}
	r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, EventLost, "Renew", "grant %d to %s lost: %s", h.token, h.holder, conditions.Message(errString(err)))
	// Masters that still hold the lost grant's value (a minority its last
	// renewals reached, each refreshed for a whole ttl) would keep the key
	// from the next grant, this holder's included: once the validity
	// shown has passed, the value is removed wherever it is left.
	r.endGrant(s, h, nil, endLost, reason, "the grant was lost: "+errString(err), func(context.Context, error) { r.countLost(lock, reason) })
}

// countLost counts a grant of lock that ended without its holder giving
// it back, by the Held reason status shows, once status stopped showing it:
// redlock_lock_grants_lost_total, and the time of the loss, which the
// alert reads (a counter's first increment, or one after a restart, is
// invisible to increase()).
func (r *Reconciler) countLost(lock *v1alpha1.DistributedLock, reason string) {
	r.Metrics.GrantsLost.WithLabelValues(lock.Namespace, lock.Name, reason).Inc()
	r.Metrics.GrantLostAt.WithLabelValues(lock.Namespace, lock.Name, reason).Set(float64(r.Clock.Now().UnixNano()) / 1e9)
}

// lockRef is a DistributedLock object that only names a lock (and its UID,
// when given): what a wake-up, a patch by name or an event needs.
func lockRef(name types.NamespacedName, uid types.UID) *v1alpha1.DistributedLock {
	return &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name, UID: uid}}
}

// ended reports whether h's Session has ended.
func ended(h *held) bool {
	select {
	case <-h.session.Done():
		return true
	default:
		return false
	}
}

// heldConditionReason is the reason of status's Held condition, or "".
func heldConditionReason(st v1alpha1.DistributedLockStatus) string {
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHeld); c != nil {
		return c.Reason
	}
	return ""
}

// showsGrantOf reports whether status shows h's grant, or shows it ended
// (same grant ID, no holder): the same grant ID and token, and, while a
// holder is shown, h's holder.
func showsGrantOf(st v1alpha1.DistributedLockStatus, h *held) bool {
	return grantIDOf(st) == h.grantID && st.FencingToken == h.token && (st.Holder == nil || st.Holder.Identity == h.holder)
}

// resolveMasterSet finds the lock's master set and its client, and checks
// what only the controller can check. It sets Ready and reports whether the
// lock can be acted on; an error is transient (retried with backoff).
func (r *Reconciler) resolveMasterSet(ctx context.Context, s *scope) (*redlock.Client, bool, error) {
	lock := s.lock
	ms := &v1alpha1.RedisMasterSet{}
	err := r.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: lock.Spec.MasterSet}, ms)
	switch {
	case apierrors.IsNotFound(err):
		s.setReady(metav1.ConditionFalse, v1alpha1.ReasonMasterSetNotFound,
			fmt.Sprintf("RedisMasterSet %q not found in namespace %q", lock.Spec.MasterSet, lock.Namespace))
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("get master set: %w", err)
	}
	ttl := lock.Spec.TTL.Duration
	invalid := ""
	reason := v1alpha1.ReasonInvalidSpec
	switch maxTTL := ms.Spec.MaxLockTTL.Duration; {
	case ttl > maxTTL:
		invalid, reason = fmt.Sprintf("ttl %v exceeds maxLockTTL %v of RedisMasterSet %q", ttl, maxTTL, ms.Name), v1alpha1.ReasonTTLTooLong
	case keyProblem(lock) != nil:
		invalid = keyProblem(lock).Error()
	case ttl%time.Millisecond != 0 || renewInterval(lock.Spec) >= ttl:
		invalid = fmt.Sprintf("ttl %v must be whole milliseconds and longer than the renew interval %v", ttl, renewInterval(lock.Spec))
	}
	if invalid != "" {
		// A grant the spec no longer allows (maxLockTTL shrunk under it)
		// is given back: the masters' quarantine no longer covers it.
		if h := r.sessions.get(lock.UID); h != nil {
			r.release(s, nil, endSpecInvalid, reason, invalid)
		}
		s.setReady(metav1.ConditionFalse, reason, invalid)
		return nil, false, nil
	}
	c, err := r.Masters.Client(ctx, ms)
	if err != nil {
		s.setReady(metav1.ConditionFalse, v1alpha1.ReasonMasterSetNotReady,
			fmt.Sprintf("RedisMasterSet %q cannot be used: %v", ms.Name, err))
		s.requeueAfter(10 * time.Second) // a Secret is not watched: look again
		return nil, false, nil
	}
	if err := r.checkNamespace(ctx, s); err != nil {
		return nil, false, err
	}
	if s.refused == "" {
		s.setReady(metav1.ConditionTrue, v1alpha1.ReasonValid, "the spec is valid and its master set usable")
	}
	return c, true, nil
}

// reconcileHolder decides who should hold the lock (podlock.Choose over
// the static holder and the labelled pods), what to do about it, and does
// it.
func (r *Reconciler) reconcileHolder(ctx context.Context, s *scope) error {
	lock := s.lock
	var current *v1alpha1.LockHolder
	in := holderInputs{Now: s.now}
	if h := r.sessions.get(lock.UID); h != nil {
		h.session.SetTiming(lock.Spec.TTL.Duration, renewInterval(lock.Spec))
		current = &v1alpha1.LockHolder{Identity: h.holder, Pod: h.pod}
		in.ValidUntil, in.InMemory = h.session.State().ValidUntil, true
	} else if st := lock.Status; st.Holder != nil && st.ValidUntil != nil {
		current = st.Holder
		in.ValidUntil = st.ValidUntil.Time
	}
	pods, err := r.podsOf(ctx, lock, current)
	if err != nil {
		return err
	}
	s.pods = pods
	if pods, err = r.afterDeletions(ctx, s, pods); err != nil {
		return err
	}
	if lock.Status.LastHolderPod == nil {
		// A former holder that no longer carries the label (the lock was
		// re-created since, or its grant ended): track it until it stops.
		for _, p := range pods {
			if p.Labels[v1alpha1.LockLabel] != lock.Name && podlock.HeldBefore(p, lock.RedisKey()) && !podlock.Ended(p) {
				ref := podlock.Ref(p)
				lock.Status.LastHolderPod = &ref
				break
			}
		}
	}
	if last := lock.Status.LastHolderPod; last != nil {
		switch i := slices.IndexFunc(pods, func(p *corev1.Pod) bool { return p.UID == last.UID }); {
		case i < 0 || podlock.Ended(pods[i]):
			lock.Status.LastHolderPod = nil // it can no longer act on a grant
			r.relabelled.Forget(lock.Namespace + "/" + lock.Name)
		case pods[i].Labels[v1alpha1.LockLabel] != lock.Name:
			// Its events no longer reach this lock (they map by label):
			// look again soon, so that the queue moves once it stopped.
			s.requeueAfter(relabelledPoll)
		}
	}
	passable := markPassable(lock.Status, lock.Spec.TTL.Duration, s.now)
	if at := lastMarkPassableAt(lock.Status, lock.Spec.TTL.Duration, pods); s.now.Before(at) {
		s.requeueAfter(at.Sub(s.now)) // the lock is free for the others then
	}
	rules := podlock.Rules{Passable: passable, Allowed: s.allows}
	if podlock.MixedRevisions(pods) {
		// A rollout is under way: its workload's current revision goes
		// first (in the choice of a new pod, and in the queue shown).
		rules.Stale = r.staleRevisions(ctx, pods)
	}
	choice := podlock.Choose(s.staticRequest(current, in), lock.Name, lock.RedisKey(), current, lock.Status.LastHolderPod, pods, rules)
	s.requested = requestedHolder(choice)
	lock.Status.Queue = podlock.Queue(choice.Waiting)
	in.Requested, in.Holder = holderKey(s.requested), holderKey(current)
	return r.act(ctx, s, decideHolder(in), in)
}

// act carries out a holder decision.
func (r *Reconciler) act(ctx context.Context, s *scope, action holderAction, in holderInputs) error {
	c := s.client
	if action == actAdopt && r.wroteBefore(s.lock.UID) && !r.cacheCurrent(ctx, s) {
		// The cache lags behind this manager's own last write: decide
		// again on the fresh object rather than adopt a grant that may be
		// gone. A lock this manager has not written since it started (a
		// new leader's adoptions: thousands at once) is adopted without
		// that read: a cache behind another manager's write adopts a
		// grant whose first refresh, conditional on status still showing
		// it, is refused, and the reconcile that follows sees to it.
		return r.reconcileHolder(ctx, s)
	}
	logf.FromContext(ctx).V(1).Info("holder decision", "action", action.String(), "requested", in.Requested, "holder", in.Holder)
	if action != actAcquire && action != actAdopt {
		r.writer.stopWaiting(client.ObjectKeyFromObject(s.lock)) // it asks for no grant now
	}
	if s.ended != "" && (action == actRelease || action == actHandover) {
		return nil // ended already by this reconcile (its holder's word)
	}
	switch action {
	case actAcquire:
		r.acquire(ctx, s, c)
	case actAdopt:
		r.adopt(ctx, s, c)
	case actRelease:
		return r.endRequest(ctx, s, c, v1alpha1.ReasonNotRequested, "no holder is requested")
	case actHandover:
		// Stop showing the old holder, release, then acquire for the new
		// one in the next reconcile: no instant shows a grant whose keys
		// are gone.
		s.requeueAfter(time.Millisecond)
		return r.endRequest(ctx, s, c, v1alpha1.ReasonReleased, "released for the new holder")
	case actNone:
		r.showNotRequested(s)
	}
	return nil
}

// endRequest ends the current grant, whose holder is no longer the one
// requested, as requestEnd says (reason and msg when the end has none of
// its own).
func (r *Reconciler) endRequest(ctx context.Context, s *scope, c *redlock.Client, reason, msg string) error {
	cause, err := r.requestEnd(ctx, s)
	if err != nil {
		return err
	}
	r.release(s, c, cause, endReason(cause, reason), endMessage(cause, msg))
	return nil
}

// showNotRequested shows Held NotRequested when nobody is requested. A
// grant handed back by a pod being deleted keeps saying so while that pod
// may still run; so does a static request that ended, until another is
// made, and a grant whose keys are kept, until they go.
func (r *Reconciler) showNotRequested(s *scope) {
	st := s.lock.Status
	reason := heldConditionReason(st)
	ended := st.EndedRequest != nil && st.EndedRequest.Reason == reason
	at, left := r.keysLeft(s.lock)
	kept := left && s.now.Before(at)
	if s.requested == nil && !ended && !kept && (reason != v1alpha1.ReasonHolderTerminating || st.LastHolderPod == nil) {
		s.setHeld(metav1.ConditionFalse, v1alpha1.ReasonNotRequested, "no holder is requested")
	}
}

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
		former, err := r.formerHolders(ctx, lock, out)
		if err != nil {
			return nil, err
		}
		out = append(out, former...)
	}
	for _, ref := range refs {
		if ref == nil || slices.ContainsFunc(out, func(p *corev1.Pod) bool { return p.UID == ref.UID }) {
			continue
		}
		pod, err := r.podByRef(ctx, lock.Namespace, ref)
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

// formerHolders lists, from the API server, the pods of lock's namespace
// that were granted its key, may still run, and are not in known.
func (r *Reconciler) formerHolders(ctx context.Context, lock *v1alpha1.DistributedLock, known []*corev1.Pod) ([]*corev1.Pod, error) {
	var list corev1.PodList
	if err := r.APIReader.List(ctx, &list, client.InNamespace(lock.Namespace)); err != nil {
		return nil, fmt.Errorf("list former holders: %w", err)
	}
	var out []*corev1.Pod
	for i := range list.Items {
		p := &list.Items[i]
		if !podlock.HeldBefore(p, lock.RedisKey()) || podlock.Ended(p) || slices.ContainsFunc(known, func(k *corev1.Pod) bool { return k.UID == p.UID }) {
			continue
		}
		other, err := r.grantedByOther(ctx, lock, p)
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
func (r *Reconciler) grantedByOther(ctx context.Context, lock *v1alpha1.DistributedLock, pod *corev1.Pod) (bool, error) {
	if podlock.GrantedBy(pod, lock.Name) {
		return false, nil
	}
	granter := pod.Annotations[v1alpha1.LockNameAnnotation]
	other := &v1alpha1.DistributedLock{}
	switch err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: granter}, other); {
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
func (r *Reconciler) podByRef(ctx context.Context, ns string, ref *v1alpha1.PodReference) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, pod)
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

// checkHolderNode sets the HolderReachable condition while a pod holds
// the lock, from the holder's node. A failed read leaves it as it was.
func (r *Reconciler) checkHolderNode(ctx context.Context, s *scope) {
	st := &s.lock.Status
	var pod *corev1.Pod
	if st.Holder != nil && st.Holder.Pod != nil {
		if i := slices.IndexFunc(s.pods, func(p *corev1.Pod) bool { return p.UID == st.Holder.Pod.UID }); i >= 0 {
			pod = s.pods[i]
		}
	}
	if pod == nil || pod.Spec.NodeName == "" || r.IgnoreNodes {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionHolderReachable)
		return
	}
	node := &corev1.Node{}
	switch err := r.Get(ctx, types.NamespacedName{Name: pod.Spec.NodeName}, node); {
	case apierrors.IsNotFound(err):
		node = nil
	case err != nil:
		logf.FromContext(ctx).Error(err, "read the holder's node", "node", pod.Spec.NodeName)
		return
	}
	status, reason, msg := holderReachability(pod, node)
	setCondition(st, s.lock.Generation, v1alpha1.ConditionHolderReachable, status, reason, msg)
}

// requestedHolder is the holder a choice asks for (nil: nobody).
func requestedHolder(c podlock.Choice) *v1alpha1.LockHolder {
	switch {
	case c.Pod != nil:
		ref := podlock.Ref(c.Pod)
		return &v1alpha1.LockHolder{Identity: c.Pod.Name, Pod: &ref}
	case c.Static != "":
		return &v1alpha1.LockHolder{Identity: c.Static}
	default:
		return nil
	}
}

// holderKey identifies a holder for comparison: a pod by name and UID (a
// re-created pod of the same name is another holder), a static holder by
// its identity.
func holderKey(h *v1alpha1.LockHolder) string {
	switch {
	case h == nil:
		return ""
	case h.Pod != nil:
		return "pod:" + h.Pod.Name + "/" + string(h.Pod.UID)
	default:
		return h.Identity
	}
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
// being deleted or is gone is not granted; the lock looks again once the
// cache has caught up.
func (r *Reconciler) requestedPodMayHold(ctx context.Context, s *scope) bool {
	if s.requested == nil || s.requested.Pod == nil {
		return true
	}
	ref := s.requested.Pod
	pod, err := r.podByRef(ctx, s.lock.Namespace, ref)
	switch {
	case err != nil:
		logf.FromContext(ctx).Error(err, "read the requested pod before granting it", "pod", ref.Name)
	case podlock.MayHold(pod):
		return true
	default:
		logf.FromContext(ctx).V(1).Info("the requested pod has stopped or is gone; the cache lags", "pod", ref.Name)
	}
	s.requeueAfter(staleCacheRecheck)
	return false
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

// markedRecheck is how soon a lock whose next grant waits for a former
// holder's mark to go looks again (the pod's label change also brings it
// back while the pod is labelled for the lock).
const markedRecheck = 500 * time.Millisecond

// staleCacheRecheck is how soon a lock whose cache showed a stopped pod as
// a candidate is looked at again.
const staleCacheRecheck = 200 * time.Millisecond

// acquire takes the lock for the requested holder under a fresh grant ID
// and a fencing token from the masters, and starts renewing it. The grant
// counts once the status patch commits it.
func (r *Reconciler) acquire(ctx context.Context, s *scope, c *redlock.Client) {
	lock := s.lock
	name, ttl := client.ObjectKeyFromObject(lock), lock.Spec.TTL.Duration
	if !r.writer.admit(name, ttl) {
		// The held locks' refreshes are behind, or would be with this
		// grant: they go first, a new grant waits until the writer has
		// room and asks for a reconcile (waiters.go; at the latest after
		// grantRecheck). redlock_status_write_backlog, _demand_per_second
		// and _capacity_per_second show why. One message for both
		// causes: a message alternating between them would cost a status
		// write each time. A shed grant keeps showing Shed meanwhile.
		reason, msg := v1alpha1.ReasonStatusWritesBehind,
			"waiting: the status refreshes of the locks held go first; a grant is made when they leave room (redlock_status_write_backlog, redlock_status_write_capacity_per_second)"
		if heldConditionReason(lock.Status) == v1alpha1.ReasonShed {
			reason = v1alpha1.ReasonShed
		}
		s.setHeld(metav1.ConditionFalse, reason, msg)
		recheck := cmp.Or(r.GrantRecheck, grantRecheck)
		s.requeueAfter(recheck + jitter(recheck))
		return
	}
	if !r.requestedPodMayHold(ctx, s) || r.previousHolderMarked(ctx, s) {
		r.writer.stopWaiting(name) // no grant: its room goes back
		return
	}
	if lock.Status.Holder != nil && r.sessions.get(lock.UID) == nil && !s.now.Before(releasableAt(lock)) && s.ended == "" {
		// Status still shows a grant whose validity passed (decideHolder)
		// and that no Session here renews: it is replaced or hidden by
		// this reconcile's patch, and what it left released after that.
		r.endGrant(s, nil, c, endLapsed, "", "", nil)
	}
	grantID := lockvalue.NewGrantID()
	value := r.Values.Value(string(lock.UID), grantID)
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	lk, err := acquire(octx, c, lock, ttl, redlock.WithValue(value), redlock.WithFencing())
	if err != nil {
		// No grant: the room admit kept for it goes back (a lock whose
		// key another lock holds, or whose masters lack a quorum, would
		// otherwise keep it for as long as that lasts).
		r.writer.stopWaiting(name)
		if at, left := r.keysLeft(lock); left && errors.Is(err, redlock.ErrLockHeld) && s.now.Before(at) {
			// Most likely the keys of the last grant, which its end left
			// until the validity it showed has passed: the reason stays.
			s.setHeld(metav1.ConditionFalse, heldConditionReason(lock.Status),
				"the last grant's keys are kept until the validity it showed has passed ("+at.UTC().Format(time.RFC3339Nano)+"); the next is granted then: "+err.Error())
		} else {
			s.setHeld(metav1.ConditionFalse, heldReason(err), heldMessage(lock, err))
		}
		setQuorum(&lock.Status, c.Quorum(), votesOf(err))
		s.requeueAfter(retryDelay(ttl, jitter))
		if s.givingBack && errors.Is(err, redlock.ErrLockHeld) {
			// Perhaps the copies of the grant this reconcile stops
			// showing: try again once they are released.
			s.requeueAfter(time.Millisecond)
		}
		return
	}
	h := &held{
		uid: lock.UID, name: name, ref: refOf(lock, grantID), masterSet: lock.Spec.MasterSet,
		leased:  s.requested.Pod == nil && lock.Spec.HolderLease != nil,
		grantID: grantID, holder: s.requested.Identity, pod: s.requested.Pod, token: lk.Token(),
		acquiredAt: r.Clock.Now(), quorum: c.Quorum(),
	}
	r.startSession(s, h, lk, c)
}

// adopt resumes a grant that status shows valid but this manager does not
// renew (it restarted, or leadership moved): its value is derived again
// from the grant ID, and one extension proves the masters still hold it.
func (r *Reconciler) adopt(ctx context.Context, s *scope, c *redlock.Client) {
	lock := s.lock
	st := lock.Status
	if sp := lock.Spec; sp.HolderLease != nil || sp.MaxHoldDuration != nil || sp.HeartbeatTimeout != nil {
		// The adopted grant's lease, bound or heartbeat is counted from
		// the next look (giveUpIfDue), which nothing else may bring
		// soon (a static holder has no pods whose events would).
		s.requeueAfter(time.Millisecond)
	}
	grantID := grantIDOf(st)
	var lk *redlock.Lock
	err := errors.New("status names no grant")
	if grantID != "" {
		// The adopting extension covers at least the validity status
		// shows (its ttl may have shrunk since the grant): the keys never
		// expire, nor is the validity shown moved back, before that.
		ttl := renewal.CoveringTTL(lock.Spec.TTL.Duration, st.ValidUntil.Time, time.Now())
		lk, err = c.Restore(lock.RedisKey(), r.Values.Value(string(lock.UID), grantID), ttl, st.ValidUntil.Time, restoreOptions(slotOf(lock), st.FencingToken)...)
	}
	if err == nil {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		err = lk.Extend(octx)
		cancel()
	}
	if err != nil && !errors.Is(err, redlock.ErrNotHeld) && !errors.Is(err, redlock.ErrExpired) && grantID != "" {
		// The grant may still stand: keep showing it while it is valid and
		// try again soon.
		setQuorum(&lock.Status, c.Quorum(), votesOf(err))
		s.requeueAfter(min(time.Second, st.ValidUntil.Sub(s.now)))
		return
	}
	if err != nil {
		// The adopting extension may have refreshed copies (a minority's,
		// or a quorum's too late): removed once status stopped showing
		// the grant and its validity passed.
		// A validity that passed between this reconcile's start and the
		// adopting extension (ErrExpired) ended at the validity shown,
		// which clearGrant records, not at this reconcile's start.
		reason := v1alpha1.ReasonLost
		if errors.Is(err, redlock.ErrExpired) {
			reason = v1alpha1.ReasonValidityExpired
		}
		r.endGrant(s, nil, c, endAdoptionFailed, reason, "the grant could not be adopted: "+err.Error(), func(context.Context, error) { r.countLost(lock, reason) })
		r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, EventLost, "Renew", "grant %d to %s was lost at its adoption: %s", st.FencingToken, st.Holder.Identity, conditions.Message(err.Error()))
		r.acquire(ctx, s, c)
		return
	}
	acquiredAt := s.now
	if st.AcquiredAt != nil {
		acquiredAt = st.AcquiredAt.Time
	}
	h := &held{
		uid: lock.UID, name: client.ObjectKeyFromObject(lock), ref: refOf(lock, grantID), masterSet: lock.Spec.MasterSet,
		leased:  st.Holder.Pod == nil && lock.Spec.HolderLease != nil,
		grantID: grantID, holder: st.Holder.Identity, pod: st.Holder.Pod, token: st.FencingToken,
		acquiredAt: acquiredAt, quorum: c.Quorum(),
		othersCopiesUntil: othersCopiesUntil(st.ValidUntil.Time, lock.Spec.TTL.Duration),
	}
	// Adopted without a status write of this reconcile's: the writer
	// refreshes the grant at once, adopted grants nearest shown validity
	// first, within its budget (writeAdopted), so that a new leader's
	// adoption of thousands of locks does not wait on a write each (make
	// bench-failover). The validity shown becomes this manager's to renew.
	r.startSession(s, h, lk, c)
	s.pending = nil
	h.wrote(st.ValidUntil.Time)
	r.writer.writeAdopted(h, st.ValidUntil.Time, lock.Spec.TTL.Duration)
	r.Recorder.Eventf(lock, nil, corev1.EventTypeNormal, EventAdopted, "Renew", "resumed renewing the grant to %s (fencing token %d)", h.holder, h.token)
	r.Metrics.FencingToken.WithLabelValues(lock.Namespace, lock.Name).Set(float64(h.token))
}

// startSession starts renewing a grant made or adopted by this reconcile.
func (r *Reconciler) startSession(s *scope, h *held, lk *redlock.Lock, c *redlock.Client) {
	lock := s.lock
	ms := types.NamespacedName{Namespace: lock.Namespace, Name: lock.Spec.MasterSet}
	r.sessions.hold(h, func() *renewal.Session {
		return renewal.Hold(r.sessions.base, renewal.Grant{
			Lock: lk, Client: c,
			Key: lk.Key(), Value: lk.Value(), Token: lk.Token(), Slot: slotOf(lock), TTL: lock.Spec.TTL.Duration, Every: renewInterval(lock.Spec),
			ValidUntil: lk.ValidUntil(), Votes: lk.Votes(), OthersCopiesUntil: h.othersCopiesUntil,
		}, renewal.Config{
			Client:  func() *redlock.Client { return r.Masters.Lookup(ms) },
			Reports: r.writer.reports,
			Metrics: r.Metrics,
			Reasons: heldReason,
		})
	})
	s.pending = h
}

// enqueue asks for a reconcile of lock without blocking the caller.
func (r *Reconciler) enqueue(name types.NamespacedName) { r.wake.add(name) }

// release ends the current grant for cause (endGrant), and tells of it
// once its keys' fate is settled. c is used when this manager has no
// Session for it. Until the patch commits, the Session keeps renewing: if
// the write fails, nothing has changed.
func (r *Reconciler) release(s *scope, c *redlock.Client, cause endCause, reason, msg string) {
	lock := s.lock
	holder := shownHolder(lock.Status, s.now)
	h := r.sessions.get(lock.UID)
	if h != nil {
		holder = h.holder
	}
	r.endGrant(s, h, c, cause, reason, msg, func(_ context.Context, err error) {
		if decideEnd(cause).keys == keysNow {
			r.releasedEvent(lock, holder+"'s grant", "released by "+holder, err)
			return
		}
		r.Recorder.Eventf(lock, nil, corev1.EventTypeNormal, EventReleased, "Release",
			"grant of %s ended (%s): its keys are kept until the validity status showed has passed", holder, cause)
	})
}

// releasableAt is when lock's shown grant, which no Session here renews,
// has lapsed long enough to be released (zero: no validity is shown): its
// validity may come from another manager's clock, so the clock drift
// allowance passes first (until then its copies would have been there
// anyway).
func releasableAt(lock *v1alpha1.DistributedLock) time.Time {
	if vu := lock.Status.ValidUntil; vu != nil {
		return vu.Add(redlock.Drift(lock.Spec.TTL.Duration))
	}
	return time.Time{}
}

// grantRef names a grant in Redis.
type grantRef struct {
	uid     types.UID
	key     string
	grantID string
	ttl     time.Duration
	slot    *redlock.Slot // the semaphore slot the lock is; nil for a plain lock
}

// refOf names the grant grantID of lock.
func refOf(lock *v1alpha1.DistributedLock, grantID string) grantRef {
	return grantRef{uid: lock.UID, key: lock.RedisKey(), grantID: grantID, ttl: lock.Spec.TTL.Duration, slot: slotOf(lock)}
}

// othersCopiesUntil bounds the copies of a grant whose validity status
// showed as shown that another renewer wrote (this manager before a
// restart, a deposed leader waking from a pause): it may renew until its
// own validity, which status trails by less than a TTL, and each renewal's
// copies live a TTL past it, applied within an operation's time (two: the
// renewal and the restore after it). The drift allowance comes on top
// where it is used.
func othersCopiesUntil(shown time.Time, ttl time.Duration) time.Time {
	return shown.Add(2*ttl + 2*opTimeout)
}

// giveBack releases a grant in Redis: through its session when this
// manager renews it (h), otherwise from its grant ID on client c. When the
// release does not complete, the instant every copy has expired is
// remembered for a deletion waiting on it.
func (r *Reconciler) giveBack(ctx context.Context, h *held, g grantRef, c *redlock.Client) error {
	var err error
	var expiry time.Time
	if h != nil {
		err = r.releaseSession(ctx, h)
		// Not the validity: a renewal that failed may still have reached
		// some masters, and its copies outlive the validity. Read once the
		// Session stopped, so that a renewal in flight counts.
		expiry = h.session.State().ExpiresBy
	} else {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		err = r.releaseGrant(octx, g, c)
		cancel()
	}
	if err != nil && !errors.Is(err, redlock.ErrNotHeld) && !expiry.IsZero() {
		r.ends.setExpiry(g.uid, expiry)
	}
	return err
}

// releaseSession forgets h and releases its grant through its session,
// within one operation's time.
func (r *Reconciler) releaseSession(ctx context.Context, h *held) error {
	r.sessions.drop(h)
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return h.session.Release(octx)
}

// releaseGrant releases the grant g on client c.
func (r *Reconciler) releaseGrant(ctx context.Context, g grantRef, c *redlock.Client) error {
	switch {
	case g.grantID == "":
		return redlock.ErrNotHeld
	case c == nil:
		return redlock.ErrQuorumUnavailable
	}
	lk, err := c.Restore(g.key, r.Values.Value(string(g.uid), g.grantID), g.ttl, time.Time{}, restoreOptions(g.slot, 0)...)
	if err != nil {
		return err
	}
	return lk.Release(ctx)
}

// reconcileDelete releases the lock and removes the finalizer, in two
// steps: status stops showing the grant (and, once that committed, the
// grant is released in Redis); then, with no grant shown, the finalizer is
// removed. When the masters cannot be reached, the finalizer stays until
// every copy of the grant has expired: what the session wrote (its latest
// renewal sent, answered or not: renewal.State.ExpiresBy, which for an
// adopted grant covers the previous renewer's copies too) when this
// manager renewed it, otherwise what othersCopiesUntil bounds from
// status's validity, and never before a release recorded in status could
// have run; plus the drift allowance.
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) error {
	lock := s.lock
	r.writer.stopWaiting(client.ObjectKeyFromObject(lock))
	if !controllerutil.ContainsFinalizer(lock, Finalizer) {
		return nil
	}
	if h := r.sessions.get(lock.UID); h != nil && (lock.Status.Holder == nil || !showsGrantOf(lock.Status, h)) {
		// The cache may show the deletion but not this manager's own last
		// commit (a grant made just before it): what status shows decides
		// between giving the Session back now and hiding its grant first.
		fresh := &v1alpha1.DistributedLock{}
		switch err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(lock), fresh); {
		case apierrors.IsNotFound(err):
			// Gone, so nothing shows the grant any more.
			_ = r.settle(ctx, lock, h, h.ref, nil, time.Time{}, endObjectGone)
			return nil
		case err != nil:
			return fmt.Errorf("read lock: %w", err)
		case fresh.UID != lock.UID:
			return nil // re-created: releaseOthers gives the Session back
		}
		// Nothing of the cached view is kept: the deletion computes no
		// Ready or key of its own.
		*s.lock = *fresh.DeepCopy()
		s.orig = *fresh.Status.DeepCopy()
		lock = s.lock
		if st := lock.Status; st.Holder == nil || !showsGrantOf(st, h) {
			// Hidden (or replaced) by a write whose commit this manager
			// did not see: its end is settled as syncSession settles it,
			// before the keys left are waited for.
			cause := endHiddenElsewhere
			if grantIDOf(st) != h.grantID {
				cause = endSuperseded
			}
			_ = r.settle(ctx, lock, h, h.ref, nil, lastShown(st), cause)
		}
	}
	c := r.clientFor(ctx, lock)
	if lock.Status.Holder != nil {
		if vu := lock.Status.ValidUntil; vu != nil && r.sessions.get(lock.UID) == nil {
			r.ends.setExpiry(lock.UID, othersCopiesUntil(vu.Time, lock.Spec.TTL.Duration))
		}
		cause, err := r.deletionEnd(ctx, s)
		if err != nil {
			return err
		}
		r.release(s, c, cause, endReason(cause, v1alpha1.ReasonReleased), endMessage(cause, "released on deletion"))
		s.requeueAfter(time.Millisecond) // then remove the finalizer
		return nil
	}
	return r.removeFinalizer(ctx, s, c)
}

// removeFinalizer lets a lock being deleted, which shows no grant, go:
// once the last grant's end lets its keys go (decideEnd), whatever is
// left is given back, and the finalizer removed once that completed or
// every copy has expired.
func (r *Reconciler) removeFinalizer(ctx context.Context, s *scope, c *redlock.Client) error {
	lock := s.lock
	if at, left := r.keysLeft(lock); left && s.now.Before(at) {
		s.setHeld(metav1.ConditionFalse, cmp.Or(heldConditionReason(lock.Status), v1alpha1.ReasonReleased),
			"deleting: the last grant's keys are kept until the validity it showed has passed ("+at.UTC().Format(time.RFC3339Nano)+"); the object goes then")
		s.requeueAfter(at.Sub(s.now))
		return nil
	}
	err := r.giveBack(ctx, r.sessions.get(lock.UID), refOf(lock, grantIDOf(lock.Status)), c)
	rec, _ := r.ends.get(lock.UID)
	expiry, known := rec.expiry, !rec.expiry.IsZero()
	if ra := lock.Status.ReleasedAt; ra != nil {
		// Another manager (or this one before a restart) stopped showing
		// the grant at releasedAt and renewed it at most until its release
		// ran, within one operation after that.
		if by := ra.Add(opTimeout + lock.Spec.TTL.Duration); !known || by.After(expiry) {
			expiry, known = by, true
		}
	}
	if err != nil && !errors.Is(err, redlock.ErrNotHeld) && known {
		if until := expiry.Add(redlock.Drift(lock.Spec.TTL.Duration)); s.now.Before(until) {
			s.setHeld(metav1.ConditionFalse, v1alpha1.ReasonQuorumUnavailable,
				"deleting: the release did not reach a quorum; retrying until the grant expires at "+until.UTC().Format(time.RFC3339Nano))
			s.requeueAfter(min(time.Second, until.Sub(s.now)))
			return nil
		}
	}
	r.ends.forget(lock.UID)
	r.Metrics.ForgetLock(lock.Namespace, lock.Name)
	controllerutil.RemoveFinalizer(lock, Finalizer)
	if err := r.Update(ctx, lock); err != nil {
		return client.IgnoreNotFound(err)
	}
	r.written.Delete(lock.UID)
	return nil
}

// clientFor returns the client of the lock's master set, or nil.
func (r *Reconciler) clientFor(ctx context.Context, lock *v1alpha1.DistributedLock) *redlock.Client {
	ms := &v1alpha1.RedisMasterSet{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: lock.Spec.MasterSet}, ms); err != nil {
		return r.Masters.Lookup(types.NamespacedName{Namespace: lock.Namespace, Name: lock.Spec.MasterSet})
	}
	c, err := r.Masters.Client(ctx, ms)
	if err != nil {
		return r.Masters.Lookup(types.NamespacedName{Namespace: lock.Namespace, Name: lock.Spec.MasterSet})
	}
	return c
}

// showHolder fills status from the grant this manager renews, or hides a
// holder whose validity has passed. A grant status already shows is left
// to the status writer, which refreshes its validity; a shown holder that
// this manager does not renew gets a look at the moment its validity
// passes, so that status flips by itself.
func (r *Reconciler) showHolder(s *scope) {
	lock := s.lock
	st := &lock.Status
	if h := r.sessions.get(lock.UID); h != nil && h.grantID != s.ended {
		state := h.session.State()
		switch {
		case !s.now.Before(state.ValidUntil):
			// Lost, and its Session reports it: hide it below.
		case s.pending != h && st.Holder != nil && st.GrantID == h.grantID:
			// The status writer refreshes its validity; the condition
			// follows the spec's generation.
			s.setHeld(metav1.ConditionTrue, v1alpha1.ReasonAcquired, "held by "+h.holder)
			return
		default:
			showGrant(st, viewOf(h, state), lock.Generation)
			s.ownValidity = &state.ValidUntil
			return
		}
	}
	if st.Holder == nil {
		return
	}
	if st.ValidUntil == nil || !s.now.Before(st.ValidUntil.Time) {
		if r.sessions.get(lock.UID) == nil {
			if at := releasableAt(lock); s.now.Before(at) {
				// Its validity passed; readers see that. It is hidden
				// and released together once the drift allowance passed.
				s.requeueAfter(at.Sub(s.now))
				return
			}
			if s.ended == "" {
				r.endGrant(s, nil, s.client, endLapsed, "", "", nil)
			}
		}
		s.clear(v1alpha1.ReasonValidityExpired, "the grant's validity passed without renewal")
		s.afterCommit = append(s.afterCommit, func(context.Context) { r.countLost(lock, v1alpha1.ReasonValidityExpired) })
		return
	}
	s.requeueAfter(st.ValidUntil.Sub(s.now))
}

// patchStatus writes the status changes of this reconcile in one patch,
// conditional on the status the reconcile started from. A conflict is
// retried once when a fresh read shows the same grant; otherwise the
// reconcile gives up. A grant made by this reconcile counts only once the
// patch succeeded, and is given back otherwise.
func (r *Reconciler) patchStatus(ctx context.Context, s *scope) error {
	lock := s.lock
	lock.Status.ObservedGeneration = lock.Generation
	var err error
	if !equalStatus(s.orig, lock.Status) {
		err = r.patch(ctx, s)
	}
	if err != nil {
		if h := s.pending; h != nil {
			switch r.writeOutcome(ctx, lock, h, err) {
			case writeRefused:
				r.dropPending(ctx, s, h, err)
			case writeUnknown:
				r.leavePending(ctx, s, h, err)
			case writeCommitted:
				r.Metrics.Grants.WithLabelValues(lock.Namespace, lock.Name).Inc()
			}
		}
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patch status: %w", err)
	}
	for _, f := range s.afterCommit {
		f(context.WithoutCancel(ctx))
	}
	if h := s.pending; h != nil {
		r.Recorder.Eventf(lock, nil, corev1.EventTypeNormal, EventGranted, "Acquire", "granted to %s with fencing token %d", h.holder, h.token)
		r.Metrics.Grants.WithLabelValues(lock.Namespace, lock.Name).Inc()
		r.Metrics.FencingToken.WithLabelValues(lock.Namespace, lock.Name).Set(float64(h.token))
	}
	if h := s.pending; h != nil && s.ownValidity != nil {
		h.wrote(*s.ownValidity)
	}
	if h := r.sessions.get(lock.UID); h != nil && lock.Status.GrantID == h.grantID && lock.Status.Holder != nil && lock.Status.ValidUntil != nil {
		r.writer.track(h, lock.Status.ValidUntil.Time, lock.Spec.TTL.Duration)
	}
	return nil
}

// writeResult is what a failed status write did with the grant it showed.
type writeResult int

const (
	writeRefused   writeResult = iota // not committed, and never will be
	writeCommitted                    // committed all the same
	writeUnknown                      // not committed yet: it may still be
)

// writeOutcome tells what a status write that returned err did with the
// grant h (see commitOutcome), reading the lock afresh when the error
// does not say.
func (r *Reconciler) writeOutcome(ctx context.Context, lock *v1alpha1.DistributedLock, h *held, err error) writeResult {
	return commitOutcome(err, func() (bool, error) {
		fresh := &v1alpha1.DistributedLock{}
		if gerr := r.APIReader.Get(context.WithoutCancel(ctx), client.ObjectKeyFromObject(lock), fresh); gerr != nil {
			return false, gerr
		}
		return fresh.UID == h.uid && fresh.Status.GrantID == h.grantID && fresh.Status.Holder != nil, nil
	})
}

// commitOutcome decides what a failed status write did with its new grant
// (its ID was never shown before). A refusal (conflict, invalid, gone,
// forbidden, bad request) committed nothing — unless it is a conflict and a
// fresh read shows the grant: the refusal then answered a resend of a
// request that had committed (client-go resends after a 5xx with
// Retry-After).
// Any other error (a timeout, a reset connection, a request cancelled
// while the manager stops) leaves the write in flight at the API server,
// where it may still be applied after any read made now: a fresh read that
// shows the grant says it committed; one that does not, or that fails,
// says nothing for certain.
func commitOutcome(err error, showsGrant func() (bool, error)) writeResult {
	if apierrors.IsConflict(err) || apierrors.IsInvalid(err) || apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) {
		if apierrors.IsConflict(err) {
			if shows, rerr := showsGrant(); rerr == nil && shows {
				return writeCommitted
			}
		}
		return writeRefused
	}
	if shows, rerr := showsGrant(); rerr == nil && shows {
		return writeCommitted
	}
	return writeUnknown
}

// leavePending stops renewing a grant whose status write may still be
// applied, and leaves its keys to expire: they outlive any validity a late
// commit shows (it shows this Session's), and the next reconcile adopts the
// grant if status shows it. Releasing it could leave status showing a
// grant whose keys are gone, for another lock of the key to be granted
// meanwhile.
func (r *Reconciler) leavePending(ctx context.Context, s *scope, h *held, cause error) {
	_ = r.settle(ctx, s.lock, h, h.ref, nil, time.Time{}, endCommitUnknown)
	r.Recorder.Eventf(s.lock, nil, corev1.EventTypeWarning, EventNotCommitted, "Acquire",
		"grant %d to %s is left to expire: whether its status write committed is not known: %s", h.token, h.holder, conditions.Message(cause.Error()))
}

// dropPending gives back a grant this reconcile made whose status write
// did not commit: it is released, its value being unique to it.
func (r *Reconciler) dropPending(ctx context.Context, s *scope, h *held, cause error) {
	lock := s.lock
	_ = r.settle(context.WithoutCancel(ctx), lock, h, h.ref, nil, time.Time{}, endNotCommitted)
	r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, EventNotCommitted, "Acquire",
		"grant %d to %s was given back: status could not be written: %s", h.token, h.holder, conditions.Message(cause.Error()))
}

// patch sends the status patch with optimistic concurrency; see
// patchStatus. A conflict is retried while a fresh read shows the same
// grant as the status this reconcile started from: the same changes are
// sent again on the fresh version, so that a validity the status writer
// refreshed meanwhile is kept.
func (r *Reconciler) patch(ctx context.Context, s *scope) error {
	lock := s.lock
	kind := writeKind(s.orig, lock.Status)
	var err error
	for attempt := 0; ; attempt++ {
		base := lock.DeepCopy()
		base.Status = s.orig
		err = r.Status().Patch(ctx, lock, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		if !apierrors.IsConflict(err) || attempt == patchAttempts-1 {
			break
		}
		fresh := &v1alpha1.DistributedLock{}
		if gerr := r.APIReader.Get(ctx, client.ObjectKeyFromObject(lock), fresh); gerr != nil {
			return gerr
		}
		if fresh.UID != lock.UID || !sameGrant(fresh.Status, s.orig) {
			return fmt.Errorf("status changed under this reconcile (another writer): %w", err)
		}
		if hidesGrant(s.orig, lock.Status) && !sameValidity(fresh.Status, s.orig) && !r.ownValidity(lock.UID, fresh.Status) {
			// This reconcile stops showing a grant that another writer has
			// shown renewed since it read status (the status writer, or
			// the leader that took over from this manager): its decision
			// rests on a stale view. The next reconcile decides again.
			return fmt.Errorf("the grant was renewed under this reconcile, which would hide it: %w", err)
		}
		keepLaterValidity(&lock.Status, fresh.Status)
		lock.ResourceVersion = fresh.ResourceVersion
	}
	if err != nil {
		return err
	}
	r.markWritten(lock.UID)
	r.Metrics.StatusWrites.WithLabelValues(kind).Inc()
	return nil
}

// ownValidity reports whether the validity st shows is one this manager's
// own writes showed for the grant it renews (the status writer's refresh),
// rather than another manager's.
func (r *Reconciler) ownValidity(uid types.UID, st v1alpha1.DistributedLockStatus) bool {
	h := r.sessions.get(uid)
	return h != nil && st.ValidUntil != nil && showsGrantOf(st, h) && h.ownValidity(st.ValidUntil.Time)
}

// patchAttempts bounds the status patches of one reconcile that conflict
// with validity refreshes.
const patchAttempts = 4

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// SetupWithManager registers the controller and its renewal sessions.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	r.sessions = newSessions()
	qps := r.StatusWriteQPS
	if qps <= 0 {
		qps = DefaultStatusWriteQPS
	}
	// The writer has a client of its own, limited only by its budget, so
	// that refreshes never queue behind grants in the client's limiter.
	wcfg := rest.CopyConfig(mgr.GetConfig())
	wcfg.QPS, wcfg.Burst, wcfg.RateLimiter = -1, 0, nil
	wc, err := client.New(wcfg, client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return fmt.Errorf("status writer client: %w", err)
	}
	r.writer = newStatusWriter(wc, r.Recorder, r.Metrics, r.sessions, qps, r.FailoverSlack)
	r.sessions.dropped = r.writer.forget
	r.sessions.last = r.writer.handedOver
	r.writer.committed = r.markWritten
	r.writer.reconcile = r.enqueue
	r.wake = &wakeQueue{}
	r.beats = newHeartbeats(r.Clock)
	hbs, err := mgr.GetCache().GetInformer(ctx, &v1alpha1.LockHeartbeat{})
	if err != nil {
		return fmt.Errorf("heartbeat informer: %w", err)
	}
	r.beats.stopped = r.enqueue // an agent's word: the lock may pass on now
	if _, err := hbs.AddEventHandler(r.beats.handler()); err != nil {
		return fmt.Errorf("heartbeat informer: %w", err)
	}
	if err := mgr.Add(r.sessions); err != nil {
		return err
	}
	if err := mgr.Add(r.writer); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.DistributedLock{}, indexMasterSet, func(o client.Object) []string {
		return []string{o.(*v1alpha1.DistributedLock).Spec.MasterSet}
	}); err != nil {
		return err
	}
	if err := indexRules(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	workers := r.MaxConcurrentReconciles
	if workers <= 0 {
		workers = 4
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("distributedlock").
		// Held locks first when a new leader starts: see adoptionPriority.
		Watches(&v1alpha1.DistributedLock{}, &adoptFirst{now: r.Clock.Now}, builder.WithPredicates(specOrLifecycleChanged())).
		// The namespaces rule of a key governs every lock of the key.
		Watches(&v1alpha1.DistributedLock{}, handler.EnqueueRequestsFromMapFunc(r.locksOfRule), builder.WithPredicates(namespaceRuleChanged())).
		Watches(&v1alpha1.DistributedSemaphore{}, handler.EnqueueRequestsFromMapFunc(r.locksOfRule), builder.WithPredicates(namespaceRuleChanged())).
		Watches(&v1alpha1.RedisMasterSet{}, handler.EnqueueRequestsFromMapFunc(r.locksOfMasterSet),
			builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, listAdopted()))).
		WatchesRawSource(r.wake)
	if r.Pods != nil {
		b = b.WatchesRawSource(source.Kind(r.Pods, &corev1.Pod{}, handler.TypedEnqueueRequestsFromMapFunc(lockOfPod)))
		if !r.IgnoreNodes {
			b = b.Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.locksOnNode), builder.WithPredicates(nodeReadinessChanged()))
		}
	}
	return b.WithOptions(controller.Options{MaxConcurrentReconciles: workers, RateLimiter: rateLimiter(), UsePriorityQueue: ptr.To(true)}).
		Complete(r)
}

// rateLimiter is controller-runtime's default with the per-item backoff
// capped at maxBackoff: a reconcile that failed drops its RequeueAfter (a
// shown validity to hide, a former holder to look at again), so it must
// come back soon rather than after minutes of backoff.
func rateLimiter() workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, maxBackoff),
		&workqueue.TypedBucketRateLimiter[reconcile.Request]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
	)
}

// maxBackoff caps the retry delay of a failed reconcile.
const maxBackoff = 5 * time.Second

// lockOfPod enqueues the lock a pod's label names.
func lockOfPod(_ context.Context, pod *corev1.Pod) []reconcile.Request {
	name := pod.Labels[v1alpha1.LockLabel]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: pod.Namespace, Name: name}}}
}

// locksOnNode enqueues the locks of the labelled pods bound to a node.
func (r *Reconciler) locksOnNode(ctx context.Context, o client.Object) []reconcile.Request {
	var list corev1.PodList
	if err := r.Pods.List(ctx, &list); err != nil {
		logf.FromContext(ctx).Error(err, "list pods of node", "node", o.GetName())
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if list.Items[i].Spec.NodeName == o.GetName() {
			reqs = append(reqs, lockOfPod(ctx, &list.Items[i])...)
		}
	}
	return reqs
}

// nodeReadinessChanged passes node creations, deletions and updates that
// change the Ready condition's status.
func nodeReadinessChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, okOld := e.ObjectOld.(*corev1.Node)
			n, okNew := e.ObjectNew.(*corev1.Node)
			return !okOld || !okNew || nodeReady(o) != nodeReady(n)
		},
	}
}

// listAdopted passes an update of a master set that changed the list locks
// are granted on (status.addresses adopted, a membership change started or
// ended): locks waiting for it go at once.
func listAdopted() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, okOld := e.ObjectOld.(*v1alpha1.RedisMasterSet)
			n, okNew := e.ObjectNew.(*v1alpha1.RedisMasterSet)
			return okOld && okNew && (o.Status.MembershipEpoch != n.Status.MembershipEpoch || len(o.Status.Addresses) == 0 && len(n.Status.Addresses) > 0)
		},
	}
}

// locksOfMasterSet enqueues the locks that use a master set.
func (r *Reconciler) locksOfMasterSet(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.DistributedLockList
	if err := r.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexMasterSet: o.GetName()}); err != nil {
		logf.FromContext(ctx).Error(err, "list locks of master set", "masterSet", o.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// specOrLifecycleChanged passes creations, deletions and updates that change
// the spec, the deletion timestamp, the finalizers or the grant status shows
// (another manager's write) — not validity refreshes, which would otherwise
// reconcile every held lock after each of them.
func specOrLifecycleChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			ol, okOld := o.(*v1alpha1.DistributedLock)
			nl, okNew := n.(*v1alpha1.DistributedLock)
			return o.GetGeneration() != n.GetGeneration() ||
				o.GetDeletionTimestamp().IsZero() != n.GetDeletionTimestamp().IsZero() ||
				len(o.GetFinalizers()) != len(n.GetFinalizers()) ||
				!okOld || !okNew || !sameGrant(ol.Status, nl.Status)
		},
	}
}
