package apiproxy

import (
	"bufio"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// backend is an API server stand-in over TLS that wants a bearer token and
// records when each request arrived.
type backend struct {
	*httptest.Server
	mu       sync.Mutex
	arrivals map[string][]time.Time // by method
	stream   chan struct{}          // a watch sends its second event once this closes
}

func newBackend(t *testing.T) *backend {
	b := &backend{arrivals: map[string][]time.Time{}, stream: make(chan struct{})}
	b.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer secret" {
			http.Error(w, "no credentials", http.StatusUnauthorized)
			return
		}
		b.mu.Lock()
		b.arrivals[r.Method] = append(b.arrivals[r.Method], time.Now())
		b.mu.Unlock()
		if r.URL.Query().Get("watch") == "true" {
			_, _ = io.WriteString(w, "event 1\n")
			w.(http.Flusher).Flush()
			<-b.stream
			_, _ = io.WriteString(w, "event 2\n")
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(b.Close)
	return b
}

func (b *backend) config() *rest.Config {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: b.Certificate().Raw})
	return &rest.Config{Host: b.URL, BearerToken: "secret", TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
}

func (b *backend) times(method string) []time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]time.Time(nil), b.arrivals[method]...)
}

// do sends method to the proxy and fails on anything but 200.
func do(t *testing.T, p *Proxy, method, path string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, p.Config().Host+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %s", method, path, resp.Status)
	}
	return resp
}

func start(t *testing.T, b *backend, l Limits) *Proxy {
	p, err := Start(b.config(), l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// Writes begin at most WritesPerSecond a second, however many wait; the
// proxy's own credentials reach the API server, the client needs none.
func TestWritesPerSecond(t *testing.T) {
	b := newBackend(t)
	const perSecond, n = 20.0, 10
	p := start(t, b, Limits{WritesPerSecond: perSecond})
	if cfg := p.Config(); cfg.BearerToken != "" || len(cfg.CAData) != 0 || !strings.HasPrefix(cfg.Host, "http://127.0.0.1:") {
		t.Fatalf("the proxy's config %+v: want plain HTTP on loopback without credentials", cfg)
	}
	begin := time.Now()
	var wg sync.WaitGroup
	for _, m := range []string{"POST", "PUT", "PATCH", "DELETE", "POST", "PUT", "PATCH", "DELETE", "POST", "PUT"}[:n] {
		wg.Go(func() { _ = do(t, p, m, "/api/v1/namespaces/x/configmaps").Body.Close() })
	}
	wg.Wait()
	var all []time.Time
	for _, m := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		all = append(all, b.times(m)...)
	}
	if len(all) != n {
		t.Fatalf("%d writes arrived, want %d", len(all), n)
	}
	// The first write may begin at once, each next one 1/perSecond after
	// the one before: the last begins (n-1)/perSecond after the first at
	// the earliest. Load can only make it later.
	if took, want := time.Since(begin), time.Duration(float64(n-1)/perSecond*float64(time.Second)); took < want {
		t.Errorf("%d writes were done within %v, want at least %v at %v a second", n, took, want, perSecond)
	}
	if s := p.Stats(); s.Writes != n || s.Reads != 0 || s.WriteWait <= 0 {
		t.Errorf("stats %+v, want %d writes that waited", s, n)
	}
	if by := p.Stats().WritesBy; by["POST configmaps"] != 3 || by["PUT configmaps"] != 3 || by["PATCH configmaps"] != 2 || by["DELETE configmaps"] != 2 {
		t.Errorf("writes by kind %v, want 3 POST, 3 PUT, 2 PATCH, 2 DELETE of configmaps", by)
	}
}

func TestResourceOf(t *testing.T) {
	for path, want := range map[string]string{
		"/apis/redlock.dev/v1alpha1/namespaces/ns/distributedlocks/l/status": "distributedlocks/status",
		"/apis/redlock.dev/v1alpha1/namespaces/ns/distributedlocks/l":        "distributedlocks",
		"/api/v1/namespaces/ns/events":                                       "events",
		"/apis/coordination.k8s.io/v1/namespaces/ns/leases/l":                "leases",
		"/api/v1/namespaces/ns":                                              "namespaces",
		"/api/v1/namespaces":                                                 "namespaces",
		"/apis/redlock.dev/v1alpha1/distributedlocks":                        "distributedlocks",
		"/version": "/version",
	} {
		if got := resourceOf(path); got != want {
			t.Errorf("resourceOf(%q) = %q, want %q", path, got, want)
		}
	}
}

// Reads pass while writes queue; Set lifts the limit for the writes after
// it.
func TestReadsPassAndSet(t *testing.T) {
	b := newBackend(t)
	p := start(t, b, Limits{WritesPerSecond: 0.5})
	_ = do(t, p, "POST", "/a").Body.Close() // takes the one turn
	queued := make(chan struct{})
	go func() { _ = do(t, p, "POST", "/b").Body.Close(); close(queued) }() // its turn is 2 s after the first's
	_ = do(t, p, "GET", "/c").Body.Close()
	<-queued
	if read, write := b.times("GET")[0], b.times("POST")[1]; !read.Before(write) {
		t.Errorf("the read arrived %v after the queued write: reads must not wait for a write's turn", read.Sub(write))
	}
	p.Set(Limits{})
	begin := time.Now()
	for range 20 {
		_ = do(t, p, "PATCH", "/d").Body.Close()
	}
	// At 0.5 a second, 20 writes would take 38 s; without a limit they
	// take what the machine takes. 38 s is the old limit's bound, not a
	// speed asked of this machine.
	if took := time.Since(begin); took >= 38*time.Second {
		t.Errorf("20 writes after Set took %v: the limit was not lifted", took)
	}
}

// Every request waits out the latency before it is sent on.
func TestLatency(t *testing.T) {
	b := newBackend(t)
	const latency = 200 * time.Millisecond
	p := start(t, b, Limits{Latency: latency})
	for _, m := range []string{"GET", "POST"} {
		sent := time.Now()
		_ = do(t, p, m, "/x").Body.Close()
		if arrived := b.times(m)[0]; arrived.Sub(sent) < latency {
			t.Errorf("%s arrived %v after it was sent, want at least %v", m, arrived.Sub(sent), latency)
		}
	}
}

// SetAt changes the limits when it says, not before.
func TestSetAt(t *testing.T) {
	b := newBackend(t)
	p := start(t, b, Limits{})
	at := time.Now().Add(100 * time.Millisecond)
	p.SetAt(at, Limits{Latency: 300 * time.Millisecond})
	deadline := time.Now().Add(30 * time.Second)
	for {
		p.mu.Lock()
		latency, changed := p.latency, p.changed
		p.mu.Unlock()
		if latency == 300*time.Millisecond {
			if changed.Before(at) {
				t.Errorf("changed at %v, before %v", changed, at)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the change never took place")
		}
		time.Sleep(10 * time.Millisecond)
	}
	sent := time.Now()
	_ = do(t, p, "GET", "/x").Body.Close()
	if got := b.times("GET"); got[len(got)-1].Sub(sent) < 300*time.Millisecond {
		t.Errorf("a read after the change arrived %v after it was sent, want at least 300ms", got[len(got)-1].Sub(sent))
	}
}

// A watch streams: its first event reaches the client while the API server
// still holds the response open.
func TestWatchStreams(t *testing.T) {
	b := newBackend(t)
	p := start(t, b, Limits{WritesPerSecond: 1, Latency: time.Millisecond})
	resp := do(t, p, "GET", "/api/v1/configmaps?watch=true")
	defer func() { _ = resp.Body.Close() }()
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	if err != nil || line != "event 1\n" {
		t.Fatalf("first event %q, %v", line, err)
	}
	close(b.stream)
	if line, err = r.ReadString('\n'); err != nil || line != "event 2\n" {
		t.Fatalf("second event %q, %v", line, err)
	}
}
