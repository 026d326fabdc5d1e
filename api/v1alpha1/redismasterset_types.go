package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types of a RedisMasterSet.
const (
	// ConditionAvailable is True when a quorum of masters is reachable and
	// not quarantined.
	ConditionAvailable = "Available"
	// ConditionDegraded is True when some master is down or quarantined.
	ConditionDegraded = "Degraded"
)

// Reasons used in RedisMasterSet conditions.
const (
	ReasonQuorumServing    = "QuorumServing"
	ReasonQuorumLost       = "QuorumLost"
	ReasonAllServing       = "AllServing"
	ReasonMembersDown      = "MembersDown"
	ReasonAuthSecretError  = "AuthSecretError"
	ReasonNoMembers        = "NoMembers"
	ReasonProbeNotYetRun   = "ProbeNotYetRun"
	ReasonUnsupportedSpec  = "UnsupportedSpec"
	ReasonMembersAvailable = "MembersAvailable"
)

// Member states.
const (
	MemberServing     = "Serving"
	MemberQuarantined = "Quarantined"
	MemberStarting    = "Starting"
	MemberDown        = "Down"
)

// ExternalMasters lists masters run outside the operator.
type ExternalMasters struct {
	// Addresses of the independent masters, "host:port" or "[ipv6]:port".
	// An even number of masters tolerates no more failures than one fewer:
	// prefer an odd number.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=15
	// +listType=set
	// +kubebuilder:validation:items:MaxLength=261
	// +kubebuilder:validation:items:Pattern=`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$`
	Addresses []string `json:"addresses"`
}

// SecretKeyRef names a key of a Secret in the master set's namespace.
type SecretKeyRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Key of the password in the Secret. Defaults to "password".
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
	// UsernameKey is the key of an ACL user name in the Secret; empty uses
	// the default user.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	UsernameKey string `json:"usernameKey,omitempty"`
}

// RedisMasterSetSpec is the desired state of a RedisMasterSet. Exactly one
// mode is set: external (masters run elsewhere, monitored) or, in a later
// version, managed (masters run by the operator).
//
// +kubebuilder:validation:XValidation:rule="has(self.external)",message="spec.external is required (managed masters are not available yet)"
// +kubebuilder:validation:XValidation:rule="!has(self.nodeTimeout) || duration(self.nodeTimeout).getMilliseconds() * 10 <= duration(self.maxLockTTL).getMilliseconds()",message="nodeTimeout must be at most a tenth of maxLockTTL"
type RedisMasterSetSpec struct {
	// External lists masters run outside the operator.
	// +optional
	External *ExternalMasters `json:"external,omitempty"`

	// MaxLockTTL is the longest TTL a lock on these masters may use. A master
	// that restarted less than maxLockTTL (plus drift and a margin) ago does
	// not vote, so locks it forgot cannot be granted twice.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="maxLockTTL must be between 1s and 24h"
	MaxLockTTL metav1.Duration `json:"maxLockTTL"`

	// AuthSecretRef names the Secret holding the masters' password.
	// +optional
	AuthSecretRef *SecretKeyRef `json:"authSecretRef,omitempty"`

	// NodeTimeout bounds each request to one master. Defaults to ttl/100
	// clamped to 20ms–200ms per lock.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1ms') && duration(self) <= duration('10s')",message="nodeTimeout must be between 1ms and 10s"
	NodeTimeout *metav1.Duration `json:"nodeTimeout,omitempty"`
}

// MemberStatus is the observed state of one master.
type MemberStatus struct {
	// Address of the master.
	Address string `json:"address"`
	// State: Serving, Quarantined, Starting or Down.
	State string `json:"state"`
	// Reachable is true when the last probe got an answer.
	Reachable bool `json:"reachable"`
	// RunID is the master's run_id from its last answer.
	// +optional
	RunID string `json:"runID,omitempty"`
	// Restarts counts run_id changes seen by the operator.
	// +optional
	Restarts int32 `json:"restarts,omitempty"`
	// QuarantinedUntil is when a restarted master votes again.
	// +optional
	QuarantinedUntil *metav1.Time `json:"quarantinedUntil,omitempty"`
	// Message explains a Down state.
	// +optional
	Message string `json:"message,omitempty"`
}

// RedisMasterSetStatus is the observed state of a RedisMasterSet.
type RedisMasterSetStatus struct {
	// ObservedGeneration is the generation of the spec last acted upon.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Quorum is the number of masters a lock needs (N/2+1).
	// +optional
	Quorum int32 `json:"quorum,omitempty"`
	// Serving is the number of masters that can vote now.
	// +optional
	Serving int32 `json:"serving"`
	// Total is the number of masters.
	// +optional
	Total int32 `json:"total,omitempty"`
	// Members holds each master's state, in spec order.
	// +optional
	// +listType=atomic
	Members []MemberStatus `json:"members,omitempty"`
	// Conditions: Available and Degraded.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RedisMasterSet is a set of independent Redis masters that arbitrate
// DistributedLocks.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rms,categories=redlock
// +kubebuilder:printcolumn:name="Serving",type=integer,JSONPath=`.status.serving`
// +kubebuilder:printcolumn:name="Total",type=integer,JSONPath=`.status.total`
// +kubebuilder:printcolumn:name="Available",type=string,JSONPath=`.status.conditions[?(@.type=="Available")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RedisMasterSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   RedisMasterSetSpec   `json:"spec"`
	Status RedisMasterSetStatus `json:"status,omitempty"`
}

// RedisMasterSetList is a list of RedisMasterSets.
//
// +kubebuilder:object:root=true
type RedisMasterSetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RedisMasterSet `json:"items"`
}
