package operator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"sync"
	"time"

	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// MetricsCertOptions configures the certificate the operator issues for
// its metrics endpoint, so that scrapers can verify it.
type MetricsCertOptions struct {
	// Namespace of the operator: the Service and the certificate Secret.
	Namespace string
	// ServiceName is the metrics Service; the certificate is issued for
	// <service>.<namespace>.svc.
	ServiceName string
	// SecretName holds the CA (ca.crt, which scrapers trust) and the
	// certificate.
	SecretName string
	// CertDir is where the Secret is mounted, the metrics server's
	// certificate directory.
	CertDir string
}

// The metrics certificate's Secret, by the default of --metrics-secret-name.
// +kubebuilder:rbac:groups="",namespace=redlock-system,resources=secrets,verbs=update,resourceNames=redlock-operator-metrics-server-cert

// SetupMetricsCertificate runs cert-controller's rotator for the metrics
// endpoint's certificate: a CA and a certificate for the metrics Service,
// in a Secret of their own, rotated before they expire. The metrics server
// serves it once mounted (ServingCertificate).
func SetupMetricsCertificate(ctx context.Context, mgr manager.Manager, o MetricsCertOptions) error {
	_, err := addRotator(ctx, mgr, certificate{
		Namespace: o.Namespace, SecretName: o.SecretName, CertDir: o.CertDir,
		DNSName: fmt.Sprintf("%s.%s.svc", o.ServiceName, o.Namespace), Controller: "metrics-cert-rotator",
	})
	if err != nil {
		return fmt.Errorf("metrics certificate: %w", err)
	}
	return nil
}

// ServingCertificate is a tls.Config GetCertificate that serves the key
// pair in dir (tls.crt, tls.key), reloaded when it changes
// (controller-runtime's certwatcher), from the moment it is there: the
// kubelet mounts a Secret the rotator filled up to a sync period after it
// was filled. Until then it serves a self-signed certificate, which no
// scraper that verifies accepts. It looks for the files at most once a
// second, until ctx ends.
func ServingCertificate(ctx context.Context, dir string) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), error) {
	s, err := newServingCert(ctx, dir)
	if err != nil {
		return nil, err
	}
	return s.getCertificate, nil
}

func newServingCert(ctx context.Context, dir string) (*servingCert, error) {
	crt, key, err := certutil.GenerateSelfSignedCertKey("localhost", []net.IP{{127, 0, 0, 1}}, nil)
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	fallback, err := tls.X509KeyPair(crt, key)
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	return &servingCert{ctx: ctx, dir: dir, fallback: &fallback}, nil
}

type servingCert struct {
	ctx      context.Context
	dir      string
	fallback *tls.Certificate

	mu      sync.Mutex
	watcher *certwatcher.CertWatcher
	next    time.Time // when to look for the files again
	failed  string    // the last error other than files not there, logged once
}

func (s *servingCert) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if w := s.current(); w != nil {
		return w.GetCertificate(hello)
	}
	return s.fallback, nil
}

// current is the watcher of the files once they are there.
func (s *servingCert) current() *certwatcher.CertWatcher {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watcher != nil || s.ctx.Err() != nil || time.Now().Before(s.next) {
		return s.watcher
	}
	s.next = time.Now().Add(time.Second)
	logger := log.FromContext(s.ctx).WithValues("dir", s.dir)
	w, err := certwatcher.New(filepath.Join(s.dir, "tls.crt"), filepath.Join(s.dir, "tls.key"))
	if err != nil {
		// Not mounted yet is expected; anything else (a bad pair, no
		// inotify instance left) is said once.
		if !errors.Is(err, fs.ErrNotExist) && err.Error() != s.failed {
			s.failed = err.Error()
			logger.Error(err, "cannot serve the mounted certificate: serving a self-signed one")
		}
		return nil
	}
	go func() {
		err := w.Start(s.ctx)
		if err == nil || s.ctx.Err() != nil {
			return
		}
		// The watcher could not watch the files (no inotify watch left):
		// read them on a ticker instead, as certwatcher polls.
		logger.Error(err, "certificate watcher stopped: reading the certificate every 10s instead")
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-s.ctx.Done():
				return
			case <-t.C:
				if err := w.ReadCertificate(); err != nil {
					logger.Error(err, "cannot read the mounted certificate: serving the previous one")
				}
			}
		}
	}()
	logger.Info("serving the mounted certificate")
	s.watcher, s.failed = w, ""
	return w
}
