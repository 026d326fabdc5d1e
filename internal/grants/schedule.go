package grants

import (
	"container/heap"
	"context"
	"math"
	"slices"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

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

// renewNowTimeout bounds the wait for a renewal made for a late refresh;
// past it, the latest renewal is shown.
const renewNowTimeout = 250 * time.Millisecond

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
		due = w.spread(e, due)
	}
	w.wait(e, due, due.Add(-RenewLead(e.ttl)), time.Time{})
}

// spread is when e's refresh, due at due, is scheduled: in the latest slot
// of the calendar before due that has room for it within the target, at
// most maxAdvance earlier and not before now (calendar.go). Callers hold
// w.mu.
func (w *statusWriter) spread(e *refresh, due time.Time) time.Time {
	w.uncount(e) // not counted against itself
	earliest := due.Add(-maxAdvance(e.ttl, e.lead))
	if now := time.Now(); earliest.Before(now) {
		earliest = now
	}
	return w.cal.spread(due, earliest, w.load.target()*slotWidth.Seconds())
}

// uncount stops counting e in the calendar. Callers hold w.mu.
func (w *statusWriter) uncount(e *refresh) {
	if e.counted {
		w.cal.remove(e.slot)
		e.counted = false
	}
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
		w.uncount(e)
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
		e.slot, e.counted = slotOf(e.due), true
		w.cal.add(e.slot)
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
	w.gateFollows()
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
	w.gateFollows()
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

func (h refreshHeap) Len() int { return len(h.items) }

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
