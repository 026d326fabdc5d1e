package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LeaderLease is the name of the coordination.k8s.io Lease the operator's
// replicas elect their leader with, in the operator's namespace (the
// manager's --leader-election-namespace). kubectl redlock check reads it.
const LeaderLease = "redlock-operator.redlock.dev"

// StatusConfigMap is the name of the ConfigMap, beside the LeaderLease,
// in which the leading manager publishes what its status writer does
// (StatusWriterReport, as JSON under StatusWriterKey), in the manner of
// cluster-autoscaler's status ConfigMap. kubectl redlock status reads it.
const StatusConfigMap = "redlock-operator-status"

// StatusWriterKey is the key of StatusConfigMap's data that holds the
// StatusWriterReport.
const StatusWriterKey = "statusWriter"

// StatusWriterReportBeat is how often at least the leading manager
// publishes its StatusWriterReport, and StatusWriterReportMaxAge the age
// past which a report is no longer current: two beats (one write may
// fail, as in the overload the report shows) and a write's time.
const (
	StatusWriterReportBeat   = time.Minute
	StatusWriterReportMaxAge = 2*StatusWriterReportBeat + 10*time.Second
)

// StatusWriterReport is what the leading manager's status writer does:
// how many writes a second it may spend and the API server takes, what
// the grants it keeps need, and which grants it keeps, sheds and keeps
// waiting. It is published when it changes, at most every 10 s, and at
// least every minute: a report older than that is no longer current.
type StatusWriterReport struct {
	// Manager is the publishing manager: its host name, which begins its
	// identity in the LeaderLease (the pod's name, or the node's with
	// hostNetwork).
	Manager string `json:"manager"`
	// Published is when the report was made.
	Published metav1.Time `json:"published"`
	// BudgetPerSecond is --status-write-qps.
	BudgetPerSecond float64 `json:"budgetPerSecond"`
	// CapacityPerSecond is the writes a second the writer estimates the
	// API server takes; Measured: from seconds in which refreshes
	// waited, rather than the budget assumed before any did.
	CapacityPerSecond float64 `json:"capacityPerSecond"`
	Measured          bool    `json:"measured"`
	// TargetPerSecond is the demand the writer keeps and admits grants up
	// to: 80 % of the capacity, less when the API server's seconds took
	// less than the estimate more often (docs/design/overload.md).
	TargetPerSecond float64 `json:"targetPerSecond"`
	// DemandPerSecond is the writes a second the kept grants need.
	DemandPerSecond float64 `json:"demandPerSecond"`
	// Overloaded: the kept grants need more than the capacity, or their
	// refreshes land close to the validity they replace; new grants wait.
	Overloaded bool `json:"overloaded"`
	// OverloadedSince is when the overload began (unset when not).
	OverloadedSince *metav1.Time `json:"overloadedSince,omitempty"`
	// Kept is the grants whose validity the writer refreshes.
	Kept int `json:"kept"`
	// Shedding is the grants chosen to shed and not shown Shed yet: they
	// are not refreshed again.
	Shedding int `json:"shedding"`
	// Waiting is the locks whose next grant waits for room in the status
	// writes (Held reason StatusWritesBehind).
	Waiting int `json:"waiting"`
	// Shed is the grants shed since this manager began leading.
	Shed int64 `json:"shed"`
}
