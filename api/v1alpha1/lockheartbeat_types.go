package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LockHeartbeatSpec is what the holder of a lock writes to show it is
// alive.
type LockHeartbeatSpec struct {
	// HolderIdentity is the grant the renewal is for: the lock's
	// status.grantID as the holder read it. A renewal naming another grant
	// (a former holder's late write) counts for nothing.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	HolderIdentity string `json:"holderIdentity,omitempty"`
	// RenewTime is when the holder renewed, by its own clock. For people
	// only: the operator counts a renewal when it sees the object change,
	// on its own clock.
	// +optional
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
	// StoppedGrant is the in-pod agent's word that the app it ran under
	// this grant has stopped and that nothing else runs in its container:
	// the agent writes it, as the container's first process, once status
	// no longer shows the grant, after it stopped the app and killed and
	// reaped every other process there. For a pod that is being deleted
	// (its containers are never restarted) the operator takes the word as
	// the pod's end: it releases the grant and grants the next pod without
	// waiting for the kubelet to report the containers gone.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	StoppedGrant string `json:"stoppedGrant,omitempty"`
	// ReleasedGrant is a leased static holder's release of this grant
	// (the Go client's Release, kubectl redlock release), written once
	// nothing acts on it: the operator releases the keys at once and ends
	// the request (status.endedRequest, reason Released). Only those who
	// may patch the DistributedLock (and so withdraw its request anyway)
	// may write it: the admission policy lock-release-word refuses anyone
	// else, such as the agents of the lock's pods.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	ReleasedGrant string `json:"releasedGrant,omitempty"`
}

// LockHeartbeat is the heartbeat of the holder of the DistributedLock of
// the same name and namespace (renewed when that lock sets
// spec.heartbeatTimeout), and where the in-pod agent says it stopped the
// app of a grant (stoppedGrant). It exists while pods with the agent
// request the lock, or the lock sets a heartbeat timeout.
// The operator creates it, owned by the lock; the holder (the in-pod
// agent) renews it by updating spec, with get and update on this one
// object (a Role with resourceNames).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=dlockhb,categories=redlock
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.spec.holderIdentity`
// +kubebuilder:printcolumn:name="Renewed",type=string,JSONPath=`.spec.renewTime`
// +kubebuilder:printcolumn:name="Stopped",type=string,JSONPath=`.spec.stoppedGrant`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LockHeartbeat struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the latest renewal.
	// +optional
	Spec LockHeartbeatSpec `json:"spec,omitempty"`
}

// LockHeartbeatList is a list of LockHeartbeats.
//
// +kubebuilder:object:root=true
type LockHeartbeatList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LockHeartbeat `json:"items"`
}
