package distributedlock

import (
	"math"
	"slices"
	"time"
)

// Refreshes in flight. The writer sends due refreshes up to a limit in
// flight at once, sized every loadTick from the round trips the API server
// answered in that window:
//
//   - enough to send the budget at the mean round trip (Little's law), half
//     as many again for the spread (writeConcurrency), growing by at most
//     half per window: a fixed number caps the writer at that many per round
//     trip (32 at 650 ms is 49 writes per second, a sixth of a 300/s
//     budget), and the capacity it measures (load.go) would be its own limit
//     rather than the API server's;
//   - but when the mean round trip is more than queueingRatio times the
//     least of the last rttWindows windows, the API server is queueing the
//     writes (its CPU or its in-flight limit, API Priority and Fairness):
//     more in flight would only lengthen every round trip, which eats the
//     lead refreshes land with, and take deadline order away from the
//     writer's heap. The limit then shrinks by a tenth per window.
//
// Round trips of answers that are not the API server's own work (timeouts,
// throttling: the client retries those within one call) are not counted.
// The limit stays within [minWriteParallel, maxWriteParallel]; the upper
// bound is under the API server's default limit of mutating requests in
// flight (200), which every other client shares.
const (
	minWriteParallel = 32
	maxWriteParallel = 128
	queueingRatio    = 2
	rttWindows       = 10
)

// rttWindow is what the writer measured of answered round trips in one
// window.
type rttWindow struct {
	sum   time.Duration
	n     int
	least time.Duration
}

// inflightState is the limit of refreshes in flight, and the least round
// trip of each recent window that had answers (newest last).
type inflightState struct {
	limit int
	least []time.Duration
}

// writeConcurrency is how many refreshes in flight send budget writes per
// second when one takes latency, half as many again for the spread, within
// [minWriteParallel, maxWriteParallel].
func writeConcurrency(budget float64, latency time.Duration) int {
	n := int(math.Ceil(1.5 * budget * latency.Seconds()))
	return min(max(n, minWriteParallel), maxWriteParallel)
}

// nextInflight is the state after window w, for a budget of writes per
// second.
func nextInflight(prev inflightState, w rttWindow, budget float64) inflightState {
	if w.n == 0 {
		return prev // nothing answered: nothing learned
	}
	next := inflightState{limit: prev.limit, least: append(slices.Clone(prev.least), w.least)}
	if len(next.least) > rttWindows {
		next.least = next.least[len(next.least)-rttWindows:]
	}
	base := slices.Min(next.least)
	mean := w.sum / time.Duration(w.n)
	if mean > queueingRatio*base {
		next.limit = max(minWriteParallel, prev.limit-max(1, prev.limit/10))
		return next
	}
	next.limit = min(writeConcurrency(budget, mean), max(minWriteParallel, prev.limit*3/2))
	return next
}

// observeRTT adds the round trip of a refresh the API server answered to
// the window.
func (w *statusWriter) observeRTT(rtt time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rtt.sum += rtt
	w.rtt.n++
	if w.rtt.n == 1 || rtt < w.rtt.least {
		w.rtt.least = rtt
	}
}

// sizeInflight closes the round trips' window and sizes the limit in
// flight from it. Callers hold w.mu.
func (w *statusWriter) sizeInflight() {
	w.inflight = nextInflight(w.inflight, w.rtt, float64(w.budget.Limit()))
	w.rtt = rttWindow{}
	w.metrics.StatusWriteConcurrency.Set(float64(w.inflight.limit))
}

// parallel is how many refreshes may be in flight at once. Callers hold
// w.mu.
func (w *statusWriter) parallel() int { return w.inflight.limit }
