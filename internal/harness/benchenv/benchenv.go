// Package benchenv starts what the benchmark programs under hack/ measure:
// a real kube-apiserver and etcd (envtest), redis-server masters in an
// external RedisMasterSet, and the operator's manager in this process, with
// the caches and controllers the manager binary runs, or manager processes
// of the binary. Tests use internal/harness/testenv and Ginkgo, but for the
// e2e suite's second control plane: an API server with its own manager
// process beside the local cluster.
package benchenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/apiproxy"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/operator"
)

// MasterSet is the name of the RedisMasterSet Start creates.
const MasterSet = "masters"

// Options configures Start.
type Options struct {
	// Masters is how many redis-server masters to run (default 5).
	Masters int
	// Servers, when set, are the masters instead: another Env's, shared
	// as by two clusters. This Env neither starts nor stops them.
	Servers []*redistest.Server
	// MaxLockTTL is the master set's maxLockTTL.
	MaxLockTTL time.Duration
	// Workers is the parallel reconciles of the lock controller.
	Workers int
	// Namespace holds the master set and what the benchmark creates.
	Namespace string
	// ManagerQPS is the manager's client QPS (default 200, the manager
	// binary's --kube-api-qps), with a burst of twice that.
	ManagerQPS float32
	// StatusWriteQPS is the manager's --status-write-qps (default three
	// quarters of ManagerQPS).
	StatusWriteQPS float64
	// QPS and Burst of the benchmark's own client (defaults 400 and 800).
	QPS   float32
	Burst int
	// ManagerBinary, when set, runs ManagerProcesses (default 2) manager
	// processes of that binary with leader election instead of the manager
	// in this process, each with ManagerArgs besides the connection flags
	// and with its log in a file.
	ManagerBinary    string
	ManagerProcesses int
	ManagerArgs      []string
	// KeepLogs leaves the directory with the masters' data and the
	// managers' logs behind.
	KeepLogs bool
	// API, when set, puts the in-process manager behind an API server of
	// these limits (apiproxy); Env.Proxy changes them. The benchmark's
	// own client goes to the API server directly.
	API *apiproxy.Limits
	// Root is the repository's root, where the CRDs are read from
	// (default: the working directory).
	Root string
	// MasterSet, when set, is the spec of the RedisMasterSet Start
	// creates (default: external, naming the masters, no password), and
	// Objects are created in Namespace before it (e.g. its auth Secret).
	MasterSet *v1alpha1.RedisMasterSetSpec
	Objects   []client.Object
}

// withDefaults fills in what o leaves out.
func (o Options) withDefaults() Options {
	if o.Servers != nil {
		o.Masters = 0
	} else if o.Masters == 0 {
		o.Masters = 5
	}
	if o.QPS == 0 {
		o.QPS, o.Burst = 400, 800
	}
	if o.ManagerQPS == 0 {
		o.ManagerQPS = 200 // the manager binary's default --kube-api-qps
	}
	if o.StatusWriteQPS == 0 {
		o.StatusWriteQPS = float64(o.ManagerQPS) * 3 / 4
	}
	return o
}

// Process is one manager process.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	// Log is its log file; MetricsAddr its plain-HTTP metrics endpoint;
	// PprofAddr its Go pprof endpoint (--pprof-bind-address).
	Log, MetricsAddr, PprofAddr string

	bin, dir string
	args     []string
	starts   int
	exited   chan struct{}
}

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.exited }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// Leading reports whether the process runs and its log shows it acquired
// the leader Lease.
func (p *Process) Leading() bool {
	b, err := os.ReadFile(p.Log)
	return err == nil && !p.Exited() && strings.Contains(strings.ToLower(string(b)), "successfully acquired lease")
}

// Env is a running control plane, masters and manager.
type Env struct {
	// Config and Client reach the API server as an administrator.
	Config *rest.Config
	Client client.WithWatch
	// Servers are the masters.
	Servers []*redistest.Server
	// Registry holds the manager's metrics.
	Registry *prometheus.Registry
	// Namespace is Options.Namespace.
	Namespace string
	// Managers are the manager processes (Options.ManagerBinary).
	Managers []*Process
	// Proxy is the API server of known capacity the manager calls
	// (Options.API), or nil.
	Proxy *apiproxy.Proxy

	closers []func()
}

// Start starts everything and returns once the master set is Available
// (fresh masters sit out their quarantine first). The CRDs are read from
// config/crd/bases: run from the repository's root. Close stops it all.
func Start(ctx context.Context, o Options) (e *Env, err error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, errors.New("KUBEBUILDER_ASSETS is not set: run KUBEBUILDER_ASSETS=$(hack/build-envtest.sh), or the make target")
	}
	o = o.withDefaults()
	e = &Env{Namespace: o.Namespace}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join(o.Root, "config", "crd", "bases")}, ErrorIfCRDPathMissing: true, Scheme: scheme}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("envtest: %w", err)
	}
	e.closers = append(e.closers, func() { _ = env.Stop() })
	mgrCfg := rest.CopyConfig(cfg)
	if o.API != nil {
		if o.ManagerBinary != "" {
			return nil, errors.New("the API proxy serves the in-process manager only")
		}
		if e.Proxy, err = apiproxy.Start(cfg, *o.API); err != nil {
			return nil, fmt.Errorf("API proxy: %w", err)
		}
		e.closers = append(e.closers, func() { _ = e.Proxy.Close() })
		mgrCfg = e.Proxy.Config()
	}
	mgrCfg.QPS, mgrCfg.Burst = o.ManagerQPS, int(2*o.ManagerQPS)
	cfg.QPS, cfg.Burst = o.QPS, o.Burst
	e.Config = cfg
	if e.Client, err = client.NewWithWatch(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}

	dir, err := os.MkdirTemp("", "redlock-bench-")
	if err != nil {
		return nil, err
	}
	if o.KeepLogs {
		fmt.Printf("the managers' logs stay in %s\n", dir)
	} else {
		e.closers = append(e.closers, func() { _ = os.RemoveAll(dir) })
	}
	e.Servers = o.Servers
	for i := range o.Masters {
		s, err := redistest.Start(filepath.Join(dir, strconv.Itoa(i)), redistest.Options{})
		if err != nil {
			return nil, err
		}
		e.Servers = append(e.Servers, s)
		e.closers = append(e.closers, func() { _ = s.Close() })
	}

	for _, ns := range []string{"redlock-system", o.Namespace} {
		if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return nil, err
		}
	}
	if o.ManagerBinary != "" {
		err = e.startProcesses(env, dir, o)
	} else {
		err = e.startManager(ctx, mgrCfg, scheme, o)
	}
	if err != nil {
		return nil, err
	}
	for _, obj := range o.Objects {
		obj.SetNamespace(o.Namespace)
		if err := e.Client.Create(ctx, obj); err != nil {
			return nil, err
		}
	}
	spec := v1alpha1.RedisMasterSetSpec{
		External:   &v1alpha1.ExternalMasters{Addresses: redistest.Addrs(e.Servers)},
		MaxLockTTL: metav1.Duration{Duration: o.MaxLockTTL},
	}
	if o.MasterSet != nil {
		spec = *o.MasterSet
	}
	if err := e.Client.Create(ctx, &v1alpha1.RedisMasterSet{ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: MasterSet}, Spec: spec}); err != nil {
		return nil, err
	}
	fmt.Printf("waiting for the fresh masters' quarantine (maxLockTTL %v + drift + 1s)...\n", o.MaxLockTTL)
	if err := WaitFor(ctx, 2*o.MaxLockTTL+30*time.Second, func() (bool, error) {
		var set v1alpha1.RedisMasterSet
		err := e.Client.Get(ctx, types.NamespacedName{Namespace: o.Namespace, Name: MasterSet}, &set)
		return err == nil && meta.IsStatusConditionTrue(set.Status.Conditions, v1alpha1.ConditionAvailable), nil
	}); err != nil {
		return nil, fmt.Errorf("masters never available: %w", err)
	}
	return e, nil
}

// startManager runs the operator's manager in this process, as the
// manager binary sets it up.
func (e *Env) startManager(ctx context.Context, cfg *rest.Config, scheme *k8sruntime.Scheme, o Options) error {
	m := metrics.New()
	cfg, gate := operator.GateWrites(cfg, m)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, Cache: operator.CacheOptions()})
	if err != nil {
		return err
	}
	e.Registry = prometheus.NewRegistry()
	if err := m.Register(e.Registry); err != nil {
		return err
	}
	cleanup, err := operator.Setup(ctx, mgr, operator.Options{
		Namespace:     "redlock-system",
		LockKeySecret: types.NamespacedName{Namespace: "redlock-system", Name: "lock-key"},
		Workers:       o.Workers,
		Metrics:       m,

		StatusWriteQPS: o.StatusWriteQPS,
		// The manager's own limit: every Event is a write the API server
		// takes beside the refreshes (a shed records one per grant).
		EventQPS:  operator.DefaultEventQPS,
		WriteGate: gate,
	})
	if err != nil {
		return err
	}
	mgrDone := make(chan error, 1)
	mctx, stopMgr := context.WithCancel(ctx)
	go func() { mgrDone <- mgr.Start(mctx); cleanup() }()
	e.closers = append(e.closers, func() {
		stopMgr()
		if err := <-mgrDone; err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	})
	return nil
}

// startProcesses runs the manager processes of o.ManagerBinary against
// env's API server.
func (e *Env) startProcesses(env *envtest.Environment, dir string, o Options) error {
	kubeconfig, err := Kubeconfig(env, dir)
	if err != nil {
		return err
	}
	if o.ManagerProcesses == 0 {
		o.ManagerProcesses = 2
	}
	for i := range o.ManagerProcesses {
		addr, err := FreeAddr()
		if err != nil {
			return err
		}
		pprofAddr, err := FreeAddr()
		if err != nil {
			return err
		}
		p := &Process{Name: fmt.Sprintf("m%d", i+1), MetricsAddr: addr, PprofAddr: pprofAddr, dir: dir}
		p.args = append([]string{"--kubeconfig", kubeconfig, "--enable-webhook=false", "--health-probe-bind-address=0",
			"--metrics-secure=false", "--metrics-bind-address=" + addr, "--pprof-bind-address=" + pprofAddr,
			"--leader-election-namespace=redlock-system", "--lock-key-secret=redlock-system/lock-key",
			fmt.Sprintf("--kube-api-qps=%v", o.ManagerQPS), fmt.Sprintf("--kube-api-burst=%d", int(2*o.ManagerQPS)),
			fmt.Sprintf("--status-write-qps=%v", o.StatusWriteQPS), fmt.Sprintf("--max-concurrent-reconciles=%d", max(o.Workers, 1))}, o.ManagerArgs...)
		p.bin = o.ManagerBinary
		if err := p.start(); err != nil {
			return err
		}
		e.Managers = append(e.Managers, p)
		e.closers = append(e.closers, func() {
			_ = p.Cmd.Process.Kill()
			<-p.exited
		})
	}
	return nil
}

// BuildManager builds the manager binary (./cmd/manager: run from the
// repository's root) into dir and returns its path.
func BuildManager(dir string) (string, error) {
	bin := filepath.Join(dir, "manager")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/manager").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build manager: %w: %s", err, out)
	}
	return bin, nil
}

// FreeAddr returns a loopback address no listener has at the moment.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}

// Profile writes a CPU profile of the process over d to path.
func (p *Process) Profile(ctx context.Context, d time.Duration, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.PprofAddr, int(d.Seconds())), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile %s: %w", p.Name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile %s: %s", p.Name, resp.Status)
	}
	f, err := os.Create(path) //nolint:gosec // the caller's path
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// start runs the process, logging to a new file in its directory.
func (p *Process) start() error {
	p.starts++
	p.Log = filepath.Join(p.dir, fmt.Sprintf("%s-%d.log", p.Name, p.starts))
	logf, err := os.Create(p.Log)
	if err != nil {
		return err
	}
	p.Cmd = exec.Command(p.bin, p.args...)
	p.Cmd.Env = append(os.Environ(), "POD_NAMESPACE=redlock-system")
	p.Cmd.Stdout, p.Cmd.Stderr = logf, logf
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.Cmd.Start(); err != nil {
		_ = logf.Close()
		return err
	}
	exited, cmd := make(chan struct{}), p.Cmd
	p.exited = exited
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(exited)
	}()
	return nil
}

// Restart starts an exited manager process again, with a new log.
func (e *Env) Restart(p *Process) error {
	if !p.Exited() {
		return fmt.Errorf("manager %s still runs", p.Name)
	}
	return p.start()
}

// Metric reads a metric from a manager's plain-HTTP metrics endpoint at
// addr, summed over its series; it is an error when no series of it is
// exposed.
func Metric(addr, name string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics") //nolint:noctx // a local benchmark
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%s at %s: %w", name, addr, err)
		}
		sum, found = sum+v, true
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("no %s at %s", name, addr)
	}
	return sum, nil
}

// Reconciles is the reconcile count of the named controller so far, in
// this process (controller-runtime's controller_runtime_reconcile_total,
// summed over results).
func Reconciles(controller string) (float64, error) {
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		return 0, err
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum, nil
}

// Kubeconfig writes a kubeconfig of an administrator of env's API server
// into dir, for a manager process, and returns its path.
func Kubeconfig(env *envtest.Environment, dir string) (string, error) {
	user, err := env.ControlPlane.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, kc, 0o600)
}

// Close stops the manager, the masters and the control plane, in that
// order.
func (e *Env) Close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
	e.closers = nil
}

// Quiet silences the loggers of go-redis, controller-runtime and client-go,
// whose messages would interleave with a benchmark's progress and table.
// With BENCH_MANAGER_LOG set, the manager logs to that file instead.
func Quiet() {
	redis.SetLogger(quietRedis{})
	if path := os.Getenv("BENCH_MANAGER_LOG"); path != "" {
		// The manager's log, to read what it decided in a run.
		if f, err := os.Create(filepath.Clean(path)); err == nil { //nolint:gosec // a path the person running the benchmark chose
			ctrl.SetLogger(zap.New(zap.WriteTo(f)))
			klog.SetLogger(logr.Discard())
			return
		}
	}
	ctrl.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
}

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// Percentile is the nearest-rank p-th percentile of d (0 < p ≤ 1), or 0
// for no samples.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[max(0, int(math.Ceil(p*float64(len(s))))-1)]
}

// WaitFor polls cond every 200ms until it holds, fails, or timeout passes.
func WaitFor(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ControlPlane maps the command names kube-apiserver and etcd to the PIDs
// of this process's children of those names (envtest's control plane).
func ControlPlane() map[string][]int {
	procs := map[string][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, ppid := statOf(pid)
		if ppid != os.Getpid() {
			continue
		}
		switch comm {
		case "kube-apiserver", "etcd":
			procs[comm] = append(procs[comm], pid)
		}
	}
	return procs
}

// statOf returns a process's command name and parent PID.
func statOf(pid int) (string, int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0
	}
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < 0 {
		return "", 0
	}
	fields := strings.Fields(s[closing+2:])
	ppid, _ := strconv.Atoi(fields[1])
	return s[open+1 : closing], ppid
}

// CPUTimes returns the user+system CPU time of each group of PIDs (this
// process's own PID counts this process).
func CPUTimes(procs map[string][]int) map[string]time.Duration {
	tick := 100.0 // USER_HZ on Linux
	out := map[string]time.Duration{}
	for name, pids := range procs {
		for _, pid := range pids {
			if pid == os.Getpid() {
				var ru syscall.Rusage
				_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
				out[name] += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
				continue
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				continue
			}
			s := string(b)
			fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
			ut, _ := strconv.ParseFloat(fields[11], 64)
			st, _ := strconv.ParseFloat(fields[12], 64)
			out[name] += time.Duration((ut + st) / tick * float64(time.Second))
		}
	}
	return out
}
