// Package writegate holds the manager's writes back in the manager, so
// that the status writer's refreshes never queue at the API server behind
// them.
//
// An API server serves one client's writes first come first served. When
// it takes fewer writes than the manager sends, a refresh sent behind a
// burst of other writes (finalizers of a thousand new locks, a shed's
// Events) waits for all of them, and lands after the validity it
// replaces. The Gate lets at most a quarter of the status writer's limit
// of refreshes in flight (at least one; one while more refreshes are due
// than there is room for in flight) of the other writes be at the API server at once; the
// rest wait here, first come first served in three
// lanes served in turn: writes marked WithFirst (grants the writer
// admitted), the controllers' other writes, then Events (at most
// maxEventsWaiting; more are refused here, and the recorder gives them
// up). A write that has held its place for placeHold gives it up,
// answered or not, so that a slow webhook or a dead connection does not
// hold every other write back; at most as many such overdue writes as the
// limit are let be at once.
//
// Exempt: requests whose context is marked WithExempt or made through a
// config from Exempt (the status writer's client; the writes that show a
// grant given up, which the writer paces in the refreshes' turn), the leader
// election's Leases (a renewal that waits loses the lead), token and
// access reviews (they store nothing; the metrics endpoint's checks), and
// reads and watches. The reasoning and the measurements:
// docs/design/overload.md.
package writegate

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
)

const (
	// placeHold is how long a write holds its place at the API server:
	// beyond it, the wait is the write's own (a webhook, a connection
	// that died), not the API server's queue, which a ttl-10s lock's 1 s
	// lead could not wait for anyway.
	placeHold = 2 * time.Second
	// maxEventsWaiting bounds the Events waiting here: the recorder
	// starts a goroutine for each, and an overload can last hours.
	maxEventsWaiting = 1000
	// EventsRefusedReason is the reason Events refused here are counted
	// under among the Events dropped (redlock_events_dropped_total).
	EventsRefusedReason = "TooManyWaiting"
)

// Gate is the manager's gate for its writes. The zero value is not
// usable; see New. Until Follow sizes it, and after Follow(0), it lets
// every write through.
type Gate struct {
	mu       sync.Mutex
	limit    int // 0: none
	inflight int
	// lanes of waiting writes (chan struct{} each), served in order:
	// first (WithFirst), the controllers' writes, then Events; each
	// first come first served.
	lanes [3]list.List
	// overdueLimit bounds inflight and overdue together: twice the limit
	// the refreshes call for, behind or not.
	overdueLimit int
	// overdue counts the writes that held a place for hold: they no
	// longer count in inflight, but at most limit of them are let be.
	overdue int
	hold    time.Duration
	obs     Observer
}

// Observer is told what the gate does; its functions must not block, and
// may be nil.
type Observer struct {
	// Waiting is told how many writes wait at the gate each time that
	// changes.
	Waiting func(n int)
	// Queued is told of each write that waits.
	Queued func()
	// Refused is told of an Event refused: maxEventsWaiting waited.
	Refused func()
}

// New returns an open gate.
func New(o Observer) *Gate {
	if o.Waiting == nil {
		o.Waiting = func(int) {}
	}
	if o.Queued == nil {
		o.Queued = func() {}
	}
	if o.Refused == nil {
		o.Refused = func() {}
	}
	return &Gate{obs: o, hold: placeHold}
}

// Follow sizes the gate from the status writer's limit of refreshes in
// flight: a quarter of it, at least one. Zero opens the gate (no writer
// leads in this manager, or it holds no grant).
//
// While behind (the writer's due refreshes wait for room in flight), one
// other write at a time is let be: the API server serves writes in turn,
// and each in flight takes its share of what it serves.
func (g *Gate) Follow(refreshes int, behind bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.limit, g.overdueLimit = 0, 0
	if refreshes > 0 {
		g.limit = max(1, refreshes/4)
		// Writes overdue (a slow webhook, a dead connection) are let
		// be as many as usual: two of them would otherwise close the
		// gate while behind.
		g.overdueLimit = 2 * g.limit
		if behind {
			g.limit = 1
		}
	}
	g.admit()
}

// Wrap returns a copy of cfg whose writes pass the gate.
func (g *Gate) Wrap(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	prefix := ""
	if u, _, err := rest.DefaultServerUrlFor(cfg); err == nil {
		prefix = strings.TrimSuffix(u.Path, "/") // a server behind a path (a proxy's)
	}
	c.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			path := strings.TrimPrefix(req.URL.Path, prefix)
			if !gated(req, path) {
				return rt.RoundTrip(req)
			}
			ctx := req.Context()
			mark, _ := ctx.Value(firstKey{}).(*sentMark)
			lane := laneWrites
			switch {
			case mark != nil:
				lane = laneFirst
			case isEvent(path):
				lane = laneEvents
			}
			admitted, err := g.acquire(ctx, lane)
			if err != nil || !admitted {
				if req.Body != nil {
					_ = req.Body.Close() // a RoundTripper closes it, sent or not
				}
				switch {
				case err != nil && mark != nil && !mark.sent.Load():
					return nil, fmt.Errorf("%w: %w", ErrNotSent, err)
				case err != nil:
					return nil, err // an earlier attempt (client-go resends) may have been sent
				}
				return refused(req), nil
			}
			if mark != nil {
				mark.sent.Store(true)
			}
			w := &write{}
			t := time.AfterFunc(g.hold, func() { g.overstay(w) })
			defer func() { t.Stop(); g.finish(w) }()
			return rt.RoundTrip(req)
		})
	})
	return c
}

// Exempt returns a copy of cfg whose requests never wait at a gate: add
// it after (outside) the gate's Wrap.
func Exempt(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			return rt.RoundTrip(req.WithContext(WithExempt(req.Context())))
		})
	})
	return c
}

// ErrNotSent wraps the error of a write made WithFirst whose context
// ended while it waited at the gate, no attempt of it (client-go resends
// some) having been let through: the API server never saw it.
var ErrNotSent = errors.New("not sent: the write waited in the manager for its turn")

type exemptKey struct{}

type firstKey struct{}

// sentMark records whether a write made with a context was let through.
type sentMark struct{ sent atomic.Bool }

// WithFirst marks ctx: a write made with it waits at the gate before the
// other writes (a grant, which the status writer admitted), and ends with
// ErrNotSent if it never left the manager.
func WithFirst(ctx context.Context) context.Context {
	return context.WithValue(ctx, firstKey{}, &sentMark{})
}

// The lanes, in the order they are served.
const (
	laneFirst = iota
	laneWrites
	laneEvents
)

// WithExempt marks ctx: a write made with it does not wait at the gate.
func WithExempt(ctx context.Context) context.Context {
	return context.WithValue(ctx, exemptKey{}, true)
}

// gated reports whether req, to path (after the server's own), waits
// for its turn: a write, not exempt, not a Lease (the leader election's
// renewals), nor a review.
func gated(req *http.Request, path string) bool {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	if exempt, _ := req.Context().Value(exemptKey{}).(bool); exempt {
		return false
	}
	for _, group := range []string{"/apis/coordination.k8s.io/", "/apis/authentication.k8s.io/", "/apis/authorization.k8s.io/"} {
		if strings.HasPrefix(path, group) {
			return false
		}
	}
	return true
}

// isEvent reports whether path is an Event's (core or events.k8s.io):
// /api/v1/namespaces/NS/events[/NAME] or
// /apis/events.k8s.io/VERSION/namespaces/NS/events[/NAME].
func isEvent(path string) bool {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	var rest []string
	switch {
	case len(segs) >= 2 && segs[0] == "api":
		rest = segs[2:]
	case len(segs) >= 3 && segs[0] == "apis" && segs[1] == "events.k8s.io":
		rest = segs[3:]
	default:
		return false
	}
	return len(rest) >= 3 && len(rest) <= 4 && rest[0] == "namespaces" && rest[2] == "events"
}

// refused is the answer to a write the gate did not send: 429 without
// Retry-After, which client-go does not retry and the event recorder
// gives up.
func refused(req *http.Request) *http.Response {
	const body = `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too many writes wait in the manager","reason":"TooManyRequests","code":429}`
	return &http.Response{
		StatusCode: http.StatusTooManyRequests, Status: "429 Too Many Requests",
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{"Content-Type": []string{"application/json"}},
		Body:    io.NopCloser(strings.NewReader(body)),
		Request: req, ContentLength: int64(len(body)),
	}
}

// acquire waits in lane for a place at the API server, or for ctx to end.
// An Event beyond maxEventsWaiting is not admitted.
func (g *Gate) acquire(ctx context.Context, lane int) (admitted bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	g.mu.Lock()
	if g.waiting() == 0 && g.room() {
		g.inflight++
		g.mu.Unlock()
		return true, nil
	}
	if lane == laneEvents && g.lanes[laneEvents].Len() >= maxEventsWaiting {
		g.mu.Unlock()
		g.obs.Refused()
		return false, nil
	}
	turn := make(chan struct{})
	e := g.lanes[lane].PushBack(turn)
	g.obs.Queued()
	g.obs.Waiting(g.waiting())
	g.mu.Unlock()
	select {
	case <-turn:
		return true, nil
	case <-ctx.Done():
		g.mu.Lock()
		defer g.mu.Unlock()
		select {
		case <-turn: // admitted meanwhile: give the place on
			g.inflight--
			g.admit()
		default:
			g.lanes[lane].Remove(e)
			g.obs.Waiting(g.waiting())
		}
		return false, ctx.Err()
	}
}

// write is one write let through; its fields are guarded by the gate's
// mutex.
type write struct{ overdue, done bool }

// overstay counts w, which held its place for hold, overdue: its place is
// freed, and overdue writes are let be only as many as the limit.
func (g *Gate) overstay(w *write) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if w.done || w.overdue {
		return
	}
	w.overdue = true
	g.inflight--
	g.overdue++
	g.admit()
}

// finish ends w: its place is freed, or it is no longer counted overdue.
func (g *Gate) finish(w *write) {
	g.mu.Lock()
	defer g.mu.Unlock()
	w.done = true
	if w.overdue {
		g.overdue--
	} else {
		g.inflight--
	}
	g.admit()
}

// room reports whether one more write may go to the API server. Callers
// hold g.mu.
func (g *Gate) room() bool {
	return g.limit == 0 || (g.inflight < g.limit && g.inflight+g.overdue < g.overdueLimit)
}

// waiting is how many writes wait. Callers hold g.mu.
func (g *Gate) waiting() int {
	n := 0
	for i := range g.lanes {
		n += g.lanes[i].Len()
	}
	return n
}

// admit lets waiting writes through while they fit, lane by lane.
// Callers hold g.mu.
func (g *Gate) admit() {
	n := g.waiting()
	for g.waiting() > 0 && g.room() {
		lane := &g.lanes[laneFirst]
		for i := 1; lane.Len() == 0; i++ {
			lane = &g.lanes[i]
		}
		turn := lane.Remove(lane.Front()).(chan struct{})
		g.inflight++
		close(turn)
	}
	if g.waiting() != n {
		g.obs.Waiting(g.waiting())
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
