package managed

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/certs"
)

// DefaultCertificateDuration is the lifetime of the serving certificates
// the operator issues when spec.tls.certificateDuration is not set.
const DefaultCertificateDuration = 90 * 24 * time.Hour

// CAKeyKey is the key of the CA's private key in the CA Secret.
const CAKeyKey = "ca.key"

// memberRestart bounds how long a member pod takes to be replaced and to
// start, besides its restart delay and the voting margin.
const memberRestart = 30 * time.Second

// CASecretName is the Secret of the CA the operator issues a set's serving
// certificates with.
func CASecretName(ms *v1alpha1.RedisMasterSet) string { return ms.Name + "-tls-ca" }

// ServingSecretPrefix starts the names of the serving-certificate Secrets
// the operator issues for a set (a hash of the certificate follows).
func ServingSecretPrefix(ms *v1alpha1.RedisMasterSet) string { return ms.Name + "-tls-" }

// CertificateDuration is the lifetime of the set's issued certificates.
func CertificateDuration(ms *v1alpha1.RedisMasterSet) time.Duration {
	if t := ms.Spec.TLS; t != nil && t.CertificateDuration != nil {
		return t.CertificateDuration.Duration
	}
	return DefaultCertificateDuration
}

// RollTime bounds how long a roll of every member takes: one at a time,
// each replaced, waiting out its restart delay and counted again.
func RollTime(ms *v1alpha1.RedisMasterSet) time.Duration {
	return time.Duration(ms.Spec.Managed.Replicas) * (RestartDelay(ms) + votingMargin + memberRestart)
}

// RenewLead is how long before its expiry a serving certificate is renewed
// at the latest: two rolls, so that a roll that stalls (a node drained, a
// member that cannot start) still ends before the old certificate expires.
func RenewLead(ms *v1alpha1.RedisMasterSet) time.Duration { return 2 * RollTime(ms) }

// CheckCertificateDuration reports a certificateDuration too short for the
// set to roll onto a renewed certificate before the old one expires: it
// must cover twice RenewLead, or every certificate would be renewed as
// soon as it is issued.
func CheckCertificateDuration(ms *v1alpha1.RedisMasterSet) error {
	if d, lead := CertificateDuration(ms), RenewLead(ms); d < 2*lead {
		return fmt.Errorf("tls.certificateDuration %v is too short: rolling %d members through a restart delay of %v takes up to %v, and a certificate must last at least twice two rolls (%v)",
			d, ms.Spec.Managed.Replicas, RestartDelay(ms), RollTime(ms), 2*lead)
	}
	return nil
}

// ServingRequest is the serving certificate of a set's members: every
// member's name under the headless Service, and loopback (the gate's
// probe, host-network members).
func ServingRequest(ms *v1alpha1.RedisMasterSet, now time.Time) certs.Request {
	svc := NamesOf(ms).Service + "." + ms.Namespace + ".svc"
	req := certs.Request{
		CommonName: svc,
		DNSNames:   []string{"*." + svc, "*." + svc + ".cluster.local", svc, "localhost"},
		IPs:        []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		Now:        now,
		Validity:   CertificateDuration(ms),
	}
	for _, h := range ExposedHosts(ms) {
		if ip := net.ParseIP(h); ip != nil {
			req.IPs = append(req.IPs, ip)
		} else {
			req.DNSNames = append(req.DNSNames, h)
		}
	}
	return req
}

// ExposedHosts are the hosts of the members' exposed addresses: the names
// other clusters verify their certificates by.
func ExposedHosts(ms *v1alpha1.RedisMasterSet) []string {
	var out []string
	for _, a := range ms.Spec.Managed.ExposedAddresses {
		if h, _, err := net.SplitHostPort(a); err == nil {
			out = append(out, h)
		}
	}
	return out
}

// CASecret holds the CA the operator issues a set's certificates with.
func CASecret(ms *v1alpha1.RedisMasterSet, ca certs.Pair) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: meta(ms, CASecretName(ms)),
		Immutable:  new(true),
		Data:       map[string][]byte{certs.CAKey: ca.Cert, CAKeyKey: ca.Key},
	}
}

// ServingSecret holds the certificate the members serve — one the operator
// issued, or a checked copy of the user's — named by its content (a renewal
// is a new Secret: none is ever updated).
func ServingSecret(ms *v1alpha1.RedisMasterSet, p certs.Pair, caPEM []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: meta(ms, ServingSecretPrefix(ms)+ServingHash(p)[:10]),
		Type:       corev1.SecretTypeTLS,
		Immutable:  new(true),
		Data:       map[string][]byte{certs.CertKey: p.Cert, certs.KeyKey: p.Key, certs.CAKey: caPEM},
	}
}

// ServingHash identifies the certificate and key in a serving Secret.
func ServingHash(p certs.Pair) string {
	h := sha256.New()
	h.Write(p.Cert)
	h.Write(p.Key)
	return hex.EncodeToString(h.Sum(nil)[:8])
}
