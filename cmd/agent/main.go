// Command agent runs inside a pod that takes turns on a DistributedLock,
// and tells the app whether its pod holds the lock, from a watch of that
// one lock (pkg/holding) — within a second of a grant, loss or handover,
// not on the kubelet's sync.
//
//	agent run [flags] -- command [args...]
//
// is the app container's entrypoint: it starts the app only once the pod
// holds the lock, with the grant in its environment (REDLOCK_FENCING_TOKEN,
// REDLOCK_GRANT_ID, REDLOCK_LOCK_KEY, REDLOCK_VALID_UNTIL) and in files,
// and stops it — SIGTERM, SIGKILL after --grace — so that it is gone by the
// grant's fencing deadline (the validity shown less --skew-allowance,
// tracked on the agent's own monotonic clock from each observation), or at
// once when status shows the grant ended. The app runs only as the agent's
// child.
//
//	agent watch [flags]
//
// only publishes, for an app that manages itself.
//
//	agent install DEST
//	agent version
//
// copy the agent to DEST (the webhook's init container does so from the
// operator's image: internal/podagent), and print its version.
//
// Both run and watch publish the grant in --state-dir (grant.json; token:
// the token, or empty while the pod does not hold the lock) and, with
// --listen, over HTTP on that local address: GET /grant (JSON, 200 while
// held, 503 otherwise).
//
// The agent learns its pod from the downward API (POD_NAME, POD_UID,
// POD_NAMESPACE) and its lock from REDLOCK_LOCK (the pod's label
// redlock.dev/lock). It needs get, list and watch on that one
// DistributedLock, and get and update on the LockHeartbeat of the same
// name. In run mode it renews that heartbeat every third of the lock's
// spec.heartbeatTimeout while the app runs under a grant, and says there
// that the app of a grant stopped (stoppedGrant).
// The reasoning: docs/design/agent.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
	"github.com/redlock-operator/redlock-operator/internal/selfinstall"
	"github.com/redlock-operator/redlock-operator/internal/version"
	"github.com/redlock-operator/redlock-operator/pkg/holding"
)

type config struct {
	lock, namespace, podName, podUID string
	kubeconfig, stateDir, listen     string
	skew, grace, wordWait            time.Duration
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if code, done := oneShot(args); done {
		return code
	}
	if len(args) == 0 || (args[0] != "run" && args[0] != "watch") {
		fmt.Fprintln(os.Stderr, "usage: agent run [flags] -- command [args...] | agent watch [flags] | agent install DEST | agent version")
		return 2
	}
	mode := args[0]
	var cfg config
	fs := flag.NewFlagSet("agent "+mode, flag.ContinueOnError)
	fs.StringVar(&cfg.lock, "lock", os.Getenv("REDLOCK_LOCK"), "the DistributedLock (default $REDLOCK_LOCK)")
	fs.StringVar(&cfg.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the pod's namespace (default $POD_NAMESPACE)")
	fs.StringVar(&cfg.podName, "pod-name", os.Getenv("POD_NAME"), "the pod's name (default $POD_NAME)")
	fs.StringVar(&cfg.podUID, "pod-uid", os.Getenv("POD_UID"), "the pod's UID (default $POD_UID)")
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "a kubeconfig file (default: the pod's ServiceAccount)")
	fs.StringVar(&cfg.stateDir, "state-dir", "/var/run/redlock", "where grant.json and token are written (empty: nowhere)")
	fs.StringVar(&cfg.listen, "listen", "", "a local address to serve GET /grant on, e.g. 127.0.0.1:8471 (empty: none)")
	fs.DurationVar(&cfg.skew, "skew-allowance", podagent.DefaultSkewAllowance,
		"how far this host's clock may run behind the operator's; below the lock's refresh lead (ttl/10)")
	fs.DurationVar(&cfg.grace, "grace", podagent.DefaultGrace, "time between SIGTERM and SIGKILL for the app")
	fs.DurationVar(&cfg.wordWait, "word-wait", time.Second,
		"run: how long the agent, signalled while the app runs (the pod's deletion), waits for status to stop showing the grant, so that it can say the app stopped and the lock passes on at once")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	command := fs.Args()
	if mode == "run" && len(command) == 0 {
		fmt.Fprintln(os.Stderr, "agent run: no command after --")
		return 2
	}
	if cfg.lock == "" || cfg.namespace == "" || cfg.podName == "" || cfg.podUID == "" {
		fmt.Fprintln(os.Stderr, "agent: the lock, namespace, pod name and pod UID are all needed (REDLOCK_LOCK, POD_NAMESPACE, POD_NAME, POD_UID)")
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("lock", cfg.namespace+"/"+cfg.lock, "pod", cfg.podName)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	// As the container's first process the agent would otherwise die of a
	// SIGHUP sent to reload the app, or swallow the others.
	forward := make(chan os.Signal, 4)
	signal.Notify(forward, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGQUIT, syscall.SIGWINCH)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	c, err := newClient(cfg.kubeconfig)
	if err != nil {
		log.Error("connect to the API server", "error", err)
		return 1
	}
	warnIfLeadShort(ctx, c, cfg, log)
	clk := clock.RealClock{}
	w := holding.Watch(ctx, c, types.NamespacedName{Namespace: cfg.namespace, Name: cfg.lock},
		holding.Holder{Name: cfg.podName, UID: types.UID(cfg.podUID)}, holding.Options{SkewAllowance: cfg.skew, Clock: clk})
	pub := &publisher{dir: cfg.stateDir, clock: clk}
	pub.set(nil)
	if cfg.listen != "" {
		ln, err := net.Listen("tcp", cfg.listen)
		if err != nil {
			log.Error("listen", "address", cfg.listen, "error", err)
			return 1
		}
		srv := &http.Server{Handler: pub, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer func() { _ = srv.Close() }()
	}
	logf := func(msg string, kv ...any) { log.Info(msg, kv...) }

	lock := types.NamespacedName{Namespace: cfg.namespace, Name: cfg.lock}
	beat := func(ctx context.Context, g *holding.Grant) {
		var once sync.Once
		holding.Heartbeat(ctx, c, lock, g.GrantID, w.HeartbeatTimeout(g.GrantID), clk, func(err error) {
			once.Do(func() { log.Warn("heartbeat not renewed; retrying", "grantID", g.GrantID, "error", err) })
		})
	}
	if mode == "watch" {
		return watchOnly(ctx, w, pub, signals, logf)
	}
	s := &supervisor{w: w, clock: clk, grace: cfg.grace, command: command, publish: pub.set, signals: signals, forward: forward,
		beat: beat, say: sayer(ctx, c, lock, log), wordWait: cfg.wordWait, firstProcess: os.Getpid() == 1, log: logf}
	code, err := s.run(ctx)
	if err != nil && !errors.Is(err, errSignalled) {
		log.Error("agent stopped", "error", err)
	}
	return code
}

// sayer returns the supervisor's say: it writes the agent's word that the
// app of a grant stopped (holding.SayStopped), within a few seconds; when
// that fails the lock waits for the kubelet's report of the container's
// end.
func sayer(ctx context.Context, c client.Client, lock types.NamespacedName, log *slog.Logger) func(*holding.Grant) {
	return func(g *holding.Grant) {
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if err := holding.SayStopped(sctx, c, lock, g.GrantID); err != nil {
			log.Warn("could not say the app stopped", "grantID", g.GrantID, "error", err)
			return
		}
		log.Info("said the app stopped", "grantID", g.GrantID)
	}
}

// oneShot runs the subcommands that do one thing and return: version and
// install.
func oneShot(args []string) (code int, done bool) {
	switch {
	case len(args) > 0 && (args[0] == "version" || args[0] == "--version"): // the version it was built as
		fmt.Println(version.Version)
		return 0, true
	case len(args) > 0 && args[0] == "install": // agent install DEST: copy this binary (init container)
		if len(args) != 2 {
			fmt.Fprintln(os.Stderr, "usage: agent install DEST")
			return 2, true
		}
		if err := selfinstall.Install(args[1]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

// watchOnly publishes what the pod holds until the agent is signalled;
// a grant that runs out unrefreshed is published as ended at its
// deadline. It renews no heartbeat: nothing it does tells whether the
// app is alive, nor stops it (holder liveness applies to run mode only).
func watchOnly(ctx context.Context, w *holding.Watcher, pub *publisher, signals <-chan os.Signal, log func(string, ...any)) int {
	for {
		changed := w.Changed()
		g := w.Current()
		pub.set(g)
		var expire <-chan time.Time
		if g != nil {
			expire = time.After(time.Until(g.Deadline))
		}
		select {
		case <-ctx.Done():
			return 0
		case sig := <-signals:
			log("signalled", "signal", sig.String())
			pub.set(nil)
			return 0
		case <-changed:
		case <-expire:
		}
	}
}

// warnIfLeadShort warns when the app would be stopped before every
// refresh of the lock's validity: the operator refreshes it about a tenth
// of the ttl before it passes, and the agent stops the app grace plus the
// skew allowance before that.
func warnIfLeadShort(ctx context.Context, c client.Client, cfg config, log *slog.Logger) {
	var l v1alpha1.DistributedLock
	if err := c.Get(ctx, types.NamespacedName{Namespace: cfg.namespace, Name: cfg.lock}, &l); err != nil {
		return
	}
	if lead := podagent.RefreshLead(l.Spec.TTL.Duration); podagent.LeadShort(l.Spec.TTL.Duration, cfg.grace, cfg.skew) {
		log.Warn("the grace and the skew allowance reach past the lock's refresh lead: the app will be stopped before refreshes; lower --grace or raise the lock's ttl",
			"grace", cfg.grace.String(), "skewAllowance", cfg.skew.String(), "lead", lead.String())
	}
}

func newClient(kubeconfig string) (client.WithWatch, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.NewWithWatch(cfg, client.Options{Scheme: scheme})
}

// grantView is what the agent publishes.
type grantView struct {
	Held        bool    `json:"held"`
	Token       int64   `json:"token,omitempty"`
	GrantID     string  `json:"grantID,omitempty"`
	Key         string  `json:"key,omitempty"`
	ValidUntil  string  `json:"validUntil,omitempty"`
	SecondsLeft float64 `json:"secondsLeft,omitempty"` // until the fencing deadline, when published
	PublishedAt string  `json:"publishedAt"`
}

// publisher keeps the latest grant in files and serves it.
type publisher struct {
	dir   string
	clock clock.PassiveClock
	mu    sync.Mutex
	g     *holding.Grant
}

func (p *publisher) view() grantView {
	now := p.clock.Now()
	v := grantView{PublishedAt: now.UTC().Format(time.RFC3339Nano)}
	if g := p.g; g != nil && now.Before(g.Deadline) {
		v = grantView{Held: true, Token: g.Token, GrantID: g.GrantID, Key: g.Key, ValidUntil: g.ValidUntil.UTC().Format(time.RFC3339Nano),
			SecondsLeft: g.Deadline.Sub(now).Seconds(), PublishedAt: v.PublishedAt}
	}
	return v
}

// set publishes g (nil: not held): the token file first when it empties,
// last when it fills, so that a reader of it never sees a token the
// grant file says is gone.
func (p *publisher) set(g *holding.Grant) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.g = g
	if p.dir == "" {
		return
	}
	v := p.view()
	data, _ := json.Marshal(v)
	token := ""
	if v.Held {
		token = strconv.FormatInt(v.Token, 10)
	}
	_ = os.MkdirAll(p.dir, 0o755) //nolint:gosec // read by the app, perhaps as another user
	if token == "" {
		writeFile(filepath.Join(p.dir, "token"), []byte(token))
		writeFile(filepath.Join(p.dir, "grant.json"), data)
		return
	}
	writeFile(filepath.Join(p.dir, "grant.json"), data)
	writeFile(filepath.Join(p.dir, "token"), []byte(token))
}

// writeFile replaces path atomically (a rename).
func writeFile(path string, data []byte) {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil { //nolint:gosec // read by the app in the same pod
		return
	}
	_ = os.Rename(tmp, path)
}

// ServeHTTP serves GET /grant.
func (p *publisher) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/grant" || r.Method != http.MethodGet {
		http.NotFound(rw, r)
		return
	}
	p.mu.Lock()
	v := p.view()
	p.mu.Unlock()
	rw.Header().Set("Content-Type", "application/json")
	if !v.Held {
		rw.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(rw).Encode(v)
}
