package grants

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
)

// DefaultWritesPerSecond is the default budget of validity refreshes per
// second.
const DefaultWritesPerSecond = 150

// Config is what a Set is built from.
type Config struct {
	// Client writes the refreshes. It should be a client of their own,
	// limited only by WritesPerSecond and not held back by Gate, so that
	// refreshes never queue behind other writes.
	Client   client.Client
	Recorder events.EventRecorder
	Metrics  *metrics.Metrics
	// WritesPerSecond is the budget of refreshes (0: DefaultWritesPerSecond).
	WritesPerSecond float64
	// FailoverSlack is how long a standby may take to lead and adopt every
	// grant: refreshes keep that much validity ahead when the ttl allows.
	FailoverSlack time.Duration
	// Report is the ConfigMap the writer publishes its report in while
	// this manager leads (v1alpha1.StatusWriterReport): none when it has
	// no name. Manager names the publisher in it.
	Report  types.NamespacedName
	Manager string
	// Gate, if not nil, holds the manager's other writes back while this
	// writer leads (internal/writegate): it follows the writer's limit of
	// refreshes in flight, and opens when the writer stops. Client's writes
	// must not wait at it.
	Gate Gate
}

// Gate is the manager's gate for writes other than the refreshes
// (writegate.Gate).
type Gate interface {
	// Follow sizes the gate from the limit of refreshes in flight, and
	// whether due refreshes wait for room in it (behind); 0 opens it.
	Follow(refreshes int, behind bool)
}

// Callbacks are how a Set reaches the controller, in the manner of
// client-go's LeaderCallbacks. They must not block.
type Callbacks struct {
	// Reconcile asks for a reconcile of a lock: status no longer shows its
	// grant, its Session lost it, it was shed, or it waited for room and
	// now fits.
	Reconcile func(types.NamespacedName)
}

// Set is the grants one manager holds, by lock UID. It is a
// manager.Runnable: it refreshes the validity status shows of each until
// the manager stops, then refreshes those a failover would see lapse and
// orphans every Session (the next leader adopts them).
type Set struct {
	sessions *sessions
	writer   *statusWriter
}

// New returns an empty Set.
func New(cfg Config, cb Callbacks) *Set {
	qps := cfg.WritesPerSecond
	if qps <= 0 {
		qps = DefaultWritesPerSecond
	}
	ss := newSessions()
	w := newStatusWriter(cfg.Client, cfg.Recorder, cfg.Metrics, ss, qps, cfg.FailoverSlack)
	w.reconcile = cb.Reconcile
	w.publishTo, w.manager = cfg.Report, cfg.Manager
	if cfg.Gate != nil {
		w.gate = cfg.Gate
	}
	return &Set{sessions: ss, writer: w}
}

// Start implements manager.Runnable. The Sessions renew until the last
// refreshes are written, for those to show fresh renewals.
func (s *Set) Start(ctx context.Context) error {
	s.writer.run(ctx)
	s.sessions.orphanAll()
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (s *Set) NeedLeaderElection() bool { return true }

// Get returns the grant held for lock uid, or nil.
func (s *Set) Get(uid types.UID) *Grant { return s.sessions.get(uid) }

// Others returns the grants held for objects named name other than uid: a
// deleted object's, or an earlier object's of the same name.
func (s *Set) Others(name types.NamespacedName, uid types.UID) []*Grant {
	return s.sessions.others(name, uid)
}

// Hold starts renewing g with a Session of grant and cfg (whose Reports
// and Floor the Set sets). Status is not refreshed until Show.
func (s *Set) Hold(g *Grant, grant renewal.Grant, cfg renewal.Config) {
	cfg.Reports, cfg.Floor = s.writer.reports, g.Floor
	s.sessions.hold(g, func() *renewal.Session { return renewal.Hold(s.sessions.base, grant, cfg) })
}

// Drop forgets g: its validity is no longer refreshed. Its Session is the
// caller's to release or orphan.
func (s *Set) Drop(g *Grant) {
	g.dropped.Store(true)
	s.sessions.drop(g)
	s.writer.forget(g)
}

// Show records that status shows g valid until shown, and keeps it
// refreshed from then on; ttl is the lock's.
func (s *Set) Show(g *Grant, shown time.Time, ttl time.Duration) { s.writer.track(g, shown, ttl) }

// ShowAdopted is Show for a grant this manager adopted: its first refresh
// is sent at once, to fence off the writes of whoever renewed it before.
func (s *Set) ShowAdopted(g *Grant, shown time.Time, ttl time.Duration) {
	s.writer.writeAdopted(g, shown, ttl)
}

// Admit reports whether a new grant of lock name (ttl) fits in the
// refresh budget now; when not, the lock waits in line and Reconcile is
// called when it fits.
func (s *Set) Admit(name types.NamespacedName, ttl time.Duration) bool {
	return s.writer.admit(name, ttl)
}

// StopWaiting takes lock name out of the line for room.
func (s *Set) StopWaiting(name types.NamespacedName) { s.writer.stopWaiting(name) }

// Shedding reports whether g is being shed to keep the others' refreshes
// on time, and why.
func (s *Set) Shedding(g *Grant) (string, bool) { return s.writer.shedding(g) }

// ShedShown counts a grant whose status now shows it Shed, for the
// writer's report: the one count of sheds, with redlock_locks_shed_total.
func (s *Set) ShedShown() {
	s.writer.mu.Lock()
	s.writer.shedTotal++
	s.writer.win.shown++ // a write the API server took beside the refreshes (load.go)
	s.writer.mu.Unlock()
}

// Wrote records a committed write of this manager's to lock uid, named
// name.
func (s *Set) Wrote(name types.NamespacedName, uid types.UID) { s.writer.written.add(name, uid) }

// WroteBefore reports whether this manager has written lock uid since it
// started: only then can its cache lag behind a write of its own.
func (s *Set) WroteBefore(uid types.UID) bool { return s.writer.written.has(uid) }

// Forget forgets every lock object named name but keep: they are gone.
func (s *Set) Forget(name types.NamespacedName, keep types.UID) {
	s.writer.written.m.Range(func(uid, n any) bool {
		if n == name && uid != keep {
			s.writer.written.m.Delete(uid)
		}
		return true
	})
}

// written is the locks this manager has written since it started: UID to
// name.
type written struct{ m sync.Map }

func (w *written) add(name types.NamespacedName, uid types.UID) { w.m.Store(uid, name) }

func (w *written) has(uid types.UID) bool {
	_, ok := w.m.Load(uid)
	return ok
}
