package redlock_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/internal/certs"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// tlsMaterial issues a CA, a serving certificate for 127.0.0.1 and a client
// certificate.
func tlsMaterial(t *testing.T) (ca, server, client certs.Pair) {
	t.Helper()
	now := time.Now()
	ca, err := certs.NewCA("redlock test CA", now)
	if err != nil {
		t.Fatal(err)
	}
	req := certs.Request{CommonName: "redis", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Now: now, Validity: time.Hour}
	if server, err = certs.Issue(ca, req); err != nil {
		t.Fatal(err)
	}
	req.CommonName, req.Client = "locker", true
	if client, err = certs.Issue(ca, req); err != nil {
		t.Fatal(err)
	}
	return ca, server, client
}

// TestTLS: over TLS (redis-server with tls-port only, requiring a client
// certificate), a client that trusts the masters' CA and presents its
// certificate acquires, extends and releases; a client without TLS, one
// trusting another CA and one without a client certificate get no vote —
// an error, not a hang or a crash — and write nothing.
func TestTLS(t *testing.T) {
	ca, server, client := tlsMaterial(t)
	otherCA, _, _ := tlsMaterial(t)
	opts := redistest.Options{TLS: &redistest.TLS{Cert: server.Cert, Key: server.Key, CA: ca.Cert, AuthClients: true, ClientCert: client.Cert, ClientKey: client.Key}}
	servers := redistest.StartN(t, 3, opts)
	addrs := redistest.Addrs(servers)
	ctx := context.Background()
	const nodeTimeout = 2 * time.Second // handshake failures, never timeouts

	tlsConfig := func(caPEM []byte, withClient bool) redlock.Option {
		t.Helper()
		var p *certs.Pair
		if withClient {
			p = &client
		}
		cfg, err := certs.ClientConfig(caPEM, p, "")
		if err != nil {
			t.Fatal(err)
		}
		return redlock.WithTLS(cfg)
	}

	t.Run("trusted with a client certificate", func(t *testing.T) {
		c := newClient(t, addrs, tlsConfig(ca.Cert, true), redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout))
		l, err := c.Acquire(ctx, "tls", time.Second, redlock.WithFencing())
		if err != nil {
			t.Fatalf("Acquire over TLS: %v", err)
		}
		for _, s := range servers {
			// The last SET may still be under way when the quorum answered.
			waitFor(t, 5*time.Second, "the lock's value on "+s.Addr(), func() bool { return value(t, s, "tls") == l.Value() })
		}
		if err := l.Extend(ctx); err != nil {
			t.Fatalf("Extend over TLS: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release over TLS: %v", err)
		}
	})

	for _, tc := range []struct {
		name string
		opts []redlock.Option
		want string // in the error
	}{
		{name: "plaintext"},
		{name: "another CA", opts: []redlock.Option{tlsConfig(otherCA.Cert, true)}, want: "certificate signed by unknown authority"},
		{name: "no client certificate", opts: []redlock.Option{tlsConfig(ca.Cert, false)}, want: "tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "tls-" + strings.ReplaceAll(tc.name, " ", "-")
			c := newClient(t, addrs, append(tc.opts, redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout))...)
			_, err := c.Acquire(ctx, key, time.Second)
			if !errors.Is(err, redlock.ErrQuorumUnavailable) {
				t.Fatalf("Acquire: %v, want ErrQuorumUnavailable", err)
			}
			if tc.want != "" && !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Acquire: %v, want it to say %q", err, tc.want)
			}
			for _, s := range servers {
				if v := value(t, s, key); v != "" {
					t.Fatalf("master %s holds %q after a refused handshake", s.Addr(), v)
				}
			}
		})
	}

	t.Run("one master of another CA is a no vote", func(t *testing.T) {
		foreignCA, foreign, _ := tlsMaterial(t)
		mixed := append(append([]*redistest.Server(nil), servers[:2]...), redistest.StartN(t, 1, redistest.Options{TLS: &redistest.TLS{Cert: foreign.Cert, Key: foreign.Key, CA: foreignCA.Cert}})...)
		c := newClient(t, redistest.Addrs(mixed), tlsConfig(ca.Cert, true), redlock.WithTries(1), redlock.WithNodeTimeout(nodeTimeout))
		l, err := c.Acquire(ctx, "tls-mixed", time.Second)
		if err != nil {
			t.Fatalf("Acquire with two of three trusted: %v", err)
		}
		defer func() { _ = l.Release(ctx) }()
		granted := 0
		for _, v := range l.Votes() {
			if v.Outcome == redlock.OutcomeGranted {
				granted++
			}
		}
		if granted != 2 {
			t.Fatalf("votes %+v: want the two trusted masters only", l.Votes())
		}
	})
}
