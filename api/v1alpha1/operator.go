package v1alpha1

// LeaderLease is the name of the coordination.k8s.io Lease the operator's
// replicas elect their leader with, in the operator's namespace (the
// manager's --leader-election-namespace). kubectl redlock check reads it.
const LeaderLease = "redlock-operator.redlock.dev"
