package v1alpha1

import (
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SemaphoreLabel on a pod requests a slot of the DistributedSemaphore of
// that name in the pod's namespace: the webhook gates it like a pod
// labelled for a lock, and the semaphore's controller, when a slot is
// free, labels it for that slot's DistributedLock (LockLabel), which
// grants it.
const SemaphoreLabel = "redlock.dev/semaphore"

// MovingPodAnnotation on a semaphore's slot lock names (by UID) the pod the
// semaphore is moving from that slot to another: the lock grants it
// nothing. The semaphore writes it on the version of the lock it read
// before it relabels the pod, so that a grant to the pod that version did
// not show cannot commit. Only the semaphore's controller writes it.
const MovingPodAnnotation = "redlock.dev/moving-pod"

// MaxSemaphoreSlots is the largest number of slots of a semaphore
// (pkg/redlock's MaxSlots).
const MaxSemaphoreSlots = 1000

// Condition types and reasons of a DistributedSemaphore (besides Ready,
// whose reasons are the lock's).
const (
	// ConditionResizing is True while the semaphore waits for the holders
	// of its previous number of slots to finish before it serves the new
	// number (reason Draining).
	ConditionResizing = "Resizing"
	// ReasonDraining: slots of the previous number are still held.
	ReasonDraining = "Draining"
	// ReasonResized: every slot is of the spec's number.
	ReasonResized = "Resized"
	// ReasonSlotsConflict: the masters store another number of slots for
	// the semaphore's key (another semaphore, here or in a cluster sharing
	// the masters, declares it and holds a slot); no slot is granted until
	// its holders have finished.
	ReasonSlotsConflict = "SlotsConflict"
	// ReasonSlotNameTaken: a DistributedLock this semaphore does not own
	// has the name of one of its slots.
	ReasonSlotNameTaken = "SlotNameTaken"
	// ReasonCreatingSlots: the slots' DistributedLocks do not exist yet.
	ReasonCreatingSlots = "CreatingSlots"
)

// DistributedSemaphoreSpec is the desired state of a DistributedSemaphore.
//
// +kubebuilder:validation:XValidation:rule="has(self.key) == has(oldSelf.key) && (!has(self.key) || self.key == oldSelf.key)",message="key is immutable"
// +kubebuilder:validation:XValidation:rule="self.masterSet == oldSelf.masterSet",message="masterSet is immutable: create a new DistributedSemaphore to move a semaphore to other masters"
// +kubebuilder:validation:XValidation:rule="!has(self.renewInterval) || duration(self.renewInterval) < duration(self.ttl)",message="renewInterval must be shorter than ttl"
type DistributedSemaphoreSpec struct {
	// MasterSet is the name of the RedisMasterSet, in this namespace, whose
	// masters arbitrate the semaphore. Immutable.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	MasterSet string `json:"masterSet"`

	// Key is the Redis key of the semaphore. Semaphores with the same key
	// share its slots, also across clusters whose operators share the
	// masters, and must declare the same number of slots. A key is one
	// kind: no slot is granted (reason KeyKindConflict) while a
	// DistributedLock with the same key has a holder, and the lock is
	// refused while the semaphore has holders. Defaults to
	// `redlock:<namespace>/<name>` (shown in status.key), like a
	// DistributedLock's. Immutable. Slot i is the lock `<key>:slot:<i>`,
	// and while a slot is held the key itself stores the number of slots
	// on every master; `<key>:line` is reserved for its waiting line.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1000
	// +kubebuilder:validation:XValidation:rule="!self.endsWith(':fence')",message="key must not end in ':fence': '<key>:fence' is the fencing counter of the lock '<key>'"
	// +kubebuilder:validation:XValidation:rule="!self.endsWith(':line')",message="key must not end in ':line': '<key>:line' is the waiting line of the semaphore '<key>'"
	// +kubebuilder:validation:XValidation:rule="self != 'redlock:quarantine-window'",message="key 'redlock:quarantine-window' is reserved: every master keeps the quarantine window there"
	// +kubebuilder:validation:XValidation:rule="self != 'redlock:member-roll'",message="key 'redlock:member-roll' is reserved: clusters running members of one set take turns there to replace one"
	// +kubebuilder:validation:XValidation:rule="!self.matches(':slot:[0-9]+$')",message="key must not end in ':slot:<index>': those are the keys of a semaphore's slots"
	Key string `json:"key,omitempty"`

	// Slots is how many pods may hold the semaphore at once, from 1 to
	// 1000. Each holder holds one slot, with a fencing token of that slot.
	// Changing it takes effect once every holder of the previous number
	// has finished (condition Resizing): nobody new is granted meanwhile,
	// and no holder is pre-empted.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	Slots int32 `json:"slots"`

	// TTL is the validity of each slot's acquisition and renewal, from 1s
	// to 24h; it must not exceed the master set's maxLockTTL.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="ttl must be between 1s and 24h"
	TTL metav1.Duration `json:"ttl"`

	// RenewInterval is how often a held slot is renewed. Defaults to
	// ttl/3; must be shorter than ttl.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('100ms')",message="renewInterval must be at least 100ms"
	RenewInterval *metav1.Duration `json:"renewInterval,omitempty"`

	// OnLost is what happens to a holder pod whose slot is lost, as for a
	// DistributedLock: Keep (the default) or Evict.
	// +optional
	// +kubebuilder:default=Keep
	OnLost LostPolicy `json:"onLost,omitempty"`
	// AllowedHolders restricts who may queue for a slot, as for a
	// DistributedLock; its namespaces list applies to the semaphores that
	// name the same key. Unset: everyone.
	// +optional
	AllowedHolders *AllowedHolders `json:"allowedHolders,omitempty"`

	// WaitTimeout is the longest a pod may wait for a slot, counted from
	// the pod's creation, from 1s to 720h; a pod's annotation
	// redlock.dev/wait-timeout overrides it. Past it the pod gets the
	// condition redlock.dev/LockWaitTimeout and an event, and onWaitTimeout
	// applies. Unset: pods wait for as long as it takes.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('720h')",message="waitTimeout must be between 1s and 720h"
	WaitTimeout *metav1.Duration `json:"waitTimeout,omitempty"`

	// OnWaitTimeout is what happens to a pod that waited longer than
	// waitTimeout: Keep (the default) leaves it waiting, with the
	// condition; Fail sets a pod that waits behind the scheduling gate to
	// phase Failed (through pods/status, with the condition), so that its
	// Job's podFailurePolicy can match the condition
	// redlock.dev/LockWaitTimeout; other pods keep waiting. A pod's
	// annotation redlock.dev/on-wait-timeout overrides it.
	// +optional
	// +kubebuilder:default=Keep
	OnWaitTimeout WaitTimeoutPolicy `json:"onWaitTimeout,omitempty"`

	// HeartbeatTimeout turns on holder liveness for holder pods whose app
	// the agent runs, as for a DistributedLock (from 3s to 24h).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('3s') && duration(self) <= duration('24h')",message="heartbeatTimeout must be between 3s and 24h"
	HeartbeatTimeout *metav1.Duration `json:"heartbeatTimeout,omitempty"`
}

// SemaphoreHolder is one slot's holder, as its DistributedLock shows it.
type SemaphoreHolder struct {
	// Slot is the slot's index.
	Slot int32 `json:"slot"`
	// Lock is the name of the slot's DistributedLock, whose status is the
	// grant's contract (validity, renewals).
	Lock string `json:"lock"`
	// Holder is who holds the slot.
	Holder LockHolder `json:"holder"`
	// FencingToken is the grant's token: strictly increasing per slot. A
	// fenced resource compares (slot, token).
	// +optional
	FencingToken int64 `json:"fencingToken,omitempty"`
	// AcquiredAt is when the holder acquired the slot.
	// +optional
	AcquiredAt *PreciseTime `json:"acquiredAt,omitempty"`
}

// DistributedSemaphoreStatus is the observed state of a
// DistributedSemaphore, written by its controller from the slots' locks.
type DistributedSemaphoreStatus struct {
	// ObservedGeneration is the generation of the spec last acted upon.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Key is the Redis key in use.
	// +optional
	Key string `json:"key,omitempty"`

	// Slots is the number of slots the semaphore's locks declare (the
	// previous number while resizing).
	// +optional
	Slots int32 `json:"slots,omitempty"`

	// Held is how many slots are held.
	// +optional
	Held int32 `json:"held"`

	// Holders lists every slot's holder, by slot. It mirrors the slots'
	// DistributedLocks, which pods and their agents act on.
	// +optional
	// +listType=atomic
	Holders []SemaphoreHolder `json:"holders,omitempty"`

	// Queue shows the pods waiting for a slot.
	// +optional
	Queue *LockQueue `json:"queue,omitempty"`

	// Conditions: Ready and Resizing.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// DistributedSemaphore admits up to spec.slots pods at once, across the
// clusters that share its masters: each holder holds one slot, a
// DistributedLock of its own that the semaphore creates and owns.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=dsem,categories=redlock
// +kubebuilder:printcolumn:name="Slots",type=integer,JSONPath=`.spec.slots`
// +kubebuilder:printcolumn:name="Held",type=integer,JSONPath=`.status.held`
// +kubebuilder:printcolumn:name="Waiting",type=integer,JSONPath=`.status.queue.count`
// +kubebuilder:printcolumn:name="Next",type=string,JSONPath=`.status.queue.waiting[0].name`,priority=1
// +kubebuilder:printcolumn:name="Next-Priority",type=integer,JSONPath=`.status.queue.waiting[0].priority`,priority=1
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 54",message="the name of a DistributedSemaphore must be at most 54 characters: its slots are DistributedLocks named '<name>-<slots>-<index>', which pods name in a label of at most 63 characters"
type DistributedSemaphore struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the semaphore.
	Spec DistributedSemaphoreSpec `json:"spec"`
	// Status is the observed state of the semaphore, written by the
	// operator.
	Status DistributedSemaphoreStatus `json:"status,omitempty"`
}

// DistributedSemaphoreList is a list of DistributedSemaphores.
//
// +kubebuilder:object:root=true
type DistributedSemaphoreList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DistributedSemaphore `json:"items"`
}

// RedisKey is the Redis key of the semaphore: spec.key, or
// "redlock:<namespace>/<name>".
func (s *DistributedSemaphore) RedisKey() string {
	if s.Spec.Key != "" {
		return s.Spec.Key
	}
	return "redlock:" + s.Namespace + "/" + s.Name
}

// SlotLockName is the name of the DistributedLock of slot index when the
// semaphore has slots slots.
func (s *DistributedSemaphore) SlotLockName(slots, index int32) string {
	return s.Name + "-" + strconv.Itoa(int(slots)) + "-" + strconv.Itoa(int(index))
}

// SlotKey is the Redis key of slot index of the semaphore key (pkg/redlock's
// SlotKey).
func SlotKey(key string, index int32) string {
	return key + ":slot:" + strconv.Itoa(int(index))
}
