package distributedsemaphore

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
	"github.com/redlock-operator/redlock-operator/internal/semantic"
)

// inputs are what a reconcile gathered: the semaphore, the
// DistributedLocks labelled for it (its slots, and any lock that took one
// of their names), the pods labelled for it, and the slots whose
// assignment this manager made but its cache may not show yet.
type inputs struct {
	sem   *v1alpha1.DistributedSemaphore
	locks []*v1alpha1.DistributedLock
	pods  []*corev1.Pod
	// expected maps a slot's lock name to the pod this manager labelled
	// for it, while the cache may not show that label yet.
	expected map[string]types.UID
	// free tells, by index, which slots of spec.slots were free on the
	// masters (nil: not known).
	free []bool
}

// assignment labels pod for the slot's lock to (named lock), from the
// slot lock it waited for when it moves.
type assignment struct {
	pod      *corev1.Pod
	lock     string
	to, from *v1alpha1.DistributedLock
}

// plan is what a reconcile does.
type plan struct {
	// create are the slots' locks to create.
	create []*v1alpha1.DistributedLock
	// update are slots' locks whose spec is to follow the semaphore's.
	update []*v1alpha1.DistributedLock
	// remove are the idle slots of a previous number of slots.
	remove []*v1alpha1.DistributedLock
	// assign labels the first waiting pods for the idle and ending slots.
	assign []assignment
	// move labels pods that wait for a slot another holder of the key
	// has (in another cluster) for an idle slot free on the masters.
	move []assignment
	// unsettled counts the moves, and the slots' fences to clear, that
	// did not land (apply).
	unsettled int
	// stuck counts the pods that wait for a slot another holder of the
	// key has and may move (movable) while a slot is idle here.
	stuck int
	// leftBehind are the pods a move left labelled for a slot whose lock
	// is fenced against them (the relabel did not land): taken back into
	// the queue, on the version read, never by unfencing (a relabel whose
	// fate is unknown may still land).
	leftBehind []*corev1.Pod
	// taken names the slots whose names a lock the semaphore does not own
	// has.
	taken []string
	// refused is why the rule of the semaphore's key refuses its
	// namespace (a slot's lock shows NamespaceNotAllowed); "" when not.
	refused string
}

// slot is one of the semaphore's slots as gathered.
type slot struct {
	lock *v1alpha1.DistributedLock
	// pods are the pods that keep the slot busy (busy): its holder and
	// former holders that may still run, and the pods that wait for it.
	pods []*corev1.Pod
	// lastUnseen: status.lastHolderPod names a pod the cache does not
	// list. The lock controller clears it once a fresh read shows that
	// pod ended or gone; until then the pod may still run.
	lastUnseen bool
	// fenced is the pod labelled for the slot that its lock's
	// MovingPodAnnotation names (busy or not), or nil.
	fenced *corev1.Pod
	// holderEnded: status.holder names a pod the cache lists as ended
	// (podlock.Ended: its containers will not run again), whose grant
	// the lock has not ended yet.
	holderEnded bool
}

// idle reports whether the slot may be removed, or given a pod: nobody
// holds it or is shown to, and it is vacant.
func (s slot) idle(expected map[string]types.UID) bool {
	return s.lock.Status.Holder == nil && s.vacant(expected)
}

// ending reports whether the slot may be given the next pod before its
// lock has ended its holder's grant: the holder's pod ended
// (holderEnded) and the slot is vacant otherwise. The pod given it waits
// in the slot lock's queue, and the lock hands over to it as to any
// queued pod, by its own rule (no former holder may still run, keys gone
// first): the semaphore need not wait for the lock to show the slot free
// and then label the next pod. Never to remove a slot: that waits until
// idle.
func (s slot) ending(expected map[string]types.UID) bool {
	return s.holderEnded && s.vacant(expected)
}

// vacant reports whether no pod that holds or held the slot may still
// run (being deleted or not), no pod waits for it, no assignment of this
// manager's is on its way, and its lock is not being deleted.
func (s slot) vacant(expected map[string]types.UID) bool {
	_, pending := expected[s.lock.Name]
	return len(s.pods) == 0 && !s.lastUnseen && !pending && s.lock.DeletionTimestamp.IsZero()
}

// busy reports whether pod keeps the slot lock l from being idle. A pod
// that holds or held l's key (l's status names it, or it carries a token
// of l or of l's key: podlock.HeldBefore) does until its containers are
// known to have stopped (podlock.Ended: the lock controller's rule for
// former holders), even while it is being deleted. A pod that merely
// waits for l does while it may still be granted it (podlock.MayHold)
// and has not left it.
func busy(sem *v1alpha1.DistributedSemaphore, l *v1alpha1.DistributedLock, pod *corev1.Pod) bool {
	st := l.Status
	labelled := pod.Labels[v1alpha1.LockLabel] == l.Name
	held := podlock.HeldBefore(pod, l.RedisKey()) || podlock.Is(pod, st.LastHolderPod) ||
		st.Holder != nil && podlock.Is(pod, st.Holder.Pod) ||
		labelled && pod.Annotations[v1alpha1.FencingTokenAnnotation] != ""
	if held {
		return !podlock.Ended(pod)
	}
	return labelled && podlock.MayHold(pod) && !left(sem, l, pod)
}

// lastRefused reports whether the slot's lock was last refused by the
// masters: held by another holder of the key (another cluster's), another
// number of slots declared, or the key held by a plain lock.
func (s slot) lastRefused() bool {
	c := meta.FindStatusCondition(s.lock.Status.Conditions, v1alpha1.ConditionHeld)
	return c != nil && (c.Reason == v1alpha1.ReasonHeldElsewhere || c.Reason == v1alpha1.ReasonSlotsConflict || c.Reason == v1alpha1.ReasonKeyKindConflict)
}

// choosesSlots reports whether decide gives a pod a slot, or may move
// one, while a slot is idle: only then does the masters' view
// (inputs.free) change what decide gives, and only then is it asked for
// (a round to the masters, up to their node timeout when they do not
// answer). decide itself says when it gives nothing: no pod waits, slots
// of another number drain, the key's rule refuses the namespace, or the
// pods still running on a gone slot take every slot left.
func choosesSlots(in inputs) bool {
	if p := decide(in); len(p.assign) == 0 && p.stuck == 0 {
		return false
	}
	slots, _ := ownedSlots(in)
	return slices.ContainsFunc(slots, func(s slot) bool { return s.idle(in.expected) })
}

// movable returns the pod that waits for the slot while another holder of
// its key (another cluster's) has it, or nil: the slot's lock holds
// nothing here and was last refused by the masters for that holder
// (HeldElsewhere), and its one pod waits for it, never granted (no
// fencing token) and still behind the scheduling gate, so nothing of it
// runs and it may wait for another slot instead. A pod its lock is fenced
// against (a move under way, or one that left it behind: taken back
// first) is not moved.
func (s slot) movable(expected map[string]types.UID) *corev1.Pod {
	held := meta.FindStatusCondition(s.lock.Status.Conditions, v1alpha1.ConditionHeld)
	if s.lock.Status.Holder != nil || held == nil || held.Reason != v1alpha1.ReasonHeldElsewhere ||
		len(s.pods) != 1 || s.lastUnseen || !s.lock.DeletionTimestamp.IsZero() {
		return nil
	}
	p := s.pods[0]
	if p.Labels[v1alpha1.LockLabel] != s.lock.Name || p.Annotations[v1alpha1.FencingTokenAnnotation] != "" ||
		podlock.GateOf(p) != podlock.GateScheduling || podlock.Finished(p) || !p.DeletionTimestamp.IsZero() {
		return nil
	}
	if uid, ok := expected[s.lock.Name]; ok && uid != p.UID || s.lock.MovingPod() == string(p.UID) {
		return nil
	}
	return p
}

// leftBehind returns the pod the slot lock's MovingPodAnnotation names when
// the cache shows it still labelled for the lock, able to hold it
// (podlock.MayHold: a pod that cannot is no obstacle to clearing the
// fence), and no move of this manager's to another slot is on its way
// (its relabel did not land), or nil.
func (s slot) leftBehind(expected map[string]types.UID) *corev1.Pod {
	p := s.fenced
	if p == nil || !podlock.MayHold(p) {
		return nil
	}
	for lock, e := range expected {
		if e == p.UID && lock != s.lock.Name {
			return nil
		}
	}
	return p
}

// heldElsewhere reports whether slot index, idle or ending, is held by
// another holder of the key (another cluster's, sharing the masters): an
// idle slot whose key the masters hold, when free (by index) was read;
// else, and for an ending slot (whose key the masters hold for its own
// grant), one the masters last refused (lastRefused).
func (s slot) heldElsewhere(expected map[string]types.UID, free []bool, index int32) bool {
	idle := s.idle(expected)
	if idle && free != nil {
		return !free[index]
	}
	return (idle || s.ending(expected)) && s.lastRefused()
}

// ownedSlots sorts the locks labelled for the semaphore into its slots,
// by number of slots then index, and the names of the slots of its
// current number that a lock it does not own has taken (a lock of another
// name carrying its label takes nothing).
func ownedSlots(in inputs) (slots []slot, taken []string) {
	x := indexPods(in.pods)
	for _, l := range in.locks {
		if !metav1.IsControlledBy(l, in.sem) || l.Spec.SlotOf == nil {
			if isSlotName(in.sem, l.Name) {
				taken = append(taken, l.Name)
			}
			continue
		}
		s := slot{lock: l}
		for _, p := range x.of(l) {
			if busy(in.sem, l, p) {
				s.pods = append(s.pods, p)
			}
		}
		for _, p := range x.byLock[l.Name] {
			if uid := l.MovingPod(); uid != "" && string(p.UID) == uid {
				s.fenced = p
			}
		}
		if last := l.Status.LastHolderPod; last != nil {
			p := x.byUID[last.UID]
			s.lastUnseen = p == nil || !podlock.Is(p, last)
		}
		if h := l.Status.Holder; h != nil && h.Pod != nil {
			p := x.byUID[h.Pod.UID]
			s.holderEnded = p != nil && podlock.Is(p, h.Pod) && podlock.Ended(p)
		}
		slots = append(slots, s)
	}
	slices.SortFunc(slots, func(a, b slot) int {
		if c := int(a.lock.Spec.SlotOf.Slots) - int(b.lock.Spec.SlotOf.Slots); c != 0 {
			return c
		}
		return int(a.lock.Spec.SlotOf.Index) - int(b.lock.Spec.SlotOf.Index)
	})
	slices.Sort(taken)
	return slots, taken
}

// podIndex finds the pods that may keep a slot busy.
type podIndex struct {
	// byLock: by their label redlock.dev/lock; byKey: by the key of the
	// token they carry.
	byLock, byKey map[string][]*corev1.Pod
	byUID         map[types.UID]*corev1.Pod
}

func indexPods(pods []*corev1.Pod) podIndex {
	x := podIndex{byLock: map[string][]*corev1.Pod{}, byKey: map[string][]*corev1.Pod{}, byUID: map[types.UID]*corev1.Pod{}}
	for _, p := range pods {
		x.byUID[p.UID] = p
		if name := p.Labels[v1alpha1.LockLabel]; name != "" {
			x.byLock[name] = append(x.byLock[name], p)
		}
		if key := p.Annotations[v1alpha1.LockKeyAnnotation]; podlock.HeldBefore(p, key) {
			x.byKey[key] = append(x.byKey[key], p)
		}
	}
	return x
}

// of returns the pods labelled for l, those granted l's key, and the pods
// l's status names, each once.
func (x podIndex) of(l *v1alpha1.DistributedLock) []*corev1.Pod {
	out := slices.Concat(x.byLock[l.Name], x.byKey[l.RedisKey()])
	refs := []*v1alpha1.PodReference{l.Status.LastHolderPod}
	if l.Status.Holder != nil {
		refs = append(refs, l.Status.Holder.Pod)
	}
	for _, ref := range refs {
		if ref != nil && x.byUID[ref.UID] != nil {
			out = append(out, x.byUID[ref.UID])
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int { return strings.Compare(string(a.UID), string(b.UID)) })
	return slices.CompactFunc(out, func(a, b *corev1.Pod) bool { return a.UID == b.UID })
}

// strays counts the pods that were granted a slot of the semaphore's key
// whose lock none of its slots is now (deleted by a user, or with an
// earlier semaphore of this name) and may still run. The locks of the
// current slots do not know of them (each looks for the former holders
// of its own key only), so each keeps one slot from being given out.
func strays(sem *v1alpha1.DistributedSemaphore, slots []slot, pods []*corev1.Pod) int {
	keys := map[string]bool{}
	for _, s := range slots {
		keys[s.lock.RedisKey()] = true
	}
	n := 0
	for _, p := range pods {
		key := p.Annotations[v1alpha1.LockKeyAnnotation]
		if !keys[key] && isSlotKey(sem, key) && podlock.HeldBefore(p, key) && !podlock.Ended(p) {
			n++
		}
	}
	return n
}

// isSlotKey reports whether key is the key of a slot of the semaphore's
// key.
func isSlotKey(sem *v1alpha1.DistributedSemaphore, key string) bool {
	index, err := strconv.ParseInt(key[strings.LastIndex(key, ":")+1:], 10, 32)
	return err == nil && index >= 0 && v1alpha1.SlotKey(sem.RedisKey(), int32(index)) == key
}

// left reports whether pod, labelled for the slot lock l, has left it to
// others: it was never granted, and l (whose spec already follows the
// semaphore's list, so that it cannot grant the pod from an older copy)
// never will grant it — the list no longer allows it, or an annotation of
// its cannot be used.
func left(sem *v1alpha1.DistributedSemaphore, l *v1alpha1.DistributedLock, pod *corev1.Pod) bool {
	if pod.Annotations[v1alpha1.FencingTokenAnnotation] != "" || l.Spec.SlotOf.Slots != sem.Spec.Slots {
		return false
	}
	if podlock.AnnotationProblem(pod) != "" {
		return true
	}
	return !allowed(sem, pod) && semantic.Equal(l.Spec.AllowedHolders, sem.Spec.AllowedHolders)
}

// waiting are the pods labelled for the semaphore that wait for a slot:
// candidates labelled for no lock yet that the semaphore allows, in queue
// order (podlock.Order: higher priority first, then first come, first
// served).
func waiting(sem *v1alpha1.DistributedSemaphore, pods []*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		if p.Labels[v1alpha1.LockLabel] == "" && podlock.SemaphoreCandidate(p) && allowed(sem, p) {
			out = append(out, p)
		}
	}
	podlock.Order(out)
	return out
}

// decide plans a reconcile: the slots of spec.slots exist (created only
// once no slot of another number is left: holders of two numbers never
// share the key), follow the semaphore's spec, and each idle or ending
// one is given the next waiting pod; a slot of another number is removed
// once idle.
func decide(in inputs) plan {
	var p plan
	slots, taken := ownedSlots(in)
	p.taken = taken
	n := in.sem.Spec.Slots
	draining := false
	current := map[int32]slot{}
	for _, s := range slots {
		// Every slot follows the semaphore's spec, those of a previous
		// number too while they drain.
		so := s.lock.Spec.SlotOf
		if pod := s.leftBehind(in.expected); pod != nil {
			p.leftBehind = append(p.leftBehind, pod)
		}
		if want := slotLock(in.sem, so.Slots, so.Index); !semantic.Equal(mutableSpec(s.lock.Spec), mutableSpec(want.Spec)) {
			u := s.lock.DeepCopy()
			u.Spec = withMutable(u.Spec, want.Spec)
			p.update = append(p.update, u)
		}
		if so.Slots != n {
			draining = true
			if s.idle(in.expected) {
				p.remove = append(p.remove, s.lock)
			}
			continue
		}
		current[so.Index] = s
	}
	p.refused = refused(slots)
	if draining || p.refused != "" {
		return p
	}
	var idle, ending, heldElsewhere []string
	for i := range n {
		s, ok := current[i]
		switch {
		case !ok && slices.Contains(taken, in.sem.SlotLockName(n, i)):
		case !ok:
			p.create = append(p.create, slotLock(in.sem, n, i))
		case s.heldElsewhere(in.expected, in.free, i):
			heldElsewhere = append(heldElsewhere, s.lock.Name)
		case s.idle(in.expected):
			idle = append(idle, s.lock.Name)
		case s.ending(in.expected):
			ending = append(ending, s.lock.Name)
		}
	}
	// A pod that waits for a slot another cluster holds moves to an idle
	// slot the masters show free, before any pod is given one: it came
	// first.
	p.move, p.stuck, idle = moves(in, current, idle)
	// Otherwise a pod given a slot keeps it: idle slots go first, then
	// those whose holder ended (their lock ends its grant first), and
	// slots held elsewhere (in another cluster sharing the key: by the
	// masters' view when it was read, else last refused by them) last, so
	// that a pod does not wait on one while another is free.
	free := slices.Concat(idle, ending, heldElsewhere)
	free = free[:max(0, len(free)-strays(in.sem, slots, in.pods))]
	for i, pod := range waiting(in.sem, in.pods) {
		if i >= len(free) {
			break
		}
		p.assign = append(p.assign, assignment{pod: pod, lock: free[i], to: lockNamed(current, free[i])})
	}
	return p
}

// lockNamed is the lock of the slot of current named name.
func lockNamed(current map[int32]slot, name string) *v1alpha1.DistributedLock {
	for _, s := range current {
		if s.lock.Name == name {
			return s.lock
		}
	}
	return nil
}

// moves moves the pods that wait for a slot of current another holder of
// the key has (movable) to the idle slots (free on the masters when
// in.free is known), in queue order, while any is left; it returns the
// moves, how many pods may move, and the idle slots left.
func moves(in inputs, current map[int32]slot, idle []string) ([]assignment, int, []string) {
	if !slices.ContainsFunc(slices.Collect(maps.Values(current)), func(s slot) bool { return s.idle(in.expected) }) {
		return nil, 0, idle // no slot idle here to move to: nothing to look for
	}
	var stuck []*corev1.Pod
	from := map[types.UID]slot{}
	for _, s := range current {
		if pod := s.movable(in.expected); pod != nil {
			stuck = append(stuck, pod)
			from[pod.UID] = s
		}
	}
	if in.free == nil {
		return nil, len(stuck), idle
	}
	podlock.Order(stuck)
	var out []assignment
	for _, pod := range stuck {
		if len(idle) == 0 {
			break
		}
		if s := from[pod.UID]; !in.free[s.lock.Spec.SlotOf.Index] {
			out = append(out, assignment{pod: pod, lock: idle[0], to: lockNamed(current, idle[0]), from: s.lock})
			idle = idle[1:]
		}
	}
	return out, len(stuck), idle
}

// slotLock is the DistributedLock of slot index of the semaphore's slots
// slots: owned by the semaphore, labelled for it, its key the slot's.
func slotLock(sem *v1alpha1.DistributedSemaphore, slots, index int32) *v1alpha1.DistributedLock {
	key := sem.RedisKey()
	l := &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: sem.Namespace,
			Name:      sem.SlotLockName(slots, index),
			Labels:    map[string]string{v1alpha1.SemaphoreLabel: sem.Name},
			Annotations: map[string]string{
				SlotAnnotation: strconv.Itoa(int(index)) + "/" + strconv.Itoa(int(slots)),
			},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(sem, v1alpha1.GroupVersion.WithKind("DistributedSemaphore"))},
		},
		Spec: v1alpha1.DistributedLockSpec{
			MasterSet: sem.Spec.MasterSet,
			Key:       v1alpha1.SlotKey(key, index),
			SlotOf:    &v1alpha1.SemaphoreSlot{SemaphoreKey: key, Slots: slots, Index: index},
		},
	}
	l.Spec = withMutable(l.Spec, v1alpha1.DistributedLockSpec{
		TTL: sem.Spec.TTL, RenewInterval: sem.Spec.RenewInterval, OnLost: sem.Spec.OnLost, HeartbeatTimeout: sem.Spec.HeartbeatTimeout,
		AllowedHolders: sem.Spec.AllowedHolders, WaitTimeout: sem.Spec.WaitTimeout, OnWaitTimeout: sem.Spec.OnWaitTimeout,
	})
	return l
}

// SlotAnnotation on a slot's DistributedLock reads "<index>/<slots>".
const SlotAnnotation = "redlock.dev/slot"

// mutableSpec is the part of a slot's spec that follows the semaphore's.
func mutableSpec(s v1alpha1.DistributedLockSpec) v1alpha1.DistributedLockSpec {
	return withMutable(v1alpha1.DistributedLockSpec{}, s)
}

// withMutable returns to with the semaphore-following fields of from.
func withMutable(to, from v1alpha1.DistributedLockSpec) v1alpha1.DistributedLockSpec {
	to.TTL, to.RenewInterval, to.OnLost, to.HeartbeatTimeout = from.TTL, from.RenewInterval, from.OnLost, from.HeartbeatTimeout
	to.AllowedHolders, to.WaitTimeout, to.OnWaitTimeout = from.AllowedHolders, from.WaitTimeout, from.OnWaitTimeout
	return to
}

// allowed reports whether the semaphore's spec.allowedHolders lets pod
// queue for a slot.
func allowed(sem *v1alpha1.DistributedSemaphore, pod *corev1.Pod) bool {
	return podlock.NotAllowed(sem.Spec.AllowedHolders, "", pod) == ""
}

// refused is the message of a slot's lock refused because the semaphores
// of its key refuse its namespace (spec.allowedHolders.namespaces); ""
// when none is. Nobody is given a slot meanwhile.
func refused(slots []slot) string {
	for _, s := range slots {
		if c := meta.FindStatusCondition(s.lock.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.Reason == v1alpha1.ReasonNamespaceNotAllowed {
			return c.Message
		}
	}
	return ""
}

// isSlotName reports whether name is the name of a slot of the
// semaphore's current number.
func isSlotName(sem *v1alpha1.DistributedSemaphore, name string) bool {
	for i := range sem.Spec.Slots {
		if sem.SlotLockName(sem.Spec.Slots, i) == name {
			return true
		}
	}
	return false
}
