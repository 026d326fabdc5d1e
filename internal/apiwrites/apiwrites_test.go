package apiwrites_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/redlock-operator/redlock-operator/internal/apiwrites"
)

func TestCounterCountsWritesAnswered(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Query().Get("load") != "":
			w.WriteHeader(http.StatusTooManyRequests) // refused for load: no work done
		case r.URL.Query().Get("fail") != "":
			w.WriteHeader(http.StatusServiceUnavailable)
		case r.Method == http.MethodPut:
			w.WriteHeader(http.StatusConflict) // refused on the object's account: the API server did the work
		}
	}))
	defer srv.Close()
	c := &apiwrites.Counter{}
	orig := &rest.Config{Host: srv.URL}
	cfg := c.Wrap(orig)
	if orig.WrapTransport != nil {
		t.Error("Wrap changed the config it was given")
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	send := func(method, path string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		_ = resp.Body.Close()
	}
	for _, m := range []string{http.MethodGet, http.MethodPatch, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead} {
		send(m, "/api/v1/namespaces/a/configmaps/b")
	}
	if all, events := c.Writes(); all != 4 || events != 0 {
		t.Errorf("writes counted = %d (%d Events), want 4 (PATCH, POST, PUT, DELETE), no Event", all, events)
	}
	send(http.MethodPost, "/api/v1/namespaces/a/events")
	send(http.MethodPatch, "/apis/events.k8s.io/v1/namespaces/a/events/e")
	send(http.MethodPatch, "/api/v1/namespaces/a/configmaps/b?load=1")
	send(http.MethodPatch, "/api/v1/namespaces/a/configmaps/b?fail=1")
	if all, events := c.Writes(); all != 6 || events != 2 {
		t.Errorf("after two Events, a 429 and a 503: writes counted = %d (%d Events), want 6 (2 Events)", all, events)
	}
	srv.Close()
	req, _ := http.NewRequest(http.MethodPatch, srv.URL+"/x", nil)
	if _, err := rt.RoundTrip(req); err == nil {
		t.Fatal("a write to a closed server succeeded")
	}
	if all, _ := c.Writes(); all != 6 {
		t.Errorf("writes counted after one that got no answer = %d, want 6", all)
	}
}

func TestResource(t *testing.T) {
	for path, want := range map[string]string{
		"/apis/redlock.dev/v1alpha1/namespaces/ns/distributedlocks/l/status": "distributedlocks/status",
		"/apis/redlock.dev/v1alpha1/namespaces/ns/distributedlocks/l":        "distributedlocks",
		"/apis/events.k8s.io/v1/namespaces/ns/events/e":                      "events",
		"/api/v1/namespaces/ns/events":                                       "events",
		"/apis/coordination.k8s.io/v1/namespaces/ns/leases/l":                "leases",
		"/api/v1/namespaces/ns":                                              "namespaces",
		"/api/v1/namespaces":                                                 "namespaces",
		"/apis/redlock.dev/v1alpha1/distributedlocks":                        "distributedlocks",
		"/version": "/version",
		"/k8s/clusters/c-1/apis/redlock.dev/v1alpha1/namespaces/ns/distributedlocks/l/status": "distributedlocks/status",
		"/k8s/clusters/c-1/api/v1/namespaces/ns/events":                                       "events",
	} {
		if got := apiwrites.Resource(path); got != want {
			t.Errorf("Resource(%q) = %q, want %q", path, got, want)
		}
	}
}
