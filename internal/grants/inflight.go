package grants

import (
	"context"
	"errors"
	"maps"
	"math"
	"net"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Refreshes in flight: the writer sends due refreshes up to a limit sized
// every loadTick from the window that ended: Little's law at the mean round
// trip, within [minWriteParallel, maxWriteParallel]; capped so that a
// refresh waits at the API server no more than a quarter of the shortest
// lead beyond the base round trip (the least of the last baseWindows
// windows), at the capacity estimated (load.go; at least
// leastWriteParallel); halved on congestion. Refreshes that wait
// longer wait in the writer, in its order (keep.go), not in the API
// server's. The reasoning and the measurements behind it:
// docs/design/lock-controller.md and docs/design/overload.md.
const (
	minWriteParallel   = 32
	leastWriteParallel = 4
	maxWriteParallel   = 128
	leadShare          = 0.25
	leadQuantile       = 0.1
	// congestedShare of a window's writes (at least congestedLeast)
	// meeting congestion halves the limit.
	congestedShare = 0.05
	congestedLeast = 2
	// baseWindows is how many windows' least round trips the base round
	// trip is the least of: one window's least, while every write queues,
	// is queueing too, and a cap grown from it let more queue.
	baseWindows = 30
)

// congestion reports whether a refresh failed for want of the API
// server's room: it timed out (here or in the API server), was throttled,
// or the server failed or was unavailable. Other errors (forbidden, a
// webhook's refusal) are the write's own, and one lock retrying such a
// failure every 100 ms must not halve every lock's limit.
func congestion(err error) bool {
	var nerr net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &nerr) && nerr.Timeout()) ||
		apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err)
}

// rttWindow is what the writer measured of answered round trips in one
// window, and how many writes met congestion instead.
type rttWindow struct {
	rtts      []time.Duration // the answered round trips
	congested int
}

// least is the least answered round trip (zero: none answered).
func (w rttWindow) least() time.Duration {
	if len(w.rtts) == 0 {
		return 0
	}
	return slices.Min(w.rtts)
}

// mean is the mean answered round trip (zero: none answered).
func (w rttWindow) mean() time.Duration {
	if len(w.rtts) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range w.rtts {
		sum += d
	}
	return sum / time.Duration(len(w.rtts))
}

// writeConcurrency is how many refreshes in flight send budget writes per
// second when one takes latency, half as many again for the spread, within
// [minWriteParallel, maxWriteParallel].
func writeConcurrency(budget float64, latency time.Duration) int {
	n := int(math.Ceil(1.5 * budget * latency.Seconds()))
	return min(max(n, minWriteParallel), maxWriteParallel)
}

// nextInflight is the limit in flight after window w, from prev, for a
// budget of writes per second, when the API server is estimated to take
// capacity refreshes per second and the shortest lead of the grants held
// is lead (zero: none held). The cap on what waits at the API server
// counts the base round trip apart: a write in flight that long is not
// waiting behind others (Little's law). It follows the capacity estimated,
// not what committed: a writer with little due commits little, and a cap
// from that held back the next burst (a thousand grants at once were
// admitted at a fifth of the API server's pace).
func nextInflight(prev int, w rttWindow, budget, capacity float64, base, lead time.Duration) int {
	if w.congested >= congestedLeast && float64(w.congested) >= congestedShare*float64(len(w.rtts)+w.congested) {
		return max(leastWriteParallel, prev/2)
	}
	if len(w.rtts) == 0 {
		return prev // nothing answered: nothing learned
	}
	target := writeConcurrency(budget, w.mean())
	if lead > 0 {
		queued := capacity * (base.Seconds() + leadShare*lead.Seconds())
		target = min(target, max(leastWriteParallel, int(math.Round(queued))))
	}
	return min(target, max(minWriteParallel, prev*3/2))
}

// observeRTT adds the round trip of a refresh the API server answered to
// the window.
func (w *statusWriter) observeRTT(rtt time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rtt.rtts = append(w.rtt.rtts, rtt)
}

// sizeInflight closes the round trips' window (tight: refreshes landed
// tight, loadWindow.landsTight), and sizes the lead floor and the limit in
// flight from it. Callers hold w.mu.
func (w *statusWriter) sizeInflight(tight bool) {
	w.setLeadFloor(nextLeadFloor(w.sched.floor, w.rtt, tight))
	// The leads without the floor: the floor follows the round trips, and
	// a limit sized from it would let more writes queue as they slow down,
	// which slows them further.
	base := w.sched
	base.floor = 0
	lead := w.shortLead(base)
	if len(w.rtt.rtts) > 0 {
		w.leasts = append(w.leasts[max(0, len(w.leasts)-baseWindows+1):], w.rtt.least())
	}
	w.inflight = nextInflight(w.inflight, w.rtt, float64(w.budget.Limit()), w.load.capacity, w.baseRTT(), lead)
	w.rtt = rttWindow{}
	w.metrics.StatusWriteConcurrency.Set(float64(w.inflight))
	w.followGate()
}

// followGate sizes the manager's gate for other writes from the limit in
// flight while grants are held, and opens it while none is: no refresh
// needs the API server then. Callers hold w.mu.
func (w *statusWriter) followGate() {
	w.gateBehind = w.behindInFlight()
	if len(w.entries) == 0 {
		w.gate.Follow(0, false)
		return
	}
	w.gate.Follow(w.inflight, w.gateBehind)
}

// behindInFlight reports whether more refreshes are due than there is
// room for in flight: the manager's other writes then go one at a time
// (followGate), and grants chosen to shed one at a time (canSend). Not
// "a due refresh waits": that turned false with every refresh answered,
// and the room it made went to the others first. Callers hold w.mu.
func (w *statusWriter) behindInFlight() bool {
	return w.ready.Len() > w.parallel()-w.sending
}

// gateFollows sizes the gate again when due refreshes began or ceased to
// wait for room in flight. Callers hold w.mu.
func (w *statusWriter) gateFollows() {
	if w.behindInFlight() != w.gateBehind {
		w.followGate()
	}
}

// setLeadFloor makes floor the schedule's lead floor, and the demand
// what the grants held need with the leads it gives. A raise also brings
// forward the refreshes waiting for their due time (not those backing off
// after a failed write) whose new due time is still ahead: they are the
// ones the slower round trips would make land tight. Those whose new due
// time has passed keep theirs (and the lead they are judged by): sent at
// once, they would be a burst of refreshes with less than the new lead,
// which the load rules would read as overload. Callers hold w.mu.
func (w *statusWriter) setLeadFloor(floor time.Duration) {
	floor = floor.Truncate(time.Millisecond) // decays to zero, not to a rounded-up millisecond
	if floor == w.sched.floor {
		return
	}
	raised := floor > w.sched.floor
	w.sched.floor = floor
	w.metrics.StatusWriteLeadFloor.Set(floor.Seconds())
	demand := 0.0
	for ttl, n := range w.ttls {
		demand += float64(n) * w.sched.perSecond(ttl)
	}
	w.setDemand(demand)
	if !raised {
		return // the refreshes scheduled keep their due times
	}
	now := time.Now()
	for _, e := range slices.Clone(w.waiting.items) {
		if due := w.sched.due(e.h.shown, e.ttl); e.notBefore.IsZero() && due.Before(e.due) && due.After(now) {
			w.schedule(e, due)
		}
	}
}

// shortLead is the shortest lead on schedule sched of the tenth of the
// grants held with the shortest leads (leadQuantile); zero when none is
// held. Callers hold w.mu.
func (w *statusWriter) shortLead(sched refreshSchedule) time.Duration {
	ttls := slices.Sorted(maps.Keys(w.ttls)) // a longer ttl has a longer lead
	total := 0
	for _, n := range w.ttls {
		total += n
	}
	seen := 0
	for _, ttl := range ttls {
		if seen += w.ttls[ttl]; float64(seen) > leadQuantile*float64(total) {
			return sched.lead(ttl)
		}
	}
	return 0
}

// countTTL moves an entry's count from ttl from to ttl to (zero: none).
// Callers hold w.mu.
func (w *statusWriter) countTTL(from, to time.Duration) {
	if from != 0 {
		if w.ttls[from]--; w.ttls[from] <= 0 {
			delete(w.ttls, from)
		}
	}
	if to != 0 {
		w.ttls[to]++
	}
}

// apiQueue reports whether the round trips of the window still open met a
// queue at the API server: their mean exceeded the base round trip (or
// the window's least, when no base was measured) by more than
// apiQueueShare of the shortest lead held. Callers hold w.mu.
func (w *statusWriter) apiQueue() bool {
	if len(w.rtt.rtts) == 0 {
		return false
	}
	base := w.baseRTT()
	if least := w.rtt.least(); base <= 0 || least < base {
		base = least
	}
	return float64(w.rtt.mean()-base) > apiQueueShare*float64(w.shortLead(w.sched))
}

// baseRTT is the base round trip: the least of the last baseWindows
// windows' least (zero: none measured). Callers hold w.mu.
func (w *statusWriter) baseRTT() time.Duration {
	if len(w.leasts) == 0 {
		return 0
	}
	return slices.Min(w.leasts)
}

// parallel is how many refreshes may be in flight at once. Callers hold
// w.mu.
func (w *statusWriter) parallel() int { return w.inflight }

// openGate is the Gate of a writer given none: nothing is held back.
type openGate struct{}

func (openGate) Follow(int, bool) {}
