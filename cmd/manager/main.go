// Command manager runs redlock-operator: the DistributedLock,
// DistributedSemaphore and RedisMasterSet controllers, with leader
// election, health probes and Prometheus metrics.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/operator"
	"github.com/redlock-operator/redlock-operator/internal/version"

	// A bundle of public roots, used only where the system has none, as in
	// the release's image: external masters whose TLS names no caSecretRef
	// are verified with the system's roots.
	_ "golang.org/x/crypto/x509roots/fallback"
)

// The lock value key (--lock-key-secret) and the webhook's certificate
// Secret are created when missing; the key is read by name.
// +kubebuilder:rbac:groups="",namespace=redlock-system,resources=secrets,verbs=get;create
// Leader election reads, creates and renews (updates) its Lease, and
// releases it with an update; it never lists, watches, patches or deletes.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=redlock-system,resources=leases,verbs=get;create;update
// +kubebuilder:rbac:groups="",namespace=redlock-system,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",namespace=redlock-system,resources=configmaps,verbs=create
// +kubebuilder:rbac:groups="",namespace=redlock-system,resources=configmaps,resourceNames=redlock-operator-status,verbs=patch
// The secure metrics endpoint asks the API server who a scraper is and
// whether it may read /metrics: a ClusterRole of its own, which
// --metrics-secure=false or --metrics-bind-address=0 does without.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create,roleName=metrics-auth-role
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create,roleName=metrics-auth-role

// flagValues are the manager's flags once parsed.
type flagValues struct {
	cfg         config
	qps         float64
	burst       int
	lockSecret  string
	showVersion bool
	zap         zap.Options
	// watchParsed completes cfg once the flags are parsed (watchFlags).
	watchParsed func()
}

// bindFlags registers every flag of the manager on fs (the kubeconfig
// flag aside: controller-runtime registers it on the command line).
// docs/reference/flags.md lists them; a test keeps the two the same.
func bindFlags(fs *flag.FlagSet, namespace string) *flagValues {
	f := &flagValues{}
	fs.StringVar(&f.cfg.metricsAddr, "metrics-bind-address", ":8443", "Address of the Prometheus metrics endpoint; 0 disables it.")
	fs.BoolVar(&f.cfg.metricsSecure, "metrics-secure", true,
		"Serve metrics over HTTPS, to scrapers the API server authenticates (TokenReview) and authorizes (SubjectAccessReview: get on the /metrics non-resource URL); false serves plain HTTP to anyone, for local use.")
	fs.StringVar(&f.cfg.metricsCert.CertDir, "metrics-cert-dir", "",
		"Directory holding tls.crt and tls.key for the metrics endpoint (reloaded when they change); a self-signed certificate is served until they are there. Empty: always self-signed.")
	fs.StringVar(&f.cfg.metricsCert.SecretName, "metrics-secret-name", "",
		"Secret (in the operator's namespace) into which the manager issues, and rotates, a CA (ca.crt, which scrapers verify with) and a certificate for --metrics-service-name; mount it at --metrics-cert-dir. Ignored when the endpoint is off or plain HTTP. Empty: none.")
	fs.StringVar(&f.cfg.metricsCert.ServiceName, "metrics-service-name", "redlock-operator-controller-manager-metrics-service",
		"Service in front of the metrics endpoint (the certificate of --metrics-secret-name names it).")
	fs.BoolVar(&f.cfg.enableHTTP2, "enable-http2", false, "Allow HTTP/2 on the metrics and webhook servers (off: HTTP/2 Rapid Reset and Stream Cancellation, CVE-2023-44487 and CVE-2023-39325).")
	fs.BoolVar(&f.showVersion, "version", false, "Print the version and exit.")
	fs.StringVar(&f.cfg.probeAddr, "health-probe-bind-address", ":8081", "Address of the health and readiness probes.")
	fs.StringVar(&f.cfg.pprofAddr, "pprof-bind-address", "0", "Address of Go's pprof endpoints (/debug/pprof/), for profiling; 0 disables them. Plain HTTP without authentication: bind it to localhost.")
	fs.BoolVar(&f.cfg.leaderElect, "leader-elect", true, "Elect a leader so that one manager acts at a time.")
	fs.StringVar(&f.cfg.leaderNamespace, "leader-election-namespace", namespace, "Namespace of the leader election Lease.")
	fs.DurationVar(&f.cfg.leaseDuration, "leader-elect-lease-duration", 8*time.Second, "How long a leader's Lease lasts without renewal; a replica waits that long before taking over from a leader that vanished.")
	fs.DurationVar(&f.cfg.renewDeadline, "leader-elect-renew-deadline", 6*time.Second, "How long the leader keeps trying to renew its Lease before it stops leading (and the process exits).")
	fs.DurationVar(&f.cfg.retryPeriod, "leader-elect-retry-period", time.Second, "How often replicas try to acquire or renew the Lease.")
	fs.StringVar(&f.lockSecret, "lock-key-secret", namespace+"/redlock-operator-lock-key",
		"namespace/name of the Secret holding the key lock values are derived from (created when missing).")
	fs.DurationVar(&f.cfg.probeInterval, "probe-interval", 10*time.Second, "How often the masters of each RedisMasterSet are probed.")
	fs.IntVar(&f.cfg.workers, "max-concurrent-reconciles", 4, "Parallel reconciles of DistributedLocks.")
	fs.DurationVar(&f.cfg.nodeTimeout, "redis-node-timeout", 0,
		"Timeout of one request to one Redis master, for master sets without spec.nodeTimeout; 0 derives it from each lock's ttl (ttl/100 in [50ms, 200ms]).")
	fs.StringVar(&f.cfg.gateImage, "gate-image", envOr("OPERATOR_IMAGE", "redlock-operator:dev"),
		"The operator's own image: managed Redis pods copy the gate from it, and pods that ask for the in-pod agent copy or run the agent from it.")
	fs.BoolVar(&f.cfg.agentAccess, "agent-access", true,
		"Keep, for every lock that pods with the in-pod agent request, a Role that reads that one lock and a RoleBinding of it to those pods' ServiceAccounts (redlock-agent:<lock>). false: create them yourself.")
	fs.BoolVar(&f.cfg.enableWebhook, "enable-webhook", true, "Serve the mutating webhook that adds the lock gate to pods labelled redlock.dev/lock (its certificate is managed in-process).")
	fs.IntVar(&f.cfg.webhookPort, "webhook-port", 9443, "Port of the webhook server.")
	fs.StringVar(&f.cfg.webhook.CertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "Where the webhook's serving certificate is written and read.")
	fs.StringVar(&f.cfg.webhook.ServiceName, "webhook-service-name", "redlock-operator-webhook-service", "Service in front of the webhook (the certificate names it).")
	fs.StringVar(&f.cfg.webhook.SecretName, "webhook-secret-name", "redlock-operator-webhook-server-cert", "Secret (in the operator's namespace) that keeps the webhook's CA and certificate.")
	fs.Func("webhook-extra-dns-name", "A further DNS name in the webhook's certificate (repeatable), e.g. localhost for a webhook reached on the host network.", func(v string) error {
		f.cfg.webhook.ExtraDNSNames = append(f.cfg.webhook.ExtraDNSNames, v)
		return nil
	})
	fs.StringVar(&f.cfg.webhook.ConfigurationName, "webhook-configuration-name", "redlock-operator-mutating-webhook-configuration", "MutatingWebhookConfiguration whose CA bundle the operator keeps current.")
	f.watchParsed = watchFlags(fs, &f.cfg)
	fs.Float64Var(&f.qps, "kube-api-qps", 200, "Client-side limit of API requests per second.")
	fs.Float64Var(&f.cfg.statusWriteQPS, "status-write-qps", 0,
		"Budget of status writes per second that refresh held locks' validity (about 1.15/ttl per held lock; more for ttls that keep the failover slack), sent on a client of their own besides --kube-api-qps, so that they never queue behind grants. 0: three quarters of --kube-api-qps.")
	fs.BoolVar(&f.cfg.releaseNotices, "release-notices", true,
		"Publish a notice on the masters when a grant is released, and try at once for a lock whose key another holder (in any cluster) released. The masters' ACL must allow the notice channels (redlock.NoticeACLRules); a lost or refused notice costs the retry delay. false: retry delays only.")
	fs.BoolVar(&f.cfg.waitingLines, "waiting-lines", true,
		"Keep locks whose key another holder has in the key's waiting line on the masters, so that locks in every cluster sharing them attempt first come, first served. The masters' ACL must allow the line's commands (redlock.LineACLRules); a line that cannot be used orders nothing, and locks attempt as without it. false: no lines.")
	fs.DurationVar(&f.cfg.failoverSlack, "failover-slack", 0,
		"Validity that held locks' status keeps ahead so that a standby taking over from a crashed leader adopts every lock before its status lapses; kept for locks whose ttl is at least twice it. 0: derived from the leader election flags (lease duration + 4.4 retry periods + 2s to adopt; 14.4s with the defaults), or none without leader election.")
	fs.IntVar(&f.burst, "kube-api-burst", 400, "Client-side burst of API requests.")
	fs.Float64Var(&f.cfg.eventQPS, "event-qps", operator.DefaultEventQPS,
		"Events recorded per second, in bursts of five seconds' worth; the rest are dropped and counted in redlock_events_dropped_total (warnings go first). Every Event is an API write: a new leader adopting thousands of locks would otherwise crowd out its own Lease renewal. 0: no limit.")
	f.zap.BindFlags(fs)
	return f
}

func main() {
	namespace := envOr("POD_NAMESPACE", "redlock-system")
	f := bindFlags(flag.CommandLine, namespace)
	flag.Parse()
	if err := noArgs(flag.CommandLine); err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(2)
	}
	if f.showVersion {
		fmt.Println(version.Version)
		return
	}
	f.watchParsed()
	cfg, opts, qps, burst, lockSecret := f.cfg, f.zap, f.qps, f.burst, f.lockSecret
	cfg.namespace, cfg.webhook.Namespace, cfg.metricsCert.Namespace = namespace, namespace, namespace
	cfg.webhook.AgentImage = cfg.gateImage
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	var err error
	if cfg.lockKeySecret, err = parseRef(lockSecret); err == nil {
		err = checkFlags(cfg, qps, burst)
	}
	if err != nil {
		log.Error(err, "bad flag")
		os.Exit(2)
	}
	if cfg.statusWriteQPS == 0 {
		cfg.statusWriteQPS = qps * 3 / 4
	}
	if cfg.failoverSlack == 0 && cfg.leaderElect {
		cfg.failoverSlack = takeoverTime(cfg.leaseDuration, cfg.retryPeriod)
	}
	restCfg := ctrl.GetConfigOrDie()
	restCfg.QPS, restCfg.Burst = float32(qps), burst
	if err := run(ctrl.SetupSignalHandler(), restCfg, cfg); err != nil {
		log.Error(err, "manager stopped")
		os.Exit(1)
	}
}

// adoptAllowance is the time takeoverTime allows a new leader to start its
// controllers and adopt the held locks once it leads.
const adoptAllowance = 2 * time.Second

// takeoverTime bounds how long after a crashed leader's last Lease renewal
// a standby leads and has adopted the held locks: it observes that renewal
// up to one jittered retry period late (client-go tries every retry period
// × [1, 1+JitterFactor]), waits the lease duration from then, takes the
// Lease on its next try, and adopts within adoptAllowance.
func takeoverTime(lease, retry time.Duration) time.Duration {
	jittered := time.Duration(float64(retry) * (1 + leaderelection.JitterFactor))
	return lease + 2*jittered + adoptAllowance
}

// noArgs refuses arguments left after the flags: Go's flag package stops
// at the first argument that is not a flag (e.g. "false" in
// "--leader-elect false"), and every flag after it would be ignored
// without a word.
func noArgs(fs *flag.FlagSet) error {
	if fs.NArg() > 0 {
		return fmt.Errorf("%q is not a flag (write --flag=value): the %d argument(s) from it on would be ignored", fs.Arg(0), fs.NArg())
	}
	return nil
}

// checkFlags refuses flag values the manager cannot run with, naming the
// flag, before anything starts.
func checkFlags(cfg config, qps float64, burst int) error {
	if err := checkMetricsFlags(cfg); err != nil {
		return err
	}
	switch {
	case qps <= 0:
		return fmt.Errorf("--kube-api-qps %v: must be positive", qps)
	case burst < 1:
		return fmt.Errorf("--kube-api-burst %d: must be at least 1", burst)
	case cfg.eventQPS < 0:
		return fmt.Errorf("--event-qps %v: must be 0 (no limit) or more", cfg.eventQPS)
	case cfg.statusWriteQPS < 0:
		return fmt.Errorf("--status-write-qps %v: must be 0 (three quarters of --kube-api-qps) or more", cfg.statusWriteQPS)
	case cfg.failoverSlack < 0:
		return fmt.Errorf("--failover-slack %v: must be 0 (derived from the leader election flags) or more", cfg.failoverSlack)
	case cfg.workers < 1:
		return fmt.Errorf("--max-concurrent-reconciles %d: must be at least 1", cfg.workers)
	case cfg.probeInterval < 100*time.Millisecond || cfg.probeInterval > 10*time.Minute:
		return fmt.Errorf("--probe-interval %v: must be between 100ms and 10m (admissions of replacement members wait for up to an interval)", cfg.probeInterval)
	case cfg.nodeTimeout < 0 || cfg.nodeTimeout > 10*time.Second:
		return fmt.Errorf("--redis-node-timeout %v: must be between 0 (derived from each lock's ttl) and 10s", cfg.nodeTimeout)
	case cfg.gateImage == "":
		return errors.New("--gate-image: must name an image (the operator's own)")
	case cfg.enableWebhook && (cfg.webhookPort < 1 || cfg.webhookPort > 65535):
		return fmt.Errorf("--webhook-port %d: must be a port, 1 to 65535", cfg.webhookPort)
	}
	return checkLeaderFlags(cfg)
}

// checkLeaderFlags is checkFlags for the leader election flags.
func checkLeaderFlags(cfg config) error {
	if cfg.leaderElect && (cfg.retryPeriod <= 0 || cfg.renewDeadline <= time.Duration(leaderelection.JitterFactor*float64(cfg.retryPeriod)) ||
		cfg.leaseDuration <= cfg.renewDeadline || cfg.leaseDuration < time.Second) {
		// client-go refuses a renew deadline within 1.2 retry periods, and
		// keeps the lease duration in whole seconds.
		return fmt.Errorf("--leader-elect-lease-duration %v, --leader-elect-renew-deadline %v, --leader-elect-retry-period %v: want lease duration ≥ 1s, lease duration > renew deadline > 1.2 × retry period > 0",
			cfg.leaseDuration, cfg.renewDeadline, cfg.retryPeriod)
	}
	return nil
}

// checkMetricsFlags is checkFlags for the metrics endpoint's flags.
func checkMetricsFlags(cfg config) error {
	if issueMetricsCert(cfg) && cfg.metricsCert.CertDir == "" {
		return fmt.Errorf("--metrics-secret-name %s: needs --metrics-cert-dir, where the Secret is mounted", cfg.metricsCert.SecretName)
	}
	return nil
}

// issueMetricsCert says whether the manager issues the metrics endpoint's
// certificate: --metrics-secret-name names a Secret and the endpoint
// serves HTTPS. Off or over plain HTTP (--metrics-bind-address=0,
// --metrics-secure=false, as overlays set them) the name is ignored.
func issueMetricsCert(cfg config) bool {
	return cfg.metricsCert.SecretName != "" && cfg.metricsSecure && cfg.metricsAddr != "0"
}

// config is what the flags set for run.
type config struct {
	namespace              string // the operator's own (POD_NAMESPACE)
	metricsAddr, probeAddr string
	pprofAddr              string
	metricsSecure          bool
	metricsCert            operator.MetricsCertOptions
	enableHTTP2            bool
	leaderElect            bool
	leaderNamespace        string
	leaseDuration          time.Duration
	renewDeadline          time.Duration
	retryPeriod            time.Duration
	lockKeySecret          types.NamespacedName
	probeInterval          time.Duration
	workers                int
	statusWriteQPS         float64
	releaseNotices         bool
	waitingLines           bool
	eventQPS               float64
	failoverSlack          time.Duration
	nodeTimeout            time.Duration
	gateImage              string
	agentAccess            bool
	enableWebhook          bool
	webhookPort            int
	webhook                operator.WebhookOptions
	watchNamespaces        namespaceList
	watchNodes             bool
}

func run(ctx context.Context, restCfg *rest.Config, cfg config) error {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))

	metricsOpts, err := metricsOptions(ctx, cfg)
	if err != nil {
		return err
	}
	m := metrics.New()
	// Writes other than the refreshes wait in the manager while the
	// refreshes need the API server.
	restCfg, gate := operator.GateWrites(restCfg, m)
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsOpts,
		HealthProbeBindAddress:        cfg.probeAddr,
		PprofBindAddress:              cfg.pprofAddr,
		LeaderElection:                cfg.leaderElect,
		LeaderElectionID:              v1alpha1.LeaderLease,
		LeaderElectionNamespace:       cfg.leaderNamespace,
		LeaderElectionReleaseOnCancel: true, // a stopping leader hands over at once
		LeaseDuration:                 &cfg.leaseDuration,
		RenewDeadline:                 &cfg.renewDeadline,
		RetryPeriod:                   &cfg.retryPeriod,
		Cache:                         operator.CacheOptions(cfg.watchNamespaces...),
		WebhookServer:                 webhook.NewServer(webhook.Options{Port: cfg.webhookPort, CertDir: cfg.webhook.CertDir, TLSOpts: tlsOptions(cfg)}),
	})
	if err != nil {
		return fmt.Errorf("new manager: %w", err)
	}
	if err := m.Register(ctrlmetrics.Registry); err != nil {
		return err
	}
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "redlock_operator_build_info",
		Help: "Always 1, labelled with the version the manager was built as.",
	}, []string{"version"})
	buildInfo.WithLabelValues(version.Version).Set(1)
	if err := ctrlmetrics.Registry.Register(buildInfo); err != nil {
		return fmt.Errorf("register build info: %w", err)
	}
	cleanup, err := operator.Setup(ctx, mgr, operator.Options{
		Namespace:     cfg.namespace,
		LockKeySecret: cfg.lockKeySecret,
		ProbeInterval: cfg.probeInterval,
		Workers:       cfg.workers,
		Metrics:       m,
		Registry:      ctrlmetrics.Registry,

		StatusWriteQPS:   cfg.statusWriteQPS,
		NoReleaseNotices: !cfg.releaseNotices,
		NoWaitingLines:   !cfg.waitingLines,
		EventQPS:         cfg.eventQPS,
		FailoverSlack:    cfg.failoverSlack,
		// Beside the leader Lease, where kubectl redlock looks.
		StatusReportNamespace: cfg.leaderNamespace,
		Manager:               hostname(),

		DefaultNodeTimeout: cfg.nodeTimeout,
		GateImage:          cfg.gateImage,
		WatchNamespaces:    cfg.watchNamespaces,
		IgnoreNodes:        !cfg.watchNodes,
		NoAgentAccess:      !cfg.agentAccess,
		WriteGate:          gate,
	})
	if err != nil {
		return err
	}
	defer cleanup()
	if cfg.enableWebhook {
		if err := operator.SetupWebhook(ctx, mgr, cfg.webhook); err != nil {
			return err
		}
	}
	switch {
	case issueMetricsCert(cfg):
		if err := operator.SetupMetricsCertificate(ctx, mgr, cfg.metricsCert); err != nil {
			return err
		}
	case cfg.metricsCert.SecretName != "":
		ctrl.Log.WithName("setup").Info("no metrics certificate: the metrics endpoint is off or plain HTTP", "metricsSecretName", cfg.metricsCert.SecretName)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	ctrl.Log.WithName("setup").Info("starting manager", "version", version.Version, "leaderElection", cfg.leaderElect, "metricsSecure", cfg.metricsSecure,
		"watchNamespaces", cfg.watchNamespaces, "watchNodes", cfg.watchNodes)
	return mgr.Start(ctx)
}

// metricsOptions serves metrics the kubebuilder v4 way: HTTPS behind
// controller-runtime's authentication and authorization filter, or plain
// HTTP when --metrics-secure=false. The certificate is the one in
// --metrics-cert-dir once it is there.
func metricsOptions(ctx context.Context, cfg config) (metricsserver.Options, error) {
	o := metricsserver.Options{BindAddress: cfg.metricsAddr, SecureServing: cfg.metricsSecure, TLSOpts: tlsOptions(cfg)}
	if !cfg.metricsSecure {
		return o, nil
	}
	o.FilterProvider = filters.WithAuthenticationAndAuthorization
	if cfg.metricsCert.CertDir != "" {
		get, err := operator.ServingCertificate(ctx, cfg.metricsCert.CertDir)
		if err != nil {
			return o, fmt.Errorf("metrics certificate: %w", err)
		}
		o.TLSOpts = append(o.TLSOpts, func(c *tls.Config) { c.GetCertificate = get })
	}
	return o, nil
}

// tlsOptions turns HTTP/2 off unless --enable-http2 allows it.
func tlsOptions(cfg config) []func(*tls.Config) {
	if cfg.enableHTTP2 {
		return nil
	}
	return []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
}

func parseRef(ref string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" {
		return types.NamespacedName{}, fmt.Errorf("--lock-key-secret %q: want namespace/name", ref)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// watchFlags registers --watch-namespaces and --watch-nodes on fs; call the
// returned function once fs is parsed.
func watchFlags(fs *flag.FlagSet, cfg *config) (parsed func()) {
	fs.Var(&cfg.watchNamespaces, "watch-namespaces",
		"Namespaces whose locks, master sets and pods the operator serves, comma-separated (repeatable); empty: the whole cluster. With it the operator lists and watches only those namespaces, so namespaced Roles in each are enough.")
	fs.BoolVar(&cfg.watchNodes, "watch-nodes", true,
		"Read Nodes (cluster-scoped) for the HolderReachable condition of locks held by pods and the zones of managed Redis members. Default: true, false with --watch-namespaces.")
	return func() {
		cfg.webhook.WatchNamespaces = cfg.watchNamespaces
		if !isSet(fs, "watch-nodes") {
			cfg.watchNodes = len(cfg.watchNamespaces) == 0
		}
	}
}

// namespaceList is the value of --watch-namespaces: namespace names,
// comma-separated, the flag repeatable; each must be a valid namespace
// name, and one named twice counts once.
type namespaceList []string

func (l *namespaceList) String() string { return strings.Join(*l, ",") }

func (l *namespaceList) Set(v string) error {
	for ns := range strings.SplitSeq(v, ",") {
		ns = strings.TrimSpace(ns)
		if ns == "" {
			continue
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fmt.Errorf("namespace %q: %s", ns, strings.Join(errs, "; "))
		}
		if !slices.Contains(*l, ns) {
			*l = append(*l, ns)
		}
	}
	return nil
}

// isSet reports whether the flag name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// hostname names this manager in what it publishes: its pod's name.
func hostname() string {
	name, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return name
}
