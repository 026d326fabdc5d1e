package distributedlock

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
	"github.com/redlock-operator/redlock-operator/internal/seen"
	"github.com/redlock-operator/redlock-operator/internal/writegate"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Finalizer makes deleting a DistributedLock release it in Redis first.
const Finalizer = "redlock.dev/release"

// indexMasterSet indexes DistributedLocks by spec.masterSet.
const indexMasterSet = "spec.masterSet"

// relabelledPoll is how often a lock looks at a former holder pod whose
// label no longer names it, and whose events therefore do not wake it.
const relabelledPoll = 2 * time.Second

// grantWait is how soon, plus jitter, a lock shown shed is looked at
// again, to wait for room as new grants do (grants.Set.Admit).
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
	// (default grants.DefaultWritesPerSecond), sent on a client of their own.
	StatusWriteQPS float64
	// WriteGate, if not nil, is the gate the manager's client writes
	// through (operator.GateWrites): the status writer sizes it while it
	// leads, and its own writes, and those showing a grant given up, pass
	// it.
	WriteGate *writegate.Gate
	// FailoverSlack is how long after the leader's last Lease renewal a
	// standby may take to lead and adopt every held lock (0: no standby to
	// wait for): status keeps that much validity ahead when the ttl is at
	// least twice it, so that a crash of the leader lapses no lock.
	FailoverSlack time.Duration
	// GrantRecheck is how long a lock whose grant waits for room in the
	// status writes waits, plus jitter, for a reconcile the writer does
	// not ask for (0: grants.GrantRecheck).
	GrantRecheck time.Duration
	// RetryDelay is how long a lock whose acquisition failed waits to try
	// again (0: retryDelay, from its ttl; tests set it long to see
	// wake-ups alone).
	RetryDelay time.Duration
	// StatusReport is the ConfigMap in which the status writer publishes
	// what it does while this manager leads (kubectl redlock status), as
	// Manager; none when it has no name.
	StatusReport types.NamespacedName
	Manager      string
	// ReleaseNotices: a lock whose key another holder has is tried for
	// again as soon as the masters tell of the key's release (the masters'
	// clients publish them: masters.Registry.ReleaseNotices), besides
	// after its retry delay.
	ReleaseNotices bool
	// WaitingLines: locks wait in their keys' lines on the masters, so
	// that locks in every cluster sharing them attempt first come, first
	// served (lines.go).
	WaitingLines bool

	grants     *grants.Set
	wake       *wakeQueue
	relabelled seen.Set // lock namespace/name → lock UID/pod UID of the relabelled holder last reported
	overheld   seen.Set // lock namespace/name → grant ID of the holder pod last told it held past maxHoldDuration
	// beats are the heartbeat Lease renewals seen (liveness.go).
	beats *heartbeats
	// keys removes ended grants' keys and records the last of each lock
	// (keys.go).
	keys *keys
	// wakeups wakes locks on release notices (wakeups.go; nil: off).
	wakeups *wakeups
	// lines keeps waiting locks in their keys' lines (lines.go; nil: off).
	lines *lines
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
	// held is the grant this manager holds for the lock (grant): gathered
	// once, then followed through this reconcile's acquisitions and drops.
	held *grants.Grant
	// pending is a grant this reconcile made: it counts once the status
	// patch has committed it, and is given back otherwise.
	pending *grants.Grant
	// requested is who should hold the lock (nil: nobody).
	requested *v1alpha1.LockHolder
	// pods are the pods that take part: those labelled for the lock, and
	// the holder pod if its label was changed after its grant.
	pods []*corev1.Pod
	// client is the master set's client, once resolved.
	client *redlock.Client
	// ended is the grant this reconcile ended (endGrant; "" when none):
	// it is not shown again, and its keys go only after the patch that
	// stops showing it has committed (afterCommit).
	ended string
	// endDecided is set once this reconcile ended a grant: no other end,
	// of that grant or another, is decided in the same patch.
	endDecided bool
	// givingBack is set when this reconcile stops showing a grant and
	// releases its keys once that committed (afterCommit): an acquisition
	// that meets them meanwhile tries again right after.
	givingBack bool
	// attempted is set when this reconcile came to an attempt (acquire,
	// past this cluster's gates): a lock that did not leaves its key's
	// waiting line (lines.go).
	attempted bool
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
	// heartbeat: the lock's LockHeartbeat as the cache showed it, read
	// once (Reconciler.heartbeat; nil: none).
	hb     *v1alpha1.LockHeartbeat
	hbErr  error
	hbRead bool
}

// grant returns the grant this manager holds for the lock, or nil.
func (s *scope) grant() *grants.Grant {
	if s.held != nil && s.held.Dropped() {
		s.held = nil
	}
	return s.held
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
		r.grants.StopWaiting(req.NamespacedName)
		r.beats.forget(req.NamespacedName)
		r.keys.forgetName(req.NamespacedName)
		r.wakeups.forget(req.NamespacedName)
		r.lines.withdraw(req.NamespacedName)
		r.grants.Forget(req.NamespacedName, "")
		return ctrl.Result{}, nil
	}
	r.releaseOthers(ctx, req.NamespacedName, lock.UID)
	s := &scope{lock: lock, orig: *lock.Status.DeepCopy(), now: r.Clock.Now(), held: r.grants.Get(lock.UID)}
	defer func() {
		if !s.attempted {
			r.lines.withdraw(req.NamespacedName) // held back, not requested, or held
		}
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
		r.grants.Wrote(client.ObjectKeyFromObject(lock), lock.UID)
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

// heldConditionReason is the reason of status's Held condition, or "".
func heldConditionReason(st v1alpha1.DistributedLockStatus) string {
	if c := heldCondition(st); c != nil {
		return c.Reason
	}
	return ""
}

// heldCondition is st's Held condition, or nil.
func heldCondition(st v1alpha1.DistributedLockStatus) *metav1.Condition {
	return meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHeld)
}

// resolveMasterSet finds the lock's master set and its client, and checks
// what only the controller can check. It sets Ready and reports whether the
// lock can be acted on; an error is transient (retried with backoff).
func (r *Reconciler) resolveMasterSet(ctx context.Context, s *scope) (*redlock.Client, bool, error) {
	lock := s.lock
	ms := &v1alpha1.RedisMasterSet{}
	err := r.Get(ctx, masterSetOf(lock), ms)
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
		if h := s.grant(); h != nil {
			r.endGrant(s, h, nil, endSpecInvalid, reason, endMessage(endSpecInvalid, invalid))
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
	if h := s.grant(); h != nil {
		h.Session.SetTiming(lock.Spec.TTL.Duration, renewInterval(lock.Spec))
		current = &v1alpha1.LockHolder{Identity: h.Holder, Pod: h.Pod}
		in.ValidUntil, in.InMemory = h.Session.State().ValidUntil, true
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
		rules.Stale = r.api().staleRevisions(ctx, pods)
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
	if action == actAdopt && r.grants.WroteBefore(s.lock.UID) && !r.cacheCurrent(ctx, s) {
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
		r.grants.StopWaiting(client.ObjectKeyFromObject(s.lock)) // it asks for no grant now
	}
	if s.endDecided && (action == actRelease || action == actHandover) {
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
	if s.lock.Status.Holder == nil && s.grant() == nil {
		return nil // no grant shown nor renewed here: nothing ends
	}
	cause, err := r.requestEnd(ctx, s)
	if err != nil {
		return err
	}
	r.endGrant(s, s.grant(), c, cause, reason, endMessage(cause, msg))
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
	at, left := r.keys.left(s.lock, s.grant())
	kept := left && s.now.Before(at)
	if s.requested == nil && !ended && !kept && (reason != v1alpha1.ReasonHolderTerminating || st.LastHolderPod == nil) {
		s.setHeld(metav1.ConditionFalse, v1alpha1.ReasonNotRequested, "no holder is requested")
	}
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

// markedRecheck is how soon a lock whose next grant waits for a former
// holder's mark to go looks again (the pod's label change also brings it
// back while the pod is labelled for the lock).
const markedRecheck = 500 * time.Millisecond

// staleCacheRecheck is how soon a lock whose cache showed a stopped pod as
// a candidate is looked at again.
const staleCacheRecheck = 200 * time.Millisecond

// heartbeat returns the lock's LockHeartbeat as the cache shows it (nil:
// there is none), read once per reconcile.
func (r *Reconciler) heartbeat(ctx context.Context, s *scope) (*v1alpha1.LockHeartbeat, error) {
	if !s.hbRead {
		hb := &v1alpha1.LockHeartbeat{}
		err := r.Get(ctx, client.ObjectKeyFromObject(s.lock), hb)
		switch {
		case apierrors.IsNotFound(err):
			hb, err = nil, nil
		case err != nil:
			hb, err = nil, fmt.Errorf("read heartbeat: %w", err)
		}
		s.hb, s.hbErr, s.hbRead = hb, err, true
	}
	return s.hb, s.hbErr
}

// api reads from the API server, past the cache.
func (r *Reconciler) api() apiReads { return apiReads{r.APIReader} }

// enqueue asks for a reconcile of lock without blocking the caller.
func (r *Reconciler) enqueue(name types.NamespacedName) { r.wake.add(name) }

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

// refOf names the grant grantID of lock.
func refOf(lock *v1alpha1.DistributedLock, grantID string) grants.Ref {
	return grants.Ref{UID: lock.UID, Key: lock.RedisKey(), GrantID: grantID, TTL: lock.Spec.TTL.Duration, Slot: slotOf(lock)}
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

// clientFor returns the client of the lock's master set, or nil.
func (r *Reconciler) clientFor(ctx context.Context, lock *v1alpha1.DistributedLock) *redlock.Client {
	ms := &v1alpha1.RedisMasterSet{}
	if err := r.Get(ctx, masterSetOf(lock), ms); err != nil {
		return r.Masters.Lookup(masterSetOf(lock))
	}
	c, err := r.Masters.Client(ctx, ms)
	if err != nil {
		return r.Masters.Lookup(masterSetOf(lock))
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
	h := s.grant()
	if h != nil && h.ID != s.ended {
		state := h.Session.State()
		switch {
		case h.Ended() && h != s.pending:
			// Its Session reported its end since syncSession looked: the
			// reconcile it asked for ends the grant as lost.
			return
		case !s.now.Before(state.ValidUntil):
			// Its validity passed while its Session still runs (about to
			// report the loss): it lapsed, below.
		case s.pending != h && st.Holder != nil && st.GrantID == h.ID:
			// The status writer refreshes its validity; the condition
			// follows the spec's generation.
			s.setHeld(metav1.ConditionTrue, v1alpha1.ReasonAcquired, "held by "+h.Holder)
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
		if at := releasableAt(lock); h == nil && s.now.Before(at) {
			// Its validity passed; readers see that. It is hidden and
			// released together once the drift allowance passed (the
			// validity may come from another manager's clock).
			s.requeueAfter(at.Sub(s.now))
			return
		}
		// Ended here, its Session (if any) stopped once the patch
		// committed: the loss is counted once, not again when the
		// Session reports it.
		if !r.endGrant(s, h, s.client, endLapsed, "", lapsedMessage) && h != nil && h.ID != s.ended {
			return // another grant ended in this reconcile: this one next time
		}
		s.clear(v1alpha1.ReasonValidityExpired, lapsedMessage)
		return
	}
	s.requeueAfter(st.ValidUntil.Sub(s.now))
}

const (
	writeRefused   writeResult = iota // not committed, and never will be
	writeCommitted                    // committed all the same
	writeUnknown                      // not committed yet: it may still be
)

// maxBackoff caps the retry delay of a failed reconcile.
const maxBackoff = 5 * time.Second
