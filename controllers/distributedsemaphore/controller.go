package distributedsemaphore

import (
	"context"
	"fmt"
	"sync"
	"time"

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
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/conditions"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
	"github.com/redlock-operator/redlock-operator/internal/semantic"
	"github.com/redlock-operator/redlock-operator/internal/waitlimit"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// expectationTTL is how long an assignment this manager made counts
// without the cache showing it: past it, the cache is trusted again.
const expectationTTL = time.Minute

// StatusInterval is the least time between two status writes of a
// semaphore that change only who holds and who waits (status.holders,
// held, queue): while slots change hands, the status is written at most
// that often, the last change included, instead of twice per handover.
// Any other change (conditions, slots, observedGeneration) is written at
// once.
const StatusInterval = time.Second

// EventSlotNameTaken is the reason of the event when a DistributedLock
// the semaphore does not own has a slot's name.
const EventSlotNameTaken = "SlotNameTaken"

// MasterClients gives the Redlock client of a master set.
type MasterClients interface {
	Client(ctx context.Context, ms *v1alpha1.RedisMasterSet) (*redlock.Client, error)
}

// freeSlotsTimeout bounds the look at which slots are free on the masters
// (building the client included); after one that failed, the master set's
// semaphores give slots without it for freeSlotsRetry, so that masters
// that do not answer stall the controller's worker once, not at every
// reconcile of every semaphore on them.
const (
	freeSlotsTimeout = 2 * time.Second
	freeSlotsRetry   = 30 * time.Second
)

// Reconciler runs DistributedSemaphores: it keeps one DistributedLock per
// slot and labels waiting pods for idle and ending slots.
type Reconciler struct {
	client.Client
	Recorder events.EventRecorder
	// Pods caches the pods labelled redlock.dev/semaphore.
	Pods cache.Cache
	// APIReader reads from the API server, past the caches (nil: a slot's
	// fence is never cleared).
	APIReader client.Reader
	Clock     clock.PassiveClock
	// Masters (nil: none) tells which slots are free on the masters, so
	// that a waiting pod is given a slot no other holder of the key (in
	// another cluster sharing the masters) holds.
	Masters MasterClients

	mu sync.Mutex
	// expected: semaphore → slot lock name → the assignment made.
	expected map[types.NamespacedName]map[string]expectation
	// written: semaphore → when this manager last wrote its status.
	written map[types.NamespacedName]time.Time
	// unviewed: master set → when its masters last failed to say which
	// slots are free.
	unviewed map[types.NamespacedName]time.Time
}

// expectation is an assignment this manager made.
type expectation struct {
	pod types.UID
	at  time.Time
}

// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=distributedsemaphores,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=distributedsemaphores/status,verbs=patch
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=distributedsemaphores/finalizers,verbs=update
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=distributedlocks,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=redismastersets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods/status,verbs=patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	sem := &v1alpha1.DistributedSemaphore{}
	if err := r.Get(ctx, req.NamespacedName, sem); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if !sem.DeletionTimestamp.IsZero() {
		// Its slots' locks go with it (owner references), each releasing
		// its grant first (their finalizer).
		return ctrl.Result{}, nil
	}
	in, err := r.gather(ctx, sem)
	if err != nil {
		return ctrl.Result{}, err
	}
	p := decide(in)
	errs := r.apply(ctx, sem, &p)
	errs = append(errs, r.takeBack(ctx, in)...)
	errs = append(errs, r.tellNotAllowed(ctx, in, p.refused)...)
	waitRecheck, waitErrs := r.enforceWaits(ctx, in, p)
	errs = append(errs, waitErrs...)
	st := computeStatus(in, p)
	res := ctrl.Result{RequeueAfter: waitRecheck}
	if !semantic.Equal(st, sem.Status) {
		if wait := r.statusDue(req.NamespacedName, sem.Status, st); wait > 0 {
			res.RequeueAfter = earlier(res.RequeueAfter, wait)
		} else if err := r.patchStatus(ctx, sem, st); err != nil {
			errs = append(errs, err)
		}
	}
	switch {
	case p.unsettled > 0:
		// A move, or a slot's fence, did not land (a write conflicted):
		// look again soon, as nothing may wake the semaphore.
		res.RequeueAfter = earlier(res.RequeueAfter, time.Second)
	case p.stuck > len(p.move):
		// Pods wait for slots other clusters hold, and no free one was
		// seen: look at the masters again after the slots' locks' longest
		// retry delay (nothing here changes when a slot frees there).
		res.RequeueAfter = earlier(res.RequeueAfter, moveRecheck(sem))
	}
	if r.pending(req.NamespacedName) {
		// An assignment the cache does not show yet: look again once it
		// may, whatever wakes the semaphore before.
		res.RequeueAfter = earlier(res.RequeueAfter, time.Second)
	}
	return res, kerrors.NewAggregate(errs)
}

// patchStatus writes st as sem's status, conditional on the version read:
// a process that paused after gathering (a deposed leader waking up) does
// not overwrite what a newer view wrote; it computes again from the newer
// semaphore, whose watch event brings it back.
func (r *Reconciler) patchStatus(ctx context.Context, sem *v1alpha1.DistributedSemaphore, st v1alpha1.DistributedSemaphoreStatus) error {
	patched := sem.DeepCopy()
	patched.Status = st
	err := r.Status().Patch(ctx, patched, client.MergeFromWithOptions(sem, client.MergeFromWithOptimisticLock{}))
	switch {
	case err == nil:
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.written == nil {
			r.written = map[types.NamespacedName]time.Time{}
		}
		r.written[client.ObjectKeyFromObject(sem)] = r.Clock.Now()
		return nil
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err):
		logf.FromContext(ctx).V(1).Info("status conflict: computing again from the newer semaphore")
		return nil
	default:
		return fmt.Errorf("patch status: %w", err)
	}
}

// statusDue returns how long the write of status want over shown waits:
// 0 when it is due now (it changes more than who holds and who waits, or
// StatusInterval has passed since this manager last wrote the
// semaphore's status), otherwise the rest of that interval.
func (r *Reconciler) statusDue(sem types.NamespacedName, shown, want v1alpha1.DistributedSemaphoreStatus) time.Duration {
	if !semantic.Equal(withoutHolders(shown), withoutHolders(want)) {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	last, ok := r.written[sem]
	if !ok {
		return 0
	}
	return max(0, last.Add(StatusInterval).Sub(r.Clock.Now()))
}

// withoutHolders is st without who holds and who waits.
func withoutHolders(st v1alpha1.DistributedSemaphoreStatus) v1alpha1.DistributedSemaphoreStatus {
	st.Holders, st.Held, st.Queue = nil, 0, nil
	return st
}

// earlier returns the earlier of two requeue delays, 0 meaning none.
func earlier(a, b time.Duration) time.Duration {
	if a == 0 || b > 0 && b < a {
		return b
	}
	return a
}

// tellNotAllowed gives the pods waiting for a slot that the semaphore
// never grants (its list refuses them, or nsRefusal says why the rule of
// its key refuses its namespace) the condition
// redlock.dev/HolderNotAllowed and an event (and turns it False once they
// are allowed). The pods given a slot are
// the pod gate controller's to tell, as for any lock.
func (r *Reconciler) tellNotAllowed(ctx context.Context, in inputs, nsRefusal string) []error {
	var errs []error
	for _, pod := range in.pods {
		if _, labelled := pod.Labels[v1alpha1.LockLabel]; labelled || podlock.Finished(pod) || !pod.DeletionTimestamp.IsZero() {
			continue // given a slot (or labelled empty): the pod gate's to tell
		}
		if err := r.reportProblem(ctx, pod); err != nil {
			errs = append(errs, err)
		}
		if !podlock.SemaphoreCandidate(pod) {
			continue
		}
		reason, msg := "", podlock.NotAllowed(in.sem.Spec.AllowedHolders, "DistributedSemaphore "+in.sem.Name, pod)
		switch {
		case msg != "":
			reason = v1alpha1.ReasonServiceAccountNotAllowed
		case nsRefusal != "":
			reason, msg = v1alpha1.ReasonNamespaceNotAllowed, nsRefusal
		}
		if reason == "" {
			if err := conditions.WithdrawPod(ctx, r.Client, pod, v1alpha1.ConditionHolderNotAllowed, "Allowed", "the semaphore allows this pod now", r.Clock.Now()); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if conditions.PodHas(pod, v1alpha1.ConditionHolderNotAllowed, corev1.ConditionTrue, reason) {
			continue
		}
		if err := conditions.SetPod(ctx, r.Client, pod, v1alpha1.ConditionHolderNotAllowed, corev1.ConditionTrue, reason, msg, r.Clock.Now()); err != nil {
			errs = append(errs, err)
			continue
		}
		r.Recorder.Eventf(pod, in.sem, corev1.EventTypeWarning, reason, "Queue", "%s", conditions.Message(msg))
	}
	return errs
}

// enforceWaits applies the wait limit (waitlimit.Enforce) to the pods
// waiting for a slot, but those this reconcile gave one; it returns when
// the next limit passes. Pods given a slot are the pod gate's, under the
// slot lock's copy of the limit.
func (r *Reconciler) enforceWaits(ctx context.Context, in inputs, p plan) (time.Duration, []error) {
	given := map[types.UID]bool{}
	for _, a := range p.assign {
		given[a.pod.UID] = true
	}
	var next time.Duration
	var errs []error
	for _, pod := range in.pods {
		if pod.Labels[v1alpha1.LockLabel] != "" || given[pod.UID] || !podlock.SemaphoreCandidate(pod) {
			continue
		}
		limit, _ := podlock.WaitLimitOf(pod, in.sem.Spec.WaitTimeout, in.sem.Spec.OnWaitTimeout)
		at, err := waitlimit.Enforce(ctx, r.Client, r.Recorder, pod, "a slot of DistributedSemaphore "+in.sem.Name, in.sem, limit, false, r.Clock.Now(), nil)
		if err != nil {
			errs = append(errs, err)
		}
		if at > 0 && (next == 0 || at < next) {
			next = at
		}
	}
	return next, errs
}

// EventBadRequest is the reason of the event on a pod waiting for a slot
// whose request cannot be served (the pod gate's LockRequestInvalid).
const EventBadRequest = "LockRequestInvalid"

// reportProblem records on a pod waiting for a slot why it cannot wait
// the way it asks (the annotation redlock.dev/problem and an event), or
// removes that annotation once the problem is gone. The pod gate owns the
// annotation on pods given a slot.
func (r *Reconciler) reportProblem(ctx context.Context, pod *corev1.Pod) error {
	problem := podlock.SemaphoreProblem(pod)
	if problem == "" {
		problem = podlock.GateProblem(pod)
	}
	return conditions.ReportProblem(ctx, r.Client, r.Recorder, pod, EventBadRequest, "Queue", problem)
}

// gather reads what decide needs: the locks and pods labelled for the
// semaphore, and the assignments the cache may not show yet.
func (r *Reconciler) gather(ctx context.Context, sem *v1alpha1.DistributedSemaphore) (inputs, error) {
	in := inputs{sem: sem}
	var locks v1alpha1.DistributedLockList
	if err := r.List(ctx, &locks, client.InNamespace(sem.Namespace), client.MatchingLabels{v1alpha1.SemaphoreLabel: sem.Name}); err != nil {
		return in, fmt.Errorf("list the slots' locks: %w", err)
	}
	for i := range locks.Items {
		in.locks = append(in.locks, &locks.Items[i])
	}
	var pods corev1.PodList
	if err := r.Pods.List(ctx, &pods, client.InNamespace(sem.Namespace), client.MatchingLabels{v1alpha1.SemaphoreLabel: sem.Name}); err != nil {
		return in, fmt.Errorf("list the semaphore's pods: %w", err)
	}
	for i := range pods.Items {
		in.pods = append(in.pods, &pods.Items[i])
	}
	in.expected = r.expectations(client.ObjectKeyFromObject(sem), in.pods)
	if choosesSlots(in) {
		in.free = r.freeOnMasters(ctx, sem)
	}
	return in, nil
}

// freeOnMasters asks the semaphore's masters which slots of spec.slots are
// free (redlock.Client.FreeSlots), or nil when it cannot: no clients, the
// master set not found or not usable, the masters not answering (then
// not again for freeSlotsRetry). Slots are then given by what this
// cluster shows, as they are without it.
func (r *Reconciler) freeOnMasters(ctx context.Context, sem *v1alpha1.DistributedSemaphore) []bool {
	if r.Masters == nil {
		return nil
	}
	name := types.NamespacedName{Namespace: sem.Namespace, Name: sem.Spec.MasterSet}
	now := r.Clock.Now()
	r.mu.Lock()
	failed, ok := r.unviewed[name]
	r.mu.Unlock()
	if ok && now.Sub(failed) < freeSlotsRetry {
		return nil
	}
	fctx, cancel := context.WithTimeout(ctx, freeSlotsTimeout)
	defer cancel()
	free, err := r.askFree(fctx, name, sem)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if r.unviewed == nil {
			r.unviewed = map[types.NamespacedName]time.Time{}
		}
		r.unviewed[name] = now
		logf.FromContext(ctx).V(1).Info("free slots not known", "masterSet", name.Name, "error", err.Error())
		return nil
	}
	delete(r.unviewed, name)
	return free
}

// askFree reads the master set name and asks its masters which slots of
// sem are free.
func (r *Reconciler) askFree(ctx context.Context, name types.NamespacedName, sem *v1alpha1.DistributedSemaphore) ([]bool, error) {
	ms := &v1alpha1.RedisMasterSet{}
	if err := r.Get(ctx, name, ms); err != nil {
		return nil, fmt.Errorf("read master set: %w", err)
	}
	c, err := r.Masters.Client(ctx, ms)
	if err != nil {
		return nil, fmt.Errorf("client of master set: %w", err)
	}
	return c.FreeSlots(ctx, sem.RedisKey(), int(sem.Spec.Slots))
}

// createSlots creates p's slots' locks; a slot's name found taken by a
// lock the semaphore does not own is added to p.taken.
func (r *Reconciler) createSlots(ctx context.Context, sem *v1alpha1.DistributedSemaphore, p *plan) []error {
	var errs []error
	for _, l := range p.create {
		err := r.Create(ctx, l)
		if apierrors.IsAlreadyExists(err) {
			existing := &v1alpha1.DistributedLock{}
			gerr := r.Get(ctx, client.ObjectKeyFromObject(l), existing)
			switch {
			case apierrors.IsNotFound(gerr):
				// Created by an earlier look, not in the cache yet: its
				// event brings the semaphore back.
			case gerr != nil:
				errs = append(errs, fmt.Errorf("read slot %s: %w", l.Name, gerr))
			case !metav1.IsControlledBy(existing, sem):
				p.taken = append(p.taken, l.Name)
				r.Recorder.Eventf(sem, nil, corev1.EventTypeWarning, EventSlotNameTaken, "CreateSlot",
					"DistributedLock %s exists and is not this semaphore's: slot %s cannot be created", l.Name, l.Name)
			default:
				// Its own slot, which the list did not show: its label was
				// removed (or the cache lags). The label is how the
				// semaphore finds its slots: put it back.
				if err := r.restoreLabel(ctx, sem, existing); err != nil {
					errs = append(errs, err)
				}
			}
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("create slot %s: %w", l.Name, err))
		}
	}
	return errs
}

// apply carries out p: creates, updates and removes slots' locks, takes
// back the pods a move left behind, and labels pods for idle and ending
// slots (moving some first).
func (r *Reconciler) apply(ctx context.Context, sem *v1alpha1.DistributedSemaphore, p *plan) []error {
	errs := r.createSlots(ctx, sem, p)
	for _, l := range p.update {
		if err := r.Update(ctx, l); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("update slot %s: %w", l.Name, err))
		}
	}
	for _, l := range p.remove {
		// Only as seen: a slot granted since this view was read is not
		// removed (its resourceVersion moved).
		uid, rv := l.UID, l.ResourceVersion
		if err := r.Delete(ctx, l, client.Preconditions{UID: &uid, ResourceVersion: &rv}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("remove slot %s: %w", l.Name, err))
		}
	}
	for _, pod := range p.leftBehind {
		if err := r.takeBackLeft(ctx, sem, pod); err != nil {
			errs = append(errs, fmt.Errorf("take pod %s back from slot %s: %w", pod.Name, pod.Labels[v1alpha1.LockLabel], err))
		}
	}
	for _, a := range p.move {
		landed, err := r.move(ctx, sem, a)
		if err != nil {
			errs = append(errs, err)
		}
		if !landed {
			p.unsettled++
		}
	}
	for _, a := range p.assign {
		cleared, err := r.assign(ctx, sem, a)
		if err != nil {
			errs = append(errs, err)
		}
		if !cleared {
			p.unsettled++
		}
	}
	return errs
}

// assign labels a waiting pod for a free slot's lock, on the version of
// the pod this reconcile read: a pod changed since (labelled by an earlier
// reconcile whose write the cache does not show yet) is left for the next.
// A slot fenced by a move is cleared first (clearFence); it reports false
// when that did not land.
func (r *Reconciler) assign(ctx context.Context, sem *v1alpha1.DistributedSemaphore, a assignment) (bool, error) {
	if ok, err := r.clearFence(ctx, a.to); err != nil || !ok {
		return false, wrapIf(err, "clear slot %s to give it pod %s", a.lock, a.pod.Name)
	}
	written, err := r.labelAsRead(ctx, a.pod, v1alpha1.LockLabel, a.lock)
	if err != nil {
		return true, fmt.Errorf("label pod %s for slot %s: %w", a.pod.Name, a.lock, err)
	}
	if written {
		r.expect(client.ObjectKeyFromObject(sem), a.lock, a.pod.UID)
		logf.FromContext(ctx).V(1).Info("slot assigned", "pod", a.pod.Name, "lock", a.lock)
	}
	return true, nil
}

// labelAsRead sets the label key of obj to value ("" removes it) with a
// patch conditional on the version read, and reports whether it wrote: an
// object changed since, or gone, is left to the next reconcile, which
// sees it.
func (r *Reconciler) labelAsRead(ctx context.Context, obj client.Object, key, value string) (bool, error) {
	return r.patchAsRead(ctx, obj, func(o client.Object) {
		o.SetLabels(withEntry(o.GetLabels(), key, value))
	})
}

// withEntry sets key to value in m ("" removes it), making m when nil.
func withEntry(m map[string]string, key, value string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	if value == "" {
		delete(m, key)
	} else {
		m[key] = value
	}
	return m
}

// patchAsRead patches a copy of obj with edit, conditional on the
// version read, and reports whether it wrote: an object changed since, or
// gone, is left to the next reconcile, which sees it.
func (r *Reconciler) patchAsRead(ctx context.Context, obj client.Object, edit func(client.Object)) (bool, error) {
	patched, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return false, fmt.Errorf("copy of %T is not an object", obj)
	}
	edit(patched)
	err := r.Patch(ctx, patched, client.MergeFromWithOptions(obj, client.MergeFromWithOptimisticLock{}))
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return false, nil
	default:
		return false, err
	}
}

// expect records an assignment until the cache shows it.
func (r *Reconciler) expect(sem types.NamespacedName, lock string, pod types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.expected == nil {
		r.expected = map[types.NamespacedName]map[string]expectation{}
	}
	if r.expected[sem] == nil {
		r.expected[sem] = map[string]expectation{}
	}
	r.expected[sem][lock] = expectation{pod: pod, at: r.Clock.Now()}
}

// expectations drops the assignments pods shows, those of pods it no
// longer lists, and those too old, and returns the others.
func (r *Reconciler) expectations(sem types.NamespacedName, pods []*corev1.Pod) map[string]types.UID {
	r.mu.Lock()
	defer r.mu.Unlock()
	labelled := map[types.UID]string{}
	for _, p := range pods {
		labelled[p.UID] = p.Labels[v1alpha1.LockLabel]
	}
	out := map[string]types.UID{}
	now := r.Clock.Now()
	for lock, e := range r.expected[sem] {
		// Assigned pods came from this cache: one it no longer lists was
		// deleted (or left the semaphore) and holds the slot no more.
		label, listed := labelled[e.pod]
		if !listed || label == lock || now.Sub(e.at) > expectationTTL {
			delete(r.expected[sem], lock)
			continue
		}
		out[lock] = e.pod
	}
	return out
}

// restoreLabel puts the semaphore's label back on a slot's lock it owns,
// on the version read (a cache that merely lagged shows the label already:
// nothing is written).
func (r *Reconciler) restoreLabel(ctx context.Context, sem *v1alpha1.DistributedSemaphore, l *v1alpha1.DistributedLock) error {
	if l.Labels[v1alpha1.SemaphoreLabel] == sem.Name {
		return nil
	}
	if _, err := r.labelAsRead(ctx, l, v1alpha1.SemaphoreLabel, sem.Name); err != nil {
		return fmt.Errorf("label slot %s: %w", l.Name, err)
	}
	return nil
}

// pending reports whether an assignment to sem awaits the cache.
func (r *Reconciler) pending(sem types.NamespacedName) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.expected[sem]) > 0
}

func (r *Reconciler) forget(sem types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.expected, sem)
	delete(r.written, sem)
}

// SetupWithManager registers the controller: it watches semaphores, their
// slots' locks (a change of holder or condition, not a refresh of the
// validity) and the pods labelled for them.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("distributedsemaphore").
		// Every change, status included: a status another writer changed
		// (a deposed leader's late write) is computed again and put back.
		// The controller's own writes cost one reconcile that writes
		// nothing.
		For(&v1alpha1.DistributedSemaphore{}).
		Owns(&v1alpha1.DistributedLock{}, builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
			old, okOld := e.ObjectOld.(*v1alpha1.DistributedLock)
			cur, okNew := e.ObjectNew.(*v1alpha1.DistributedLock)
			return !okOld || !okNew || slotChanged(old, cur)
		}})).
		WatchesRawSource(source.Kind(r.Pods, &corev1.Pod{}, handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, p *corev1.Pod) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Labels[v1alpha1.SemaphoreLabel]}}}
		}))).
		Complete(r)
}

// slotChanged says whether a new version of a slot's lock can change the
// semaphore's decisions or status: anything but a refresh of the validity.
func slotChanged(old, cur *v1alpha1.DistributedLock) bool {
	if old.Generation != cur.Generation || !old.DeletionTimestamp.Equal(cur.DeletionTimestamp) ||
		old.Labels[v1alpha1.SemaphoreLabel] != cur.Labels[v1alpha1.SemaphoreLabel] {
		return true
	}
	o, c := old.Status, cur.Status
	if o.GrantID != c.GrantID || o.FencingToken != c.FencingToken ||
		!semantic.Equal(o.Holder, c.Holder) || !semantic.Equal(o.LastHolderPod, c.LastHolderPod) {
		return true
	}
	for _, typ := range []string{v1alpha1.ConditionHeld, v1alpha1.ConditionReady} {
		oc, cc := meta.FindStatusCondition(o.Conditions, typ), meta.FindStatusCondition(c.Conditions, typ)
		if (oc == nil) != (cc == nil) || oc != nil && (oc.Status != cc.Status || oc.Reason != cc.Reason || oc.Message != cc.Message) {
			return true
		}
	}
	return false
}
