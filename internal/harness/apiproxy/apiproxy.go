// Package apiproxy is an API server of known capacity for tests and
// benchmarks: an HTTP proxy in front of a kube-apiserver (envtest's) that
// lets at most a given number of mutating requests (POST, PUT, PATCH,
// DELETE) begin a second, delays every request by a given latency, and
// changes both while it runs, at once or at a given time. Reads and watches
// are not rate limited, and watches stream.
//
// Clients reach it over plain HTTP on loopback, without credentials
// (Config); it calls the API server with the credentials of the
// rest.Config it was started with. toxiproxy, which the suites use for
// Redis, works on TCP streams: under TLS it cannot tell a write from a read
// or a watch, hence a proxy of HTTP requests.
package apiproxy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/rest"
)

// Limits are the capacity the proxy gives the API server.
type Limits struct {
	// WritesPerSecond is how many mutating requests may begin a second,
	// one every 1/WritesPerSecond (no burst); 0 is no limit.
	WritesPerSecond float64
	// Latency delays every request before it is sent on.
	Latency time.Duration
}

// Stats count what went through the proxy.
type Stats struct {
	// Writes and Reads are the requests sent on, mutating or not.
	Writes, Reads int64
	// WriteWait is the time writes spent waiting for their turn, summed.
	WriteWait time.Duration
	// WritesBy counts the writes by method and resource, e.g. "PATCH
	// distributedlocks/status" or "POST events".
	WritesBy map[string]int64
}

// Proxy is a running proxy; Close stops it.
type Proxy struct {
	srv *http.Server
	ln  net.Listener
	cfg *rest.Config

	mu      sync.Mutex
	limiter *rate.Limiter
	latency time.Duration
	timers  []*time.Timer
	changed time.Time // when Set last changed the limits

	writes, reads, waitNanos atomic.Int64
	writesBy                 map[string]int64 // under mu
}

// Start runs a proxy of the API server cfg names, with limits l, on a free
// loopback port.
func Start(cfg *rest.Config, l Limits) (*Proxy, error) {
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("API server address %q: %w", cfg.Host, err)
	}
	if target.Scheme == "" {
		target.Scheme = "https"
	}
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("transport to the API server: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, cfg: cfg, limiter: rate.NewLimiter(rate.Inf, 1), writesBy: map[string]int64{}}
	p.Set(l)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = transport
	rp.FlushInterval = -1 // watches stream
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		if !errors.Is(err, context.Canceled) {
			http.Error(w, "apiproxy: "+err.Error(), http.StatusBadGateway)
		}
	}
	p.srv = &http.Server{Handler: p.handler(rp), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// handler waits for a write's turn and the latency, then sends the request
// on.
func (p *Proxy) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		limiter, latency := p.limiter, p.latency
		p.mu.Unlock()
		if mutating(r.Method) {
			start := time.Now()
			if err := limiter.Wait(r.Context()); err != nil {
				return // the client went away while it waited
			}
			p.waitNanos.Add(int64(time.Since(start)))
			p.writes.Add(1)
			p.mu.Lock()
			p.writesBy[r.Method+" "+resourceOf(r.URL.Path)]++
			p.mu.Unlock()
		} else {
			p.reads.Add(1)
		}
		if latency > 0 {
			t := time.NewTimer(latency)
			select {
			case <-r.Context().Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		next.ServeHTTP(w, r)
	})
}

// resourceOf is the resource (and subresource) a request path names:
// /apis/g/v/namespaces/ns/distributedlocks/l/status is
// "distributedlocks/status".
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	default:
		return path
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return "namespaces"
	case 1, 2:
		return parts[0]
	default:
		return parts[0] + "/" + parts[2]
	}
}

func mutating(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// Set changes the limits now. Writes already waiting keep the turn they
// were given.
func (p *Proxy) Set(l Limits) {
	limit := rate.Inf
	if l.WritesPerSecond > 0 {
		limit = rate.Limit(l.WritesPerSecond)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.limiter.SetLimit(limit)
	p.latency = l.Latency
	p.changed = time.Now()
}

// SetAt changes the limits at t (now, if t has passed).
func (p *Proxy) SetAt(t time.Time, l Limits) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.timers = append(p.timers, time.AfterFunc(time.Until(t), func() { p.Set(l) }))
}

// Config is a rest.Config of the proxy: cfg's client settings (rate
// limits, timeouts, user agent), the proxy's address, no credentials.
func (p *Proxy) Config() *rest.Config {
	c := rest.AnonymousClientConfig(p.cfg)
	c.Host = "http://" + p.ln.Addr().String()
	c.TLSClientConfig = rest.TLSClientConfig{}
	return c
}

// Stats are the counts so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	by := maps.Clone(p.writesBy)
	p.mu.Unlock()
	return Stats{Writes: p.writes.Load(), Reads: p.reads.Load(), WriteWait: time.Duration(p.waitNanos.Load()), WritesBy: by}
}

// Close stops the proxy and its pending changes of limits, and ends the
// requests in flight (watches included).
func (p *Proxy) Close() error {
	p.mu.Lock()
	for _, t := range p.timers {
		t.Stop()
	}
	p.mu.Unlock()
	return p.srv.Close()
}
