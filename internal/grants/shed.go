package grants

import (
	"container/heap"
	"context"
	"time"
)

// Shedding in turn. Each grant shed costs a write (status showing it Shed,
// made by its lock's reconcile) through the same API server whose writes
// ran short. Asked for all at once (a drop of capacity sheds most of the
// grants held), those writes took the room the grants kept needed, and the
// kept ones lapsed too; and a grant refreshed until its Shed showed cost a
// write for nothing. So a grant chosen to shed is not refreshed again
// (doomed): the writer asks for its lock's reconcile, which shows it Shed,
// nearest shown validity first of those whose validity has not passed
// (those past it last: passShed), at most a quarter as many at once as
// refreshes in flight and at least two (shedParallel), each counted until the grant is
// forgotten; after the refreshes while those are behind (keep.go), and
// one at a time while more refreshes are due than there is room for in
// flight (canSend).
// The reasoning: docs/design/overload.md#a-drop-of-capacity.

// shedParallel is how many grants chosen to shed may wait at once for the
// reconcile that shows them Shed, when parallel refreshes may be in flight.
func shedParallel(parallel int) int { return max(2, parallel/4) }

// chosen reports whether e's grant is chosen to shed. Callers hold w.mu.
func (w *statusWriter) chosen(e *refresh) bool {
	if w.entries[e.h.UID] != e {
		return false
	}
	_, ok := w.shed[e.h.UID]
	return ok
}

// keptDemand is the refreshes per second the grants not chosen to shed
// need: those chosen are not refreshed again. Callers hold w.mu.
func (w *statusWriter) keptDemand() float64 {
	d := w.demand
	for uid := range w.shed {
		if e := w.entries[uid]; e != nil {
			d -= w.sched.perSecond(e.ttl)
		}
	}
	return max(d, 0)
}

// passShed moves the grants chosen to shed whose shown validity passes
// before a write sent now could commit (the base round trip) behind the
// others: shown Shed late whatever their turn, they give the writes to
// those that can still be shown Shed in time. Nearest validity first, a
// drop's first Shed writes went to grants already late. Callers hold
// w.mu.
func (w *statusWriter) passShed(now time.Time) {
	cut := now.Add(w.baseRTT())
	for w.toShed.Len() > 0 && w.chosen(w.toShed.items[0]) && w.toShed.items[0].h.shown.Before(cut) {
		w.place(w.toShed.items[0], doomedLate)
	}
}

// refreshFirst reports whether the refresh next gives goes before the
// grant chosen to shed nearest its shown validity: while refreshes are
// behind (keep order), or when it is nearer its own. A grant that is late
// already (passShed) goes only when no other is being shown Shed and
// refreshes are not behind: one at a time, so that it is shown at last
// even while refreshes are always ready. Callers hold w.mu; a refresh and
// a grant chosen to shed are there.
func (w *statusWriter) refreshFirst(now time.Time) bool {
	e := w.next(now)
	if w.toShed.Len() == 0 {
		return w.shedSending > 0 || e != w.ready.items[0]
	}
	return e != w.ready.items[0] || !w.toShed.items[0].h.shown.Before(e.h.shown)
}

// shedTurn takes the grant chosen to shed whose turn came (nearest its
// shown validity of those in time, else of those late: passShed), and
// returns it with a channel closed when the writer forgets it; shedding
// reports it from now on. Callers hold w.mu; one is there.
func (w *statusWriter) shedTurn() (*refresh, chan struct{}) {
	h := &w.toShed
	if h.Len() == 0 {
		h = &w.toShedLate
	}
	e := h.items[0]
	heap.Pop(h)
	e.where, e.index = inFlight, -1
	w.shedSending++
	gone, ok := w.shedAsked[e.h.UID]
	if !ok {
		gone = make(chan struct{})
		w.shedAsked[e.h.UID] = gone
	}
	return e, gone
}

// shedWrite asks for the reconcile of e's lock, which shows its grant
// Shed, and waits until the writer forgets the grant (the reconcile
// dropped it) or writeTimeout passes; then, if it is still held, its turn
// comes again.
func (w *statusWriter) shedWrite(ctx context.Context, e *refresh, gone chan struct{}) {
	if w.reconcile != nil {
		w.reconcile(e.h.Name)
	}
	t := time.NewTimer(writeTimeout)
	defer t.Stop()
	select {
	case <-gone:
		return // its Shed committed (counted by Set.ShedShown)
	case <-ctx.Done():
	case <-t.C:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.entries[e.h.UID] == e && e.where == inFlight {
		w.place(e, doomed)
	}
}

// shedSent counts a grant's shedWrite done, and wakes send.
func (w *statusWriter) shedSent() {
	w.mu.Lock()
	w.shedSending--
	w.mu.Unlock()
	kick(w.kickSend)
}

// spareShed spares the grants chosen to shed whose turn has not come: the
// overload ended first. They are refreshed again, but for those whose
// shown validity is within half their lead: not refreshed since they
// were chosen, they would land tight or late, and a reader that saw the
// validity pass must not see the same grant held again. Callers hold w.mu.
func (w *statusWriter) spareShed(now time.Time) {
	for uid := range w.shed {
		if _, asked := w.shedAsked[uid]; asked {
			continue
		}
		e := w.entries[uid]
		if e != nil && e.h.shown.Sub(now) < w.sched.lead(e.ttl)/2 {
			continue
		}
		delete(w.shed, uid)
		if e != nil && (e.where == doomed || e.where == doomedLate) {
			w.schedule(e, w.sched.due(e.h.shown, e.ttl))
		}
	}
}

// shedding reports why h's grant is to be shed, if it is and its turn
// came.
func (w *statusWriter) shedding(h *Grant) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e := w.entries[h.UID]; e == nil || e.h != h {
		return "", false
	}
	why, ok := w.shed[h.UID]
	_, asked := w.shedAsked[h.UID]
	return why, ok && asked
}
