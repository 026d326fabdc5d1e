package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// A malformed --lock-key-secret is refused with a message naming the flag,
// before anything starts.
func TestParseRef(t *testing.T) {
	for _, tc := range []struct {
		in, wantErr string
	}{
		{"redlock-system/key", ""},
		{"key", "want namespace/name"},
		{"/key", "want namespace/name"},
		{"ns/", "want namespace/name"},
		{"", "want namespace/name"},
	} {
		ref, err := parseRef(tc.in)
		switch {
		case tc.wantErr == "" && (err != nil || ref.String() != tc.in):
			t.Errorf("parseRef(%q) = %v, %v", tc.in, ref, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "--lock-key-secret")):
			t.Errorf("parseRef(%q) error %v, want one naming the flag and %q", tc.in, err, tc.wantErr)
		}
	}
}

// --watch-namespaces takes namespace names, comma-separated or repeated;
// --watch-nodes follows it unless given: a manager limited to namespaces
// reads no Node unless told to.
func TestWatchFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    []string
		nodes   bool
		wantErr string
	}{
		{args: nil, want: nil, nodes: true},
		{args: []string{"--watch-namespaces="}, want: nil, nodes: true},
		{args: []string{"--watch-namespaces=team-a"}, want: []string{"team-a"}},
		{args: []string{"--watch-namespaces=team-a, team-b,,team-a"}, want: []string{"team-a", "team-b"}},
		{args: []string{"--watch-namespaces=team-a", "--watch-namespaces=team-c"}, want: []string{"team-a", "team-c"}},
		{args: []string{"--watch-namespaces=team-a", "--watch-nodes"}, want: []string{"team-a"}, nodes: true},
		{args: []string{"--watch-nodes=false"}, want: nil},
		{args: []string{"--watch-namespaces=Team_A"}, wantErr: `namespace "Team_A"`},
		{args: []string{"--watch-namespaces=team-a/locks"}, wantErr: `namespace "team-a/locks"`},
	} {
		var cfg config
		fs := flag.NewFlagSet("manager", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		parsed := watchFlags(fs, &cfg)
		err := fs.Parse(tc.args)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "-watch-namespaces") {
				t.Errorf("%q: error %v, want one naming the flag and %s", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		parsed()
		if !slices.Equal(cfg.watchNamespaces, tc.want) || cfg.watchNodes != tc.nodes || !slices.Equal(cfg.webhook.WatchNamespaces, tc.want) {
			t.Errorf("%q: namespaces %q (webhook %q), nodes %v; want %q, %v", tc.args, cfg.watchNamespaces, cfg.webhook.WatchNamespaces, cfg.watchNodes, tc.want, tc.nodes)
		}
	}
}

// Flag values the manager cannot run with are refused before anything
// starts, with a message naming the flag: one case per flag.
func TestCheckFlags(t *testing.T) {
	good := config{probeInterval: 10 * time.Second, workers: 4, gateImage: "op:1", enableWebhook: true, webhookPort: 9443,
		leaderElect: true, leaseDuration: 15 * time.Second, renewDeadline: 10 * time.Second, retryPeriod: 2 * time.Second}
	if err := checkFlags(good, 200, 400); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	for _, tc := range []struct {
		flag   string
		mutate func(*config)
		qps    float64
		burst  int
	}{
		{flag: "--kube-api-qps", qps: -1, burst: 400},
		{flag: "--kube-api-burst", qps: 200, burst: 0},
		{flag: "--status-write-qps", mutate: func(c *config) { c.statusWriteQPS = -1 }},
		{flag: "--event-qps", mutate: func(c *config) { c.eventQPS = -1 }},
		{flag: "--failover-slack", mutate: func(c *config) { c.failoverSlack = -time.Second }},
		{flag: "--max-concurrent-reconciles", mutate: func(c *config) { c.workers = 0 }},
		{flag: "--probe-interval", mutate: func(c *config) { c.probeInterval = time.Millisecond }},
		{flag: "--redis-node-timeout", mutate: func(c *config) { c.nodeTimeout = time.Minute }},
		{flag: "--gate-image", mutate: func(c *config) { c.gateImage = "" }},
		{flag: "--webhook-port", mutate: func(c *config) { c.webhookPort = 70000 }},
		{flag: "--metrics-secret-name", mutate: func(c *config) { c.metricsSecure, c.metricsCert.SecretName = true, "metrics-cert" }}, // no --metrics-cert-dir to mount it at
		{flag: "--leader-elect-renew-deadline", mutate: func(c *config) { c.renewDeadline = 20 * time.Second }},
		{flag: "--leader-elect-retry-period", mutate: func(c *config) { c.retryPeriod = 9 * time.Second }}, // client-go: renew deadline > 1.2 × retry period
		{flag: "--leader-elect-lease-duration", mutate: func(c *config) {
			c.leaseDuration, c.renewDeadline, c.retryPeriod = 900*time.Millisecond, 800*time.Millisecond, 100*time.Millisecond
		}}, // whole seconds in the Lease
	} {
		t.Run(tc.flag, func(t *testing.T) {
			cfg := good
			if tc.mutate != nil {
				tc.mutate(&cfg)
			}
			qps, burst := tc.qps, tc.burst
			if qps == 0 && burst == 0 {
				qps, burst = 200, 400
			}
			err := checkFlags(cfg, qps, burst)
			if err == nil || !strings.Contains(err.Error(), tc.flag) {
				t.Fatalf("checkFlags: %v, want an error naming %s", err, tc.flag)
			}
		})
	}
	t.Run("webhook off: its port is not checked", func(t *testing.T) {
		cfg := good
		cfg.enableWebhook, cfg.webhookPort = false, 0
		if err := checkFlags(cfg, 200, 400); err != nil {
			t.Fatal(err)
		}
	})
	// config/default passes --metrics-secret-name; overlays that turn the
	// endpoint off or to plain HTTP must still start.
	for _, off := range []struct {
		name   string
		mutate func(*config)
	}{
		{"metrics over plain HTTP", func(c *config) { c.metricsSecure = false }},
		{"metrics off", func(c *config) { c.metricsSecure, c.metricsAddr = true, "0" }},
	} {
		t.Run(off.name+": --metrics-secret-name is ignored", func(t *testing.T) {
			cfg := good
			cfg.metricsAddr, cfg.metricsCert.CertDir, cfg.metricsCert.SecretName = ":8443", "", "metrics-cert"
			off.mutate(&cfg)
			if err := checkFlags(cfg, 200, 400); err != nil {
				t.Fatal(err)
			}
			if issueMetricsCert(cfg) {
				t.Error("a metrics certificate issued for an endpoint without TLS")
			}
		})
	}
}

// The failover slack derived from the leader election flags covers a
// standby that sees the crashed leader's last renewal a jittered retry
// period late, waits out the Lease, takes it on its next jittered try and
// adopts within adoptAllowance.
func TestTakeoverTime(t *testing.T) {
	for _, tc := range []struct {
		name         string
		lease, retry time.Duration
		want         time.Duration
	}{
		{"the defaults", 8 * time.Second, time.Second, 14400 * time.Millisecond},
		{"client-go's defaults", 15 * time.Second, 2 * time.Second, 25800 * time.Millisecond},
		{"a short Lease", 4 * time.Second, 500 * time.Millisecond, 8200 * time.Millisecond},
		{"the test managers' Lease", 2 * time.Second, 200 * time.Millisecond, 4880 * time.Millisecond},
	} {
		if got := takeoverTime(tc.lease, tc.retry); got != tc.want {
			t.Errorf("%s: takeoverTime(%v, %v) = %v, want %v", tc.name, tc.lease, tc.retry, got, tc.want)
		}
	}
}

// TestFlagsReference: docs/reference/flags.md names every flag of the
// manager, and only those.
func TestFlagsReference(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "reference", "flags.md"))
	if err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	bindFlags(fs, "redlock-system")
	var flags []string
	fs.VisitAll(func(f *flag.Flag) { flags = append(flags, f.Name) })
	// controller-runtime registers --kubeconfig on the command line.
	if flag.CommandLine.Lookup("kubeconfig") == nil {
		t.Fatal("--kubeconfig is not registered: the manager imports controller-runtime's config")
	}
	flags = append(flags, "kubeconfig")
	for _, name := range flags {
		if !strings.Contains(string(doc), "`--"+name+"`") {
			t.Errorf("docs/reference/flags.md does not name --%s", name)
		}
	}
	for _, m := range regexp.MustCompile("`--([a-z0-9-]+)").FindAllStringSubmatch(string(doc), -1) {
		if !slices.Contains(flags, m[1]) {
			t.Errorf("docs/reference/flags.md names --%s, which the manager does not have", m[1])
		}
	}
}

// An argument that is not a flag stops Go's flag parsing: the manager
// refuses it rather than ignore the flags after it.
func TestNoArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--leader-elect=false", "--probe-interval=1s"}, true},
		{[]string{"--leader-elect", "false", "--probe-interval=1s"}, false},
	} {
		fs := flag.NewFlagSet("manager", flag.ContinueOnError)
		bindFlags(fs, "redlock-system")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := noArgs(fs); (err == nil) != tc.ok {
			t.Errorf("%v: noArgs says %v", tc.args, err)
		}
	}
}
