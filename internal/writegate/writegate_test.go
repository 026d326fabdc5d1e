package writegate

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// server answers a request to a path once the test lets it (answer), and
// reports each arrival on arrived.
type server struct {
	*httptest.Server
	arrived chan string
	mu      sync.Mutex
	answers map[string]chan struct{}
}

func newServer(t *testing.T) *server {
	s := &server{arrived: make(chan string, 100), answers: map[string]chan struct{}{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.arrived <- r.Method + " " + r.URL.Path
		// Read to the end: only then does the server see the client
		// hang up, and end r's context.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-s.answer(r.URL.Path):
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(s.Close)
	return s
}

// answer is the channel that lets the request to path be answered.
func (s *server) answer(path string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.answers[path] == nil {
		s.answers[path] = make(chan struct{}, 1)
	}
	return s.answers[path]
}

// release answers the requests to paths.
func (s *server) release(paths ...string) {
	for _, p := range paths {
		s.answer(p) <- struct{}{}
	}
}

func httpClient(t *testing.T, cfg *rest.Config) *http.Client {
	t.Helper()
	c, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// send makes a request in a goroutine and returns its error when done.
func send(ctx context.Context, c *http.Client, method, url string) <-chan error {
	done := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader("{}"))
		if err == nil {
			var resp *http.Response
			if resp, err = c.Do(req); err == nil {
				err = resp.Body.Close()
			}
		}
		done <- err
	}()
	return done
}

// expectDone waits for each write to return without an error.
func expectDone(t *testing.T, writes ...<-chan error) {
	t.Helper()
	for _, done := range writes {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// newGate is a gate that follows refreshes, a server behind it, and a
// client through it.
// Its writes hold their places as long as they take (a loaded machine
// must not free one), but in tests of the hold.
func newGate(t *testing.T, refreshes int, o Observer) (*server, *Gate, *http.Client) {
	s := newServer(t)
	g := New(o)
	g.hold = time.Hour
	g.Follow(refreshes, false)
	return s, g, httpClient(t, g.Wrap(&rest.Config{Host: s.URL}))
}

func expectArrival(t *testing.T, s *server, want string) {
	t.Helper()
	select {
	case got := <-s.arrived:
		if got != want {
			t.Fatalf("the API server got %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%q never reached the API server", want)
	}
}

// expectNoArrival checks that nothing reached the server by the time a
// request sent after it, exempt, did.
func expectNoArrival(t *testing.T, s *server, c *http.Client, probe string) {
	t.Helper()
	done := send(WithExempt(context.Background()), c, http.MethodPatch, s.URL+probe)
	expectArrival(t, s, "PATCH "+probe)
	s.release(probe)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// queued follows how many writes wait at a gate.
type queued struct {
	mu      sync.Mutex
	changed chan struct{}
	counts  []int
}

func newQueued() *queued { return &queued{changed: make(chan struct{}, 1)} }

func (q *queued) observe(n int) {
	q.mu.Lock()
	q.counts = append(q.counts, n)
	q.mu.Unlock()
	select {
	case q.changed <- struct{}{}:
	default:
	}
}

// await waits until n writes wait at the gate.
func (q *queued) await(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		q.mu.Lock()
		last := -1
		if len(q.counts) > 0 {
			last = q.counts[len(q.counts)-1]
		}
		q.mu.Unlock()
		if last == n {
			return
		}
		select {
		case <-q.changed:
		case <-deadline:
			t.Fatalf("%d writes wait at the gate, want %d", last, n)
		}
	}
}

func TestWritesBeyondTheLimitWaitInTurn(t *testing.T) {
	q := newQueued()
	var waited atomic.Int32
	s, g, c := newGate(t, 8, Observer{Waiting: q.observe, Queued: func() { waited.Add(1) }}) // a quarter: 2
	g.mu.Lock()
	limit := g.limit
	g.mu.Unlock()
	if limit != 2 {
		t.Fatalf("limit %d, want 2 (a quarter of 8)", limit)
	}
	ctx := context.Background()
	a := send(ctx, c, http.MethodPatch, s.URL+"/apis/x/v1/a")
	expectArrival(t, s, "PATCH /apis/x/v1/a")
	b := send(ctx, c, http.MethodPost, s.URL+"/api/v1/namespaces/n/events")
	expectArrival(t, s, "POST /api/v1/namespaces/n/events")
	third := send(ctx, c, http.MethodPut, s.URL+"/apis/x/v1/third")
	q.await(t, 1)
	// The third waits in the manager: reads, Leases and exempt writes do not.
	get := send(ctx, c, http.MethodGet, s.URL+"/apis/x/v1/read")
	expectArrival(t, s, "GET /apis/x/v1/read")
	lease := send(ctx, c, http.MethodPut, s.URL+"/apis/coordination.k8s.io/v1/namespaces/n/leases/l")
	expectArrival(t, s, "PUT /apis/coordination.k8s.io/v1/namespaces/n/leases/l")
	review := send(ctx, c, http.MethodPost, s.URL+"/apis/authorization.k8s.io/v1/subjectaccessreviews")
	expectArrival(t, s, "POST /apis/authorization.k8s.io/v1/subjectaccessreviews")
	exempt := send(ctx, httpClient(t, Exempt(g.Wrap(&rest.Config{Host: s.URL}))), http.MethodPatch, s.URL+"/apis/x/v1/refresh")
	expectArrival(t, s, "PATCH /apis/x/v1/refresh")
	expectNoArrival(t, s, c, "/apis/x/v1/probe")
	fourth := send(ctx, c, http.MethodDelete, s.URL+"/apis/x/v1/fourth")
	q.await(t, 2)
	expectNoArrival(t, s, c, "/apis/x/v1/probe2")

	// Answers that are not gated writes' free no place.
	s.release("/apis/x/v1/read", "/apis/coordination.k8s.io/v1/namespaces/n/leases/l", "/apis/x/v1/refresh", "/apis/authorization.k8s.io/v1/subjectaccessreviews")
	expectNoArrival(t, s, c, "/apis/x/v1/probe3")
	// One answer lets the first waiting write through, not the one after it.
	s.release("/apis/x/v1/a")
	expectArrival(t, s, "PUT /apis/x/v1/third")
	q.await(t, 1)
	expectNoArrival(t, s, c, "/apis/x/v1/probe4")
	s.release("/api/v1/namespaces/n/events")
	expectArrival(t, s, "DELETE /apis/x/v1/fourth")
	q.await(t, 0)
	s.release("/apis/x/v1/third", "/apis/x/v1/fourth")
	expectDone(t, a, b, third, get, lease, review, exempt, fourth)
	if n := waited.Load(); n != 2 {
		t.Fatalf("%d writes told as queued, want 2 (third and fourth)", n)
	}
}

func TestAWriteWaitingEndsWithItsContext(t *testing.T) {
	q := newQueued()
	s, _, c := newGate(t, 1, Observer{Waiting: q.observe}) // at least one
	first := send(context.Background(), c, http.MethodPatch, s.URL+"/a")
	expectArrival(t, s, "PATCH /a")
	ctx, cancel := context.WithCancel(context.Background())
	gone := send(ctx, c, http.MethodPatch, s.URL+"/gone")
	q.await(t, 1)
	next := send(context.Background(), c, http.MethodPatch, s.URL+"/next")
	q.await(t, 2)
	expectNoArrival(t, s, c, "/probe")
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("a write whose context ended while waiting returned %v, want context.Canceled", err)
	}
	q.await(t, 1)
	s.release("/a")
	expectArrival(t, s, "PATCH /next") // the cancelled one gave up its turn
	s.release("/next")
	expectDone(t, first, next)
}

func TestFollowZeroOpensTheGate(t *testing.T) {
	q := newQueued()
	s, g, c := newGate(t, 4, Observer{Waiting: q.observe})
	first := send(context.Background(), c, http.MethodPatch, s.URL+"/a")
	expectArrival(t, s, "PATCH /a")
	second := send(context.Background(), c, http.MethodPatch, s.URL+"/b")
	q.await(t, 1)
	expectNoArrival(t, s, c, "/probe")
	g.Follow(0, false) // the writer stopped leading
	expectArrival(t, s, "PATCH /b")
	third := send(context.Background(), c, http.MethodPatch, s.URL+"/c")
	expectArrival(t, s, "PATCH /c")
	s.release("/a", "/b", "/c")
	expectDone(t, first, second, third)
}

// TestBehindLetsOneWriteBe: a gate following 8 refreshes lets two other
// writes be at the API server; while the writer is behind, one: the
// second waits until the first is answered, and a third until the writer
// catches up.
func TestBehindLetsOneWriteBe(t *testing.T) {
	q := newQueued()
	s, g, c := newGate(t, 8, Observer{Waiting: q.observe})
	g.Follow(8, true)
	first := send(context.Background(), c, http.MethodPatch, s.URL+"/a")
	expectArrival(t, s, "PATCH /a")
	second := send(context.Background(), c, http.MethodPatch, s.URL+"/b")
	q.await(t, 1)
	expectNoArrival(t, s, c, "/probe")
	s.release("/a")
	expectArrival(t, s, "PATCH /b")
	third := send(context.Background(), c, http.MethodPatch, s.URL+"/c")
	q.await(t, 1)
	expectNoArrival(t, s, c, "/probe2")
	g.Follow(8, false) // caught up: two at once
	expectArrival(t, s, "PATCH /c")
	s.release("/b", "/c")
	expectDone(t, first, second, third)
}

func TestWritesWaitInLanes(t *testing.T) {
	q := newQueued()
	s, _, c := newGate(t, 4, Observer{Waiting: q.observe}) // one at a time
	ctx := context.Background()
	first := send(ctx, c, http.MethodPatch, s.URL+"/apis/x/v1/namespaces/n/locks/a")
	expectArrival(t, s, "PATCH /apis/x/v1/namespaces/n/locks/a")
	event := send(ctx, c, http.MethodPost, s.URL+"/apis/events.k8s.io/v1/namespaces/n/events")
	q.await(t, 1)
	write := send(ctx, c, http.MethodPut, s.URL+"/apis/x/v1/namespaces/n/locks/events") // a lock named events
	q.await(t, 2)
	grant := send(WithFirst(ctx), c, http.MethodPatch, s.URL+"/apis/x/v1/namespaces/n/locks/g/status")
	q.await(t, 3)
	// Served in turn: the grant, the controller's write, the Event.
	answered := "/apis/x/v1/namespaces/n/locks/a"
	for _, next := range []string{"PATCH /apis/x/v1/namespaces/n/locks/g/status", "PUT /apis/x/v1/namespaces/n/locks/events", "POST /apis/events.k8s.io/v1/namespaces/n/events"} {
		s.release(answered)
		expectArrival(t, s, next)
		answered = strings.SplitN(next, " ", 2)[1]
	}
	s.release(answered)
	expectDone(t, first, event, write, grant)
}

func TestEventsBeyondTheBoundAreRefused(t *testing.T) {
	q := newQueued()
	refused := make(chan struct{}, 1)
	s, _, c := newGate(t, 1, Observer{Waiting: q.observe, Refused: func() { refused <- struct{}{} }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := send(ctx, c, http.MethodPatch, s.URL+"/a")
	expectArrival(t, s, "PATCH /a")
	var waiting []<-chan error
	for range maxEventsWaiting {
		waiting = append(waiting, send(ctx, c, http.MethodPost, s.URL+"/api/v1/namespaces/n/events"))
	}
	q.await(t, maxEventsWaiting)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/api/v1/namespaces/n/events", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("an Event beyond %d waiting got %d (Retry-After %q), want 429 without Retry-After", maxEventsWaiting, resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	<-refused
	cancel() // the waiting Events give up
	for _, done := range waiting {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("a waiting Event returned %v, want context.Canceled", err)
		}
	}
	s.release("/a")
	if err := <-first; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

func TestASlowWriteGivesItsPlaceUp(t *testing.T) {
	q := newQueued()
	s, g, c := newGate(t, 1, Observer{Waiting: q.observe})
	g.hold = 50 * time.Millisecond
	ctx := context.Background()
	slow := send(ctx, c, http.MethodPatch, s.URL+"/slow")
	expectArrival(t, s, "PATCH /slow")
	next := send(ctx, c, http.MethodPatch, s.URL+"/next")
	expectArrival(t, s, "PATCH /next") // while /slow is unanswered
	// Two overdue with a limit of one: the third waits for one to end.
	third := send(ctx, c, http.MethodPatch, s.URL+"/third")
	q.await(t, 1)
	waitOverdue(t, g, 2)
	expectNoArrival(t, s, c, "/probe")
	s.release("/slow")
	expectArrival(t, s, "PATCH /third")
	s.release("/next", "/third")
	expectDone(t, slow, next, third)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inflight != 0 || g.overdue != 0 {
		t.Fatalf("%d places held and %d overdue after every write was answered, want none", g.inflight, g.overdue)
	}
}

// TestOverdueWritesDoNotCloseTheGateWhileBehind: following 8 refreshes
// (a limit of two), two overdue writes leave room while the writer is
// behind and the limit is one: overdue writes are let be as many as
// usual, and a third write goes.
func TestOverdueWritesDoNotCloseTheGateWhileBehind(t *testing.T) {
	q := newQueued()
	s, g, c := newGate(t, 8, Observer{Waiting: q.observe})
	g.Follow(8, true)
	g.hold = 50 * time.Millisecond
	ctx := context.Background()
	slow := send(ctx, c, http.MethodPatch, s.URL+"/slow")
	expectArrival(t, s, "PATCH /slow")
	next := send(ctx, c, http.MethodPatch, s.URL+"/next")
	expectArrival(t, s, "PATCH /next") // once /slow is overdue
	waitOverdue(t, g, 2)
	third := send(ctx, c, http.MethodPatch, s.URL+"/third")
	expectArrival(t, s, "PATCH /third")
	s.release("/slow", "/next", "/third")
	expectDone(t, slow, next, third)
}

// waitOverdue waits until n writes are counted overdue: each is, once it
// held its place for the gate's hold.
func waitOverdue(t *testing.T, g *Gate, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g.mu.Lock()
		got := g.overdue
		g.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d writes overdue, want %d", got, n)
		}
		time.Sleep(g.hold)
	}
}

func TestAServerBehindAPathKeepsItsExemptions(t *testing.T) {
	s := newServer(t)
	q := newQueued()
	g := New(Observer{Waiting: q.observe})
	g.hold = time.Hour
	g.Follow(1, false)
	const at = "/k8s/clusters/c-1"
	c := httpClient(t, g.Wrap(&rest.Config{Host: s.URL + at}))
	ctx := context.Background()
	first := send(ctx, c, http.MethodPatch, s.URL+at+"/apis/x/v1/a")
	expectArrival(t, s, "PATCH "+at+"/apis/x/v1/a")
	lease := send(ctx, c, http.MethodPut, s.URL+at+"/apis/coordination.k8s.io/v1/namespaces/n/leases/l")
	expectArrival(t, s, "PUT "+at+"/apis/coordination.k8s.io/v1/namespaces/n/leases/l")
	event := send(ctx, c, http.MethodPost, s.URL+at+"/api/v1/namespaces/n/events")
	q.await(t, 1)
	write := send(ctx, c, http.MethodPut, s.URL+at+"/apis/x/v1/b")
	q.await(t, 2)
	s.release(at+"/apis/x/v1/a", at+"/apis/coordination.k8s.io/v1/namespaces/n/leases/l")
	expectArrival(t, s, "PUT "+at+"/apis/x/v1/b") // the Event, in its lane, goes after
	s.release(at + "/apis/x/v1/b")
	expectArrival(t, s, "POST "+at+"/api/v1/namespaces/n/events")
	s.release(at + "/api/v1/namespaces/n/events")
	expectDone(t, first, lease, write, event)
}

func TestNotSentOnlyWhenNoAttemptLeft(t *testing.T) {
	q := newQueued()
	s, _, c := newGate(t, 1, Observer{Waiting: q.observe})
	first := send(context.Background(), c, http.MethodPatch, s.URL+"/a")
	expectArrival(t, s, "PATCH /a")

	ctx, cancel := context.WithCancel(WithFirst(context.Background()))
	waiting := send(ctx, c, http.MethodPatch, s.URL+"/grant")
	q.await(t, 1)
	cancel()
	if err := <-waiting; !errors.Is(err, ErrNotSent) {
		t.Fatalf("a grant whose context ended while it waited returned %v, want ErrNotSent", err)
	}
	// A context already ended is not sent either.
	if err := <-send(ctx, c, http.MethodPatch, s.URL+"/grant"); !errors.Is(err, ErrNotSent) {
		t.Fatalf("a grant whose context had ended returned %v, want ErrNotSent", err)
	}
	s.release("/a")
	expectDone(t, first)

	// An attempt let through, then a resend that waits and ends: the
	// first may have committed, so the error says nothing of the kind.
	ctx, cancel = context.WithCancel(WithFirst(context.Background()))
	defer cancel()
	sent := send(ctx, c, http.MethodPatch, s.URL+"/resent")
	expectArrival(t, s, "PATCH /resent")
	resend := send(ctx, c, http.MethodPatch, s.URL+"/resent")
	q.await(t, 1)
	cancel()
	if err := <-resend; errors.Is(err, ErrNotSent) || !errors.Is(err, context.Canceled) {
		t.Fatalf("a resend whose first attempt was sent returned %v, want context.Canceled and not ErrNotSent", err)
	}
	if err := <-sent; !errors.Is(err, context.Canceled) {
		t.Fatalf("the first attempt returned %v, want context.Canceled", err)
	}
}
