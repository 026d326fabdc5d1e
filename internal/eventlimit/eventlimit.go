// Package eventlimit bounds the Events a manager records per second.
//
// Events are a courtesy to whoever reads `kubectl describe`; what pods and
// tools act on is status and its conditions. Yet every Event is a write to
// the API server, recorded by client-go in a goroutine of its own and
// limited only by the manager's client: a new leader adopting 5,000 held
// locks recorded 5,000 Adopted Events at once, and the API server, busy
// with them, answered the leader's Lease renewal too late: it lost the
// Lease 10 s after taking it, and no manager led. A Recorder lets at most
// a rate of Events through (a token bucket) and drops the rest, counting
// them by reason in a metric and saying so in the log at most once every
// logEvery. Warnings go first: a Normal Event is let through only while at
// least half the burst is left, so a wave of Normal ones (grants,
// adoptions) does not use up the room of a loss or a shed that follows.
package eventlimit

import (
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

// logEvery is the least time between two log lines about dropped Events.
const logEvery = 30 * time.Second

// minBurst is the least burst: half of it is kept for warnings.
const minBurst = 4

// Recorder is an events.EventRecorder that lets at most a rate of Events
// through to another.
type Recorder struct {
	next    events.EventRecorder
	limit   *rate.Limiter
	dropped *prometheus.CounterVec
	log     logr.Logger

	mu        sync.Mutex // orders allow's look at the tokens and its take; guards the rest
	unlogged  int        // dropped since the last log line
	lastLogAt time.Time  // of the last log line
}

var _ events.EventRecorder = (*Recorder)(nil)

// New returns a Recorder that passes at most perSecond Events a second,
// in bursts of up to burst (at least minBurst), to next; it counts the ones it drops in
// dropped (labelled by reason) and logs them to log. perSecond ≤ 0 lets
// every Event through.
func New(next events.EventRecorder, perSecond float64, burst int, dropped *prometheus.CounterVec, log logr.Logger) *Recorder {
	limit := rate.NewLimiter(rate.Inf, 0)
	if perSecond > 0 {
		limit = rate.NewLimiter(rate.Limit(perSecond), max(burst, minBurst))
	}
	return &Recorder{next: next, limit: limit, dropped: dropped, log: log}
}

// Eventf implements events.EventRecorder.
func (r *Recorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	if !r.allow(eventtype, time.Now()) {
		r.drop(reason)
		return
	}
	r.next.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

// allow reports whether an Event of eventtype may go now, and takes its
// token.
func (r *Recorder) allow(eventtype string, now time.Time) bool {
	if r.limit.Limit() == rate.Inf {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if eventtype != corev1.EventTypeWarning && r.limit.TokensAt(now) < float64(r.limit.Burst())/2 {
		return false // the rest is kept for warnings
	}
	return r.limit.AllowN(now, 1)
}

// drop counts an Event of reason that was not let through.
func (r *Recorder) drop(reason string) {
	r.dropped.WithLabelValues(reason).Inc()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unlogged++
	if time.Since(r.lastLogAt) < logEvery {
		return
	}
	r.log.Info("events dropped: more than --event-qps were recorded; status and its conditions still say what happened",
		"dropped", r.unlogged, "eventQPS", float64(r.limit.Limit()), "burst", r.limit.Burst())
	r.unlogged, r.lastLogAt = 0, time.Now()
}
