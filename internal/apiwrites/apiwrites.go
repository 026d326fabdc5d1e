// Package apiwrites counts the writes a manager sends to the API server.
// The status writer measures the API server's capacity by them: in a
// second in which refreshes waited, every write that committed is what the
// API server took, whichever part of the manager sent it.
package apiwrites

import (
	"net/http"
	"strings"
	"sync/atomic"

	"k8s.io/client-go/rest"
)

// Counter counts the mutating requests that went through the configs it
// wrapped and that the API server did the work of: answered, and not with
// 429 (Too Many Requests, which client-go retries through the same
// transport) or a 5xx; and of them those that wrote Events. A request
// without such an answer (timed out, cancelled, refused for load) is not
// counted: it may never have reached the API server's storage, and
// counted it raised the capacity measured past what the API server took.
// A refusal on the object's own account (409, 422, 404) is work done, and
// counts. The zero value is ready to use.
type Counter struct{ writes, events atomic.Int64 }

// Wrap returns a copy of cfg whose mutating requests c counts. Clients,
// informers and the event recorder built from it all count.
func (c *Counter) Wrap(cfg *rest.Config) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &counting{c: c, next: rt} })
	return out
}

// Writes is how many writes were counted so far, and how many of them
// wrote Events (read first: an Event is counted after its write).
func (c *Counter) Writes() (all, events int64) {
	events = c.events.Load()
	return c.writes.Load(), events
}

// Mutating reports whether an HTTP method writes.
func Mutating(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// Resource is the resource (and subresource) a request path names:
// /apis/g/v/namespaces/ns/distributedlocks/l/status is
// "distributedlocks/status".
// A prefix before /api or /apis (an API server behind a path, as a
// cluster proxy serves it) is skipped.
func Resource(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i := 0; ; i++ {
		if i == len(parts) {
			return path
		}
		if parts[i] == "apis" && len(parts) >= i+3 {
			parts = parts[i+3:]
			break
		}
		if parts[i] == "api" && len(parts) >= i+2 {
			parts = parts[i+2:]
			break
		}
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

type counting struct {
	c    *Counter
	next http.RoundTripper
}

func (t *counting) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && Mutating(req.Method) && resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode < 500 {
		t.c.writes.Add(1)
		if Resource(req.URL.Path) == "events" {
			t.c.events.Add(1)
		}
	}
	return resp, err
}
