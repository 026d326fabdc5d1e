package distributedlock

import (
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Overload and shedding. The status writer measures, every loadTick, how
// many refreshes committed, how many landed with less than half their lead
// left (or late), and how long refreshes that were due waited unsent. From
// that it estimates the writes per second the API server takes (capacity):
// what it committed in a window in which refreshes waited throughout, at
// most the budget (--status-write-qps), recovering by a tenth per window
// otherwise. The writer is overloaded when the held grants need more than
// that (demand above a saturated capacity, or above the budget), or when
// more than a tenth of its refreshes land tight: deadline-first order then
// makes every lock miss in turn. Overloaded for two windows in a row (at
// once when demand exceeds the budget: that needs no measuring), it sheds
// the youngest grants (the oldest are kept: their holders have the most
// work under way) until demand is shedTarget of capacity: each shed grant is shown Held=False (reason
// Shed) by a reconcile of its lock before its shown validity passes, then
// released in Redis. New grants wait while the demand they add would take
// it above shedTarget of capacity (of the budget, until a saturated window
// measured less): a manager never grants what it cannot keep refreshed.
const (
	loadTick = time.Second
	// saturatedShare of a window with refreshes waiting makes what
	// committed in it the capacity.
	saturatedShare = 0.8
	// tightShare of a window's refreshes landing tight is overload.
	tightShare = 0.1
	// shedTarget is the share of capacity demand is brought down to, and
	// new grants are admitted up to once capacity was measured.
	shedTarget = 0.8
	// shedLeast is the least share of demand shed in an overloaded window.
	shedLeast = 0.05
	// recovery is how much a capacity estimate grows per window in which
	// the writer kept up.
	recovery = 1.1
)

// loadWindow is what the writer measured over one window.
type loadWindow struct {
	span       time.Duration
	written    int           // refreshes committed
	tight      int           // ... with less than half their lead left, or late
	backlogged time.Duration // time refreshes were due and unsent
	demand     float64       // refreshes per second the held grants need
	budget     float64       // --status-write-qps
}

// loadState is the writer's view of its load.
type loadState struct {
	// capacity is the refreshes per second the API server is estimated to
	// take (at most the budget); measured reports whether that came from
	// a saturated window rather than the budget.
	capacity   float64
	measured   bool
	overloaded bool
}

// initialLoad is the state before anything was measured.
func initialLoad(budget float64) loadState { return loadState{capacity: budget} }

// nextLoad is the load state after window w, and how many refreshes per
// second of demand to shed.
func nextLoad(prev loadState, w loadWindow) (loadState, float64) {
	next := prev
	rate := float64(w.written) / w.span.Seconds()
	saturated := w.backlogged >= time.Duration(saturatedShare*float64(w.span))
	switch {
	case saturated:
		next.capacity, next.measured = min(w.budget, rate), rate < w.budget
	case prev.capacity*recovery >= w.budget:
		next.capacity, next.measured = w.budget, false
	default:
		next.capacity = max(prev.capacity*recovery, min(rate, w.budget))
	}
	tight := w.written > 0 && float64(w.tight) > tightShare*float64(w.written)
	next.overloaded = (saturated && w.demand > next.capacity) || tight || w.demand > w.budget
	if !next.overloaded {
		return next, 0
	}
	return next, max(w.demand-shedTarget*next.capacity, shedLeast*w.demand)
}

// admits reports whether a new grant that needs add refreshes per second
// may be made while the held grants need demand.
func (l loadState) admits(demand, add float64) bool {
	return !l.overloaded && demand+add <= shedTarget*l.capacity
}

// shedCandidate is a held grant the writer may shed.
type shedCandidate struct {
	uid        types.UID
	acquiredAt time.Time
	perSecond  float64 // refreshes per second it needs
}

// chooseShed picks the grants to shed to remove perSecond refreshes per
// second: the youngest first. A grant close to its shown validity is
// refreshed meanwhile as usual (deadline first), so shedding it never
// lets its status lapse; it costs that one write more.
func chooseShed(cands []shedCandidate, perSecond float64) []types.UID {
	if perSecond <= 0 {
		return nil
	}
	sorted := append([]shedCandidate(nil), cands...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].acquiredAt.After(sorted[j].acquiredAt) })
	var out []types.UID
	left := perSecond
	for _, c := range sorted {
		if left <= 1e-9 {
			break
		}
		out = append(out, c.uid)
		left -= c.perSecond
	}
	return out
}
