// Package v1alpha1 contains the API types of the coordination.redlock.dev
// group, version v1alpha1: DistributedLock, DistributedSemaphore,
// RedisMasterSet and LockHeartbeat. It holds types, validation markers and
// generated deep-copy functions, no logic.
//
// +kubebuilder:object:generate=true
// +groupName=coordination.redlock.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "coordination.redlock.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this group-version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&DistributedLock{}, &DistributedLockList{},
		&RedisMasterSet{}, &RedisMasterSetList{},
		&LockHeartbeat{}, &LockHeartbeatList{},
		&DistributedSemaphore{}, &DistributedSemaphoreList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
