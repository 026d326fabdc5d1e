package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Condition types of a DistributedLock.
const (
	// ConditionHeld is True while the lock is held in Redis by the holder in
	// status, within its validity.
	ConditionHeld = "Held"
	// ConditionReady is True when the spec is valid and its master set can be
	// used; False with a reason when the controller cannot act on the spec.
	ConditionReady = "Ready"
	// ConditionHolderReachable is present while a pod holds the lock: False
	// (reason HolderUnreachable) when the holder's node does not report to
	// the API server, so nobody can tell whether its containers still run.
	// The lock stays with that pod until its object is gone.
	ConditionHolderReachable = "HolderReachable"
)

// Reasons used in DistributedLock conditions.
const (
	ReasonAcquired          = "Acquired"
	ReasonHeldElsewhere     = "HeldElsewhere"
	ReasonQuorumUnavailable = "QuorumUnavailable"
	ReasonValidityExpired   = "ValidityExpired"
	ReasonNotRequested      = "NotRequested"
	ReasonReleased          = "Released"
	ReasonRenewFailed       = "RenewFailed"
	ReasonLost              = "Lost"
	ReasonValid             = "Valid"
	ReasonMasterSetNotFound = "MasterSetNotFound"
	ReasonMasterSetNotReady = "MasterSetNotReady"
	ReasonTTLTooLong        = "TTLExceedsMaxLockTTL"
	ReasonInvalidSpec       = "InvalidSpec"
	// ReasonKeyKindConflict: the masters hold the key as the other kind —
	// a plain lock's key is a semaphore's with holders, or a semaphore's
	// key (of a slot's lock) a plain lock's with a holder, here or in a
	// cluster sharing the masters. A key is one kind: nobody is granted
	// until the other kind's holders are gone.
	ReasonKeyKindConflict = "KeyKindConflict"
	// ReasonNamespaceNotAllowed: another DistributedLock (or
	// DistributedSemaphore) of the same key names the namespaces that may
	// take it (spec.allowedHolders.namespaces), and this one's is not
	// among them: it grants nobody.
	ReasonNamespaceNotAllowed = "NamespaceNotAllowed"
	// ReasonLeaseExpired: the static holder did not renew its lease
	// (spec.holderLease) in time; the grant and the request ended.
	ReasonLeaseExpired = "LeaseExpired"
	// ReasonMaxHoldExceeded: the grant was held for spec.maxHoldDuration.
	ReasonMaxHoldExceeded = "MaxHoldExceeded"
	// ReasonServiceAccountNotAllowed is the reason of the pod condition
	// redlock.dev/HolderNotAllowed on a pod whose ServiceAccount the lock's
	// spec.allowedHolders.serviceAccounts does not name.
	ReasonServiceAccountNotAllowed = "ServiceAccountNotAllowed"
	// ReasonStatusWritesBehind: a new grant waits, because the status
	// refreshes of the locks already held are behind and go first.
	ReasonStatusWritesBehind = "StatusWritesBehind"
	// ReasonShed: the grant was released because the operator's status
	// writes could not keep every held lock's validity refreshed; the
	// youngest grants go first (docs/design/overload.md).
	ReasonShed = "Shed"
	// ReasonSuperseded: another grant of the key was committed to status
	// (for example by a new operator leader) and this one was given up.
	ReasonSuperseded = "Superseded"
	// ReasonPreviousHolderMarked: the next grant waits until the pod gate
	// controller has removed the label redlock.dev/holds from a pod that
	// no longer holds the lock.
	ReasonPreviousHolderMarked = "PreviousHolderMarked"
	// ReasonHolderReachable and ReasonHolderUnreachable are the reasons of
	// the HolderReachable condition.
	ReasonHolderReachable   = "NodeReady"
	ReasonHolderUnreachable = "HolderUnreachable"
	// ReasonHolderUnresponsive: the holder pod's heartbeat stopped, or its
	// containers crash-looped, for longer than spec.heartbeatTimeout; the
	// grant was given up and the pod is marked with UnresponsiveAnnotation
	// (docs/concepts/active-passive.md, holder liveness).
	ReasonHolderUnresponsive = "HolderUnresponsive"
	// ReasonHolderTerminating: the holder pod, whose app the in-pod agent
	// runs, is being deleted; status stopped showing its grant so that the
	// agent stops the app at once, and the grant is released, and the
	// next pod granted, once the agent says the app stopped
	// (LockHeartbeat stoppedGrant) or the pod's containers have stopped
	// (docs/concepts/active-passive.md).
	ReasonHolderTerminating = "HolderTerminating"
	// ReasonRequestChanged: someone other than the leased static holder
	// cleared or changed its request (spec.holderIdentity) without the
	// holder's release word; the grant ended, and its keys are kept until
	// the validity status showed has passed (docs/design/grant-life.md).
	ReasonRequestChanged = "RequestChanged"
	// ReasonDeleting: the lock is being deleted; the grant ended, and its
	// keys, and the object, are kept until the validity status showed has
	// passed, unless its holder pod ended.
	ReasonDeleting = "Deleting"
)

// DistributedLockSpec is the desired state of a DistributedLock.
//
// +kubebuilder:validation:XValidation:rule="has(self.key) == has(oldSelf.key) && (!has(self.key) || self.key == oldSelf.key)",message="key is immutable"
// +kubebuilder:validation:XValidation:rule="self.masterSet == oldSelf.masterSet",message="masterSet is immutable: create a new DistributedLock to move a lock to other masters"
// +kubebuilder:validation:XValidation:rule="!has(self.renewInterval) || duration(self.renewInterval) < duration(self.ttl)",message="renewInterval must be shorter than ttl"
// +kubebuilder:validation:XValidation:rule="has(self.slotOf) == has(oldSelf.slotOf) && (!has(self.slotOf) || self.slotOf == oldSelf.slotOf)",message="slotOf is immutable"
// +kubebuilder:validation:XValidation:rule="!has(self.slotOf) || (has(self.key) && self.key.startsWith(self.slotOf.semaphoreKey + ':slot:') && self.key.substring(size(self.slotOf.semaphoreKey) + 6).matches('^(0|[1-9][0-9]*)$') && int(self.key.substring(size(self.slotOf.semaphoreKey) + 6)) == self.slotOf.index)",message="the key of a semaphore's slot is '<slotOf.semaphoreKey>:slot:<slotOf.index>'"
// +kubebuilder:validation:XValidation:rule="!has(self.slotOf) || !has(self.holderIdentity)",message="a semaphore's slot serves pods: it has no holderIdentity"
// +kubebuilder:validation:XValidation:rule="!has(self.key) || !self.key.matches(':slot:[0-9]+$') || has(self.slotOf)",message="a key '<semaphore>:slot:<index>' is a slot of a semaphore: only a DistributedSemaphore's own locks (spec.slotOf) take it"
type DistributedLockSpec struct {
	// MasterSet is the name of the RedisMasterSet, in this namespace, whose
	// masters arbitrate the lock. Immutable: a lock held on one set must not
	// be granted on another while its keys still stand on the first.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	MasterSet string `json:"masterSet"`

	// Key is the Redis key of the lock. Locks with the same key exclude each
	// other, also across clusters whose operators share the masters. A key
	// is one kind: the lock is refused (reason KeyKindConflict) while a
	// DistributedSemaphore with the same key has holders, and the
	// semaphore while the lock has a holder. Defaults to
	// `redlock:<namespace>/<name>` (shown in status.key), like a
	// DistributedSemaphore's: a lock and a semaphore of one name in one
	// namespace share it. Immutable. It may
	// not end in `:fence`: `<key>:fence` holds the fencing counter of the lock
	// `<key>` on every master. `redlock:quarantine-window` is
	// reserved too: every master keeps the longest quarantine window there;
	// and `redlock:member-roll`, where clusters running one set's members
	// take turns to replace one;
	// so are semaphores' slots, `<key>:slot:<index>`, but for a
	// semaphore's own locks; and `<key>:line`, the waiting line of
	// `<key>`.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="!self.endsWith(':fence')",message="key must not end in ':fence': '<key>:fence' is the fencing counter of the lock '<key>'"
	// +kubebuilder:validation:XValidation:rule="!self.endsWith(':line')",message="key must not end in ':line': '<key>:line' is the waiting line of the lock '<key>'"
	// +kubebuilder:validation:XValidation:rule="self != 'redlock:quarantine-window'",message="key 'redlock:quarantine-window' is reserved: every master keeps the quarantine window there"
	// +kubebuilder:validation:XValidation:rule="self != 'redlock:member-roll'",message="key 'redlock:member-roll' is reserved: clusters running members of one set take turns there to replace one"
	Key string `json:"key,omitempty"`

	// TTL is the validity of each acquisition and renewal, from 1s to 24h in
	// whole milliseconds. It must not exceed the master set's maxLockTTL.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="ttl must be between 1s and 24h"
	TTL metav1.Duration `json:"ttl"`

	// RenewInterval is how often a held lock is renewed. Defaults to ttl/3;
	// must be shorter than ttl.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('100ms')",message="renewInterval must be at least 100ms"
	RenewInterval *metav1.Duration `json:"renewInterval,omitempty"`

	// HolderIdentity requests the lock for a static holder (a process or
	// team name); pods labelled for the lock wait behind it. Empty: the lock
	// serves the pods labelled `redlock.dev/lock: <name>` in this namespace,
	// first come, first served. Changing it releases the lock and acquires
	// it for the new holder.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	HolderIdentity string `json:"holderIdentity,omitempty"`

	// OnLost is what happens to a holder pod when the lock is lost (its
	// renewals failed past the validity): Keep (the default) leaves it
	// running, with its readiness gate False; Evict evicts it through the
	// Eviction API, honouring PodDisruptionBudgets.
	// +optional
	// +kubebuilder:default=Keep
	OnLost LostPolicy `json:"onLost,omitempty"`

	// HeartbeatTimeout turns on holder liveness for holder pods whose app
	// the agent runs (annotation redlock.dev/agent: run): the agent renews
	// the LockHeartbeat of the lock's name every third of it while the app
	// runs under the pod's grant. A holder whose heartbeat the operator
	// has not seen for this long, or whose containers crash-loop for this
	// long, is treated as finished: its grant ends (Held=False, reason
	// HolderUnresponsive), the pod is marked (redlock.dev/unresponsive)
	// and waits behind every other pod from then on, and the next pod is
	// granted once the validity status showed has passed (by then the
	// agent has stopped the app). From 3s to 24h. Unset (the default): a holder pod
	// keeps the lock while it may run. Other holders are not affected.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('3s') && duration(self) <= duration('24h')",message="heartbeatTimeout must be between 3s and 24h"
	HeartbeatTimeout *metav1.Duration `json:"heartbeatTimeout,omitempty"`

	// HolderLease makes a static holder's grant a lease (from 3s to 24h):
	// the holder renews the lock's LockHeartbeat (spec.holderIdentity: the
	// grant ID status shows; spec.renewTime) at least this often, e.g.
	// with `kubectl redlock renew`. Unrenewed for this long, counted from
	// when the operator first looked at the grant, the grant ends (Held
	// False, reason LeaseExpired; its keys expire after the validity
	// shown) and so does the request: status.endedRequest names it, and
	// the lock serves its pods as if holderIdentity were empty until
	// spec.holderIdentity changes. Unset (the default): a static holder
	// holds for as long as the spec names it.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('3s') && duration(self) <= duration('24h')",message="holderLease must be between 3s and 24h"
	HolderLease *metav1.Duration `json:"holderLease,omitempty"`

	// MaxHoldDuration is the longest one grant may be held, from its
	// acquisition (from 1s to 720h). Past it the grant ends (Held False,
	// reason MaxHoldExceeded): a static holder's request ends with it, as
	// with holderLease; a holder pod whose app the agent runs is marked
	// and waits behind the others, as with heartbeatTimeout (the agent
	// stops the app by the validity it saw). Other holder pods are not
	// cut short, since nothing would stop them: an event says so. Unset
	// (the default): no limit.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('720h')",message="maxHoldDuration must be between 1s and 720h"
	MaxHoldDuration *metav1.Duration `json:"maxHoldDuration,omitempty"`

	// SlotOf makes the lock one slot of a DistributedSemaphore: the
	// semaphore's controller creates such locks, one per slot, and owns
	// them. Its acquisitions declare the semaphore's number of slots on the
	// masters and are refused (reason SlotsConflict) while holders that
	// declared another number hold a slot of the same semaphore key.
	// Immutable; the key must then be '<semaphoreKey>:slot:<index>'.
	// +optional
	SlotOf *SemaphoreSlot `json:"slotOf,omitempty"`

	// AllowedHolders restricts who may queue for the lock. Unset (the
	// default): every pod of the namespace labelled for it, and every
	// DistributedLock of any namespace that names its key. Pods it does
	// not allow are never granted the lock: they get the pod condition
	// redlock.dev/HolderNotAllowed and an event. Changing it never takes
	// the lock from its current holder (docs/tasks/who-may-hold.md).
	// +optional
	AllowedHolders *AllowedHolders `json:"allowedHolders,omitempty"`

	// WaitTimeout is the longest a pod may wait for the lock, counted from
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
}

// WaitTimeoutPolicy is what happens to a pod that waited too long.
// +kubebuilder:validation:Enum=Keep;Fail
type WaitTimeoutPolicy string

// Policies for pods that waited longer than their wait limit.
const (
	// WaitKeep leaves the pod waiting, with the condition
	// redlock.dev/LockWaitTimeout.
	WaitKeep WaitTimeoutPolicy = "Keep"
	// WaitFail sets a scheduling-gated pod to phase Failed, with the
	// condition.
	WaitFail WaitTimeoutPolicy = "Fail"
)

// AllowedHolders names who may queue for a lock or a semaphore. A list
// that is unset allows everyone; both lists must allow a holder.
type AllowedHolders struct {
	// ServiceAccounts are the names of the ServiceAccounts, in the lock's
	// namespace, whose pods may queue for it. A pod's ServiceAccount is
	// spec.serviceAccountName ("default" when unset). Whoever may create
	// pods in the namespace may run them as any of its ServiceAccounts:
	// this keeps workloads apart, not tenants (a namespace is the boundary
	// between tenants).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	ServiceAccounts []string `json:"serviceAccounts,omitempty"`
	// Namespaces are the namespaces whose DistributedLocks (and, for a
	// semaphore, DistributedSemaphores) may take this key in this cluster:
	// a lock in another namespace that names the same key is refused
	// (Ready False, reason NamespaceNotAllowed) and grants nobody. When
	// several objects of a key name namespaces, an object must be allowed
	// by every one of them. Operators in other clusters sharing the masters
	// do not see this list: across clusters, the masters' credentials are
	// the boundary.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespaces []string `json:"namespaces,omitempty"`
}

// SemaphoreSlot names one slot of a semaphore.
//
// +kubebuilder:validation:XValidation:rule="self.index < self.slots",message="slotOf.index must be less than slotOf.slots"
type SemaphoreSlot struct {
	// SemaphoreKey is the Redis key of the semaphore, with the rules of a
	// DistributedSemaphore's key.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1000
	// +kubebuilder:validation:XValidation:rule="!self.endsWith(':fence') && !self.endsWith(':line') && self != 'redlock:quarantine-window' && self != 'redlock:member-roll' && !self.matches(':slot:[0-9]+$')",message="slotOf.semaphoreKey must not end in ':fence', ':line' or ':slot:<index>', nor be 'redlock:quarantine-window' or 'redlock:member-roll': those keys are reserved"
	SemaphoreKey string `json:"semaphoreKey"`
	// Slots is the semaphore's number of slots.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	Slots int32 `json:"slots"`
	// Index is this slot, from 0.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=999
	Index int32 `json:"index"`
}

// LostPolicy is what happens to a holder pod whose lock is lost.
// +kubebuilder:validation:Enum=Keep;Evict
type LostPolicy string

// Policies for holder pods whose lock is lost.
const (
	// LostKeep leaves the pod running, with its readiness gate False.
	LostKeep LostPolicy = "Keep"
	// LostEvict evicts the pod through the Eviction API, honouring
	// PodDisruptionBudgets.
	LostEvict LostPolicy = "Evict"
)

// LockHolder identifies who holds a lock.
type LockHolder struct {
	// Identity is the holder's identity: the static holder, or the name of
	// the holder pod.
	Identity string `json:"identity"`
	// Pod is the holder pod, when a pod holds the lock.
	// +optional
	Pod *PodReference `json:"pod,omitempty"`
}

// PodReference names a pod of the lock's namespace.
type PodReference struct {
	// Name of the pod.
	Name string `json:"name"`
	// UID of the pod: a pod re-created under the same name is another pod.
	UID types.UID `json:"uid"`
}

// EndedRequest is a static holder's request that ended on its own.
type EndedRequest struct {
	// Identity is the static holder.
	Identity string `json:"identity"`
	// Generation is the lock's metadata.generation when it ended, for
	// the record: only another spec.holderIdentity asks again.
	Generation int64 `json:"generation"`
	// Reason is LeaseExpired, MaxHoldExceeded, or Released (the holder's
	// own release word).
	Reason string `json:"reason"`
	// At is when it ended.
	// +optional
	At *PreciseTime `json:"at,omitempty"`
}

// QueuedPod is a pod waiting in a lock's or a semaphore's queue.
type QueuedPod struct {
	// Name of the pod.
	Name string `json:"name"`
	// UID of the pod.
	UID types.UID `json:"uid"`
	// Priority is the pod's queue priority: its annotation
	// redlock.dev/priority, or else its PriorityClass's value
	// (spec.priority), or else 0.
	// +optional
	Priority int32 `json:"priority"`
}

// LockQueue shows the pods waiting for a lock.
type LockQueue struct {
	// Waiting lists the first pods in line (at most 10), in the order they
	// will be served (docs/concepts/queue-order.md): higher priority first,
	// then first come, first served (creation time, then name).
	// +optional
	// +listType=atomic
	Waiting []QueuedPod `json:"waiting,omitempty"`
	// Count is how many pods wait.
	Count int32 `json:"count"`
}

// MasterVote is one master's answer to the latest operation on the lock.
type MasterVote struct {
	// Address is the master's address.
	Address string `json:"address"`
	// Vote is the master's answer: Granted, Held (another value), Absent,
	// Error, Quarantined or Pending (no answer before the decision).
	Vote string `json:"vote"`
	// Error is the master's error, when Vote is Error or Quarantined.
	// +optional
	Error string `json:"error,omitempty"`
}

// QuorumStatus summarises the votes of the latest operation.
type QuorumStatus struct {
	// Quorum is the number of granted votes needed (N/2+1).
	Quorum int32 `json:"quorum"`
	// Granted is the number of masters that granted.
	Granted int32 `json:"granted"`
	// Masters holds each master's vote.
	// +optional
	// +listType=atomic
	Masters []MasterVote `json:"masters,omitempty"`
}

// DistributedLockStatus is the observed state of a DistributedLock.
type DistributedLockStatus struct {
	// ObservedGeneration is the generation of the spec last acted upon.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Key is the Redis key in use.
	// +optional
	Key string `json:"key,omitempty"`

	// Holder is who holds the lock; empty when nobody does.
	// +optional
	Holder *LockHolder `json:"holder,omitempty"`

	// AcquiredAt is when the current holder acquired the lock.
	// +optional
	AcquiredAt *PreciseTime `json:"acquiredAt,omitempty"`

	// RenewedAt is when the lock was last renewed, as far as status shows
	// (renewals are not all written).
	// +optional
	RenewedAt *PreciseTime `json:"renewedAt,omitempty"`

	// ValidUntil is when the holder's validity ends unless renewed
	// (microsecond precision). The real validity is never earlier: a reader
	// must treat the lock as not held once ValidUntil has passed, whatever
	// the Held condition says.
	// +optional
	ValidUntil *PreciseTime `json:"validUntil,omitempty"`

	// ReleasedAt is when status stopped showing the latest grant (released,
	// lost or expired); the grant is given back in Redis only after that.
	// +optional
	ReleasedAt *PreciseTime `json:"releasedAt,omitempty"`

	// LastValidUntil is the validity status last showed of the latest
	// grant, kept once status stopped showing it: its keys stay on the
	// masters until it has passed (and the drift allowance), unless its
	// holder was proven to have stopped (docs/design/grant-life.md).
	// +optional
	LastValidUntil *PreciseTime `json:"lastValidUntil,omitempty"`

	// FencingToken is the token of the current (or latest) grant. Tokens
	// are strictly increasing per Redis key, across DistributedLocks,
	// clusters and operators that share the masters, and across restarts
	// of the operator and of the masters; they are large and not
	// consecutive. Pass it to the resources the holder writes so that they
	// reject writes carrying a smaller token.
	// +optional
	FencingToken int64 `json:"fencingToken,omitempty"`

	// GrantID identifies the current (or latest) grant. The value stored in
	// Redis is derived from it with the operator's secret key, so that a new
	// operator leader can renew or release the grant; every acquisition
	// attempt has its own.
	// +optional
	GrantID string `json:"grantID,omitempty"`

	// LastHolderPod is the pod of the latest pod grant, kept after that
	// grant ended (released, lost) for as long as the pod may still run:
	// no other pod is granted the lock before it stopped, whatever its
	// labels say by then.
	// +optional
	LastHolderPod *PodReference `json:"lastHolderPod,omitempty"`

	// Queue shows the pods waiting for the lock.
	// +optional
	Queue *LockQueue `json:"queue,omitempty"`

	// EndedRequest is the static holder's request that ended on its own
	// (its lease expired, or it held past maxHoldDuration): the lock does
	// not grant it again until spec.holderIdentity changes.
	// +optional
	EndedRequest *EndedRequest `json:"endedRequest,omitempty"`

	// Quorum shows the masters' votes on the latest operation.
	// +optional
	Quorum *QuorumStatus `json:"quorum,omitempty"`

	// Conditions: Held and Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// DistributedLock is a lock acquired with Redlock across the masters of a
// RedisMasterSet and held for a holder.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=dlock,categories=redlock
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.status.holder.identity`
// +kubebuilder:printcolumn:name="Held",type=string,JSONPath=`.status.conditions[?(@.type=="Held")].status`
// +kubebuilder:printcolumn:name="Valid-Until",type=string,JSONPath=`.status.validUntil`
// +kubebuilder:printcolumn:name="Token",type=integer,JSONPath=`.status.fencingToken`
// +kubebuilder:printcolumn:name="Waiting",type=integer,JSONPath=`.status.queue.count`
// +kubebuilder:printcolumn:name="Next",type=string,JSONPath=`.status.queue.waiting[0].name`,priority=1
// +kubebuilder:printcolumn:name="Next-Priority",type=integer,JSONPath=`.status.queue.waiting[0].priority`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="the name of a DistributedLock must be at most 63 characters: pods name their lock in the label redlock.dev/lock, whose values are at most 63 characters"
type DistributedLock struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the lock: its master set, key, TTL and
	// holder.
	Spec DistributedLockSpec `json:"spec"`
	// Status is the observed state of the lock, written by the operator.
	Status DistributedLockStatus `json:"status,omitempty"`
}

// DistributedLockList is a list of DistributedLocks.
//
// +kubebuilder:object:root=true
type DistributedLockList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DistributedLock `json:"items"`
}

// RedisKey is the Redis key the lock takes: spec.key, or
// "redlock:<namespace>/<name>".
func (l *DistributedLock) RedisKey() string {
	if l.Spec.Key != "" {
		return l.Spec.Key
	}
	return "redlock:" + l.Namespace + "/" + l.Name
}

// MovingPod is the UID of the pod the semaphore of this slot lock fenced
// it against (MovingPodAnnotation: it is moving that pod to another slot),
// or "" (always for a plain lock).
func (l *DistributedLock) MovingPod() string {
	if l.Spec.SlotOf == nil {
		return ""
	}
	return l.Annotations[MovingPodAnnotation]
}

// StaticRequest is the static holder the lock asks for: spec.holderIdentity,
// or "" when there is none or status.endedRequest shows that request ended
// (its lease expired, or it held past maxHoldDuration; the lock then serves
// its pods until spec.holderIdentity changes).
func (l *DistributedLock) StaticRequest() string {
	if er := l.Status.EndedRequest; er != nil && er.Identity == l.Spec.HolderIdentity {
		return ""
	}
	return l.Spec.HolderIdentity
}
