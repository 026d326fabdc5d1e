package grants

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
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
	rtt      rttWindow
	leasts   []time.Duration // the least round trip of each of the last baseWindows windows (inflight.go)
	waiting  refreshHeap     // by due time
	ready    refreshHeap     // due: by shown validity
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
	// lead is the lead its due time was scheduled with (zero: none yet):
	// a refresh lands tight against the lead it was sent with, not one the
	// lead floor raised after.
	lead time.Duration
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
	defer w.gate.Follow(0) // after the handover: a standby holds nothing back
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

// scheduleLoop readies waiting refreshes as they wake and asks Sessions
// for the renewals refreshes will show, on a timer of its own: a sender
// blocked on the budget or on writes in flight delays no ask.
func (w *statusWriter) scheduleLoop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		w.mu.Lock()
		now := time.Now()
		asks := w.wakeUp(now)
		asks = append(asks, w.askForLate(now)...)
		next := time.Hour
		if w.waiting.Len() > 0 {
			next = w.waiting.items[0].wake.Sub(now)
		}
		w.mu.Unlock()
		for _, h := range asks {
			h.Session.RenewSoon()
		}
		timer.Reset(max(next, 0))
		select {
		case <-ctx.Done():
			return
		case <-w.kickSchedule:
		case <-timer.C:
		}
	}
}

// askForLate asks for a renewal for the first ready refreshes that are
// late: a refresh sent late shows a renewal made when it is sent, which
// also moves its next refresh away from those it was late with. Each waits
// until its renewal is reported (renewed) or for renewNowTimeout — a few
// at a time, at about the pace they are sent, and not when the shown
// validity would pass meanwhile. Callers hold w.mu.
func (w *statusWriter) askForLate(now time.Time) (ask []*Grant) {
	for w.ready.Len() > 0 && w.poking < w.parallel() {
		e := w.ready.items[0]
		if !e.askedAt.IsZero() || e.h.shown.Sub(now) < 2*renewNowTimeout ||
			!e.h.Session.State().RenewedAt.Before(now.Add(-2*RenewLead(e.ttl))) {
			break
		}
		w.awaitRenewal(e, now.Add(renewNowTimeout))
		e.poking, e.askedAt = true, now
		w.poking++
		w.backlogChanged()
		ask = append(ask, e.h)
	}
	return ask
}

// send writes ready refreshes in the order next gives (nearest shown
// validity first, or the oldest grant first while that one lands tight),
// and shows the grants chosen to shed Shed in their turn (shed.go), within
// the budget and at most w.parallel() refreshes at a time, until ctx ends.
func (w *statusWriter) send(ctx context.Context, wg *sync.WaitGroup) {
	for {
		w.mu.Lock()
		refresh, shed := w.canSend()
		w.mu.Unlock()
		if !refresh && !shed {
			// A refresh made ready, or a write done, kicks.
			select {
			case <-ctx.Done():
				return
			case <-w.kickSend:
			}
			continue
		}
		waited := time.Now()
		if err := w.budget.Wait(ctx); err != nil {
			return // the manager is stopping
		}
		w.mu.Lock()
		w.win.limited += time.Since(waited)
		e, gone := w.pick(time.Now())
		w.mu.Unlock()
		switch {
		case e == nil:
		case gone != nil:
			wg.Go(func() {
				defer w.shedSent()
				w.shedWrite(ctx, e, gone)
			})
		default:
			wg.Go(func() {
				defer w.sent()
				w.write(ctx, e)
			})
		}
	}
}

// canSend reports whether a refresh, and a grant chosen to shed, may be
// sent now. Callers hold w.mu.
func (w *statusWriter) canSend() (refresh, shed bool) {
	return w.ready.Len() > 0 && w.sending < w.parallel(), w.toShed.Len()+w.toShedLate.Len() > 0 && w.shedSending < shedParallel(w.parallel())
}

// pick takes what send sends next: a refresh, or a grant chosen to shed
// (with the channel closed when it is forgotten), nearest shown validity
// first, but refreshes first while they are behind (keep.go), and grants
// chosen to shed whose shown validity passed last (shed.go). Callers hold
// w.mu.
func (w *statusWriter) pick(now time.Time) (*refresh, chan struct{}) {
	w.passShed(now)
	refresh, shed := w.canSend()
	if refresh && (!shed || w.refreshFirst(now)) {
		e := w.next(now)
		w.place(e, inFlight)
		w.donePoking(e)
		w.sendingChanged(1)
		return e, nil
	}
	if shed {
		return w.shedTurn()
	}
	return nil, nil
}

// sent counts a write of send's done, and wakes send.
func (w *statusWriter) sent() {
	w.mu.Lock()
	w.sendingChanged(-1)
	w.mu.Unlock()
	kick(w.kickSend)
}

// wakeUp acts on the waiting refreshes whose wake time has come by now:
// one that is due, or whose grant was renewed fresh enough to show, is
// ready to send; one renewLead before its due time asks for the renewal it
// will show (returned, for RenewSoon) and waits until due, or until the
// Session reports that renewal (renewed). Callers hold w.mu.
func (w *statusWriter) wakeUp(now time.Time) (ask []*Grant) {
	for w.waiting.Len() > 0 && !w.waiting.items[0].wake.After(now) {
		e := w.waiting.items[0]
		if !now.Before(e.due) || w.sched.fresh(e.h.shown, e.ttl, e.h.Session.State().RenewedAt) {
			w.place(e, ready)
			continue
		}
		e.wake = e.due
		heap.Fix(&w.waiting, e.index)
		ask = append(ask, e.h)
	}
	return ask
}

// write sends one refresh and schedules the next.
func (w *statusWriter) write(ctx context.Context, e *refresh) {
	h := e.h
	w.mu.Lock()
	shown, shownText := e.h.shown, e.shownText
	w.mu.Unlock()
	st := h.Session.State()
	switch {
	case w.sessions.get(h.UID) != h || st.ValidUntil.IsZero():
		w.forget(h) // released, lost or replaced: the reconcile shows that
		return
	case !st.ValidUntil.After(shown):
		// Nothing newer: after the next renewal (or at once, if one
		// landed since the state was read: renewed skipped it in flight).
		w.mu.Lock()
		if w.entries[h.UID] == e {
			if h.Session.State().Renewals > st.Renewals {
				w.place(e, ready)
			} else {
				w.schedule(e, time.Time{})
			}
		}
		w.mu.Unlock()
		return
	}
	patch, err := RefreshPatch(h, st, shown, shownText)
	if err != nil {
		logf.FromContext(ctx).Error(err, "build a validity refresh", "lock", h.Name)
		w.forget(h)
		return
	}
	// Renewals keep the keys at least until the validity shown: raise the
	// floor before the write may commit.
	h.raiseFloor(st.ValidUntil)
	obj := LockRef(h.Name, "")
	octx, cancel := context.WithTimeout(ctx, writeTimeout)
	start := time.Now()
	err = w.client.Status().Patch(octx, obj, client.RawPatch(types.JSONPatchType, patch))
	cancel()
	now := time.Now()
	if err == nil || apierrors.IsInvalid(err) || apierrors.IsNotFound(err) {
		// Answered by the API server's own work, not a timeout or a
		// throttle (whose retries the client hides in the round trip).
		w.observeRTT(now.Sub(start))
	}
	switch {
	case err == nil:
	case apierrors.IsInvalid(err) && w.relearn(ctx, e, shown):
		// Status shows the grant with another validity than this writer
		// last saw (its own write that timed out yet committed, or a
		// deposed leader's late one): sent again on the validity shown.
		return
	case apierrors.IsInvalid(err) || apierrors.IsNotFound(err):
		// A test failed: status no longer shows this grant (released,
		// lost, replaced) or the object is gone. The reconcile sees to
		// the grant.
		w.refuse(h, now)
		return
	default:
		w.failed(ctx, e, err, now)
		return
	}
	w.landed(e, st, shown, now)
}

// landed records a refresh of e that committed at now, showing st's
// validity in place of shown, and schedules the next.
func (w *statusWriter) landed(e *refresh, st renewal.State, shown, now time.Time) {
	h := e.h
	h.Committed(st.ValidUntil)
	w.written.add(h.Name, h.UID)
	w.metrics.StatusWrites.WithLabelValues("renewal").Inc()
	slack := shown.Sub(now)
	if slack >= 0 {
		w.metrics.StatusWriteSlack.Observe(slack.Seconds())
	} else {
		w.metrics.StatusWriteLapse.Observe(-slack.Seconds())
	}
	w.mu.Lock()
	w.count(e, slack)
	delete(w.refused, h.ID)
	e.fails, e.askedAt, e.shownText = 0, time.Time{}, ""
	report := slack < 0 && !e.lapsed
	e.lapsed = slack < 0
	if st.ValidUntil.After(h.shown) {
		h.setShown(st.ValidUntil)
	}
	if w.entries[h.UID] == e {
		w.schedule(e, w.sched.due(e.h.shown, e.ttl))
	}
	demand, budget := w.demand, float64(w.budget.Limit())
	w.mu.Unlock()
	if slack < 0 {
		w.metrics.StatusWritesLate.Inc()
	}
	if report {
		w.recorder.Eventf(LockRef(h.Name, h.UID), nil, corev1.EventTypeWarning, EventStatusWriteLate, "Renew",
			"status showed a validity until %s that passed %v before its refresh was written, though the masters held the grant: status writes are behind (budget %.0f/s; the locks held need %.0f/s)",
			shown.UTC().Format(time.RFC3339Nano), (-slack).Round(time.Millisecond), budget, demand)
	}
}

// failed sees to a refresh of e that failed without an answer on the
// grant (a timeout, an overloaded or unreachable API server): retried with
// a backoff, or left to handOver when the manager stops.
func (w *statusWriter) failed(ctx context.Context, e *refresh, err error, now time.Time) {
	h := e.h
	if ctx.Err() != nil {
		// The manager stops: handOver sends it again (if it has not
		// committed, the validity shown is still this one).
		w.mu.Lock()
		if w.entries[h.UID] == e && e.where == inFlight {
			w.place(e, ready)
		}
		w.mu.Unlock()
		return
	}
	logf.FromContext(ctx).Error(err, "refresh a held lock's validity", "lock", h.Name, "token", h.Token)
	w.mu.Lock()
	e.fails++
	if congestion(err) {
		w.rtt.congested++ // the limit in flight halves when enough do
	}
	// Back off, but not past half the time the shown validity has
	// left: the rate limiter bounds the total.
	backoff := min(retryBase<<min(e.fails-1, 10), retryMax, max(retryBase, e.h.shown.Sub(now)/2))
	w.mu.Unlock()
	w.reschedule(e, now.Add(backoff)) // then in deadline order again
}

// count adds a refresh of e that committed with slack left to the load
// window. Callers hold w.mu.
func (w *statusWriter) count(e *refresh, slack time.Duration) {
	w.win.written++
	// An adopted grant's first refresh is written whatever validity it
	// inherited: it says nothing of this writer's pace.
	if w.settleAdoption(e) {
		return
	}
	w.win.slacks = append(w.win.slacks, slack)
	lead := e.lead
	if lead <= 0 {
		lead = w.sched.lead(e.ttl)
	}
	if slack < lead/2 {
		w.win.tight++
		if slack < 0 {
			w.win.late++
		}
	}
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

// refuse stops refreshing h's grant, which status no longer shows, and
// asks for a reconcile of its lock; the grant's refreshes are held back
// for refusedBackoff.
func (w *statusWriter) refuse(h *Grant, now time.Time) {
	w.mu.Lock()
	if len(w.refused) > 256 && now.Sub(w.pruned) > refusedBackoff {
		w.pruned = now
		for id, at := range w.refused {
			if now.Sub(at) > refusedBackoff {
				delete(w.refused, id)
			}
		}
	}
	w.refused[h.ID] = now
	w.mu.Unlock()
	w.forget(h)
	w.reconcile(h.Name)
}

// relearn reads the lock after a refresh of e, made while status showed
// validity shown, was refused. When status still shows e's grant, with
// another validity, e takes that validity as the one its next refresh
// replaces, is due again, and relearn reports true. A refresh never
// moves the validity back: the next one is sent only with a later one.
func (w *statusWriter) relearn(ctx context.Context, e *refresh, shown time.Time) bool {
	h := e.h
	fresh := &v1alpha1.DistributedLock{}
	octx, cancel := context.WithTimeout(ctx, writeTimeout)
	err := w.client.Get(octx, h.Name, fresh)
	cancel()
	st := fresh.Status
	if err != nil || fresh.UID != h.UID || st.Holder == nil || !h.ShowsIn(st) || st.ValidUntil == nil {
		return false
	}
	if st.ValidUntil.Equal(shown.Truncate(time.Microsecond)) {
		// The same instant in another form than this writer's (an earlier
		// version wrote whole seconds): test the text status holds.
		return w.retestAs(ctx, e, shown)
	}
	logf.FromContext(ctx).Info("validity changed under the status writer", "lock", h.Name, "token", h.Token,
		"expected", shown.UTC().Format(time.RFC3339Nano), "shown", st.ValidUntil.UTC().Format(time.RFC3339Nano))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.entries[h.UID] != e {
		h.raiseFloor(st.ValidUntil.Time)
		return true // forgotten meanwhile
	}
	h.setShown(st.ValidUntil.Time)
	if h.Session.State().ValidUntil.After(h.shown) {
		w.place(e, ready)
	} else {
		w.schedule(e, time.Time{}) // after the next renewal
	}
	return true
}

// retestAs reads the text of the validity status shows for e's grant and,
// when it is not the form this writer would test (shown), makes e's next
// refresh test that text; it reports whether it did.
func (w *statusWriter) retestAs(ctx context.Context, e *refresh, shown time.Time) bool {
	raw := &unstructured.Unstructured{}
	raw.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("DistributedLock"))
	octx, cancel := context.WithTimeout(ctx, writeTimeout)
	err := w.client.Get(octx, e.h.Name, raw)
	cancel()
	text, _, _ := unstructured.NestedString(raw.Object, "status", "validUntil")
	if err != nil || text == "" || text == v1alpha1.NewPreciseTime(shown).UTC().Format(metav1.RFC3339Micro) {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.entries[e.h.UID] == e && e.h.shown.Equal(shown) {
		e.shownText = text
		w.place(e, ready)
	}
	return true
}

// Retries of a refresh that failed without an answer (a timeout, an
// overloaded API server) back off from retryBase to retryMax.
const (
	retryBase = 100 * time.Millisecond
	retryMax  = 5 * time.Second
)

// awaitRenewal asks s for a renewal and waits until it is made, for up to
// timeout.
func awaitRenewal(ctx context.Context, s *renewal.Session, timeout time.Duration) {
	before := s.State().Renewals
	s.RenewSoon()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(timeout)
	for s.State().Renewals == before {
		select {
		case <-ctx.Done():
			return
		case <-deadline:
			return
		case <-tick.C:
		}
	}
}

// renewNowTimeout bounds the wait for a renewal made for a late refresh;
// past it, the latest renewal is shown.
const renewNowTimeout = 250 * time.Millisecond

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// RefreshPatch is the JSON patch that shows st's validity for h's grant,
// on the condition that status still shows that grant, with the validity
// shown that it replaces: a writer with a stale view (a deposed leader
// woken from a pause) cannot move it, backwards or forwards.
func RefreshPatch(h *Grant, st renewal.State, shown time.Time, shownText string) ([]byte, error) {
	var prev any = v1alpha1.NewPreciseTime(shown)
	if shownText != "" {
		prev = shownText
	}
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	ops := []op{
		{"test", "/metadata/uid", h.UID},
		{"test", "/status/grantID", h.ID},
		{"test", "/status/fencingToken", h.Token},
		{"test", "/status/holder/identity", h.Holder},
		{"test", "/status/validUntil", prev},
		{"add", "/status/renewedAt", v1alpha1.NewPreciseTime(st.RenewedAt)},
		{"add", "/status/validUntil", v1alpha1.NewPreciseTime(st.ValidUntil)},
	}
	if q := QuorumOf(h.Quorum, st.Votes); q != nil {
		ops = append(ops, op{"add", "/status/quorum", q})
	}
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("refresh %s: %w", h.Name, err)
	}
	return b, nil
}

// refreshSchedule says when a refresh is due: a lead before the validity
// status shows passes. The renewal it shows is asked for renewLead before
// that; a renewal made within two renewLeads of the due time is fresh
// enough to send at once. The lead is the failover slack when the ttl is
// at least twice that, and statusLead otherwise; it is never less than the
// lead floor. The reasoning: docs/design/status-writer.md#the-refresh-schedule.
type refreshSchedule struct {
	// failover is how long after the leader's last Lease renewal a standby
	// may take to lead and adopt (0: nothing to cover).
	failover time.Duration
	// floor is the least lead the API server's round trips call for
	// (nextLeadFloor), applied up to a quarter of each ttl (0: none).
	floor time.Duration
}

// The lead floor. Once refreshes land tight (loadWindow.landsTight), the
// lead grows to roundTripLeads mean round trips of the window and to at
// least twice its round trip at tailQuantile, up to a quarter of each ttl;
// waiting refreshes are brought forward to the new leads. It grows only
// from minFloorSample round trips, and not on a new leader's adoption. It
// falls by at most leadFloorDecay per window; a window with no answered
// write keeps it. The reasoning: docs/design/status-writer.md#the-lead-floor.
const (
	roundTripLeads = 3
	tailQuantile   = 0.9
	leadFloorDecay = 0.1
	// minFloorSample is the fewest round trips a raise is measured from:
	// below ten, the 90th percentile is the slowest one.
	minFloorSample = 10
)

// nextLeadFloor is the lead floor after window w, from prev; tight tells
// whether the window's refreshes landed tight (loadWindow.landsTight).
func nextLeadFloor(prev time.Duration, w rttWindow, tight bool) time.Duration {
	if len(w.rtts) == 0 {
		return prev
	}
	rtts := slices.Sorted(slices.Values(w.rtts))
	measured := max(roundTripLeads*w.mean(), 2*rtts[int(math.Ceil(tailQuantile*float64(len(rtts))))-1])
	if measured > prev {
		if tight && len(rtts) >= minFloorSample {
			return measured
		}
		return prev
	}
	return max(measured, prev-time.Duration(leadFloorDecay*float64(prev)))
}

// lead is how long before the shown validity passes a refresh is due: the
// failover slack or statusLead as above, and at least the measured floor
// (nextLeadFloor), up to a quarter of the ttl.
func (p refreshSchedule) lead(ttl time.Duration) time.Duration {
	lead := StatusLead(ttl)
	if p.failover > 0 && ttl >= 2*p.failover {
		lead = max(p.failover, lead)
	}
	return max(lead, min(p.floor, ttl/4))
}

// due is when status showing validity shown must be refreshed (zero when
// nothing is shown).
func (p refreshSchedule) due(shown time.Time, ttl time.Duration) time.Time {
	if shown.IsZero() {
		return time.Time{}
	}
	return shown.Add(-p.lead(ttl))
}

// fresh reports whether a renewal made at renewedAt is the one to write for
// validity shown: it was made within two renewLeads of the due time.
func (p refreshSchedule) fresh(shown time.Time, ttl time.Duration, renewedAt time.Time) bool {
	due := p.due(shown, ttl)
	return !due.IsZero() && !renewedAt.Before(due.Add(-2*RenewLead(ttl)))
}

// writesPerTTL is how many status writes per ttl a held grant needs in
// steady state: a write shows the validity of a renewal made renewLead
// before it was due, and is due a lead before that validity passes.
func (p refreshSchedule) writesPerTTL(ttl time.Duration) float64 {
	cycle := ttl - redlock.Drift(ttl) - p.lead(ttl) - RenewLead(ttl)
	return float64(ttl) / float64(cycle)
}

// perSecond is writesPerTTL per second.
func (p refreshSchedule) perSecond(ttl time.Duration) float64 {
	return p.writesPerTTL(ttl) / ttl.Seconds()
}

// WritesPerTTL is how many status writes per ttl a held grant needs in
// steady state, with no failover slack.
func WritesPerTTL(ttl time.Duration) float64 { return refreshSchedule{}.writesPerTTL(ttl) }

// StatusLead is the least lead of a refresh: the time a status write has to
// land. A tenth of the ttl, and at least min(ttl/4, 500ms).
func StatusLead(ttl time.Duration) time.Duration {
	return max(ttl/10, min(ttl/4, 500*time.Millisecond))
}

// RenewLead is how long before a refresh is due the renewal it shows is
// asked for: a fiftieth of the ttl in [20ms, 1s], room for one renewal
// round.
func RenewLead(ttl time.Duration) time.Duration {
	return min(max(ttl/50, 20*time.Millisecond), time.Second)
}

// reschedule retries e at due after a failed write, unless it was
// forgotten meanwhile.
func (w *statusWriter) reschedule(e *refresh, due time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.entries[e.h.UID] == e {
		w.backOff(e, due)
	}
}

// schedule puts e in the waiting heap, to be sent at due (parked when due
// is zero, until the next renewal); it wakes renewLead before due to ask
// for the renewal the refresh will show, and a renewal fresh enough to
// show makes it ready at once. Callers hold w.mu.
func (w *statusWriter) schedule(e *refresh, due time.Time) {
	if !due.IsZero() {
		e.lead = e.h.shown.Sub(due)
	}
	w.wait(e, due, due.Add(-RenewLead(e.ttl)), time.Time{})
}

// backOff puts e in the waiting heap to be sent at due and not before,
// whatever renewals come meanwhile: a retry after a failed or refused
// write. Callers hold w.mu.
func (w *statusWriter) backOff(e *refresh, due time.Time) {
	w.wait(e, due, due, due)
}

// awaitRenewal puts e, which asked for a renewal, in the waiting heap
// until the renewal is reported (renewed) or due. Callers hold w.mu.
func (w *statusWriter) awaitRenewal(e *refresh, due time.Time) {
	w.wait(e, due, due, time.Time{})
}

// wait places e to wake at wake, be sent at due (parked when zero), and
// not readied by a renewal before notBefore. A renewal it asked for is no
// longer waited for. Callers hold w.mu.
func (w *statusWriter) wait(e *refresh, due, wake, notBefore time.Time) {
	e.due, e.wake, e.notBefore = due, wake, notBefore
	w.donePoking(e)
	e.askedAt = time.Time{}
	if due.IsZero() {
		w.place(e, parked)
		return
	}
	w.place(e, waiting)
}

// place moves e to p. Callers hold w.mu.
func (w *statusWriter) place(e *refresh, p place) {
	if p != inFlight && p != doomedLate && w.chosen(e) {
		p = doomed // not refreshed again: shown Shed in its turn
	}
	switch e.where {
	case waiting:
		heap.Remove(&w.waiting, e.index)
	case ready:
		heap.Remove(&w.ready, e.index)
		heap.Remove(&w.readyKeep, e.keepIndex)
	case doomed:
		heap.Remove(&w.toShed, e.index)
	case doomedLate:
		heap.Remove(&w.toShedLate, e.index)
	}
	e.where, e.index, e.keepIndex = p, -1, -1
	if p == doomed || p == doomedLate {
		w.donePoking(e) // not refreshed again: it waits for no renewal
	}
	switch p {
	case waiting:
		heap.Push(&w.waiting, e)
	case ready:
		heap.Push(&w.ready, e)
		heap.Push(&w.readyKeep, e)
	case doomed:
		heap.Push(&w.toShed, e)
	case doomedLate:
		heap.Push(&w.toShedLate, e)
	}
	w.backlogChanged()
	kick(w.kickSchedule)
	if p == ready || p == doomed || p == doomedLate {
		kick(w.kickSend)
	}
}

// kick signals c without blocking.
func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// donePoking stops counting e among the refreshes waiting for their
// renewal. Callers hold w.mu.
func (w *statusWriter) donePoking(e *refresh) {
	if e.poking {
		e.poking = false
		w.poking--
		w.backlogChanged()
		kick(w.kickSchedule) // room to ask for another late refresh's renewal
	}
}

// sendingChanged adds d to the refreshes in flight, and counts the time
// any was in flight (loadWindow.busy). Callers hold w.mu.
func (w *statusWriter) sendingChanged(d int) {
	w.sending += d
	switch {
	case w.sending > 0 && w.busySince.IsZero():
		w.busySince = time.Now()
	case w.sending == 0 && !w.busySince.IsZero():
		w.win.busy += time.Since(w.busySince)
		w.busySince = time.Time{}
	}
}

// backlogChanged sets the backlog gauge: refreshes due, including late
// ones waiting for the renewal they asked for. Callers hold w.mu.
func (w *statusWriter) backlogChanged() {
	n := w.ready.Len() + w.poking
	w.metrics.StatusWriteBacklog.Set(float64(n))
	switch {
	case n > 0 && w.backlogSince.IsZero():
		w.backlogSince = time.Now()
	case n == 0 && !w.backlogSince.IsZero():
		w.win.backlogged += time.Since(w.backlogSince)
		w.backlogSince = time.Time{}
	}
}

// remove forgets e. Callers hold w.mu.
func (w *statusWriter) remove(e *refresh) {
	w.donePoking(e)
	current := w.entries[e.h.UID] == e
	if current {
		delete(w.shed, e.h.UID)
		if gone, ok := w.shedAsked[e.h.UID]; ok {
			close(gone)
			delete(w.shedAsked, e.h.UID)
		}
	}
	w.place(e, parked)
	if current {
		delete(w.entries, e.h.UID)
		w.setDemand(w.demand - w.sched.perSecond(e.ttl))
		w.countTTL(e.ttl, 0)
		w.settleAdoption(e)
		w.roomMade()
	}
}

// setDemand records the writes per second the tracked grants need, and
// logs when it crosses the budget. Callers hold w.mu.
func (w *statusWriter) setDemand(d float64) {
	w.demand = max(d, 0)
	w.metrics.StatusWriteDemand.Set(w.demand)
	budget := float64(w.budget.Limit())
	if over := w.demand > budget; over != w.over {
		w.over = over
		logf.Log.WithName("status-writer").Info("status write demand crossed the budget",
			"demandPerSecond", w.demand, "budgetPerSecond", budget, "over", over, "locks", len(w.entries))
	}
}

// refreshHeap is a heap of refreshes ordered by less. A refresh keeps its
// index in it in index, or in keepIndex for the keep order's heap.
type refreshHeap struct {
	items []*refresh
	less  func(a, b *refresh) bool
	keep  bool
}

func (h refreshHeap) Len() int           { return len(h.items) }
func (h refreshHeap) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) }
func (h refreshHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.setIndex(h.items[i], i)
	h.setIndex(h.items[j], j)
}

func (h refreshHeap) setIndex(e *refresh, i int) {
	if h.keep {
		e.keepIndex = i
		return
	}
	e.index = i
}

func (h *refreshHeap) Push(x any) {
	e := x.(*refresh)
	h.setIndex(e, len(h.items))
	h.items = append(h.items, e)
}

func (h *refreshHeap) Pop() any {
	old := h.items
	e := old[len(old)-1]
	old[len(old)-1] = nil
	h.items = old[:len(old)-1]
	h.setIndex(e, -1)
	return e
}
