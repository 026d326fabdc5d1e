// Command demo shows the operator at work on the local cluster: it deploys
// the operator from config/ (the config/e2e overlay), then runs the tour of
// package test/demo with a live view. `make demo` brings the cluster up
// around it and down after it.
//
//	KUBECONFIG=… KUBECTL=… go run ./hack/demo [--duration 90s] [--report report.json]
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

func main() {
	var o demo.Options
	var report string
	var deploy bool
	flag.StringVar(&o.Namespace, "namespace", "demo", "Namespace of the demo's objects.")
	flag.IntVar(&o.BasePort, "base-port", 17100, "Host port of Redis member 0 (member i listens on base+i).")
	flag.DurationVar(&o.TTL, "ttl", 6*time.Second, "TTL of the locks and maxLockTTL of the master set.")
	flag.DurationVar(&o.Duration, "duration", 0, "Stop after this long, or once the tour is done (0: run until Ctrl-C).")
	flag.StringVar(&o.ClusterState, "cluster-state", envOr("CLUSTER_STATE", "/var/tmp/redlock-cluster"), "hack/local-cluster's state directory.")
	flag.StringVar(&report, "report", "", "Write the report as JSON to this file.")
	flag.BoolVar(&deploy, "deploy", true, "Deploy the operator (kustomize config/e2e, server-side apply) first.")
	flag.Parse()
	o.Out = os.Stdout
	if fi, err := os.Stdout.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		o.Live = true
	}
	kubeconfig, kubectl := os.Getenv("KUBECONFIG"), envOr("KUBECTL", "kubectl")
	o.Hint = fmt.Sprintf("In another terminal: KUBECONFIG=%s %s get dlock,rms,pods -A", kubeconfig, kubectl)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, o, kubeconfig, kubectl, deploy)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	summary(rep)
	if report != "" {
		data, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(report, data, 0o644); err != nil { //nolint:gosec // a report, not a secret
			fmt.Fprintln(os.Stderr, "demo:", err)
			os.Exit(1)
		}
	}
	if o.Duration > 0 && len(rep.Failures()) > 0 {
		os.Exit(1)
	}
}

func run(ctx context.Context, o demo.Options, kubeconfig, kubectl string, deploy bool) (*demo.Report, error) {
	redis.SetLogger(quiet{})
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	if deploy {
		if err := deployOperator(ctx, c, kubectl); err != nil {
			return nil, err
		}
	}
	return demo.Run(ctx, c, o)
}

// deployOperator applies config/e2e (config/default for the local
// cluster: host network, imported image) and waits for the manager.
func deployOperator(ctx context.Context, c client.Client, kubectl string) error {
	fmt.Println("demo: deploying the operator (config/default with the config/e2e overlay) …")
	manifests, err := exec.CommandContext(ctx, "go", "tool", "-modfile=hack/tools/go.mod", "kustomize", "build", "config/e2e").Output()
	if err != nil {
		return fmt.Errorf("kustomize build config/e2e: %w", err)
	}
	apply := exec.CommandContext(ctx, kubectl, "apply", "--server-side", "-f", "-")
	apply.Stdin = bytes.NewReader(manifests)
	if out, err := apply.CombinedOutput(); err != nil {
		return fmt.Errorf("kubectl apply: %w: %s", err, out)
	}
	fmt.Println("demo: waiting for the manager to be available …")
	deadline := time.Now().Add(3 * time.Minute)
	for {
		d := &appsv1.Deployment{}
		err := c.Get(ctx, client.ObjectKey{Namespace: "redlock-system", Name: "redlock-operator-controller-manager"}, d)
		if err == nil && d.Status.AvailableReplicas > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the manager is not available after 3 minutes (last error: %w)", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func summary(rep *demo.Report) {
	fmt.Printf("\ndemo: %s\n", strings.Repeat("─", 60))
	for _, s := range rep.Done {
		fmt.Println("  ✓", s)
	}
	for _, f := range rep.Failures() {
		fmt.Println("  ✗", f)
	}
	if c := rep.Crash; c != nil {
		fmt.Printf("  member #%d: out of service %v (restart delay %v); lock %s token %d before, %d after\n",
			c.Member, c.OutOfService.Round(100*time.Millisecond), c.RestartDelay.Round(10*time.Millisecond), demo.IdentityLk, c.TokenBefore, c.TokenAfter)
	}
	for _, j := range rep.Jobs {
		fmt.Printf("  %s ran %s–%s with fencing token %d\n", j.Pod, j.Start.Format("15:04:05"), j.Finish.Format("15:04:05"), j.Token)
	}
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}
