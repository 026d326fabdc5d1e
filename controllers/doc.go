// Package controllers holds the reconcilers of redlock-operator: the
// DistributedLock controller, the RedisMasterSet controller and the pod
// gating controller. They build on pkg/redlock for every Redis operation.
package controllers
