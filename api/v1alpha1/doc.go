// Package v1alpha1 holds the API types of the coordination.redlock.dev/v1alpha1
// group: DistributedLock and RedisMasterSet. The types, their validation
// markers and the generated deep-copy functions arrive with the controller
// (issue 3); this package holds no logic.
package v1alpha1
