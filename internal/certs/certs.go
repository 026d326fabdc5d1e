// Package certs issues and checks the X.509 material of TLS between the
// operator and Redis masters: a CA and serving certificates for managed
// master sets, checks of user-supplied PEM (it parses, the key matches the
// certificate, the certificate chains to the CA and is in its validity), and
// the client tls.Config built from them. Everything here is pure: PEM in,
// PEM or errors out; the caller reads and writes the Secrets.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Keys of TLS material in Secrets (those of kubernetes.io/tls Secrets and
// of cert-manager's).
const (
	CertKey = "tls.crt"
	KeyKey  = "tls.key"
	CAKey   = "ca.crt"
)

// Sentinel errors of Check and Pool: errors.Is tells what is wrong with
// user-supplied material.
var (
	// ErrNoCertificate reports PEM holding no certificate that parses.
	ErrNoCertificate = errors.New("no PEM certificate that parses")
	// ErrKeyMismatch reports a private key that does not parse or does
	// not belong to the certificate.
	ErrKeyMismatch = errors.New("private key does not parse or does not match the certificate")
	// ErrUntrusted reports a certificate that does not chain to the CA,
	// is not yet or no longer valid, or may not be used for the purpose.
	ErrUntrusted = errors.New("certificate not valid for the CA")
)

// Pair is a certificate and its private key, both PEM.
type Pair struct {
	Cert, Key []byte
}

// caValidity is the lifetime of an issued CA: its certificate is what
// clients trust, and it is not rotated by the operator.
const caValidity = 10 * 365 * 24 * time.Hour

// backdate covers clock skew between the operator and the masters.
const backdate = time.Hour

// NewCA issues a self-signed CA valid from now (minus an hour for clock
// skew) for ten years.
func NewCA(commonName string, now time.Time) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	return sign(tmpl, tmpl, key, key)
}

// Request describes a leaf certificate for Issue.
type Request struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	// Now is when it is issued; it is valid from an hour before (clock
	// skew) until Now + Validity.
	Now      time.Time
	Validity time.Duration
	// Client makes a client certificate instead of a server one.
	Client bool
}

// Issue signs a leaf certificate for req with the CA.
func Issue(ca Pair, req Request) (Pair, error) {
	caCert, caKey, err := parseCA(ca)
	if err != nil {
		return Pair{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, fmt.Errorf("generate key: %w", err)
	}
	usage := x509.ExtKeyUsageServerAuth
	if req.Client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: req.CommonName},
		DNSNames:     req.DNSNames,
		IPAddresses:  req.IPs,
		NotBefore:    req.Now.Add(-backdate),
		NotAfter:     req.Now.Add(req.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	return sign(tmpl, caCert, key, caKey)
}

func parseCA(ca Pair) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	pair, err := tls.X509KeyPair(ca.Cert, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("CA: %w: %w", ErrKeyMismatch, err)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, fmt.Errorf("CA: %w: not an ECDSA key", ErrKeyMismatch)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, fmt.Errorf("CA: %w: %w", ErrNoCertificate, err)
	}
	return cert, key, nil
}

func sign(tmpl, parent *x509.Certificate, key, parentKey *ecdsa.PrivateKey) (Pair, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return Pair{}, fmt.Errorf("sign certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Pair{}, fmt.Errorf("marshal key: %w", err)
	}
	return Pair{
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

// Pool parses a PEM bundle of CA certificates.
func Pool(caPEM []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("CA bundle: %w", ErrNoCertificate)
	}
	return pool, nil
}

// Check parses a certificate and its key and, when roots is not nil,
// verifies that the certificate chains to roots at now for the purpose
// (server or client authentication). It returns the leaf certificate.
func Check(p Pair, roots *x509.CertPool, now time.Time, purpose x509.ExtKeyUsage) (*x509.Certificate, error) {
	block, _ := pem.Decode(p.Cert)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, ErrNoCertificate
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCertificate, err)
	}
	if _, err := tls.X509KeyPair(p.Cert, p.Key); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyMismatch, err)
	}
	if roots == nil {
		return leaf, nil
	}
	inter := x509.NewCertPool() // further certificates after the leaf
	_, rest := pem.Decode(p.Cert)
	for {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{purpose}}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUntrusted, err)
	}
	return leaf, nil
}

// ClientConfig is the tls.Config of a client of the masters: it trusts
// caPEM (the system roots when empty), presents client when not nil, and
// verifies serverName (empty: each master's host name or IP).
func ClientConfig(caPEM []byte, client *Pair, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if len(caPEM) > 0 {
		pool, err := Pool(caPEM)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if client != nil {
		pair, err := tls.X509KeyPair(client.Cert, client.Key)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w: %w", ErrKeyMismatch, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// RenewAt is when a certificate valid from notBefore to notAfter is
// replaced: once two thirds of its life have passed, or earlier by lead
// (the time to roll every member onto a new one) before it expires.
func RenewAt(notBefore, notAfter time.Time, lead time.Duration) time.Time {
	at := notAfter.Add(-notAfter.Sub(notBefore) / 3)
	if byLead := notAfter.Add(-lead); byLead.Before(at) {
		return byLead
	}
	return at
}
