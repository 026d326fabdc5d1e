// Command benchsemaphore measures a DistributedSemaphore serving a queue of
// pods, next to a DistributedLock serving the same queue in the same run:
// grants per second and slot handover latency; and the Go client
// (pkg/lockclient) holding a lock for a critical section next to client-go's
// leaderelection on a Lease: Acquire → granted, Release → next granted.
//
// It starts a real kube-apiserver and etcd (envtest), five redis-server
// masters and the manager in this process. envtest has no kubelet: the
// program plays it. All the pods of a run are created at once, labelled
// for the semaphore (or the lock); each pod, once a watch shows it
// ungated, is bound and reported running, holds for -hold, and is marked
// Succeeded. A handover is the time from a holder's Succeeded to the watch
// showing the next pod of the same slot (or lock) ungated. The program
// also counts, from the pods it runs, the most that held at once, and
// every error (a failed status write, a pod never ungated) without
// stopping.
//
//	KUBEBUILDER_ASSETS=$(hack/build-envtest.sh) go run ./hack/benchsemaphore
//
// (`make bench-semaphore` does this.)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/benchenv"
	"github.com/redlock-operator/redlock-operator/internal/harness/podsim"
)

var (
	pods   = flag.Int("pods", 30, "pods queued per run")
	slots  = flag.Int("slots", 3, "slots of the semaphore")
	hold   = flag.Duration("hold", 200*time.Millisecond, "how long each pod holds its slot")
	ttl    = flag.Duration("ttl", 10*time.Second, "ttl of the semaphore and of the locks")
	rounds = flag.Int("rounds", 20, "rounds of the Go client and of leaderelection")
)

const (
	ns   = "bench"
	node = "node-1"
)

func main() {
	flag.Parse()
	benchenv.Quiet()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchsemaphore:", err)
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
	if err := podsim.NodeReady(ctx, env.Client, node, corev1.ConditionTrue); err != nil {
		return err
	}

	fmt.Printf("semaphore of %d slots, %d pods...\n", *slots, *pods)
	sem := &v1alpha1.DistributedSemaphore{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sem"},
		Spec: v1alpha1.DistributedSemaphoreSpec{
			MasterSet: benchenv.MasterSet, Slots: int32(*slots), TTL: metav1.Duration{Duration: *ttl}, //nolint:gosec // a flag
		},
	}
	if err := env.Client.Create(ctx, sem); err != nil {
		return fmt.Errorf("create semaphore: %w", err)
	}
	semRun := queue(ctx, env.Client, "sem", v1alpha1.SemaphoreLabel)

	fmt.Printf("lock, %d pods...\n", *pods)
	lock := &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lock"},
		Spec:       v1alpha1.DistributedLockSpec{MasterSet: benchenv.MasterSet, TTL: metav1.Duration{Duration: *ttl}},
	}
	if err := env.Client.Create(ctx, lock); err != nil {
		return fmt.Errorf("create lock: %w", err)
	}
	lockRun := queue(ctx, env.Client, "lock", v1alpha1.LockLabel)

	fmt.Printf("Go client and leaderelection, %d rounds each...\n", *rounds)
	clientRun := lockClientRun(ctx, env.Client, *rounds)
	elections := []electionTimings{
		{"defaults", 15 * time.Second, 10 * time.Second, 2 * time.Second},
		{"fast", 3 * time.Second, 2 * time.Second, 200 * time.Millisecond},
	}
	var electionRuns []clientResult
	for _, t := range elections {
		electionRuns = append(electionRuns, leaderElectionRun(ctx, env.Config, *rounds, t))
	}

	fmt.Printf("\nenvtest kube-apiserver + etcd, 5 masters, ttl %v, hold %v, manager in this process, %d CPUs\n\n", *ttl, *hold, runtime.NumCPU())
	fmt.Println("| run | pods | grants/s | handover p50 | handover p99 | most holding at once | errors |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	row := func(name string, r result) {
		fmt.Printf("| %s | %d | %.1f | %v | %v | %d | %d |\n", name, r.granted, r.rate(), round(pct(r.handovers, 0.5)), round(pct(r.handovers, 0.99)), r.most, len(r.errs))
	}
	row(fmt.Sprintf("DistributedSemaphore, %d slots", *slots), semRun)
	row("DistributedLock", lockRun)
	fmt.Printf("\n| ratio, semaphore / lock | grants/s | handover p50 | handover p99 |\n|---|---:|---:|---:|\n")
	fmt.Printf("| | %.2f× | %.2f× | %.2f× |\n", semRun.rate()/lockRun.rate(),
		ratio(pct(semRun.handovers, 0.5), pct(lockRun.handovers, 0.5)), ratio(pct(semRun.handovers, 0.99), pct(lockRun.handovers, 0.99)))
	fmt.Printf("\n| critical section in a process | rounds | Acquire → granted p50 | p99 | Release → next granted p50 | p99 | errors |\n|---|---:|---:|---:|---:|---:|---:|\n")
	crow := func(name string, r clientResult) {
		fmt.Printf("| %s | %d | %v | %v | %v | %v | %d |\n", name, len(r.handover), round(pct(r.acquire, 0.5)), round(pct(r.acquire, 0.99)),
			round(pct(r.handover, 0.5)), round(pct(r.handover, 0.99)), len(r.errs))
	}
	crow("pkg/lockclient, DistributedLock (holderLease 3s)", clientRun)
	for i, t := range elections {
		crow(fmt.Sprintf("client-go leaderelection, Lease (%s: %v/%v/%v)", t.name, t.leaseDuration, t.renewDeadline, t.period), electionRuns[i])
	}
	fmt.Printf("\n| ratio, lockclient / leaderelection | Acquire p50 | Release → next p50 |\n|---|---:|---:|\n")
	for i, t := range elections {
		e := electionRuns[i]
		fmt.Printf("| %s | %.2f× | %.2f× |\n", t.name, ratio(pct(clientRun.acquire, 0.5), pct(e.acquire, 0.5)), ratio(pct(clientRun.handover, 0.5), pct(e.handover, 0.5)))
	}
	for _, r := range append([]clientResult{clientRun}, electionRuns...) {
		for _, err := range r.errs[:min(len(r.errs), 5)] {
			fmt.Println("error:", err)
		}
	}
	for _, r := range []result{semRun, lockRun} {
		for _, err := range r.errs[:min(len(r.errs), 5)] {
			fmt.Println("error:", err)
		}
	}
	if semRun.most > *slots || lockRun.most > 1 {
		return fmt.Errorf("more holders at once than allowed: semaphore %d of %d, lock %d of 1", semRun.most, *slots, lockRun.most)
	}
	return nil
}

// result is one run's measurements.
type result struct {
	granted   int
	elapsed   time.Duration // first pod created → last pod ungated
	handovers []time.Duration
	most      int
	errs      []error
}

func (r result) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.granted) / r.elapsed.Seconds()
}

// queue creates *pods gated pods labelled label: name and plays their
// kubelet until each has run, or a pod waits past a deadline.
func queue(ctx context.Context, k8s client.WithWatch, name, label string) result {
	var (
		mu       sync.Mutex
		r        result
		holding  int
		finished = map[string]time.Time{} // slot lock → when its last holder finished
		started  = map[string]bool{}
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		r.errs = append(r.errs, err)
		mu.Unlock()
	}
	var list corev1.PodList
	if err := k8s.List(ctx, &list, client.InNamespace(ns)); err != nil {
		r.errs = append(r.errs, err)
		return r
	}
	w, err := k8s.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns), client.MatchingLabels{label: name},
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		r.errs = append(r.errs, err)
		return r
	}
	defer w.Stop()

	begin := time.Now()
	for i := range *pods {
		p := podsim.Gated(ns, fmt.Sprintf("%s-%03d", name, i), map[string]string{label: name})
		if err := k8s.Create(ctx, p); err != nil {
			fail(fmt.Errorf("create %s: %w", p.Name, err))
		}
	}
	deadline := time.After(time.Duration(*pods)*(*hold+*ttl) + time.Minute)
	var last time.Time
	for r.granted+len(r.errs) < *pods {
		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-deadline:
			fail(fmt.Errorf("%d of %d pods of %s not granted in time", *pods-r.granted, *pods, name))
			wg.Wait()
			r.elapsed = last.Sub(begin)
			return r
		}
		pod, ok := ev.Object.(*corev1.Pod)
		if !ok || ev.Type == watch.Deleted || podsim.IsGated(pod) {
			continue
		}
		now := time.Now()
		mu.Lock()
		if started[pod.Name] {
			mu.Unlock()
			continue
		}
		started[pod.Name] = true
		r.granted++
		last = now
		slot := pod.Annotations[v1alpha1.LockNameAnnotation]
		if t, ok := finished[slot]; ok {
			r.handovers = append(r.handovers, now.Sub(t))
		}
		holding++
		r.most = max(r.most, holding)
		mu.Unlock()
		wg.Go(func() {
			if err := podsim.Run(ctx, k8s, pod, node); err != nil {
				fail(err)
			}
			time.Sleep(*hold) // the pod's work
			mu.Lock()
			holding-- // before Finish: no pod is granted before it is written
			finished[slot] = time.Now()
			mu.Unlock()
			if err := podsim.Finish(ctx, k8s, pod, 0); err != nil {
				fail(err)
			}
		})
	}
	wg.Wait()
	r.elapsed = last.Sub(begin)
	return r
}

func pct(d []time.Duration, p float64) time.Duration { return benchenv.Percentile(d, p) }

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func round(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
