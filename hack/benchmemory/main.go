// Command benchmemory measures the manager's memory before and after 1,000
// unrelated ConfigMaps and 1,000 unrelated Secrets (4 KiB each) appear in
// the cluster: a manager whose cache holds only the objects it owns stays
// flat. It runs the manager binary against envtest, with one managed
// RedisMasterSet (so that the caches of every kind it owns are started),
// and reads the process's RSS and Go heap.
//
//	make bench-memory [BENCH_MEMORY_FLAGS="--manager /path/to/other/manager"]
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/benchenv"
)

func main() {
	manager := flag.String("manager", "", "Manager binary to measure (default: build ./cmd/manager).")
	objects := flag.Int("objects", 1000, "Unrelated ConfigMaps, and as many Secrets, to create.")
	settle := flag.Duration("settle", 15*time.Second, "Wait before each measurement.")
	flag.Parse()
	benchenv.Quiet()
	if err := run(context.Background(), *manager, *objects, *settle); err != nil {
		fmt.Fprintln(os.Stderr, "benchmemory:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, bin string, n int, settle time.Duration) error {
	dir, err := os.MkdirTemp("", "benchmemory")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if bin == "" {
		if bin, err = benchenv.BuildManager(dir); err != nil {
			return err
		}
	}
	_, file, _, _ := runtime.Caller(0)
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join(filepath.Dir(file), "..", "..", "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("envtest: %w", err)
	}
	defer func() { _ = env.Stop() }()
	scheme := k8sruntime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	kubeconfig, err := benchenv.Kubeconfig(env, dir)
	if err != nil {
		return err
	}
	for _, ns := range []string{"redlock-system", "locks"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return err
		}
	}

	metricsAddr, err := benchenv.FreeAddr()
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--leader-elect=false", "--enable-webhook=false", //nolint:gosec // the binary to measure
		"--health-probe-bind-address=0", "--metrics-secure=false", "--metrics-bind-address="+metricsAddr)
	cmd.Env = append(os.Environ(), "POD_NAMESPACE=redlock-system")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	// One managed set: the manager then reads every kind it owns.
	if err := c.Create(ctx, &v1alpha1.RedisMasterSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "locks", Name: "masters"},
		Spec: v1alpha1.RedisMasterSetSpec{
			MaxLockTTL: metav1.Duration{Duration: 10 * time.Second},
			Managed:    &v1alpha1.ManagedMasters{Replicas: 3, Image: "redis:7.2", Port: 6379, Persistence: v1alpha1.PersistenceNone},
		},
	}); err != nil {
		return err
	}
	if err := benchenv.WaitFor(ctx, 2*time.Minute, func() (bool, error) {
		return c.Get(ctx, client.ObjectKey{Namespace: "locks", Name: "masters"}, &appsv1.StatefulSet{}) == nil, nil
	}); err != nil {
		return fmt.Errorf("the manager never created the StatefulSet: %w", err)
	}

	time.Sleep(settle)
	before, err := measure(cmd.Process.Pid, metricsAddr)
	if err != nil {
		return err
	}
	payload := strings.Repeat("x", 4096)
	start := time.Now()
	for i := range n {
		ns := fmt.Sprintf("unrelated-%d", i%10)
		if i < 10 {
			if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				return err
			}
		}
		name := fmt.Sprintf("obj-%d", i)
		if err := c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{"data": payload}}); err != nil {
			return err
		}
		if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, StringData: map[string]string{"data": payload}}); err != nil {
			return err
		}
	}
	created := time.Since(start)
	time.Sleep(settle)
	after, err := measure(cmd.Process.Pid, metricsAddr)
	if err != nil {
		return err
	}
	fmt.Printf("\nmanager memory with %d unrelated ConfigMaps and %d unrelated Secrets (4 KiB each; created in %v)\n\n", n, n, created.Round(time.Second))
	fmt.Printf("| %-22s | %12s | %12s | %10s |\n", "", "before", "after", "growth")
	fmt.Printf("|%s|%s|%s|%s|\n", strings.Repeat("-", 24), strings.Repeat("-", 14), strings.Repeat("-", 14), strings.Repeat("-", 12))
	for _, row := range []struct {
		name string
		a, b float64
	}{{"RSS (MiB)", before.rss, after.rss}, {"Go heap in use (MiB)", before.heap, after.heap}} {
		fmt.Printf("| %-22s | %12.1f | %12.1f | %+9.1f |\n", row.name, row.a, row.b, row.b-row.a)
	}
	return nil
}

type sample struct{ rss, heap float64 } // MiB

// measure takes the largest of five samples a second apart.
func measure(pid int, metricsAddr string) (sample, error) {
	var out sample
	for range 5 {
		rss, err := rssMiB(pid)
		if err != nil {
			return out, err
		}
		heap, err := heapMiB(metricsAddr)
		if err != nil {
			return out, err
		}
		out.rss, out.heap = max(out.rss, rss), max(out.heap, heap)
		time.Sleep(time.Second)
	}
	return out, nil
}

func rssMiB(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// heapMiB is the manager's heap in use, from its metrics endpoint.
func heapMiB(addr string) (float64, error) {
	b, err := benchenv.Metric(addr, "go_memstats_heap_inuse_bytes")
	return b / (1 << 20), err
}
