// Package testenv is the shared harness of the controller suites: a real
// kube-apiserver and etcd (envtest, built by hack/build-envtest.sh), the
// operator's manager run in-process as the binary runs it, and master sets
// of real redis-server processes. It is imported by tests only.
package testenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:staticcheck // a Ginkgo harness
	. "github.com/onsi/gomega"    //nolint:staticcheck // a Ginkgo harness
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/lockvalue"
	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/operator"
)

// Timeout is the default timeout of the suites' Eventually, and Poll their
// polling interval (see Configure).
const (
	Timeout = 15 * time.Second
	Poll    = 50 * time.Millisecond
)

// OperatorNamespace holds the operator's own objects (lock key, leases).
const OperatorNamespace = "redlock-system"

// MasterNodeTimeout of the test master sets: a loaded 2-core machine running
// envtest, five masters and the race detector misses short timeouts now
// and then, and a lock needs every live master when two of five are down.
const MasterNodeTimeout = 200 * time.Millisecond

// LockKeySecret is the Secret of the lock value key.
var LockKeySecret = types.NamespacedName{Namespace: OperatorNamespace, Name: "redlock-operator-lock-key"}

// Env is one control plane and a client of it.
type Env struct {
	Cfg    *rest.Config
	Client client.Client
	Scheme *kruntime.Scheme
	Ctx    context.Context
	// Values derives lock values with the operator's key.
	Values *lockvalue.Deriver
	// GateImage is the operator image managers started from now on run
	// with (default redlock-operator:test).
	GateImage string

	env    *envtest.Environment
	cancel context.CancelFunc
}

// Configure sets Gomega's defaults for the suites.
func Configure() {
	SetDefaultEventuallyTimeout(Timeout)
	SetDefaultEventuallyPollingInterval(Poll)
	SetDefaultConsistentlyPollingInterval(100 * time.Millisecond)
}

// Start starts a control plane with the project's CRDs.
func Start() *Env {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	redis.SetLogger(quiet{})
	Configure()
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(), "run through `make test`, which builds the control plane and sets KUBEBUILDER_ASSETS")
	e := &Env{Scheme: kruntime.NewScheme(), GateImage: "redlock-operator:test"}
	e.Ctx, e.cancel = context.WithCancel(context.Background())
	Expect(clientgoscheme.AddToScheme(e.Scheme)).To(Succeed())
	Expect(v1alpha1.AddToScheme(e.Scheme)).To(Succeed())
	_, file, _, _ := runtime.Caller(0)
	var err error
	for attempt := 1; ; attempt++ {
		e.env = &envtest.Environment{
			CRDDirectoryPaths:     []string{filepath.Join(filepath.Dir(file), "..", "..", "..", "config", "crd", "bases")},
			ErrorIfCRDPathMissing: true,
			Scheme:                e.Scheme,
		}
		e.Cfg, err = e.env.Start()
		// envtest waits a fixed 5s for the default namespace once the API
		// server is up; a CPU-starved machine (a second control plane
		// started while other suites and a hog run) can take longer.
		// Such a start is made again, on a fresh control plane.
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "default namespace didn't register") {
			break
		}
		GinkgoWriter.Printf("testenv: control plane start %d: %v; starting a fresh one\n", attempt, err)
		_ = e.env.Stop()
	}
	Expect(err).NotTo(HaveOccurred())
	e.Client, err = client.New(e.Cfg, client.Options{Scheme: e.Scheme})
	Expect(err).NotTo(HaveOccurred())
	Expect(e.Client.Create(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: OperatorNamespace}})).To(Succeed())
	e.Values, err = operator.LoadLockKey(e.Ctx, e.Client, LockKeySecret)
	Expect(err).NotTo(HaveOccurred())
	return e
}

// Kubeconfig writes a kubeconfig of an administrator of the control plane
// into dir and returns its path, for processes run beside the test.
func (e *Env) Kubeconfig(dir string) string {
	user, err := e.env.ControlPlane.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	kc, err := user.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	path := filepath.Join(dir, "kubeconfig")
	Expect(os.WriteFile(path, kc, 0o600)).To(Succeed())
	return path
}

// Stop stops the control plane.
func (e *Env) Stop() {
	if e == nil {
		return
	}
	e.cancel()
	if e.env != nil {
		Expect(e.env.Stop()).To(Succeed())
	}
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// mountSecret plays the kubelet's part for a Secret volume: it keeps the
// Secret's files in dir current until ctx ends.
func (e *Env) mountSecret(ctx context.Context, name types.NamespacedName, dir string) {
	for {
		var s corev1.Secret
		if err := e.Client.Get(ctx, name, &s); err == nil {
			for k, v := range s.Data {
				if cur, _ := os.ReadFile(filepath.Join(dir, k)); string(cur) != string(v) { //nolint:gosec // the test's own directory
					tmp := filepath.Join(dir, "."+k)
					if os.WriteFile(tmp, v, 0o600) == nil {
						_ = os.Rename(tmp, filepath.Join(dir, k))
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond): // the kubelet syncs volumes periodically too
		}
	}
}

// Webhook is where a test manager serves the mutating webhook.
type Webhook struct {
	Port    int
	Options operator.WebhookOptions
}

// Manager is one running operator manager.
type Manager struct {
	Metrics *metrics.Metrics
	// Registry holds Metrics and the state collector, as the binary's
	// registry does, for specs that read a scrape (Gather).
	Registry *prometheus.Registry
	cancel   context.CancelFunc
	done     chan error
}

// StartManager runs the operator as the binary does, with leader election.
func (e *Env) StartManager() *Manager { return e.StartManagerWith(nil) }

// StartManagerWith is StartManager with the mutating webhook when wh is not
// nil: served on wh.Port of localhost from a certificate the rotator keeps
// in wh.Options.CertDir.
func (e *Env) StartManagerWith(wh *Webhook) *Manager { return e.StartScopedManager(Scope{}, wh) }

// StartManagerAt is StartManager with the controllers reading time from
// clk.
func (e *Env) StartManagerAt(clk clock.PassiveClock) *Manager {
	return e.StartScopedManager(Scope{Clock: clk}, nil)
}

// Scope is whom a test manager acts as, what it watches and its clock.
type Scope struct {
	// Cfg is the manager's connection to the API server; nil: the
	// administrator's (Env.Cfg). A copy that impersonates a ServiceAccount
	// runs the manager with that account's RBAC.
	Cfg *rest.Config
	// WatchNamespaces limits the manager as --watch-namespaces does, and
	// like it turns off the reads of Nodes.
	WatchNamespaces []string
	// Clock is what the controllers read time from; nil: the real clock.
	Clock clock.PassiveClock
	// StatusWriteQPS is the budget of validity refreshes (0: the default).
	StatusWriteQPS float64
	// FailoverSlack is the manager's --failover-slack (0: none).
	FailoverSlack time.Duration
	// GrantRecheck is the manager's operator.Options.GrantRecheck.
	GrantRecheck time.Duration
	// RetryDelay is the manager's operator.Options.RetryDelay.
	RetryDelay time.Duration
	// NoReleaseNotices and NoWaitingLines are the manager's
	// --release-notices=false and --waiting-lines=false.
	NoReleaseNotices, NoWaitingLines bool
	// Workers is the manager's parallel reconciles per controller (0: 4).
	Workers int
	// StatusReportNamespace is where the status writer publishes its
	// report (operator.Options.StatusReportNamespace); empty: nowhere.
	StatusReportNamespace string
	// PodCacheCfg is the connection the cache of gated pods watches
	// through (nil: the manager's), e.g. through a proxy a test stalls.
	PodCacheCfg *rest.Config
	// Intercept, when set, sits between the controllers and the manager's
	// client (cached reads, writes): a test's fault, such as a cache read
	// that lags behind the API server, or a check before a write.
	Intercept *interceptor.Funcs
}

// StartScopedManager is StartManagerWith, as s says.
func (e *Env) StartScopedManager(s Scope, wh *Webhook) *Manager {
	cfg := s.Cfg
	if cfg == nil {
		cfg = e.Cfg
	}
	if wh != nil {
		wh.Options.WatchNamespaces = s.WatchNamespaces
	}
	var server webhook.Server
	if wh != nil {
		server = webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: wh.Port, CertDir: wh.Options.CertDir})
	}
	var newClient client.NewClientFunc
	if s.Intercept != nil {
		newClient = func(cfg *rest.Config, opts client.Options) (client.Client, error) {
			c, err := client.NewWithWatch(cfg, opts)
			if err != nil {
				return nil, err
			}
			return interceptor.NewClient(c, *s.Intercept), nil
		}
	}
	mgrMetrics := metrics.New()
	cfg, gate := operator.GateWrites(cfg, mgrMetrics)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		NewClient:                     newClient,
		WebhookServer:                 server,
		Scheme:                        e.Scheme,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                true,
		LeaderElectionID:              "redlock-operator-test",
		LeaderElectionNamespace:       OperatorNamespace,
		LeaderElectionReleaseOnCancel: true,
		// A stopping manager releases the Lease (ReleaseOnCancel), so the
		// next one leads within a retry period; the durations only need to
		// survive a loaded machine (4s/3s lost the lead under a CPU hog).
		LeaseDuration: ptr(15 * time.Second),
		RenewDeadline: ptr(10 * time.Second),
		RetryPeriod:   ptr(200 * time.Millisecond),
		// Several managers run in this process, one after another.
		Controller: config.Controller{SkipNameValidation: ptr(true)},
		Cache:      operator.CacheOptions(s.WatchNamespaces...),
	})
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(e.Ctx)
	m := &Manager{cancel: cancel, done: make(chan error, 1), Metrics: mgrMetrics, Registry: prometheus.NewPedanticRegistry()}
	Expect(m.Metrics.Register(m.Registry)).To(Succeed())
	cleanup, err := operator.Setup(ctx, mgr, operator.Options{
		Namespace:     OperatorNamespace,
		LockKeySecret: LockKeySecret,
		ProbeInterval: 500 * time.Millisecond,
		Workers:       cmp.Or(s.Workers, 4),
		Metrics:       m.Metrics,
		Registry:      m.Registry,
		GateImage:     e.GateImage,
		Clock:         s.Clock,

		WatchNamespaces: s.WatchNamespaces,
		IgnoreNodes:     len(s.WatchNamespaces) > 0,
		StatusWriteQPS:  s.StatusWriteQPS,
		FailoverSlack:   s.FailoverSlack,
		GrantRecheck:    s.GrantRecheck,
		RetryDelay:      s.RetryDelay,
		PodCacheConfig:  s.PodCacheCfg,

		NoReleaseNotices: s.NoReleaseNotices,
		NoWaitingLines:   s.NoWaitingLines,
		WriteGate:        gate,

		StatusReportNamespace: s.StatusReportNamespace,
		Manager:               "testenv",
	})
	Expect(err).NotTo(HaveOccurred())
	if wh != nil {
		Expect(operator.SetupWebhook(ctx, mgr, wh.Options)).To(Succeed())
		go e.mountSecret(ctx, types.NamespacedName{Namespace: wh.Options.Namespace, Name: wh.Options.SecretName}, wh.Options.CertDir)
	}
	go func() {
		defer GinkgoRecover()
		err := mgr.Start(ctx)
		cleanup()
		m.done <- err
	}()
	return m
}

// Stop stops the manager and waits for it.
func (m *Manager) Stop() {
	m.cancel()
	Eventually(m.done, 30*time.Second).Should(Receive(BeNil()), "the operator's manager (namespace %s) to stop cleanly", OperatorNamespace)
}

func ptr[T any](v T) *T { return &v }

// MasterSet is a set of real redis-server masters and its RedisMasterSet.
type MasterSet struct {
	Servers []*redistest.Server
	Name    string
	NS      string
	// Addresses name the servers in the RedisMasterSet (default: their
	// 127.0.0.1 addresses); e.g. localhost aliases, for a set naming the
	// same servers by other addresses.
	Addresses []string
}

var startMu sync.Mutex

// NewMasters starts n masters and creates an external RedisMasterSet for
// them in ns with the given maxLockTTL.
func (e *Env) NewMasters(ns, name string, n int, maxTTL time.Duration) *MasterSet {
	ms := &MasterSet{Name: name, NS: ns, Servers: StartServers(n, redistest.Options{})}
	e.CreateMasterSet(ms, maxTTL)
	return ms
}

// NewServingMasters is NewMasters, then waits until the set's status shows
// every master serving (fresh masters sit out their quarantine first).
func (e *Env) NewServingMasters(ns, name string, n int, maxTTL time.Duration) *MasterSet {
	ms := e.NewMasters(ns, name, n, maxTTL)
	e.WaitServing(ms, 0)
	return ms
}

// WaitServing waits until a running manager shows every master of ms
// serving (fresh masters sit out their quarantine first), for up to
// timeout (0: the suite's default).
func (e *Env) WaitServing(ms *MasterSet, timeout time.Duration) {
	var intervals []any
	if timeout > 0 {
		intervals = append(intervals, timeout)
	}
	Eventually(func(g Gomega) {
		set := &v1alpha1.RedisMasterSet{}
		g.Expect(e.Client.Get(e.Ctx, client.ObjectKey{Namespace: ms.NS, Name: ms.Name}, set)).To(Succeed())
		g.Expect(set.Status.Serving).To(BeEquivalentTo(len(ms.Servers)), "fresh masters sit out their quarantine first")
	}, intervals...).Should(Succeed(), "master set %s/%s to serve", ms.NS, ms.Name)
}

// StartServers starts n redis-server processes, stopped when the spec ends.
func StartServers(n int, opts redistest.Options) []*redistest.Server {
	startMu.Lock()
	defer startMu.Unlock()
	dir := GinkgoT().TempDir()
	var out []*redistest.Server
	for i := range n {
		s, err := redistest.Start(filepath.Join(dir, fmt.Sprint(i)), opts)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		out = append(out, s)
	}
	return out
}

// CreateMasterSet creates the RedisMasterSet of ms's servers in ms.NS (for
// a second control plane sharing the masters).
func (e *Env) CreateMasterSet(ms *MasterSet, maxTTL time.Duration) {
	Expect(e.Client.Create(e.Ctx, &v1alpha1.RedisMasterSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ms.NS, Name: ms.Name},
		Spec: v1alpha1.RedisMasterSetSpec{
			External:    &v1alpha1.ExternalMasters{Addresses: ms.addresses()},
			MaxLockTTL:  metav1.Duration{Duration: maxTTL},
			NodeTimeout: &metav1.Duration{Duration: MasterNodeTimeout},
		},
	})).To(Succeed())
}

func (ms *MasterSet) addresses() []string {
	if len(ms.Addresses) > 0 {
		return ms.Addresses
	}
	return redistest.Addrs(ms.Servers)
}

// NewNamespace creates a namespace for one test.
func (e *Env) NewNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"}}
	Expect(e.Client.Create(e.Ctx, ns)).To(Succeed())
	return ns.Name
}

// Get reads a key on one master ("" when absent or unreachable).
func Get(s *redistest.Server, key string) string {
	c := s.Client()
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	v, err := c.Get(ctx, key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return ""
	}
	return v
}

// ValuesOn returns the values of key found on each master.
func (ms *MasterSet) ValuesOn(key string) []string {
	out := make([]string, len(ms.Servers))
	for i, s := range ms.Servers {
		out[i] = Get(s, key)
	}
	return out
}

// CountEqual counts the entries of vals equal to v.
func CountEqual(vals []string, v string) int {
	n := 0
	for _, x := range vals {
		if x == v {
			n++
		}
	}
	return n
}

// EventReasons lists the reasons of the events about the object name in ns.
func (e *Env) EventReasons(ns, name string) []string {
	var list eventsv1.EventList
	Expect(e.Client.List(e.Ctx, &list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, ev := range list.Items {
		if ev.Regarding.Name == name {
			out = append(out, ev.Reason)
		}
	}
	return out
}
