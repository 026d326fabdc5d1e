// Command leasepeer is the Kubernetes-native peer of an agent-run app for
// the pod failover benchmark (make bench-failover-pods): client-go's
// leaderelection on a Lease (15s lease, 10s renew deadline, 2s retry
// period, ReleaseOnCancel), run as a Deployment's container. Its "app"
// runs while it leads and reports its active periods as the agent's apps
// do (test/e2e activeScript): a line "start UPTIME POD N" when it starts
// and "stop UPTIME POD N" when it stops, appended to $REPORT, stamped with
// the host's /proc/uptime.
//
// On SIGTERM the app stops first and only then is the elector's context
// cancelled, so that ReleaseOnCancel gives the Lease up after the guarded
// work is done, as client-go asks; a lost Lease stops the app and ends
// the process (the kubelet restarts it).
//
// The e2e suite builds it statically and imports it into the local
// cluster as the image leasepeer:local.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func main() {
	if err := run(); err != nil {
		slog.Error("leasepeer", "err", err)
		os.Exit(1)
	}
}

// app is the work the Lease guards: it runs between start and stop.
type app struct {
	report, pod string
	mu          sync.Mutex
	n           int
	stop        chan struct{} // closed to stop the running app; nil when none runs
	stopped     chan struct{} // closed once the running app has reported its stop
}

func (a *app) write(what string, n int) {
	up, err := os.ReadFile("/proc/uptime")
	if err != nil {
		slog.Error("reading /proc/uptime", "err", err)
		return
	}
	line := fmt.Sprintf("%s %s %s %d\n", what, strings.Fields(string(up))[0], a.pod, n)
	f, err := os.OpenFile(a.report, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		slog.Error("opening the report", "err", err)
		return
	}
	defer func() { _ = f.Close() }()
	if _, err := f.WriteString(line); err != nil {
		slog.Error("writing the report", "err", err)
	}
}

// run is OnStartedLeading: the app runs until the leader's context ends
// (the Lease is lost) or halt stops it.
func (a *app) run(ctx context.Context) {
	a.mu.Lock()
	a.n++
	n := a.n
	stop, stopped := make(chan struct{}), make(chan struct{})
	a.stop, a.stopped = stop, stopped
	a.write("start", n)
	a.mu.Unlock()
	slog.Info("leading: the app runs", "n", n)
	select {
	case <-ctx.Done():
	case <-stop:
	}
	a.mu.Lock()
	a.write("stop", n)
	a.stop = nil
	a.mu.Unlock()
	close(stopped)
	slog.Info("the app stopped", "n", n)
}

// halt stops the running app, if any, and waits for its stop report.
func (a *app) halt() {
	a.mu.Lock()
	stop, stopped := a.stop, a.stopped
	if stop != nil {
		close(stop)
		a.stop = nil
	}
	a.mu.Unlock()
	if stopped != nil {
		<-stopped
	}
}

func run() error {
	pod, namespace, lease := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE"), os.Getenv("LEASE")
	a := &app{report: os.Getenv("REPORT"), pod: pod}
	if pod == "" || namespace == "" || lease == "" || a.report == "" {
		return fmt.Errorf("POD_NAME, POD_NAMESPACE, LEASE and REPORT are all needed")
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		slog.Info("stopping: the app first, then the Lease")
		a.halt()
		cancel()
	}()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: lease},
			Client:     cs.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: pod},
		},
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		Name:            lease,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: a.run,
			OnStoppedLeading: func() { slog.Info("not leading") },
		},
	})
	if err != nil {
		return err
	}
	le.Run(ctx)
	a.halt() // a lost Lease: the app has stopped (or is stopping) already
	return nil
}
