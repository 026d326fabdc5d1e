package masters

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/certs"
	"github.com/redlock-operator/redlock-operator/internal/managed"
)

// ErrTLSSecret reports a missing or unusable Secret of spec.tls.
var ErrTLSSecret = errors.New("tls secret")

// ErrNotOwned reports a Secret of a name the operator generates for a set
// that the set does not control: someone else made it (perhaps to plant a
// password or a CA key the operator would use). It is not used.
var ErrNotOwned = errors.New("not made by the operator for this set")

// ReadSecret reads a Secret a master set uses, in the set's namespace. A
// Secret the user names serves only when it carries the label
// v1alpha1.RedisCredentialsLabel: "true" (ErrNotOptedIn otherwise); when
// generated is true (the operator generates a Secret of this name for the
// set), only when the set controls it (ErrNotOwned otherwise), whatever its
// labels.
func ReadSecret(ctx context.Context, r client.Reader, ms *v1alpha1.RedisMasterSet, name string, generated bool) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: ms.Namespace, Name: name}, s); err != nil {
		return nil, err
	}
	switch {
	case generated && !metav1.IsControlledBy(s, ms):
		return nil, ErrNotOwned
	case !generated && s.Labels[v1alpha1.RedisCredentialsLabel] != "true":
		return nil, ErrNotOptedIn
	}
	return s, nil
}

// value is a Secret's non-empty value of key.
func value(s *corev1.Secret, key string) ([]byte, error) {
	v := s.Data[key]
	if len(v) == 0 {
		return nil, fmt.Errorf("%w %q", errNoKey, key)
	}
	return v, nil
}

// ServingPair reads a serving certificate and key (tls.crt, tls.key) from a
// Secret.
func ServingPair(s *corev1.Secret) (certs.Pair, error) {
	crt, err := value(s, certs.CertKey)
	if err != nil {
		return certs.Pair{}, err
	}
	key, err := value(s, certs.KeyKey)
	if err != nil {
		return certs.Pair{}, err
	}
	return certs.Pair{Cert: crt, Key: key}, nil
}

// credentials are what a set's client logs in and connects with.
type credentials struct {
	user, pass string
	tls        *tls.Config
	// version identifies the Secrets read: a change rebuilds the client.
	version string
}

// namesSecrets reports whether a set's client depends on Secrets, which
// are read again every SecretRecheck.
func namesSecrets(ms *v1alpha1.RedisMasterSet) bool {
	return ms.Spec.AuthSecretRef != nil || ms.Spec.TLS != nil
}

// credentials reads the set's auth and TLS Secrets.
func (r *Registry) credentials(ctx context.Context, ms *v1alpha1.RedisMasterSet) (credentials, error) {
	user, pass, authVersion, err := r.auth(ctx, ms)
	if err != nil {
		return credentials{}, err
	}
	cfg, tlsVersion, err := r.tlsConfig(ctx, ms)
	if err != nil {
		return credentials{}, err
	}
	return credentials{user: user, pass: pass, tls: cfg, version: authVersion + "/" + tlsVersion}, nil
}

// CABundle names where a set's client finds the CAs it trusts: the Secret,
// its key, and whether the operator generates it; an empty name means the
// system's roots.
func CABundle(ms *v1alpha1.RedisMasterSet) (name, key string, generated bool) {
	t := ms.Spec.TLS
	switch {
	case t.CASecretRef != nil:
		key = t.CASecretRef.Key
		if key == "" {
			key = certs.CAKey
		}
		return t.CASecretRef.Name, key, false
	case ms.Spec.Managed != nil && t.ServerSecretRef == nil:
		return managed.CASecretName(ms), certs.CAKey, true
	case t.ServerSecretRef != nil:
		return t.ServerSecretRef.Name, certs.CAKey, false
	default:
		return "", "", false
	}
}

// ReadCABundle reads the CAs a set's client trusts (nil: the system's).
func ReadCABundle(ctx context.Context, r client.Reader, ms *v1alpha1.RedisMasterSet) (pem []byte, version string, err error) {
	name, key, generated := CABundle(ms)
	if name == "" {
		return nil, "", nil
	}
	s, err := ReadSecret(ctx, r, ms, name, generated)
	if err == nil {
		pem, err = value(s, key)
	}
	if err == nil {
		_, err = certs.Pool(pem)
	}
	if err != nil {
		return nil, "", fmt.Errorf("%w %q (CA bundle): %w", ErrTLSSecret, name, err)
	}
	return pem, s.ResourceVersion, nil
}

// tlsConfig is the TLS configuration of a set's client (nil without
// spec.tls) and the versions of the Secrets it was read from.
func (r *Registry) tlsConfig(ctx context.Context, ms *v1alpha1.RedisMasterSet) (*tls.Config, string, error) {
	t := ms.Spec.TLS
	if t == nil {
		return nil, "", nil
	}
	caPEM, caVersion, err := ReadCABundle(ctx, r.Reader, ms)
	if err != nil {
		return nil, "", err
	}
	versions := []string{caVersion}
	var client *certs.Pair
	if ref := t.ClientSecretRef; ref != nil {
		s, err := ReadSecret(ctx, r.Reader, ms, ref.Name, false)
		var p certs.Pair
		if err == nil {
			p, err = ServingPair(s)
		}
		if err != nil {
			return nil, "", fmt.Errorf("%w %q (client certificate): %w", ErrTLSSecret, ref.Name, err)
		}
		client = &p
		versions = append(versions, s.ResourceVersion)
	}
	cfg, err := certs.ClientConfig(caPEM, client, t.ServerName)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrTLSSecret, err)
	}
	return cfg, strings.Join(versions, ","), nil
}
