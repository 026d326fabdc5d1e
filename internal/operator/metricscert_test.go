package operator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

// pair writes a certificate for host and its key into dir.
func pair(t *testing.T, dir, host string) {
	t.Helper()
	crt, key, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"tls.crt": crt, "tls.key": key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// servedFor is the first DNS name of the certificate get serves.
func servedFor(t *testing.T, get func(*tls.ClientHelloInfo) (*tls.Certificate, error)) string {
	t.Helper()
	c, err := get(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(leaf.DNSNames) == 0 {
		return ""
	}
	return leaf.DNSNames[0]
}

// waitServed waits until get serves a certificate for host: within
// certwatcher's poll interval (10s) and the lookup's (1s), with slack for
// a loaded machine.
func waitServed(t *testing.T, get func(*tls.ClientHelloInfo) (*tls.Certificate, error), host string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for servedFor(t, get) != host {
		if time.Now().After(deadline) {
			t.Fatalf("serving a certificate for %q, want %q", servedFor(t, get), host)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The metrics endpoint serves a self-signed certificate until the mounted
// pair is there and valid, then the pair, then each pair that replaces it.
func TestServingCertificate(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	s, err := newServingCert(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	get := s.getCertificate
	// lookNow makes the next handshake look for the files.
	lookNow := func() { s.mu.Lock(); s.next = time.Time{}; s.mu.Unlock() }
	if got := servedFor(t, get); got != "localhost" {
		t.Fatalf("nothing mounted: serving a certificate for %q, want the self-signed one for localhost", got)
	}

	// A key that does not match the certificate is no pair: still the
	// self-signed one.
	pair(t, dir, "one.example")
	other := t.TempDir()
	pair(t, other, "other.example")
	key, err := os.ReadFile(filepath.Join(other, "tls.key")) //nolint:gosec // the test's own file
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), key, 0o600); err != nil { //nolint:gosec // the test's own directory
		t.Fatal(err)
	}
	lookNow()
	if got := servedFor(t, get); got != "localhost" {
		t.Fatalf("mismatched pair: serving a certificate for %q, want the self-signed one", got)
	}
	s.mu.Lock()
	failed := s.failed
	s.mu.Unlock()
	if failed == "" {
		t.Error("the mismatched pair is not reported")
	}

	pair(t, dir, "one.example")
	waitServed(t, get, "one.example")
	pair(t, dir, "two.example") // the rotator's next certificate, as the kubelet updates the mount
	waitServed(t, get, "two.example")
}
