package grants

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
)

// EventStatusWriteLate is the event of a held lock whose validity refresh
// landed after the validity its status showed had passed.
const EventStatusWriteLate = "StatusWriteLate"

// writeTimeout bounds one validity refresh.
const writeTimeout = 10 * time.Second

// statusWriter refreshes the validity that held locks' status shows. It is
// the one writer of every grant this manager renews, once the reconcile
// that made the grant has shown it. It owns the refresh schedule
// (refreshSchedule): it asks the grant's Session for a renewal renewLead
// before a refresh is due, and sends due refreshes nearest shown validity
// first (oldest grant first while those land tight: keep.go), within a
// budget of writes per second. A refresh that lands late
// is reported on the lock (StatusWriteLate), once per lapse. A Session
// that ended by itself asks, through the writer, for a reconcile of its
// lock. Every refresh is a conditional JSON patch (RefreshPatch).
// The reasoning: docs/design/status-writer.md#what-it-owns.
type statusWriter struct {
	client   client.Client
	recorder events.EventRecorder
	metrics  *metrics.Metrics
	sessions *sessions
	budget   *rate.Limiter
	sched    refreshSchedule
	// reports carries the renewals and losses of every Session this
	// manager starts.
	reports *renewal.Reports
	// publishTo is the ConfigMap the writer publishes its report in, as
	// manager (publish.go); none when it has no name.
	publishTo types.NamespacedName
	manager   string
	// reconcile asks for a reconcile of a lock: its status no longer
	// shows its grant, its Session lost it, it was shed, or its grant
	// waited and now fits (waiters.go).
	reconcile func(types.NamespacedName)
	// written records the locks a refresh committed to.
	written *written
	// gate follows the limit in flight while the writer runs (Config.Gate).
	gate Gate

	// kickSchedule wakes scheduleLoop (a refresh was placed); kickSend
	// wakes send (a refresh is ready).
	kickSchedule, kickSend chan struct{}
	// kickWaiters wakes loadLoop to wake waiting grants: room was made.
	kickWaiters chan struct{}
	// kickPublish wakes publishLoop: the overload turned over.
	kickPublish chan struct{}

	mu      sync.Mutex
	entries map[types.UID]*refresh
	// ttls counts the entries by lock ttl, for the shortest lead held.
	ttls    map[time.Duration]int
	refused map[string]time.Time // by grant ID: when a refresh of the grant was last refused
	pruned  time.Time            // when refused was last pruned
	poking  int                  // refreshes waiting for the renewal they asked for
	sending int                  // refreshes send has in flight
	// inflight is how many refreshes may be in flight (inflight.go).
	inflight int
	// gateBehind is whether the gate was last sized while due refreshes
	// waited for room in flight (followGate).
	gateBehind bool
	rtt        rttWindow
	leasts     []time.Duration // the least round trip of each of the last baseWindows windows (inflight.go)
	waiting    refreshHeap     // by due time
	// cal counts the waiting refreshes by the slot of their due time
	// (calendar.go).
	cal   calendar
	ready refreshHeap // due: by shown validity
	// readyKeep is the same refreshes, oldest grant first (keep.go).
	readyKeep refreshHeap
	// toShed is the grants chosen to shed, by shown validity; toShedLate
	// those whose shown validity passed before their turn, shown Shed
	// after the others; shedSending how many of them send has asked to
	// show Shed and not seen forgotten (shed.go).
	toShed, toShedLate refreshHeap
	shedSending        int
	demand             float64
	over               bool // demand exceeds the budget (logged once per crossing)

	// Load (load.go): the current window's measurements, the state they
	// lead to, and the grants shed and not yet forgotten.
	load          loadState
	win           loadWindow
	backlogSince  time.Time // when the backlog last became non-empty (zero: empty)
	busySince     time.Time // when a refresh was last sent with none in flight (zero: none in flight)
	adopting      int       // adopted grants whose first refresh has not committed
	adoptSince    time.Time // when adopted grants last began waiting for their first refresh
	overloadSince time.Time
	strikes       int                  // overloaded windows in a row
	shed          map[types.UID]string // by lock UID: why the grant is being shed
	// shedAsked is the grants chosen to shed whose turn came (shed.go),
	// each with a channel closed when the writer forgets it.
	shedAsked map[types.UID]chan struct{}
	shedTotal int64                            // grants shown Shed (ShedShown)
	waiters   waitQueue                        // grants waiting for room
	promised  map[types.NamespacedName]promise // room kept for grants admitted or woken, not made yet
}

// refresh is the validity refresh of one grant.
type refresh struct {
	h   *Grant
	ttl time.Duration
	// shownText is the validity status shows (h.shown) as status holds
	// it, when that is not the form this writer would write (an earlier
	// version's whole seconds): the JSON patch's test compares the text.
	shownText string
	due       time.Time // when the next refresh is due (zero: after the next renewal)
	// wake is when the writer next acts on a waiting refresh: renewLead
	// before due, to ask for the renewal it will show, then due.
	wake time.Time
	// notBefore: a reported renewal does not make the refresh ready
	// before then (a backoff).
	notBefore time.Time
	lapsed    bool // a lapse was reported and has not ended
	fails     int  // transient write errors in a row
	// askedAt is when a renewal was asked for this late refresh (zero:
	// none): an older one is not shown.
	askedAt time.Time
	poking  bool // ... and the refresh waits for it (counted in poking)
	where   place
	index   int // in its heap
	// keepIndex is its index in the ready refreshes' keep order (readyKeep).
	keepIndex int
	adopted   bool // its first refresh since this manager adopted it is not written yet
	// lead is the lead of the due time it was scheduled for, before the
	// calendar moved it earlier (zero: none yet):
	// a refresh lands tight against the lead it was sent with, not one the
	// lead floor raised after.
	lead time.Duration
	// slot is the calendar slot it is counted in, while counted.
	slot    int64
	counted bool
}

type place int

const (
	parked     place = iota // waits for a renewal
	waiting                 // waits for its wake time, or a fresh renewal
	ready                   // due
	inFlight                // being written
	doomed                  // chosen to shed: waits for its turn to be shown Shed (shed.go)
	doomedLate              // ... and its shown validity passed first: after the others (shed.go)
)

// byShown orders refreshes nearest shown validity first.
func byShown(a, b *refresh) bool { return a.h.shown.Before(b.h.shown) }

// newStatusWriter returns a writer of perSecond refreshes at most, whose
// refreshes keep failover of validity ahead when the ttl allows.
func newStatusWriter(c client.Client, rec events.EventRecorder, m *metrics.Metrics, ss *sessions, perSecond float64, failover time.Duration) *statusWriter {
	m.StatusWriteBudget.Set(perSecond)
	m.StatusWriteCapacity.Set(perSecond) // until a window measures less
	m.StatusWriteConcurrency.Set(minWriteParallel)
	return &statusWriter{
		inflight: minWriteParallel,
		client:   c, recorder: rec, metrics: m, sessions: ss,
		sched:        refreshSchedule{failover: failover},
		budget:       rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond))),
		reports:      renewal.NewReports(),
		written:      &written{},
		gate:         openGate{},
		kickSchedule: make(chan struct{}, 1),
		kickSend:     make(chan struct{}, 1),
		kickWaiters:  make(chan struct{}, 1),
		kickPublish:  make(chan struct{}, 1),
		waiters:      waitQueue{byName: map[types.NamespacedName]waiter{}},
		promised:     map[types.NamespacedName]promise{},
		entries:      map[types.UID]*refresh{},
		cal:          calendar{},
		ttls:         map[time.Duration]int{},
		shed:         map[types.UID]string{},
		shedAsked:    map[types.UID]chan struct{}{},
		load:         initialLoad(perSecond),
		refused:      map[string]time.Time{},
		waiting:      refreshHeap{less: func(a, b *refresh) bool { return a.wake.Before(b.wake) }},
		ready:        refreshHeap{less: byShown},
		readyKeep:    refreshHeap{less: keptFirst, keep: true},
		toShed:       refreshHeap{less: byShown},
		toShedLate:   refreshHeap{less: byShown},
	}
}

// track makes w refresh the validity of h's grant, which status now shows
// valid until shown; ttl is the lock's. It tells the Session what is shown.
func (w *statusWriter) track(h *Grant, shown time.Time, ttl time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.trackLocked(h, shown, ttl)
}

// trackLocked is track for callers that hold w.mu.
func (w *statusWriter) trackLocked(h *Grant, shown time.Time, ttl time.Duration) {
	e := w.entries[h.UID]
	if e != nil && e.h != h {
		w.remove(e)
		e = nil
	}
	fresh := e == nil
	if fresh {
		e = &refresh{h: h, index: -1, keepIndex: -1}
		w.entries[h.UID] = e
		w.notWaiting(h.Name)
		w.setDemand(w.demand + w.sched.perSecond(ttl))
		w.countTTL(0, ttl)
	} else if e.ttl != ttl {
		w.setDemand(w.demand - w.sched.perSecond(e.ttl) + w.sched.perSecond(ttl))
		w.countTTL(e.ttl, ttl)
	}
	e.ttl = ttl
	moved := fresh || shown.After(h.shown)
	if moved {
		h.setShown(shown)
		e.shownText = ""
	}
	if e.where == inFlight || (!fresh && !moved) {
		return // its schedule stands
	}
	due := w.sched.due(e.h.shown, e.ttl)
	if at, ok := w.refused[h.ID]; ok {
		// A refresh of this grant was refused a moment ago: the reconcile
		// that re-tracks it may still work from a stale cache.
		if retry := at.Add(refusedBackoff); retry.After(due) {
			w.backOff(e, earlier(retry, e.h.shown.Add(-w.sched.lead(e.ttl)/2)))
			return
		}
	}
	w.schedule(e, due)
}

// writeAdopted tracks h's grant, adopted while status shows it valid until
// shown, and readies its first refresh at once (sent nearest shown validity
// first, within the budget). Until a write of this manager's changes the
// lock's status, a write another manager decided on the same status (a
// deposed leader woken from a pause, hiding the grant) would still commit:
// the refresh fences it off, as the adoption's own write did when adoptions
// wrote status.
func (w *statusWriter) writeAdopted(h *Grant, shown time.Time, ttl time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.trackLocked(h, shown, ttl) // and marked adopted before a refresh can land
	if e := w.entries[h.UID]; e != nil && e.h == h {
		if !e.adopted {
			e.adopted = true
			if w.adopting == 0 {
				w.adoptSince = time.Now()
			}
			w.adopting++
		}
		if e.where != inFlight && e.where != ready {
			w.place(e, ready)
		}
	}
}

// refusedBackoff is how long after a refused refresh the lock's grant is
// refreshed again.
const refusedBackoff = time.Second

// renewed is called after each renewal of h's grant: a renewal fresh
// enough for the next refresh makes it due now (unless it backs off).
func (w *statusWriter) renewed(h *Grant) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entries[h.UID]
	if e == nil || e.h != h || (e.where != parked && e.where != waiting) {
		return
	}
	if e.where == parked {
		w.place(e, ready)
		return
	}
	at := h.Session.State().RenewedAt
	if !time.Now().Before(e.notBefore) && !at.Before(e.askedAt) && w.sched.fresh(e.h.shown, e.ttl, at) {
		w.place(e, ready)
	}
}

// readReports reads the Sessions' reports until ctx ends.
func (w *statusWriter) readReports(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.reports.Ready():
		}
		for _, s := range w.reports.Take() {
			h := w.sessions.ofSession(s)
			switch {
			case h == nil: // released or replaced meanwhile
			case errors.Is(s.Err(), renewal.ErrLost):
				w.reconcile(h.Name)
			case s.Err() == nil:
				w.renewed(h)
			}
		}
	}
}

// behind reports whether refreshes that are due wait to be sent at now:
// more than the writer can have in flight, or one whose shown validity
// passes within half its lead. Only kept grants' refreshes are ready (those
// chosen to shed wait apart, shed.go). New grants wait meanwhile (admit).
// Callers hold w.mu.
func (w *statusWriter) behind(now time.Time) bool {
	if w.ready.Len() > w.parallel() {
		return true
	}
	if w.ready.Len() == 0 {
		return false
	}
	e := w.ready.items[0]
	return e.h.shown.Sub(now) < w.sched.lead(e.ttl)/2
}

// forget stops refreshing h's grant.
func (w *statusWriter) forget(h *Grant) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e := w.entries[h.UID]; e != nil && e.h == h {
		w.remove(e)
	}
}

// run sends refreshes as they fall due until ctx ends, then hands over
// (handOver).
func (w *statusWriter) run(ctx context.Context) {
	w.mu.Lock()
	w.followGate()
	w.mu.Unlock()
	defer w.gate.Follow(0, false) // after the handover: a standby holds nothing back
	var wg sync.WaitGroup
	wg.Go(func() { w.readReports(ctx) })
	wg.Go(func() { w.scheduleLoop(ctx) })
	wg.Go(func() { w.loadLoop(ctx) })
	wg.Go(func() { w.publishLoop(ctx, w.publishTo, w.manager) })
	w.send(ctx, &wg)
	wg.Wait()
	w.handOver(logf.FromContext(ctx))
}

// handoverTimeout bounds the refreshes of a stopping leader, within the
// manager's graceful shutdown timeout (30s).
const handoverTimeout = 15 * time.Second

// handOver runs when the manager stops: it refreshes every held lock not
// chosen to shed whose shown validity passes within the failover slack,
// nearest first, with a renewal asked for then (the Sessions renew until
// the handover is done: sessions.last). The manager still leads (it
// releases its Lease once its runnables have stopped), and the next
// leader takes the released Lease within a few retry periods and adopts:
// a lock whose lead is a tenth of its ttl would otherwise lapse meanwhile
// (a rollout of the operator).
func (w *statusWriter) handOver(log logr.Logger) {
	if w.sched.failover <= 0 {
		return // no standby to hand over to
	}
	ctx, cancel := context.WithTimeout(context.Background(), handoverTimeout)
	defer cancel()
	w.mu.Lock()
	var due []*refresh
	limit := time.Now().Add(w.sched.failover)
	for _, e := range w.entries {
		// A grant chosen to shed is not refreshed again (shed.go), here
		// neither: its validity may have passed already. The next leader
		// adopts it while that lasts, or ends it (ValidityExpired).
		if e.where != inFlight && !w.chosen(e) && e.h.shown.Before(limit) {
			w.place(e, inFlight)
			due = append(due, e)
		}
	}
	slices.SortFunc(due, func(a, b *refresh) int { return a.h.shown.Compare(b.h.shown) })
	parallel := w.parallel()
	w.mu.Unlock()
	start := time.Now()
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for _, e := range due {
		if w.budget.Wait(ctx) != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			awaitRenewal(ctx, e.h.Session, renewNowTimeout)
			w.write(ctx, e)
		})
	}
	wg.Wait()
	log.Info("refreshed the held locks' validity before handing over", "locks", len(due), "took", time.Since(start), "error", ctx.Err())
}

// settleAdoption stops counting e among the adopted grants waiting for
// their first refresh, and reports whether it was one. Callers hold w.mu.
func (w *statusWriter) settleAdoption(e *refresh) bool {
	if !e.adopted {
		return false
	}
	e.adopted = false
	w.adopting--
	return true
}
