package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/lockvalue"
	"github.com/redlock-operator/redlock-operator/internal/operator"
	"github.com/redlock-operator/redlock-operator/pkg/metrics"
	"github.com/redlock-operator/redlock-operator/pkg/redistest"
)

// The suite runs the controllers in-process against a real kube-apiserver
// and etcd (envtest, built by hack/build-envtest.sh) and real redis-server
// masters.

const (
	operatorNamespace = "redlock-system"
	// maxLockTTL of the test master sets: short, so that the quarantine of
	// a restarted master (maxLockTTL + drift + 1s) passes quickly.
	maxLockTTL = 2 * time.Second
)

var (
	cfg       *rest.Config
	k8s       client.Client
	testEnv   *envtest.Environment
	scheme    = runtime.NewScheme()
	suiteCtx  context.Context
	cancelAll context.CancelFunc
	values    *lockvalue.Deriver
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controllers")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	redis.SetLogger(quiet{})
	suiteCtx, cancelAll = context.WithCancel(context.Background())
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(), "run through `make test`, which builds the control plane and sets KUBEBUILDER_ASSETS")

	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	var err error
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	Expect(k8s.Create(suiteCtx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}})).To(Succeed())
	values, err = operator.LoadLockKey(suiteCtx, k8s, lockKeySecret)
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	cancelAll()
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

var lockKeySecret = types.NamespacedName{Namespace: operatorNamespace, Name: "redlock-operator-lock-key"}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// manager is one running operator manager.
type manager struct {
	cancel  context.CancelFunc
	done    chan error
	metrics *metrics.Metrics
}

// startManager runs the operator as the binary does, with leader election.
func startManager() *manager {
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                true,
		LeaderElectionID:              "redlock-operator-test",
		LeaderElectionNamespace:       operatorNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 ptr(4 * time.Second),
		RenewDeadline:                 ptr(3 * time.Second),
		RetryPeriod:                   ptr(200 * time.Millisecond),
		// Several managers run in this process, one after another.
		Controller: config.Controller{SkipNameValidation: ptr(true)},
		Cache:      operator.CacheOptions(),
	})
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(suiteCtx)
	m := &manager{cancel: cancel, done: make(chan error, 1), metrics: metrics.New()}
	cleanup, err := operator.Setup(ctx, mgr, operator.Options{
		LockKeySecret: lockKeySecret,
		ProbeInterval: 500 * time.Millisecond,
		Workers:       4,
		Metrics:       m.metrics,
		GateImage:     "redlock-operator:test",
	})
	Expect(err).NotTo(HaveOccurred())
	go func() {
		defer GinkgoRecover()
		err := mgr.Start(ctx)
		cleanup()
		m.done <- err
	}()
	return m
}

// stop stops the manager and waits for it.
func (m *manager) stop() {
	m.cancel()
	Eventually(m.done, 30*time.Second).Should(Receive(BeNil()))
}

func ptr[T any](v T) *T { return &v }

// masterSet is a set of real redis-server masters and its RedisMasterSet.
type masterSet struct {
	servers []*redistest.Server
	name    string
	ns      string
}

var startMu sync.Mutex

// newMasters starts n masters and creates a RedisMasterSet for them in ns.
func newMasters(ns, name string, n int) *masterSet {
	return newMastersTTL(ns, name, n, maxLockTTL)
}

// nodeTimeout of the test master sets: a loaded 2-core machine running
// envtest, five masters and the race detector misses the 20ms default of
// short TTLs now and then, and a lock needs every live master when two of
// five are down.
const nodeTimeout = 200 * time.Millisecond

// newMastersTTL is newMasters with the set's maxLockTTL.
func newMastersTTL(ns, name string, n int, maxTTL time.Duration) *masterSet {
	startMu.Lock()
	defer startMu.Unlock()
	dir := GinkgoT().TempDir()
	ms := &masterSet{name: name, ns: ns}
	for i := range n {
		s, err := redistest.Start(filepath.Join(dir, fmt.Sprint(i)), redistest.Options{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		ms.servers = append(ms.servers, s)
	}
	Expect(k8s.Create(suiteCtx, &v1alpha1.RedisMasterSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.RedisMasterSetSpec{
			External:    &v1alpha1.ExternalMasters{Addresses: redistest.Addrs(ms.servers)},
			MaxLockTTL:  metav1.Duration{Duration: maxTTL},
			NodeTimeout: &metav1.Duration{Duration: nodeTimeout},
		},
	})).To(Succeed())
	return ms
}

// newNamespace creates a namespace for one test.
func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"}}
	Expect(k8s.Create(suiteCtx, ns)).To(Succeed())
	return ns.Name
}

// get reads a key on one master ("" when absent or unreachable).
func get(s *redistest.Server, key string) string {
	c := s.Client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(suiteCtx, 300*time.Millisecond)
	defer cancel()
	v, err := c.Get(ctx, key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return ""
	}
	return v
}

// holdersOnQuorum returns the values found on the masters.
func valuesOn(ms *masterSet, key string) []string {
	out := make([]string, len(ms.servers))
	for i, s := range ms.servers {
		out[i] = get(s, key)
	}
	return out
}

func countEqual(vals []string, v string) int {
	n := 0
	for _, x := range vals {
		if x == v {
			n++
		}
	}
	return n
}

// newLock returns a DistributedLock on ms.
func newLock(ms *masterSet, name, key, holder string, ttl time.Duration) *v1alpha1.DistributedLock {
	return &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ms.ns, Name: name},
		Spec: v1alpha1.DistributedLockSpec{
			MasterSet:      ms.name,
			Key:            key,
			TTL:            metav1.Duration{Duration: ttl},
			HolderIdentity: holder,
		},
	}
}

func fetch(l *v1alpha1.DistributedLock) *v1alpha1.DistributedLock {
	out := &v1alpha1.DistributedLock{}
	Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(l), out)).To(Succeed())
	return out
}

func condition(l *v1alpha1.DistributedLock, typ string) *metav1.Condition {
	return meta.FindStatusCondition(l.Status.Conditions, typ)
}

// heldBy reports whether the status shows holder as holding the lock now.
func heldBy(l *v1alpha1.DistributedLock, holder string) bool {
	c := condition(l, v1alpha1.ConditionHeld)
	return c != nil && c.Status == metav1.ConditionTrue && l.Status.Holder != nil && l.Status.Holder.Identity == holder &&
		l.Status.ValidUntil != nil && time.Now().Before(l.Status.ValidUntil.Add(time.Second)) // validUntil is stored in whole seconds
}

func heldReason(l *v1alpha1.DistributedLock) string {
	if c := condition(l, v1alpha1.ConditionHeld); c != nil && c.Status == metav1.ConditionFalse {
		return c.Reason
	}
	return ""
}

func readyReason(l *v1alpha1.DistributedLock) string {
	if c := condition(l, v1alpha1.ConditionReady); c != nil {
		return string(c.Status) + "/" + c.Reason
	}
	return ""
}

// expectedValue is the Redis value of the lock's current grant.
func expectedValue(l *v1alpha1.DistributedLock) string {
	return values.Value(string(l.UID), l.Status.FencingToken)
}
