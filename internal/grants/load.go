package grants

import (
	"math"
	"slices"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Overload and shedding. Every loadTick the writer measures a window of
// refreshes (committed, landed tight, landed late, time due ones waited)
// and estimates the writes per second the API server takes (capacity). It
// is overloaded when the held grants need more than capacity or the
// budget, or when a tenth of its refreshes land tight, until demand is
// back within shedTarget of capacity. While overloaded, new grants wait.
// After two pressed windows in a row it sheds the youngest grants: down to
// shedTarget of capacity when refreshes land tight or would soon land late
// (soonLate), shedLeast of demand when they land late. A shed grant is
// refreshed until status shows it Shed; its keys go after the validity
// shown.
// The reasoning: docs/design/status-writer.md#load-capacity-overload-and-shedding
// and docs/design/overload.md#the-rule.
const (
	loadTick = time.Second
	// saturatedShare of a window with refreshes waiting makes what
	// committed in it the capacity.
	saturatedShare = 0.8
	// tightShare of a window's refreshes landing tight (or late, for
	// shedding) is overload, counted from minSample refreshes.
	tightShare = 0.1
	minSample  = 5
	// shedTarget is the share of capacity demand is brought down to, and
	// new grants are admitted up to.
	shedTarget = 0.8
	// shedLeast is the share of demand shed in a window whose refreshes
	// land late.
	shedLeast = 0.05
	// recovery is how much a capacity estimate grows per window in which
	// the writer kept up, after cooldownWindows windows since a shed.
	recovery        = 1.05
	cooldownWindows = 30
	// apiQueueShare of the shortest lead is the wait at the API server,
	// beyond the base round trip, that stops recovery (loadWindow.apiQueue).
	apiQueueShare = 1.0 / 8
	// queueProbe: a queue at the API server holds recovery back for at
	// most this many refresh periods in a row, so that an API server
	// whose round trips spread for reasons of its own (an etcd, a
	// webhook) does not keep grants waiting for good.
	queueProbe = 10
	// staleSpan: a window this much longer than loadTick (the manager was
	// paused) says nothing of capacity.
	staleSpan = 3 * loadTick
	// saturatedWindows is how many saturated windows capacity is the
	// median of.
	saturatedWindows = 5
	// lateHorizon: behind, grants are shed when refreshes would land
	// late within it at the pace the backlog grows (soonLate).
	lateHorizon = 30 * time.Second
	// The spread. A saturated window's commits over the capacity
	// estimate it was judged with is a dip; the dips of the last
	// dipWindows windows are kept, and from minDips of them the share of
	// capacity demand is brought down to and admitted up to is their
	// dipQuantile when that is below shedTarget, and never below
	// minShare.
	dipWindows  = 60
	minDips     = minSample
	dipQuantile = 0.1
	minShare    = 0.5
)

// loadWindow is what the writer measured over one window.
type loadWindow struct {
	span       time.Duration
	written    int             // refreshes committed
	shown      int             // grants shown Shed (Set.ShedShown): writes the API server took beside the refreshes
	tight      int             // ... with less than half their lead left
	late       int             // ... after the validity they replaced had passed
	slacks     []time.Duration // validity left when each landed, but adoptions' first refreshes
	backlogged time.Duration   // time refreshes were due and unsent
	busy       time.Duration   // time refreshes were in flight
	limited    time.Duration   // ... of which the budget held them back
	demand     float64         // refreshes per second the held grants need
	budget     float64         // --status-write-qps
	// waiting: grants wait for room; period is the longest time between
	// two refreshes of a grant held (its ttl less its lead).
	waiting bool
	period  time.Duration
	// apiQueue: the writes answered met a queue at the API server (their
	// mean round trip exceeded the base by more than apiQueueShare of the
	// shortest lead held).
	apiQueue bool
}

// landsTight reports whether more than tightShare of the window's
// refreshes (of at least minSample) landed with less than half their lead
// left.
func (w loadWindow) landsTight() bool {
	return w.written >= minSample && float64(w.tight) > tightShare*float64(w.written)
}

// loadState is the writer's view of its load.
type loadState struct {
	// capacity is the refreshes per second the API server is estimated to
	// take (at most the budget); measured reports whether that came from
	// a saturated window rather than the budget.
	capacity   float64
	measured   bool
	overloaded bool
	// pressed: the window itself was behind, or refreshes landed tight or
	// late (overloaded also lasts, after that, until demand is back within
	// shedTarget of capacity).
	pressed bool
	// cooldown is how many windows capacity stays put after a shed.
	cooldown int
	// rates are what committed in the last saturatedWindows saturated
	// windows (oldest first): capacity is their median, so that one
	// window's dip (a second in which the API server served grants) does
	// not shed a third of the grants held.
	rates []float64
	// sinceGrowth is how many windows passed since capacity last grew by
	// recovery or was measured.
	sinceGrowth int
	// recent is what committed in the last saturatedWindows windows,
	// saturated or not (oldest first).
	recent []float64
	// dips are the saturated windows' commits over the capacity estimate
	// of their time, of the last dipWindows windows (share).
	dips []dip
}

// dip is one saturated window's commits over the capacity estimate, and
// how many windows ago it was measured.
type dip struct {
	ratio float64
	age   int
}

// share is the part of capacity demand is brought down to, and admitted
// up to: shedTarget, or less where the API server took less than the
// estimate in more than a tenth of the saturated seconds lately, so that
// demand fits in such a second too. An API server beside CPU hogs took
// from 55 % to 120 % of the estimate second to second, and kept locks
// lapsed at shedTarget; one that takes what it is let is within a tenth.
func (l loadState) share() float64 {
	if len(l.dips) < minDips {
		return shedTarget
	}
	ratios := make([]float64, len(l.dips))
	for i, d := range l.dips {
		ratios[i] = d.ratio
	}
	slices.Sort(ratios)
	return max(minShare, min(shedTarget, ratios[int(dipQuantile*float64(len(ratios)))]))
}

// target is the demand (writes per second) the share of capacity leaves.
func (l loadState) target() float64 { return l.share() * l.capacity }

// initialLoad is the state before anything was measured.
func initialLoad(budget float64) loadState { return loadState{capacity: budget} }

// nextLoad is the load state after window w, and how many refreshes per
// second of demand to shed.
func nextLoad(prev loadState, w loadWindow) (loadState, float64) {
	// Saturated: refreshes waited throughout, and not mostly for the
	// budget (the writer's own limit, not the API server's: a window's
	// count of budget-paced writes is no capacity); or they waited at
	// the API server: in flight throughout, landing tight (the writer
	// keeps few in flight, and a capacity below the estimate queues them
	// there, not in the writer).
	saturated := (w.backlogged >= time.Duration(saturatedShare*float64(w.span)) && w.limited < w.backlogged/2) ||
		(w.busy >= time.Duration(saturatedShare*float64(w.span)) && w.landsTight())
	if w.span > staleSpan || (w.written+w.shown == 0 && saturated) {
		return prev, 0 // no information
	}
	next := nextCapacity(prev, w, saturated)
	tight := w.landsTight()
	late := w.written >= minSample && float64(w.late) > tightShare*float64(w.written)
	behind := (saturated && w.demand > next.capacity) || w.demand > w.budget
	// An overload ends once the demand is back within shedTarget of
	// capacity, not at the first window that keeps up: a demand near what
	// the API server takes otherwise turned the state (its log line, metric
	// and condition) over every second or two (5,000 locks at ttl 60s on a
	// 2-core machine: 40 times in three minutes).
	// Against shedTarget, not the share: a share lowered by dips after
	// a shed (nothing pressing) would keep the writer overloaded, and new
	// grants waiting, with nothing to shed (beside other suites, for more
	// than 90 s after a drop).
	still := prev.overloaded && w.demand > shedTarget*next.capacity
	next.pressed = behind || tight || late
	next.overloaded = next.pressed || still
	var shed float64
	switch {
	case w.demand > w.budget || (behind && (tight || soonLate(w, next.capacity))):
		// Behind without tight refreshes only holds grants back: the
		// lead absorbs a backlog (a grant burst taking the API server
		// for a while) until refreshes land tight.
		shed = max(w.demand-next.target(), shedLeast*w.demand)
	case late:
		shed = shedLeast * w.demand
	}
	if shed > 0 {
		next.cooldown = cooldownWindows
	}
	return next, shed
}

// soonLate reports whether, behind, refreshes would land late within
// lateHorizon: a demand above capacity adds (demand−capacity)/capacity
// seconds of wait to the backlog every second, and a backlog served at
// about the pace it grows also wanders, by about sqrt(2·demand·horizon)
// refreshes over the horizon (a queue at its service rate drifts nowhere
// on average but is not bounded); more than a tenth of the window's
// refreshes (tightShare) had no more than the two to spare. A long lead
// (14.4 s at ttl 60s) absorbs a grant burst's backlog for minutes, and the
// writer waits for refreshes to land tight; with a short one (1 s at ttl
// 10s) waiting for that costs late refreshes: 2,000 locks at ttl 10s whose
// demand was 6 % above capacity landed 1,674 late before the shed, and
// 1,000 locks behind an API server of 40 writes/s whose demand had crept to
// the capacity measured (0.1 % above) landed 18 late, 6 of kept grants,
// over the 20 s the drift alone took to say so.
func soonLate(w loadWindow, capacity float64) bool {
	if len(w.slacks) < minSample || capacity <= 0 {
		return false
	}
	horizon := lateHorizon.Seconds()
	drift := (w.demand - capacity) / capacity * horizon
	swing := math.Sqrt(2*w.demand*horizon) / capacity
	reach := time.Duration((drift + swing) * float64(time.Second))
	soon := 0
	for _, s := range w.slacks {
		if s < reach {
			soon++
		}
	}
	return float64(soon) > tightShare*float64(len(w.slacks))
}

// nextCapacity is prev with its capacity estimate moved on by window w,
// saturated or not. Recovery grows an estimate below the budget by a
// twentieth at a time, and only while grants wait for room and the writes
// met no queue at the API server (apiQueue), once every refresh period of
// the grants held (and every queueProbe periods whatever the round
// trips). An API server that serves writes one after another queues them
// well before it is full: an estimate grown regardless probed
// past what it took (behind an API server of 40 writes/s, an estimate of
// 48 with the demand admitted to 38, and kept grants lapsed when the
// writer next fell behind). What a growth admits shows in the
// writes a period later, and an estimate grown every second past what
// the API server takes admitted a fifth more than it took before the
// first of those writes came due, and then shed a fifth of the grants
// held (over and over, at any constant capacity under the budget).
// What committed over the last saturatedWindows windows, their median,
// raises it at once: not one window's count, which a second's boundary
// inflates (an API server that lets 40 writes begin a second committed 43
// in one of the writer's windows, and the writer admitted grants up to
// 86 % of what it took).
func nextCapacity(prev loadState, w loadWindow, saturated bool) loadState {
	next := prev
	next.cooldown = max(prev.cooldown-1, 0)
	next.sinceGrowth = prev.sinceGrowth + 1
	rate := float64(w.written+w.shown) / w.span.Seconds()
	next.recent = lastRates(prev.recent, rate)
	next.dips = ageDips(prev.dips)
	if saturated && prev.measured && prev.capacity > 0 {
		next.dips = append(next.dips, dip{ratio: rate / prev.capacity})
	}
	switch {
	case saturated:
		next.rates = lastRates(prev.rates, rate)
		c := median(next.rates)
		next.capacity, next.measured, next.sinceGrowth = min(w.budget, c), c < w.budget, 0
	case !prev.measured:
		// The budget: nothing to recover.
	case len(next.recent) == saturatedWindows && median(next.recent) > prev.capacity:
		next.capacity, next.rates = min(median(next.recent), w.budget), nil
		next.measured = next.capacity < w.budget
	case prev.cooldown > 0 || !w.waiting || time.Duration(next.sinceGrowth)*loadTick < w.period:
	case w.apiQueue && time.Duration(next.sinceGrowth)*loadTick < queueProbe*w.period:
	case prev.capacity*recovery >= w.budget:
		next.capacity, next.measured, next.rates, next.sinceGrowth = w.budget, false, nil, 0
	default:
		// Recovering: the rates measured before no longer say what the
		// API server takes.
		next.capacity, next.rates, next.sinceGrowth = prev.capacity*recovery, nil, 0
	}
	return next
}

// ageDips is dips a window older, those older than dipWindows gone.
func ageDips(dips []dip) []dip {
	out := make([]dip, 0, len(dips)+1)
	for _, d := range dips {
		if d.age+1 < dipWindows {
			out = append(out, dip{ratio: d.ratio, age: d.age + 1})
		}
	}
	return out
}

// lastRates is rates with rate added, the last saturatedWindows kept.
func lastRates(rates []float64, rate float64) []float64 {
	return append(slices.Clone(rates[max(0, len(rates)-saturatedWindows+1):]), rate)
}

// median is the median of rates (not empty).
func median(rates []float64) float64 {
	s := slices.Sorted(slices.Values(rates))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// admits reports whether a new grant that needs add refreshes per second
// may be made while the held grants need demand. With nothing held, a grant
// the budget can refresh always is.
func (l loadState) admits(demand, add, budget float64) bool {
	if demand <= 0 {
		return add <= budget
	}
	return !l.overloaded && demand+add <= l.target()
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
