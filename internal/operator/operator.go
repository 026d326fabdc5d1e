// Package operator wires redlock-operator's controllers into a
// controller-runtime manager: the master-set client registry, the lock value
// key, the DistributedLock, DistributedSemaphore and RedisMasterSet
// reconcilers. The manager binary
// and the controller tests share it.
package operator

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/agentaccess"
	"github.com/redlock-operator/redlock-operator/controllers/distributedlock"
	"github.com/redlock-operator/redlock-operator/controllers/distributedsemaphore"
	"github.com/redlock-operator/redlock-operator/controllers/podgate"
	"github.com/redlock-operator/redlock-operator/controllers/redismasterset"
	"github.com/redlock-operator/redlock-operator/internal/eventlimit"
	"github.com/redlock-operator/redlock-operator/internal/lockvalue"
	"github.com/redlock-operator/redlock-operator/internal/managed"
	"github.com/redlock-operator/redlock-operator/internal/masters"
	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/writegate"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// DefaultEventQPS is the manager's --event-qps.
const DefaultEventQPS = 10

// Options configures Setup.
type Options struct {
	// Namespace is where the operator's own pods run: managed sets'
	// NetworkPolicies admit them to the Redis port.
	Namespace string
	// LockKeySecret holds the key lock values are derived from; it is
	// created with random bytes when missing.
	LockKeySecret types.NamespacedName
	// ProbeInterval of RedisMasterSets (default 10s).
	ProbeInterval time.Duration
	// Workers is the number of parallel DistributedLock reconciles.
	Workers int
	// StatusWriteQPS is the budget of held locks' validity refreshes per
	// second (default grants.DefaultWritesPerSecond).
	StatusWriteQPS float64
	// NoReleaseNotices: releases publish no notice and locks whose key
	// another holder has are tried for again after their retry delay
	// only (--release-notices=false).
	NoReleaseNotices bool
	// NoWaitingLines: locks wait in no line on the masters, and across
	// clusters the next holder is whichever attempt lands first
	// (--waiting-lines=false).
	NoWaitingLines bool
	// FailoverSlack is how long after the leader's last Lease renewal a
	// standby may take to lead and adopt every held lock; status keeps that
	// much validity ahead when a lock's ttl is at least twice it (0: none).
	FailoverSlack time.Duration
	// GrantRecheck is how long a lock whose grant waits for room in the
	// status writes waits for a reconcile the writer does not ask for
	// (0: 10s; tests set it long to see the writer's wake-ups alone).
	GrantRecheck time.Duration
	// RetryDelay is how long a lock whose acquisition failed waits to try
	// again (0: derived from its ttl; tests set it long to see the
	// wake-ups of release notices alone).
	RetryDelay time.Duration
	// StatusReportNamespace is where the status writer publishes what it
	// does (v1alpha1.StatusConfigMap), named as Manager, while this
	// manager leads: the leader election Lease's namespace, which
	// kubectl redlock reads. Empty: not published.
	StatusReportNamespace string
	Manager               string
	// EventQPS is how many Events a second the manager records, in bursts
	// of five seconds' worth; the rest are dropped and counted
	// (internal/eventlimit). 0: no limit; the manager's default is
	// DefaultEventQPS.
	EventQPS float64
	// Metrics receives the operator's metrics (registered by the caller).
	Metrics *metrics.Metrics
	// Registry, when set, gets the collector that reports what status
	// shows of every lock and master set at each scrape, on the leader
	// (metrics.StateCollector).
	Registry prometheus.Registerer
	// RedlockOptions are added to every master set's client (tests).
	RedlockOptions []redlock.Option
	// DefaultNodeTimeout is the per-master timeout of master sets that set
	// none; zero derives it from each lock's ttl.
	DefaultNodeTimeout time.Duration
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
	// GateImage is the operator's image, which managed Redis pods copy the
	// gate from.
	GateImage string
	// WatchNamespaces are the namespaces whose locks, master sets and pods
	// the operator serves (the same list as CacheOptions'); empty: all.
	WatchNamespaces []string
	// IgnoreNodes leaves out what the operator reads Nodes (cluster-scoped)
	// for: locks' HolderReachable condition, and managed members' zones
	// (their SurvivesZoneLoss condition is Unknown). A namespaced install
	// may not be allowed to read Nodes.
	IgnoreNodes bool
	// NoAgentAccess leaves the agents' Roles and RoleBindings
	// (controllers/agentaccess) to someone else.
	NoAgentAccess bool
	// PodCacheConfig is the connection the cache of gated pods watches
	// through; nil: the manager's. Tests route it through a proxy they can
	// stall, to make that cache stale while fresh reads still answer.
	PodCacheConfig *rest.Config
	// WriteGate is the gate the manager's config writes through
	// (GateWrites); nil: none.
	WriteGate *writegate.Gate
}

// GateWrites returns a copy of cfg whose writes wait in the manager while
// the status writer's refreshes need the API server (internal/writegate),
// and the gate for Options.WriteGate; m shows the writes waiting. Build
// the manager from the copy.
func GateWrites(cfg *rest.Config, m *metrics.Metrics) (*rest.Config, *writegate.Gate) {
	g := writegate.New(writegate.Observer{
		Waiting: func(n int) { m.APIWritesWaiting.Set(float64(n)) },
		Queued:  m.APIWritesWaited.Inc,
		Refused: func() { m.EventsDropped.WithLabelValues(writegate.EventsRefusedReason).Inc() },
	})
	return g.Wrap(cfg), g
}

// CacheOptions limits the manager's cache to the objects it owns, so that
// its memory does not grow with the cluster: Pods of managed master sets
// only (gated pods are watched through PodCache), and of StatefulSets,
// Services, ConfigMaps, PodDisruptionBudgets and NetworkPolicies only those
// a managed set owns, and of Roles and RoleBindings only the agents' (all
// labelled app.kubernetes.io/managed-by: redlock-operator). Secrets are
// never cached: they are read by name.
// With namespaces, every namespaced kind is listed and watched in those
// namespaces only (see WatchNamespaces); none: in the whole cluster.
func CacheOptions(namespaces ...string) cache.Options {
	members, err := labels.Parse(managed.LabelSet)
	if err != nil {
		panic(err) // a constant label key
	}
	owned := labels.SelectorFromSet(labels.Set{managed.LabelManagedBy: managed.ManagedByValue})
	return cache.Options{DefaultNamespaces: WatchNamespaces(namespaces), ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}:                   {Label: members},
		&appsv1.StatefulSet{}:           {Label: owned},
		&corev1.Service{}:               {Label: owned},
		&corev1.ConfigMap{}:             {Label: owned},
		&policyv1.PodDisruptionBudget{}: {Label: owned},
		&networkingv1.NetworkPolicy{}:   {Label: owned},
		&rbacv1.Role{}:                  {Label: owned},
		&rbacv1.RoleBinding{}:           {Label: owned},
	}}
}

// WatchNamespaces is a cache's DefaultNamespaces for the watched
// namespaces: nil (the whole cluster) when there are none. A cache limited
// to namespaces lists and watches each of them, never the cluster, so that
// namespaced Roles are enough; it refuses to read objects elsewhere.
func WatchNamespaces(namespaces []string) map[string]cache.Config {
	if len(namespaces) == 0 {
		return nil
	}
	m := make(map[string]cache.Config, len(namespaces))
	for _, ns := range namespaces {
		m[ns] = cache.Config{}
	}
	return m
}

// Setup adds the controllers to mgr. The returned cleanup closes the Redis
// clients; call it after the manager stopped.
func Setup(ctx context.Context, mgr manager.Manager, o Options) (cleanup func(), err error) {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New()
	}
	direct, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return nil, err
	}
	values, err := LoadLockKey(ctx, direct, o.LockKeySecret)
	if err != nil {
		return nil, err
	}
	registry := &masters.Registry{
		Reader:   mgr.GetAPIReader(),
		Observer: func(n types.NamespacedName) redlock.Observer { return o.Metrics.Observer(n.Namespace, n.Name) },
		Options:  o.RedlockOptions,

		ReleaseNotices:     !o.NoReleaseNotices,
		DefaultNodeTimeout: o.DefaultNodeTimeout,
	}
	recorder := eventlimit.New(mgr.GetEventRecorder("redlock-operator"), o.EventQPS, int(5*o.EventQPS), o.Metrics.EventsDropped, logf.Log.WithName("events"))
	pods, err := PodCache(mgr, o.PodCacheConfig, v1alpha1.LockLabel, o.WatchNamespaces...)
	if err != nil {
		return nil, err
	}
	semPods, err := PodCache(mgr, o.PodCacheConfig, v1alpha1.SemaphoreLabel, o.WatchNamespaces...)
	if err != nil {
		return nil, err
	}
	if err := (&distributedlock.Reconciler{
		Pods:                    pods,
		Client:                  mgr.GetClient(),
		APIReader:               mgr.GetAPIReader(),
		Recorder:                recorder,
		Masters:                 registry,
		Values:                  values,
		Metrics:                 o.Metrics,
		Clock:                   o.Clock,
		MaxConcurrentReconciles: o.Workers,
		WriteGate:               o.WriteGate,
		StatusWriteQPS:          o.StatusWriteQPS,
		FailoverSlack:           o.FailoverSlack,
		GrantRecheck:            o.GrantRecheck,
		RetryDelay:              o.RetryDelay,
		Manager:                 o.Manager,
		IgnoreNodes:             o.IgnoreNodes,
		StatusReport:            statusReport(o.StatusReportNamespace),
		ReleaseNotices:          !o.NoReleaseNotices,
		WaitingLines:            !o.NoWaitingLines,
	}).SetupWithManager(ctx, mgr); err != nil {
		return nil, fmt.Errorf("set up DistributedLock controller: %w", err)
	}
	if err := (&redismasterset.Reconciler{
		Client:            mgr.GetClient(),
		APIReader:         mgr.GetAPIReader(),
		Recorder:          recorder,
		Masters:           registry,
		Metrics:           o.Metrics,
		Clock:             o.Clock,
		ProbeInterval:     o.ProbeInterval,
		GateImage:         o.GateImage,
		OperatorNamespace: o.Namespace,
		ReadNodes:         !o.IgnoreNodes,
	}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up RedisMasterSet controller: %w", err)
	}
	if err := (&distributedsemaphore.Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  recorder,
		Pods:      semPods,
		Clock:     o.Clock,
		Masters:   registry,
	}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up DistributedSemaphore controller: %w", err)
	}
	core, err := corev1client.NewForConfig(mgr.GetConfig())
	if err != nil {
		return nil, fmt.Errorf("core client: %w", err)
	}
	if err := (&podgate.Reconciler{
		Client:    mgr.GetClient(),
		Pods:      pods,
		Recorder:  recorder,
		Clock:     o.Clock,
		Evictions: core.RESTClient(),
		APIReader: mgr.GetAPIReader(),
		Waits:     o.Metrics.PodWait,
	}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up pod gate controller: %w", err)
	}
	if o.Registry != nil {
		state := &metrics.StateCollector{Objects: mgr.GetCache(), Pods: pods, SemaphorePods: semPods, Elected: mgr.Elected(), Now: o.Clock.Now, Log: logf.Log.WithName("metrics"),
			Synced: func(ctx context.Context) bool {
				return synced(ctx, mgr.GetCache(), &v1alpha1.DistributedLock{}, &v1alpha1.DistributedSemaphore{}, &v1alpha1.RedisMasterSet{}) &&
					synced(ctx, pods, &corev1.Pod{}) && synced(ctx, semPods, &corev1.Pod{})
			}}
		if err := o.Registry.Register(state); err != nil {
			return nil, fmt.Errorf("register the state collector: %w", err)
		}
		// The collector reads this manager's caches: it goes with them.
		go func() {
			<-ctx.Done()
			o.Registry.Unregister(state)
		}()
	}
	if !o.NoAgentAccess {
		if err := (&agentaccess.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Pods: pods, Recorder: recorder}).SetupWithManager(mgr); err != nil {
			return nil, fmt.Errorf("set up agent access controller: %w", err)
		}
	}
	return registry.Close, nil
}

// synced reports, without waiting, whether c's informers of objs have
// synced.
func synced(ctx context.Context, c cache.Cache, objs ...client.Object) bool {
	for _, obj := range objs {
		inf, err := c.GetInformer(ctx, obj, cache.BlockUntilSynced(false))
		if err != nil || !inf.HasSynced() {
			return false
		}
	}
	return true
}

// PodCache returns a cache of the pods labelled label (redlock.dev/lock:
// pods that request locks; redlock.dev/semaphore: pods that request a
// semaphore's slot), added to mgr: the operator watches no other pod but
// the members of managed master sets (see CacheOptions). With namespaces,
// only the labelled pods of those.
func PodCache(mgr manager.Manager, cfg *rest.Config, label string, namespaces ...string) (cache.Cache, error) {
	sel, err := labels.Parse(label)
	if err != nil {
		return nil, err
	}
	if cfg == nil {
		cfg = mgr.GetConfig()
	}
	c, err := cache.New(cfg, cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		DefaultNamespaces: WatchNamespaces(namespaces),
		ByObject:          map[client.Object]cache.ByObject{&corev1.Pod{}: {Label: sel}},
	})
	if err != nil {
		return nil, fmt.Errorf("pod cache: %w", err)
	}
	if err := mgr.Add(c); err != nil {
		return nil, err
	}
	return c, nil
}

// LoadLockKey reads the Secret holding the lock value key, creating it with
// fresh random bytes when it does not exist.
func LoadLockKey(ctx context.Context, c client.Client, key types.NamespacedName) (*lockvalue.Deriver, error) {
	var s corev1.Secret
	err := c.Get(ctx, key, &s)
	if apierrors.IsNotFound(err) {
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{"app.kubernetes.io/name": "redlock-operator"}},
			Data:       map[string][]byte{lockvalue.SecretKey: []byte(rand.Text() + rand.Text())},
		}
		err = c.Create(ctx, &s)
		if apierrors.IsAlreadyExists(err) { // another replica created it first
			err = c.Get(ctx, key, &s)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("lock key secret %s: %w", key, err)
	}
	d, err := lockvalue.New(s.Data[lockvalue.SecretKey])
	if err != nil {
		return nil, fmt.Errorf("lock key secret %s: %w", key, err)
	}
	return d, nil
}

// statusReport is the ConfigMap the status writer publishes in, in ns:
// none when ns is empty.
func statusReport(ns string) types.NamespacedName {
	if ns == "" {
		return types.NamespacedName{}
	}
	return types.NamespacedName{Namespace: ns, Name: v1alpha1.StatusConfigMap}
}
