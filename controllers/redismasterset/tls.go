package redismasterset

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/certs"
	"github.com/redlock-operator/redlock-operator/internal/managed"
	"github.com/redlock-operator/redlock-operator/internal/masters"
)

// EventCertificateIssued is the event of a serving certificate the operator
// issued (for a new set, or renewing one).
const EventCertificateIssued = "CertificateIssued"

// errUnsupportedSpec reports a spec the API server accepted but the
// controller cannot run; nothing is written until it changes.
var errUnsupportedSpec = errors.New("unsupported spec")

// servingTLS returns the certificate a TLS set's members are to serve (nil
// without spec.tls) and records it in status. A user's Secret is checked —
// its certificate parses, matches its key, chains to the CA the operator
// trusts, is valid now and names every member — before any member is
// rolled onto it; the operator's own is issued, or renewed when due.
func (r *Reconciler) servingTLS(ctx context.Context, ms *v1alpha1.RedisMasterSet, live *appsv1.StatefulSet, now time.Time) (*managed.Serving, error) {
	t := ms.Spec.TLS
	if t == nil {
		return nil, nil
	}
	caPEM, _, err := masters.ReadCABundle(ctx, r.APIReader, ms)
	if t.ServerSecretRef == nil && apierrors.IsNotFound(err) {
		caPEM, err = r.issueCA(ctx, ms, now)
	}
	if err != nil {
		return nil, err
	}
	roots, err := certs.Pool(caPEM)
	if err != nil {
		return nil, err
	}
	name, pair, leaf, err := r.currentServing(ctx, ms, live, roots, now)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", masters.ErrTLSSecret, name, err)
	}
	st := &v1alpha1.MasterTLSStatus{}
	if t.ServerSecretRef == nil {
		if err := managed.CheckCertificateDuration(ms); err != nil {
			return nil, fmt.Errorf("%w: %w", errUnsupportedSpec, err)
		}
		lead := managed.RenewLead(ms)
		if name == "" || !now.Before(certs.RenewAt(leaf.NotBefore, leaf.NotAfter, lead)) {
			if name, pair, leaf, err = r.issueServing(ctx, ms, now); err != nil {
				return nil, err
			}
		}
		st.RenewAt = &metav1.Time{Time: certs.RenewAt(leaf.NotBefore, leaf.NotAfter, lead)}
	}
	if t.ServerSecretRef != nil {
		// The members mount a checked copy, never the user's Secret: the
		// kubelet refreshes a mounted Secret in place, and a member
		// restarting later would serve whatever it holds by then.
		sec := managed.ServingSecret(ms, pair, caPEM)
		if err := r.createOnce(ctx, ms, sec); err != nil {
			return nil, err
		}
		name = sec.Name
	}
	st.SecretName, st.NotAfter = name, &metav1.Time{Time: leaf.NotAfter}
	ms.Status.TLS = st
	return &managed.Serving{Secret: name, Hash: managed.ServingHash(pair)}, nil
}

// liveServing is the certificate the StatefulSet's members mount now (nil
// when none): what they keep serving while a new one cannot be used.
func liveServing(ms *v1alpha1.RedisMasterSet, live *appsv1.StatefulSet) *managed.Serving {
	if name := managed.MountedSecret(live, managed.TLSVolume); name != "" && strings.HasPrefix(name, managed.ServingSecretPrefix(ms)) {
		return &managed.Serving{Secret: name, Hash: live.Spec.Template.Annotations[managed.AnnotationTLS]}
	}
	return nil
}

// currentServing reads the serving certificate in use and checks it: the
// user's Secret (any fault is an error), or the Secret the operator issued
// last — the one the StatefulSet mounts, else the one status records. An
// issued certificate that is gone or no longer checks returns an empty name:
// a new one is issued.
func (r *Reconciler) currentServing(ctx context.Context, ms *v1alpha1.RedisMasterSet, live *appsv1.StatefulSet, roots *x509.CertPool, now time.Time) (string, certs.Pair, *x509.Certificate, error) {
	if ref := ms.Spec.TLS.ServerSecretRef; ref != nil {
		s, err := masters.ReadSecret(ctx, r.APIReader, ms, ref.Name, false)
		if err != nil {
			return ref.Name, certs.Pair{}, nil, err
		}
		pair, leaf, err := checkServing(ms, s, roots, now)
		return ref.Name, pair, leaf, err
	}
	name := issuedSecretName(ms, live)
	if name == "" && live == nil {
		// A new set: its first certificate may be recorded in a status
		// the cache has not caught up with yet; issuing another would
		// leave the first behind.
		fresh := &v1alpha1.RedisMasterSet{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(ms), fresh); err != nil {
			return "", certs.Pair{}, nil, fmt.Errorf("read master set: %w", err)
		}
		name = issuedSecretName(fresh, nil)
	}
	if name == "" {
		return "", certs.Pair{}, nil, nil
	}
	s, err := masters.ReadSecret(ctx, r.APIReader, ms, name, true)
	switch {
	case apierrors.IsNotFound(err):
		return "", certs.Pair{}, nil, nil
	case err != nil:
		return name, certs.Pair{}, nil, err
	}
	pair, leaf, err := checkServing(ms, s, roots, now)
	if err != nil {
		return "", certs.Pair{}, nil, nil //nolint:nilerr // an issued certificate that no longer checks is replaced
	}
	return name, pair, leaf, nil
}

// issuedSecretName is the Secret of the certificate the operator issued
// last for a set: the one its StatefulSet mounts, else the one status
// records (a new set, whose StatefulSet is created by a later reconcile).
func issuedSecretName(ms *v1alpha1.RedisMasterSet, live *appsv1.StatefulSet) string {
	if cur := liveServing(ms, live); cur != nil {
		return cur.Secret
	}
	if st := ms.Status.TLS; st != nil && strings.HasPrefix(st.SecretName, managed.ServingSecretPrefix(ms)) {
		return st.SecretName
	}
	return ""
}

// checkServing reads a serving certificate from s and checks that it chains
// to roots for serving now and names every member of the set.
func checkServing(ms *v1alpha1.RedisMasterSet, s *corev1.Secret, roots *x509.CertPool, now time.Time) (certs.Pair, *x509.Certificate, error) {
	pair, err := masters.ServingPair(s)
	if err != nil {
		return certs.Pair{}, nil, err
	}
	leaf, err := certs.Check(pair, roots, now, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return certs.Pair{}, nil, err
	}
	hosts := managed.ExposedHosts(ms)
	for _, addr := range managed.Addresses(ms) {
		host, _, _ := net.SplitHostPort(addr)
		hosts = append(hosts, host)
	}
	for _, host := range hosts {
		if err := leaf.VerifyHostname(host); err != nil {
			return certs.Pair{}, nil, fmt.Errorf("%w: %w", certs.ErrUntrusted, err)
		}
	}
	return pair, leaf, nil
}

// issueCA creates the set's CA Secret and returns the CA certificate that
// was stored (another reconcile may have stored its own first).
func (r *Reconciler) issueCA(ctx context.Context, ms *v1alpha1.RedisMasterSet, now time.Time) ([]byte, error) {
	ca, err := certs.NewCA(ms.Namespace+"/"+ms.Name+" redlock CA", now)
	if err != nil {
		return nil, err
	}
	if err := r.createOnce(ctx, ms, managed.CASecret(ms, ca)); err != nil {
		return nil, err
	}
	pem, _, err := masters.ReadCABundle(ctx, r.APIReader, ms)
	return pem, err
}

// issueServing issues a serving certificate with the set's CA into a new
// Secret named by its content.
func (r *Reconciler) issueServing(ctx context.Context, ms *v1alpha1.RedisMasterSet, now time.Time) (string, certs.Pair, *x509.Certificate, error) {
	s, err := masters.ReadSecret(ctx, r.APIReader, ms, managed.CASecretName(ms), true)
	if err != nil {
		return "", certs.Pair{}, nil, fmt.Errorf("%w %q: %w", masters.ErrTLSSecret, managed.CASecretName(ms), err)
	}
	caPEM := s.Data[certs.CAKey]
	pair, err := certs.Issue(certs.Pair{Cert: caPEM, Key: s.Data[managed.CAKeyKey]}, managed.ServingRequest(ms, now))
	if err != nil {
		return "", certs.Pair{}, nil, fmt.Errorf("%w %q: %w", masters.ErrTLSSecret, managed.CASecretName(ms), err)
	}
	sec := managed.ServingSecret(ms, pair, caPEM)
	if err := r.createOnce(ctx, ms, sec); err != nil {
		return "", certs.Pair{}, nil, err
	}
	leaf, err := certs.Check(pair, nil, now, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return "", certs.Pair{}, nil, err
	}
	r.Recorder.Eventf(ms, nil, corev1.EventTypeNormal, EventCertificateIssued, "Issue", "serving certificate in Secret %s, valid until %s; the members roll onto it one at a time", sec.Name, leaf.NotAfter.UTC().Format(time.RFC3339))
	return sec.Name, pair, leaf, nil
}
