// Command benchpodgate measures how much work the pod-gate controller does
// for locks that are only being refreshed: it starts a real kube-apiserver
// and etcd (envtest), five redis-server masters and the manager in this
// process, creates the locks and the pods queued on them (scheduling-gated,
// labelled; one per lock is granted and holds it, the rest wait), and then,
// for a while with no grant changing, counts the pod-gate reconciles per
// status refresh of the locks. It prints a table.
//
//	KUBEBUILDER_ASSETS=$(hack/build-envtest.sh) go run ./hack/benchpodgate -locks 10 -pods 1000
//
// (`make bench-podgate` does this.)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/benchenv"
)

var (
	nLocks   = flag.Int("locks", 10, "locks")
	nPods    = flag.Int("pods", 1000, "pods queued, spread evenly over the locks")
	ttl      = flag.Duration("ttl", 10*time.Second, "lock TTL")
	duration = flag.Duration("duration", time.Minute, "how long to count, with every lock held")
	timeout  = flag.Duration("grant-timeout", 3*time.Minute, "how long to wait for every lock to be held and every pod seen")
)

func main() {
	flag.Parse()
	benchenv.Quiet()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchpodgate:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env, err := benchenv.Start(ctx, benchenv.Options{MaxLockTTL: *ttl, Workers: 8, Namespace: "bench"})
	if err != nil {
		return err
	}
	defer env.Close()
	k8s := env.Client

	fmt.Printf("creating %d locks and %d pods queued on them...\n", *nLocks, *nPods)
	for i := range *nLocks {
		if err := k8s.Create(ctx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: env.Namespace, Name: lockName(i)},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: benchenv.MasterSet, TTL: metav1.Duration{Duration: *ttl}},
		}); err != nil {
			return err
		}
	}
	for i := range *nPods {
		if err := k8s.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: env.Namespace, Name: fmt.Sprintf("pod-%05d", i),
				Labels: map[string]string{v1alpha1.LockLabel: lockName(i % *nLocks)}},
			Spec: corev1.PodSpec{
				Containers:      []corev1.Container{{Name: "work", Image: "busybox"}},
				SchedulingGates: []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGate}},
			},
		}); err != nil {
			return err
		}
	}
	if err := benchenv.WaitFor(ctx, *timeout, func() (bool, error) {
		var locks v1alpha1.DistributedLockList
		if err := k8s.List(ctx, &locks, client.InNamespace(env.Namespace)); err != nil {
			return false, nil
		}
		for _, l := range locks.Items {
			if l.Status.Holder == nil || l.Status.Holder.Pod == nil {
				return false, nil
			}
		}
		return len(locks.Items) == *nLocks, nil
	}); err != nil {
		return fmt.Errorf("waiting for every lock to be held by a pod: %w", err)
	}
	// Let the grants' own pod writes (annotation, ungating, readiness) and
	// the first reconcile of every pod settle before counting.
	if err := settle(ctx); err != nil {
		return err
	}

	c := &counter{grants: map[string]string{}}
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var list v1alpha1.DistributedLockList
	w, err := k8s.Watch(wctx, &list, client.InNamespace(env.Namespace))
	if err != nil {
		stopWatch()
		return err
	}
	wg.Go(func() { c.run(w) })
	r0, err := reconciles()
	if err != nil {
		stopWatch()
		return err
	}
	fmt.Printf("every lock held; counting for %v...\n", *duration)
	time.Sleep(*duration) // the measurement window itself, not a synchronisation
	r1, err := reconciles()
	stopWatch()
	w.Stop()
	wg.Wait()
	if err != nil {
		return err
	}
	refreshes, changed := c.result()
	fmt.Printf("\n%d locks at ttl %v, %d pods queued on them (one holder per lock), counted over %v with the manager in this process\n\n", *nLocks, *ttl, *nPods, *duration)
	fmt.Println("| status refreshes | grant changes | pod-gate reconciles | reconciles per refresh | pods per lock |")
	fmt.Println("|---:|---:|---:|---:|---:|")
	fmt.Printf("| %d | %d | %.0f | %.2f | %d |\n", refreshes, changed, r1-r0, (r1-r0)/float64(max(refreshes, 1)), *nPods / *nLocks)
	return nil
}

func lockName(i int) string { return fmt.Sprintf("lock-%03d", i) }

// settle waits until the pod-gate controller has done no reconcile for two
// seconds running.
func settle(ctx context.Context) error {
	last, quiet := -1.0, time.Now()
	return benchenv.WaitFor(ctx, *timeout, func() (bool, error) {
		n, err := reconciles()
		if err != nil {
			return false, err
		}
		if n != last {
			last, quiet = n, time.Now()
		}
		return time.Since(quiet) > 2*time.Second, nil
	})
}

// reconciles is the pod-gate controller's reconcile count so far.
func reconciles() (float64, error) { return benchenv.Reconciles("podgate") }

// counter counts the versions of the locks that only refreshed the shown
// validity, and those that changed the grant.
type counter struct {
	mu                 sync.Mutex
	grants             map[string]string
	refreshes, changed int
}

func (c *counter) run(w watch.Interface) {
	for ev := range w.ResultChan() {
		l, ok := ev.Object.(*v1alpha1.DistributedLock)
		if !ok || ev.Type != watch.Added && ev.Type != watch.Modified {
			continue
		}
		c.mu.Lock()
		if ev.Type == watch.Added {
			c.grants[l.Name] = l.Status.GrantID
			c.mu.Unlock()
			continue
		}
		if prev, seen := c.grants[l.Name]; seen && prev == l.Status.GrantID {
			c.refreshes++
		} else if seen {
			c.changed++
		}
		c.grants[l.Name] = l.Status.GrantID
		c.mu.Unlock()
	}
}

func (c *counter) result() (refreshes, changed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refreshes, c.changed
}
