package certs_test

import (
	"crypto/x509"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/internal/certs"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func mustCA(t *testing.T) certs.Pair {
	t.Helper()
	ca, err := certs.NewCA("test CA", t0)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustIssue(t *testing.T, ca certs.Pair, client bool) certs.Pair {
	t.Helper()
	p, err := certs.Issue(ca, certs.Request{CommonName: "m", DNSNames: []string{"m.example"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Now: t0, Validity: 24 * time.Hour, Client: client})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCheck(t *testing.T) {
	ca, other := mustCA(t), mustCA(t)
	server, client := mustIssue(t, ca, false), mustIssue(t, ca, true)
	roots, err := certs.Pool(ca.Cert)
	if err != nil {
		t.Fatal(err)
	}
	otherRoots, err := certs.Pool(other.Cert)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		pair    certs.Pair
		roots   *x509.CertPool
		now     time.Time
		purpose x509.ExtKeyUsage
		want    error
	}{
		{name: "a server certificate of the CA", pair: server, roots: roots, now: t0, purpose: x509.ExtKeyUsageServerAuth},
		{name: "a client certificate of the CA", pair: client, roots: roots, now: t0, purpose: x509.ExtKeyUsageClientAuth},
		{name: "no CA to check against", pair: server, now: t0.Add(48 * time.Hour), purpose: x509.ExtKeyUsageServerAuth},
		{name: "certificate not PEM", pair: certs.Pair{Cert: []byte("not a certificate"), Key: server.Key}, roots: roots, now: t0, want: certs.ErrNoCertificate},
		{name: "PEM that is not a certificate", pair: certs.Pair{Cert: server.Key, Key: server.Key}, roots: roots, now: t0, want: certs.ErrNoCertificate},
		{name: "key of another certificate", pair: certs.Pair{Cert: server.Cert, Key: client.Key}, roots: roots, now: t0, want: certs.ErrKeyMismatch},
		{name: "key that is not PEM", pair: certs.Pair{Cert: server.Cert, Key: []byte("nope")}, roots: roots, now: t0, want: certs.ErrKeyMismatch},
		{name: "signed by another CA", pair: server, roots: otherRoots, now: t0, purpose: x509.ExtKeyUsageServerAuth, want: certs.ErrUntrusted},
		{name: "expired", pair: server, roots: roots, now: t0.Add(25 * time.Hour), purpose: x509.ExtKeyUsageServerAuth, want: certs.ErrUntrusted},
		{name: "not yet valid", pair: server, roots: roots, now: t0.Add(-2 * time.Hour), purpose: x509.ExtKeyUsageServerAuth, want: certs.ErrUntrusted},
		{name: "a client certificate used to serve", pair: client, roots: roots, now: t0, purpose: x509.ExtKeyUsageServerAuth, want: certs.ErrUntrusted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaf, err := certs.Check(tc.pair, tc.roots, tc.now, tc.purpose)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Check: error %v, want %v", err, tc.want)
			}
			if err == nil && leaf.Subject.CommonName != "m" {
				t.Fatalf("leaf %q, want the certificate issued", leaf.Subject.CommonName)
			}
		})
	}
}

func TestPoolAndClientConfig(t *testing.T) {
	ca := mustCA(t)
	client := mustIssue(t, ca, true)
	if _, err := certs.Pool([]byte("garbage")); !errors.Is(err, certs.ErrNoCertificate) {
		t.Fatalf("Pool(garbage): %v, want ErrNoCertificate", err)
	}
	if _, err := certs.ClientConfig([]byte("garbage"), nil, ""); !errors.Is(err, certs.ErrNoCertificate) {
		t.Fatalf("ClientConfig(garbage CA): %v, want ErrNoCertificate", err)
	}
	if _, err := certs.ClientConfig(ca.Cert, &certs.Pair{Cert: client.Cert, Key: ca.Key}, ""); !errors.Is(err, certs.ErrKeyMismatch) {
		t.Fatalf("ClientConfig(mismatched client pair): %v, want ErrKeyMismatch", err)
	}
	cfg, err := certs.ClientConfig(ca.Cert, &client, "m.example")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RootCAs == nil || len(cfg.Certificates) != 1 || cfg.ServerName != "m.example" {
		t.Fatalf("config: roots %v, %d certificates, server name %q", cfg.RootCAs != nil, len(cfg.Certificates), cfg.ServerName)
	}
	cfg, err = certs.ClientConfig(nil, nil, "")
	if err != nil || cfg.RootCAs != nil {
		t.Fatalf("no CA: roots %v, err %v; want the system roots", cfg.RootCAs, err)
	}
}

func TestRenewAt(t *testing.T) {
	day := 24 * time.Hour
	for _, tc := range []struct {
		name string
		life time.Duration
		lead time.Duration
		want time.Duration // after notBefore
	}{
		{name: "two thirds of the life", life: 90 * day, lead: time.Hour, want: 60 * day},
		{name: "a roll longer than a third of the life starts earlier", life: 3 * day, lead: 2 * day, want: day},
		{name: "a roll as long as the life renews at once", life: day, lead: 2 * day, want: -day},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := certs.RenewAt(t0, t0.Add(tc.life), tc.lead).Sub(t0); got != tc.want {
				t.Fatalf("RenewAt: %v after notBefore, want %v", got, tc.want)
			}
		})
	}
}
