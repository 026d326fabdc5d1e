// Package distributedsemaphore is the DistributedSemaphore controller. A
// semaphore of N slots is N DistributedLocks that it creates and owns,
// named <semaphore>-<N>-<index>, each the lock of one slot
// (spec.slotOf: pkg/redlock's AcquireSlot, with N stored on the masters):
// everything a lock guarantees — the status contract, renewals, adoption
// by a new leader, holder liveness, the pod gate — holds for every slot,
// and the slots of one key are never held by more than N holders that
// declared N. The controller gives each idle or ending slot the next
// waiting pod (a pod labelled redlock.dev/semaphore: <name> that
// spec.allowedHolders allows, in podlock.Order: higher priority first,
// then first come, first served) by labelling it redlock.dev/lock:
// <slot's lock>; that lock then grants it.
//
// A slot is idle when no pod that holds or held it may still run: the
// lock controller's rule for former holders (podlock.Ended, not
// MayHold: a pod being deleted runs until its containers stopped) for its
// holder, its status.lastHolderPod (one the cache does not list counts
// until the lock clears it) and any pod carrying a token of its key; and
// when no pod waits for it (MayHold). A pod granted a slot whose lock is
// gone (deleted by a user, or with an earlier semaphore of this name) and
// that may still run keeps one slot from being given out: the locks look
// for the former holders of their own key only.
//
// Slots are given in this order: idle ones free on the masters, ending
// ones, then those held elsewhere (by another cluster sharing the
// masters: an idle slot whose key the masters hold, by one FreeSlots
// round read when pods wait; without that answer, a slot whose lock the
// masters last refused), so that a pod does not wait for a slot another
// cluster holds while another is free.
//
// A pod given a slot that another cluster holds (its lock refused
// HeldElsewhere, holding nothing here), never granted and still behind
// the scheduling gate, is moved to an idle slot the masters show free,
// before any later pod is given one; the semaphore looks again every
// min(ttl/4, 5s) while such pods wait and a slot is idle (moveRecheck).
// It fences the slot's lock against the pod first (MovingPodAnnotation,
// on the version of the lock read): a grant that version did not show
// cannot commit, and the lock grants the pod nothing. The fence stays: a
// pod whose relabel did not land is taken back into the queue
// (plan.leftBehind), and a slot's fence is cleared only when the idle slot
// is given a pod again (clearFence), its fenced pod no longer labelled for it
// (or unable to hold it).
//
// A slot is ending when status.holder's pod, as cached, ended
// (podlock.Ended) and nothing else keeps the slot busy. The next pod is
// given it then, before the lock has ended the grant, and waits in the
// lock's queue: the lock hands over to it as to any queued pod, by its
// own former-holder rule on a fresh read, so a handover costs the
// semaphore one label written beside the lock's release, not a look after
// it. An ending slot is never removed: a drain waits until it is idle.
//
// Layout, in the manner of cluster-api's machineset package:
//   - controller.go: fetch, gather, apply the plan, the one status patch;
//     the watches (slots' locks on a change of holder or condition, not a
//     refresh of their validity; the pods labelled for semaphores, from a
//     cache of their own);
//   - decide.go: the plan, a pure function of what was gathered: which
//     slots to create, update (ttl, renewInterval, onLost,
//     heartbeatTimeout, allowedHolders follow the semaphore), remove, and
//     which pod goes to which idle slot (none while a slot's lock is
//     refused its namespace: NamespaceNotAllowed);
//   - moves.go: a pod's move from a slot another cluster holds (the fence
//     on the lock it leaves, the take-back of a pod a move left behind,
//     the clearing of a fence);
//   - strand.go: pods labelled for a slot's lock that no longer exists
//     (a deposed leader labelled them from its view before a resize),
//     taken back into the queue;
//   - status.go: status computed from the same inputs.
//
// Changing spec.slots drains: slots of the previous number keep their
// holders (nobody is pre-empted) and take no new pod; each is removed once
// idle (so a pod that held one never runs beside the new number's), and the slots of the new number are created only once none of the
// previous number is left, so that holders of two numbers never share the
// key (the masters would refuse them anyway: SlotsConflict).
//
// Status fields and their one owner, this controller (a merge patch of
// what it computed; nothing in it is a contract a pod acts on: pods and
// their agents read the slot's DistributedLock, named in the holder pod's
// redlock.dev/lock-name annotation):
//
//	field                                   owner
//	key, slots, held, holders, queue,       the semaphore reconciler,
//	conditions (Ready, Resizing),           from the slots' locks and
//	observedGeneration                      the pods it read
//
// Slots' locks are written by this controller only in their spec and
// metadata (create, update of the fields above, MovingPodAnnotation on
// the version read, delete); the pods only in
// the pod condition redlock.dev/HolderNotAllowed of pods that wait for a
// slot (not yet labelled for one: once they are, the pod gate owns it) and
// the label redlock.dev/lock, on the version of the pod read (optimistic
// concurrency), and counted as set until the cache shows it or no longer
// lists the pod (expectations), so that a lagging cache never gives one
// slot two pods. The label changes again, the same way, only on a pod
// never granted (no fencing token) that still waits behind the
// scheduling gate: removed when it names a slot of another number whose
// lock does not exist (that name comes back only if spec.slots does), or
// moved from a slot another cluster holds to one free on the masters. The
// admission policy lets only the operator write the label on a
// semaphore's pod, and change it only on such a pod. A pod leaves that list only when deleted: the
// admission policy keeps its label redlock.dev/semaphore while it takes
// part. The status is patched on the version of the semaphore read, and
// recomputed when another writer changed it. A change of who holds and
// who waits only is written at most once per StatusInterval (1s), so that
// slots changing hands do not cost two status writes per handover.
package distributedsemaphore
