// Package metrics defines the operator's Prometheus metrics and feeds them
// from pkg/redlock's Observer hook, so that the lock library itself carries
// no metrics dependency.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Metrics holds the collectors. Register them once with Register.
type Metrics struct {
	OpDuration  *prometheus.HistogramVec
	Votes       *prometheus.CounterVec
	Quarantines *prometheus.CounterVec
	// NoticesFailed counts release notices a master did not take, and
	// Wakeups the locks a release notice woke (controllers/distributedlock).
	NoticesFailed *prometheus.CounterVec
	Wakeups       *prometheus.CounterVec
	// LineChecks the checks of a lock's waiting line before an attempt
	// (controllers/distributedlock), by result.
	LineChecks    *prometheus.CounterVec
	RenewFailures *prometheus.CounterVec
	LocksHeld     prometheus.Gauge
	FencingToken  *prometheus.GaugeVec
	RenewLateness prometheus.Histogram
	StatusWrites  *prometheus.CounterVec

	// StatusWriteSlack, StatusWriteLapse, StatusWritesLate,
	// StatusWriteBacklog, StatusWriteDemand and StatusWriteBudget describe
	// the status writer that refreshes held locks' validity.
	StatusWriteSlack   prometheus.Histogram
	StatusWriteLapse   prometheus.Histogram
	StatusWritesLate   prometheus.Counter
	StatusWriteBacklog prometheus.Gauge
	StatusWriteDemand  prometheus.Gauge
	StatusWriteBudget  prometheus.Gauge
	// StatusWriteCapacity, StatusWriterOverloaded and LocksShed describe
	// its overload: the writes per second it estimates the API server
	// takes, whether it is overloaded, and the grants it shed.
	StatusWriteCapacity prometheus.Gauge
	// StatusWriteTarget is the demand the writer keeps and admits up to:
	// a share of the capacity that follows its spread.
	StatusWriteTarget      prometheus.Gauge
	StatusWriterOverloaded prometheus.Gauge
	LocksShed              prometheus.Counter
	// StatusWriterGrants is the grants the writer keeps refreshed (kept)
	// and those chosen to shed, not refreshed again (shedding).
	StatusWriterGrants *prometheus.GaugeVec
	// StatusWriteConcurrency is how many refreshes the writer may have in
	// flight at once, sized from their round trip.
	StatusWriteConcurrency prometheus.Gauge
	// APIWritesWaiting is how many of the manager's other writes wait in
	// the manager for a place at the API server (internal/writegate).
	APIWritesWaiting prometheus.Gauge
	// APIWritesWaited counts the writes that waited there.
	APIWritesWaited prometheus.Counter
	// StatusWriteLeadFloor is the lead floor of the refreshes: three mean
	// round trips, or twice their 90th percentile, once refreshes land
	// tight (applied up to a quarter of each lock's ttl).
	StatusWriteLeadFloor prometheus.Gauge
	// GrantsWaiting is how many locks wait for a grant until the status
	// writer has room for its refreshes.
	GrantsWaiting prometheus.Gauge
	// EventsDropped counts the Events the manager did not record, by
	// reason: more were recorded than --event-qps lets through, or too
	// many waited in the manager (writegate.EventsRefusedReason).
	EventsDropped *prometheus.CounterVec

	// GrantsLost counts, per lock and reason, the grants that ended
	// without their holder giving them back (the Held condition's reason).
	GrantsLost *prometheus.CounterVec
	// GrantLostAt is when a grant of the lock was last lost, per reason.
	GrantLostAt *prometheus.GaugeVec
	// Grants counts the new grants per lock: every handover to a next
	// holder (adoptions by a new leader are not grants).
	Grants *prometheus.CounterVec
	// PodWait is how long pods waited at a lock's scheduling gate, from
	// their creation to the gate's removal.
	PodWait prometheus.Histogram
}

// New returns unregistered collectors.
func New() *Metrics {
	return &Metrics{
		OpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "redlock_operation_duration_seconds",
			Help:    "Time until the outcome of a lock operation on the masters was decided.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"namespace", "name", "op", "result"}),
		Votes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlock_master_votes_total",
			Help: "Votes of each master on lock operations, by outcome.",
		}, []string{"namespace", "name", "master", "op", "outcome"}),
		Quarantines: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlock_master_quarantines_total",
			Help: "Masters found restarted within the quarantine window.",
		}, []string{"namespace", "name", "master"}),
		NoticesFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlock_release_notices_failed_total",
			Help: "Release notices a master refused or did not answer (an ACL without the notice channels, a timeout): waiters on that master's key try again after their retry delay.",
		}, []string{"namespace", "name", "master", "op"}),
		Wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlock_lock_wakeups_total",
			Help: "Locks whose key another holder has, tried for again at once, by cause: release (a quorum of masters told of the key's release, a grant ended in any cluster) or subscribed (the check once the key's notices are listened to).",
		}, []string{"cause"}),
		LineChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlock_lock_line_checks_total",
			Help: "Checks of a lock's waiting line on the masters before an attempt, by result: clear (nobody waits), turn (its turn came), wait (waiters ahead, in any cluster), bound (waiters ahead, but the key free for 6s), unavailable (the line could not be used: attempted as without one).",
		}, []string{"result"}),
		RenewFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlock_lock_renew_failures_total",
			Help: "Failed renewals of held locks, by reason.",
		}, []string{"reason"}),
		LocksHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "redlock_locks_held",
			Help: "Locks this manager holds in Redis now.",
		}),
		FencingToken: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "redlock_lock_fencing_token",
			Help: "Latest fencing token granted per lock.",
		}, []string{"namespace", "name"}),
		RenewLateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "redlock_lock_renew_lateness_seconds",
			Help:    "How late a renewal started relative to its schedule.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		StatusWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlock_status_writes_total",
			Help: "Status writes to the API server, by writer.",
		}, []string{"writer"}),
		StatusWriteSlack: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "redlock_status_write_slack_seconds",
			Help:    "Validity left in a held lock's status when the refresh replacing it landed in time.",
			Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		StatusWriteLapse: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "redlock_status_write_lapse_seconds",
			Help:    "How long a held lock's status showed a passed validity when the refresh replacing it landed late (redlock_status_writes_late_total counts them).",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		StatusWritesLate: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redlock_status_writes_late_total",
			Help: "Validity refreshes of held locks that landed after the validity status showed had passed.",
		}),
		StatusWriteBacklog: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "redlock_status_write_backlog",
			Help: "Validity refreshes that are due and not yet sent.",
		}),
		StatusWriteDemand: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "redlock_status_write_demand_per_second",
			Help: "Status writes per second the locks this manager holds need in steady state.",
		}),
		StatusWriteBudget: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "redlock_status_write_budget_per_second",
			Help: "Status writes per second the status writer may spend (--status-write-qps).",
		}),
		StatusWriteCapacity: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "redlock_status_write_capacity_per_second",
			Help: "Status writes per second the status writer estimates the API server takes (at most the budget): what it committed while refreshes waited.",
		}),
		StatusWriteTarget: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "redlock_status_write_target_per_second",
			Help: "Status writes per second the status writer keeps its demand within and admits grants up to: 80 % of the capacity it estimates, less when the API server's seconds took less than that estimate more often.",
		}),
		StatusWriterOverloaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "redlock_status_writer_overloaded",
			Help: "1 while the held locks need more status writes than the API server takes, or refreshes land close to the validity they replace: new grants wait and the youngest grants are shed.",
		}),
		LocksShed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redlock_locks_shed_total",
			Help: "Grants released because status writes could not keep them all refreshed (Held reason Shed).",
		}),
		StatusWriterGrants: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "redlock_status_writer_grants",
			Help: "Grants of this manager by what the status writer does with them: kept (refreshed) or shedding (chosen to shed, not refreshed again, shown Shed in turn).",
		}, []string{"state"}),
		StatusWriteConcurrency: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "redlock_status_write_concurrency",
			Help: "Validity refreshes the status writer may have in flight at once: enough to send its budget at the round trip it measures, within bounds.",
		}),
		APIWritesWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "redlock_api_writes_waiting",
			Help: "Writes of the manager other than validity refreshes waiting in the manager for a place at the API server: at most a quarter of the refreshes' limit in flight are there at once.",
		}),
		APIWritesWaited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redlock_api_writes_waited_total",
			Help: "Writes of the manager other than validity refreshes that waited in the manager for a place at the API server.",
		}),
		StatusWriteLeadFloor: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "redlock_status_write_lead_floor_seconds",
			Help: "Lead floor of the validity refreshes: three mean round trips of the status writes or twice their 90th percentile, raised once refreshes land tight and followed down as they speed up (0: none). A refresh is sent at least this long before the shown validity passes, up to a quarter of its lock's ttl.",
		}),
		GrantsWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "redlock_grants_waiting_for_status_writes",
			Help: "Locks whose next grant waits until the status writer can keep it refreshed (Held reason StatusWritesBehind or Shed).",
		}),
		EventsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlock_events_dropped_total",
			Help: "Events the manager did not record because more were recorded than --event-qps lets through, by reason, or because a thousand waited in the manager for their turn (reason TooManyWaiting).",
		}, []string{"reason"}),
		GrantsLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlock_lock_grants_lost_total",
			Help: "Grants of the lock that ended without their holder giving them back, by the Held condition's reason (Lost, ValidityExpired, Shed, HolderUnresponsive, Superseded).",
		}, []string{"namespace", "name", "reason"}),
		GrantLostAt: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "redlock_lock_grant_lost_timestamp_seconds",
			Help: "When a grant of the lock was last lost, by the Held condition's reason, in seconds since the epoch (set by the leader that saw the loss).",
		}, []string{"namespace", "name", "reason"}),
		Grants: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlock_lock_grants_total",
			Help: "New grants of the lock, each with a new fencing token: its handovers from one holder to the next (a new leader's adoption of a grant is not one).",
		}, []string{"namespace", "name"}),
		PodWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "redlock_pod_wait_seconds",
			Help:    "How long pods waited at a lock's scheduling gate: from the pod's creation to the gate's removal.",
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400},
		}),
	}
}

// ForgetLock deletes the per-lock series of a deleted lock.
func (m *Metrics) ForgetLock(namespace, name string) {
	m.FencingToken.DeleteLabelValues(namespace, name)
	m.Grants.DeleteLabelValues(namespace, name)
	m.GrantsLost.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "name": name})
	m.GrantLostAt.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "name": name})
}

// Register registers every collector with reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range m.Collectors() {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Collectors are every collector of m.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.OpDuration, m.Votes, m.Quarantines, m.NoticesFailed, m.Wakeups, m.LineChecks, m.RenewFailures, m.LocksHeld,
		m.FencingToken, m.RenewLateness, m.StatusWrites,
		m.StatusWriteSlack, m.StatusWriteLapse, m.StatusWritesLate, m.StatusWriteBacklog, m.StatusWriteDemand, m.StatusWriteBudget,
		m.StatusWriteCapacity, m.StatusWriteTarget, m.StatusWriterOverloaded, m.LocksShed, m.StatusWriterGrants, m.StatusWriteConcurrency, m.APIWritesWaiting, m.APIWritesWaited, m.StatusWriteLeadFloor,
		m.GrantsWaiting, m.EventsDropped, m.GrantsLost, m.GrantLostAt, m.Grants, m.PodWait,
	}
}

// Observer returns a redlock.Observer that records the operations of the
// client of master set namespace/name, labelled namespace and name as the
// set's other series are.
func (m *Metrics) Observer(namespace, name string) redlock.Observer {
	return observer{m: m, namespace: namespace, name: name}
}

type observer struct {
	m               *Metrics
	namespace, name string
}

func (o observer) ObserveOp(e redlock.OpEvent) {
	result := "ok"
	if e.Err != nil {
		result = "error"
	}
	o.m.OpDuration.WithLabelValues(o.namespace, o.name, string(e.Op), result).Observe(e.Latency.Seconds())
	for _, v := range e.Votes {
		o.m.Votes.WithLabelValues(o.namespace, o.name, v.Addr, string(e.Op), v.Outcome.String()).Inc()
	}
}

func (o observer) ObserveQuarantine(e redlock.QuarantineEvent) {
	o.m.Quarantines.WithLabelValues(o.namespace, o.name, e.Addr).Inc()
}

func (o observer) ObserveNotice(e redlock.NoticeEvent) {
	o.m.NoticesFailed.WithLabelValues(o.namespace, o.name, e.Addr, string(e.Op)).Inc()
}
