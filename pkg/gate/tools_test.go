package gate_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/internal/certs"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/gate"
)

func TestProbe(t *testing.T) {
	s := redistest.StartN(t, 1, redistest.Options{Password: "pw"})[0]
	// An authentication error is an answer: the member serves.
	if err := gate.Probe(s.Addr(), time.Second, false); err != nil {
		t.Fatalf("probe of a serving master: %v", err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := gate.Probe(s.Addr(), 200*time.Millisecond, false); err == nil {
		t.Fatal("probe of a dead master succeeded")
	}
	// Something that is not Redis.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			fmt.Fprint(c, "HTTP/1.1 400 Bad Request\r\n")
			_ = c.Close()
		}
	}()
	if err := gate.Probe(l.Addr().String(), time.Second, false); err == nil {
		t.Fatal("probe accepted a non-Redis reply")
	}
}

// TestProbeTLS: a TLS-only master answers a TLS probe (its certificate is
// not the probe's concern) and not a plaintext one.
func TestProbeTLS(t *testing.T) {
	ca, err := certs.NewCA("probe CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := certs.Issue(ca, certs.Request{CommonName: "redis", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Now: time.Now(), Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s := redistest.StartN(t, 1, redistest.Options{Password: "pw", TLS: &redistest.TLS{Cert: srv.Cert, Key: srv.Key, CA: ca.Cert}})[0]
	if err := gate.Probe(s.Addr(), time.Second, true); err != nil {
		t.Fatalf("TLS probe of a TLS master: %v", err)
	}
	if err := gate.Probe(s.Addr(), time.Second, false); err == nil {
		t.Fatal("plaintext probe of a TLS-only master succeeded")
	}
}

func TestMemberPort(t *testing.T) {
	t.Setenv("ORD", "3")
	if p, err := gate.MemberPort(7000, "ORD"); err != nil || p != 7003 {
		t.Fatalf("MemberPort = %d, %v", p, err)
	}
	if p, _ := gate.MemberPort(7000, ""); p != 7000 {
		t.Fatalf("no ordinal: %d", p)
	}
	t.Setenv("ORD", "x")
	if _, err := gate.MemberPort(7000, "ORD"); err == nil {
		t.Fatal("a bad ordinal was accepted")
	}
}
