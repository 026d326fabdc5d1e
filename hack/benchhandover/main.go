// Command benchhandover measures how fast the operator hands a lock from
// pod to pod, next to the Kubernetes-native alternative in the same run: a
// Lease handed over between two candidates by client-go's leaderelection
// with its defaults (15s lease, 10s renew deadline, 2s retry period).
//
// It starts a real kube-apiserver and etcd (envtest), five redis-server
// masters and the manager in this process. envtest has no kubelet: the
// program binds the holder pod and reports it running, then, at t0, marks
// it Succeeded (or deletes it); the handover ends when a watch shows the
// next pod's scheduling gate removed — the moment the scheduler may place
// it. For the Lease, t0 is when the leader's context ends (with
// ReleaseOnCancel, so it gives the lease up at once, or, as client-go
// defaults, not) and the end is the other candidate's OnStartedLeading.
//
//	KUBEBUILDER_ASSETS=$(hack/build-envtest.sh) go run ./hack/benchhandover
//
// (`make bench-handover` does this.)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/benchenv"
	"github.com/redlock-operator/redlock-operator/internal/harness/podsim"
)

var (
	handovers      = flag.Int("handovers", 100, "pod-to-pod handovers (half by the holder succeeding, half by its deletion)")
	grants         = flag.Int("grants", 20, "grants of a free lock to a new pod")
	leaseHandovers = flag.Int("lease-handovers", 100, "Lease handovers with ReleaseOnCancel")
	expiryHandover = flag.Int("lease-expiry-handovers", 10, "Lease handovers with client-go's default ReleaseOnCancel=false (each waits out the 15s lease)")
	leasePairs     = flag.Int("lease-pairs", 10, "Lease candidate pairs running at once (each its own Lease)")
	ttl            = flag.Duration("ttl", 10*time.Second, "lock TTL")
)

const ns, node = "bench", "node-1"

// pod names a pod of the benchmark's namespace.
func pod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

func main() {
	flag.Parse()
	benchenv.Quiet()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchhandover:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env, err := benchenv.Start(ctx, benchenv.Options{MaxLockTTL: *ttl, Workers: 4, Namespace: ns})
	if err != nil {
		return err
	}
	defer env.Close()

	ungated := podsim.NewGateWatch()
	if err := ungated.Watch(ctx, env.Client, ns); err != nil {
		return err
	}
	fmt.Printf("pod handovers (%d)...\n", *handovers)
	succeeded, deleted, err := podHandovers(ctx, env.Client, ungated)
	if err != nil {
		return fmt.Errorf("pod handovers: %w", err)
	}
	fmt.Printf("grants of a free lock (%d)...\n", *grants)
	grant, err := freeGrants(ctx, env.Client, ungated)
	if err != nil {
		return fmt.Errorf("grants: %w", err)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return err
	}
	fmt.Printf("Lease handovers with ReleaseOnCancel (%d, %d pairs at once)...\n", *leaseHandovers, *leasePairs)
	leaseRelease, err := leaseRuns(ctx, cs, "release", *leaseHandovers, true)
	if err != nil {
		return fmt.Errorf("lease handovers: %w", err)
	}
	fmt.Printf("Lease handovers by expiry (%d, %d pairs at once)...\n", *expiryHandover, *leasePairs)
	leaseExpiry, err := leaseRuns(ctx, cs, "expiry", *expiryHandover, false)
	if err != nil {
		return fmt.Errorf("lease handovers by expiry: %w", err)
	}

	all := append(slices.Clone(succeeded), deleted...)
	fmt.Printf("\nenvtest kube-apiserver + etcd, 5 masters, lock ttl %v, manager in this process, %d CPUs\n\n", *ttl, runtime.NumCPU())
	fmt.Println("| handover: holder done → next may run | n | p50 | p99 | max |")
	fmt.Println("|---|---:|---:|---:|---:|")
	row := func(name string, d []time.Duration) {
		fmt.Printf("| %s | %d | %v | %v | %v |\n", name, len(d), round(pct(d, 0.5)), round(pct(d, 0.99)), round(pct(d, 1)))
	}
	row("redlock-operator: holder pod Succeeded or deleted → next pod's scheduling gate removed", all)
	row("… of which holder Succeeded", succeeded)
	row("… of which holder deleted", deleted)
	row("Lease (client-go leaderelection 15s/10s/2s, ReleaseOnCancel): leader stops → other leads", leaseRelease)
	row("Lease (client-go defaults, no ReleaseOnCancel): leader stops → other leads", leaseExpiry)
	row("redlock-operator: new pod on a free lock, create → scheduling gate removed", grant)
	fmt.Printf("\n| ratio | p50 | p99 |\n|---|---:|---:|\n")
	fmt.Printf("| Lease with ReleaseOnCancel / redlock-operator | %.0f× | %.0f× |\n",
		float64(pct(leaseRelease, 0.5))/float64(pct(all, 0.5)), float64(pct(leaseRelease, 0.99))/float64(pct(all, 0.99)))
	fmt.Printf("| Lease by expiry / redlock-operator | %.0f× | %.0f× |\n",
		float64(pct(leaseExpiry, 0.5))/float64(pct(all, 0.5)), float64(pct(leaseExpiry, 0.99))/float64(pct(all, 0.99)))
	return nil
}

func createLock(ctx context.Context, k8s client.Client, name string) error {
	return k8s.Create(ctx, &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.DistributedLockSpec{MasterSet: benchenv.MasterSet, TTL: metav1.Duration{Duration: *ttl}},
	})
}

// podHandovers queues handovers+1 pods on one lock and hands it down the
// line: holder i is marked Succeeded (even i) or deleted (odd i) at t0,
// and the handover ends when the watch shows pod i+1 ungated.
func podHandovers(ctx context.Context, k8s client.Client, ungated *podsim.GateWatch) (succeeded, deleted []time.Duration, err error) {
	if err := createLock(ctx, k8s, "line"); err != nil {
		return nil, nil, err
	}
	name := func(i int) string { return fmt.Sprintf("line-%04d", i) }
	for i := range *handovers + 1 {
		if err := k8s.Create(ctx, podsim.Gated(ns, name(i), map[string]string{v1alpha1.LockLabel: "line"})); err != nil {
			return nil, nil, err
		}
	}
	if _, _, err := ungated.Wait(ctx, time.Minute, name(0)); err != nil {
		return nil, nil, err
	}
	for i := range *handovers {
		if err := podsim.Run(ctx, k8s, pod(name(i)), node); err != nil {
			return nil, nil, err
		}
		t0 := time.Now()
		if i%2 == 0 {
			err = podsim.Finish(ctx, k8s, pod(name(i)), 0)
		} else {
			err = k8s.Delete(ctx, pod(name(i)), client.GracePeriodSeconds(0))
		}
		if err != nil {
			return nil, nil, err
		}
		_, t1, err := ungated.Wait(ctx, time.Minute, name(i+1))
		if err != nil {
			return nil, nil, err
		}
		if i%2 == 0 {
			succeeded = append(succeeded, t1.Sub(t0))
		} else {
			deleted = append(deleted, t1.Sub(t0))
		}
	}
	return succeeded, deleted, nil
}

// freeGrants creates a pod for a free lock, times until it is ungated,
// then lets it finish and waits until the lock is free again.
func freeGrants(ctx context.Context, k8s client.Client, ungated *podsim.GateWatch) ([]time.Duration, error) {
	if err := createLock(ctx, k8s, "free"); err != nil {
		return nil, err
	}
	var out []time.Duration
	for i := range *grants {
		name := fmt.Sprintf("free-%04d", i)
		t0 := time.Now()
		if err := k8s.Create(ctx, podsim.Gated(ns, name, map[string]string{v1alpha1.LockLabel: "free"})); err != nil {
			return nil, err
		}
		_, t1, err := ungated.Wait(ctx, time.Minute, name)
		if err != nil {
			return nil, err
		}
		out = append(out, t1.Sub(t0))
		if err := podsim.Run(ctx, k8s, pod(name), node); err != nil {
			return nil, err
		}
		if err := podsim.Finish(ctx, k8s, pod(name), 0); err != nil {
			return nil, err
		}
		if err := benchenv.WaitFor(ctx, time.Minute, func() (bool, error) {
			l := &v1alpha1.DistributedLock{}
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "free"}, l)
			return err == nil && l.Status.Holder == nil, err
		}); err != nil {
			return nil, fmt.Errorf("lock not free after %s finished: %w", name, err)
		}
	}
	return out, nil
}

// leaseRuns runs n Lease handovers spread over leasePairs pairs of
// candidates at once, each pair on its own Lease.
func leaseRuns(ctx context.Context, cs kubernetes.Interface, prefix string, n int, releaseOnCancel bool) ([]time.Duration, error) {
	var mu sync.Mutex
	var out []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	pairs := min(*leasePairs, n)
	for p := range pairs {
		count := n / pairs
		if p < n%pairs {
			count++
		}
		wg.Go(func() {
			d, err := leasePair(ctx, cs, fmt.Sprintf("%s-%d", prefix, p), count, releaseOnCancel)
			mu.Lock()
			defer mu.Unlock()
			out = append(out, d...)
			if err != nil && firstErr == nil {
				firstErr = err
			}
		})
	}
	wg.Wait()
	return out, firstErr
}

// leasePair hands one Lease back and forth between candidates a and b
// count times. Each handover stops the leader (t0) and ends when the other
// candidate starts leading; the stopped one then runs again as a
// candidate, so that it takes the next handover.
func leasePair(ctx context.Context, cs kubernetes.Interface, lease string, count int, releaseOnCancel bool) ([]time.Duration, error) {
	leading := make(chan string, 2)
	type candidate struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	start := func(id string) (*candidate, error) {
		lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, lease, cs.CoreV1(), cs.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
		if err != nil {
			return nil, err
		}
		el, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   15 * time.Second, // client-go's and controller-runtime's defaults
			RenewDeadline:   10 * time.Second,
			RetryPeriod:     2 * time.Second,
			ReleaseOnCancel: releaseOnCancel,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { leading <- id },
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithCancel(ctx)
		c := &candidate{cancel: cancel, done: make(chan struct{})}
		go func() { defer close(c.done); el.Run(cctx) }()
		return c, nil
	}
	cands := map[string]*candidate{}
	defer func() {
		for _, c := range cands {
			c.cancel()
			<-c.done
		}
	}()
	for _, id := range []string{"a", "b"} {
		c, err := start(id)
		if err != nil {
			return nil, err
		}
		cands[id] = c
	}
	leader := <-leading
	var out []time.Duration
	for range count {
		t0 := time.Now()
		cands[leader].cancel()
		<-cands[leader].done
		var next string
		select {
		case next = <-leading:
		case <-time.After(time.Minute):
			return out, fmt.Errorf("lease %s: no new leader within a minute", lease)
		}
		out = append(out, time.Since(t0))
		if next == leader {
			return out, fmt.Errorf("lease %s: %s led again", lease, leader)
		}
		c, err := start(leader)
		if err != nil {
			return out, err
		}
		cands[leader] = c
		leader = next
	}
	return out, nil
}

func pct(d []time.Duration, p float64) time.Duration { return benchenv.Percentile(d, p) }

func round(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(100 * time.Microsecond)
}
