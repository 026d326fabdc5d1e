// Command benchfailover measures a leader handover with many locks held: it
// starts a real kube-apiserver and etcd (envtest), five redis-server masters
// and two manager processes with leader election, grants the locks (spread
// over one ttl), then stops the leader twice — SIGTERM, then, once the
// stopped manager runs again as the standby, SIGKILL — and prints a table
// per handover: locks granted again (their status lapsed before the new
// leader adopted them), refreshes that landed late, lapses a watch saw, and
// how long until the new leader had refreshed every lock. With -hog, a
// CPU-burning process runs on every core beside it. An overloaded leader
// keeps only the locks it can refresh (the rest wait or are shed): the
// handovers then start once the number held has not grown for -settle, and
// measure the locks held at the signal.
//
//	KUBEBUILDER_ASSETS=$(hack/build-envtest.sh) go run ./hack/benchfailover -locks 1000 -ttl 10s [-hog]
//
// (`make bench-failover` runs 1,000 locks at ttl 30s and at 10s;
// `make bench-failover-10k` 10,000 at 60s, which a 2-core machine does not
// finish.)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/benchenv"
	"github.com/redlock-operator/redlock-operator/internal/harness/hog"
)

var (
	nLocks       = flag.Int("locks", 1000, "locks to hold")
	ttl          = flag.Duration("ttl", 10*time.Second, "lock TTL")
	mgrQPS       = flag.Float64("kube-api-qps", 200, "the managers' --kube-api-qps")
	workers      = flag.Int("workers", 8, "the managers' --max-concurrent-reconciles")
	hogFlag      = flag.Bool("hog", false, "run a CPU-burning process on every core beside the benchmark")
	grantTimeout = flag.Duration("grant-timeout", 5*time.Minute, "how long to wait for every lock to be granted, or adopted")
	settleFlag   = flag.Duration("settle", time.Minute, "start the handovers once the number of locks held has not grown for this long, also when not every lock is held (an overloaded leader keeps what it can refresh)")
	managerArgs  = flag.String("manager-args", "", "more flags of both managers, space-separated (e.g. --failover-slack=20s)")
	keepLogs     = flag.Bool("keep-logs", false, "leave the managers' logs (at log level 1) behind, and say where")
	profile      = flag.String("profile", "", "write a CPU profile of the new leader over the 20 s after each signal to this directory")
)

func main() {
	hog.IfAsked()
	flag.Parse()
	benchenv.Quiet()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchfailover:", err)
		os.Exit(1)
	}
}

// result is what one handover did.
type result struct {
	signal     string
	held       int           // locks held at the signal: the ones measured
	shed       int           // ... of which not held once the new leader had written them
	regranted  int           // ... of which granted again with a new token
	expired    int           // ... of which the validity passed before the adoption
	late       float64       // refreshes the new leader wrote after the shown validity passed
	seenLapses int           // locks a watch saw with no valid status for a while
	worstLapse time.Duration // the longest of those
	adopted    time.Duration // signal → every lock refreshed by the new leader
	leastAhead time.Duration // the least validity any lock showed ahead at the signal
	errors     int           // API errors while watching (counted, not fatal)
	// cpu is the CPU time the API server, etcd and the new leader used,
	// over the time until every lock was refreshed by the new leader, in
	// cores; throttled the time its requests waited in its client's rate
	// limiter (rest_client_rate_limiter_duration_seconds).
	cpu       map[string]float64
	throttled time.Duration
}

func run() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "benchfailover")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	bin, err := benchenv.BuildManager(dir)
	if err != nil {
		return err
	}
	env, err := benchenv.Start(ctx, benchenv.Options{
		MaxLockTTL: *ttl, Workers: *workers, Namespace: "bench", ManagerQPS: float32(*mgrQPS),
		ManagerBinary: bin, ManagerArgs: strings.Fields(*managerArgs), KeepLogs: *keepLogs,
	})
	if err != nil {
		return err
	}
	defer env.Close()
	if *hogFlag {
		stop, err := hog.Start()
		if err != nil {
			return err
		}
		defer stop()
	}
	k8s := env.Client

	fmt.Printf("creating %d locks over one ttl (%v)...\n", *nLocks, *ttl)
	start := time.Now()
	tick := time.NewTicker(max(*ttl/time.Duration(*nLocks), time.Millisecond))
	for i := range *nLocks {
		if err := k8s.Create(ctx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: env.Namespace, Name: fmt.Sprintf("lock-%05d", i)},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: benchenv.MasterSet, TTL: metav1.Duration{Duration: *ttl}, HolderIdentity: fmt.Sprintf("holder-%d", i)},
		}); err != nil {
			return err
		}
		<-tick.C
	}
	tick.Stop()
	held, err := waitGranting(ctx, env)
	if err != nil {
		return fmt.Errorf("granting: %w", err)
	}
	if held == *nLocks {
		fmt.Printf("every lock granted %v after the first was created\n", time.Since(start).Round(time.Millisecond))
	} else {
		fmt.Printf("%d of %d locks held %v after the first was created, no more for %v: the handovers measure the locks held at the signal\n",
			held, *nLocks, time.Since(start).Round(time.Millisecond), *settleFlag)
	}

	var results []result
	// The tables print whatever was measured, also when a later handover
	// fails (a new leader that exits, a timeout).
	defer func() { printResults(results) }()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		r, err := handover(ctx, env, sig)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	return nil
}

// printResults prints the tables of the handovers measured.
func printResults(results []result) {
	if len(results) == 0 {
		return
	}
	fmt.Printf("\n%d locks at ttl %v, 5 masters, two manager processes (--kube-api-qps %v, %d workers%s; %s)\n\n",
		*nLocks, *ttl, *mgrQPS, *workers, hog.Describe(*hogFlag), strings.Join(append([]string{"default Lease"}, strings.Fields(*managerArgs)...), " "))
	fmt.Println("| leader stopped by | held at the signal | least validity shown ahead | granted again (validity passed) | shed | late refreshes | lapses a watch saw (longest) | every held lock written by the new leader | watch errors |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range results {
		fmt.Printf("| %s | %d | %v | %d (%d) | %d | %.0f | %d (%v) | %v | %d |\n", r.signal, r.held, r.leastAhead.Round(time.Millisecond), r.regranted, r.expired,
			r.shed, r.late, r.seenLapses, r.worstLapse.Round(time.Millisecond), r.adopted.Round(time.Millisecond), r.errors)
	}
	fmt.Println("\nuntil every lock was refreshed by the new leader, in cores (of 2), and the time the new leader's requests waited in its client's rate limiter:")
	fmt.Println("\n| leader stopped by | kube-apiserver | etcd | new leader | client throttling |")
	fmt.Println("|---|---:|---:|---:|---:|")
	for _, r := range results {
		fmt.Printf("| %s | %.2f | %.2f | %.2f | %v |\n", r.signal, r.cpu["kube-apiserver"], r.cpu["etcd"], r.cpu["new leader"], r.throttled.Round(time.Millisecond))
	}
}

// handover stops the leading manager with sig once every held lock has been
// refreshed since the last handover, measures the locks held at the signal
// until the new leader has written each of them (refreshed, granted again,
// or shed), and starts the stopped manager again.
func handover(ctx context.Context, env *benchenv.Env, sig syscall.Signal) (result, error) {
	r := result{signal: map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGKILL: "SIGKILL"}[sig]}
	settled := time.Now()
	if err := waitAll(ctx, env, nil, func(l v1alpha1.DistributedLock) bool {
		return l.Status.Holder == nil || l.Status.RenewedAt != nil && l.Status.RenewedAt.After(settled)
	}); err != nil {
		return r, fmt.Errorf("before %v: %w", sig, err)
	}
	var leader, standby *benchenv.Process
	if err := benchenv.WaitFor(ctx, time.Minute, func() (bool, error) {
		leader, standby = nil, nil
		for _, p := range env.Managers {
			switch {
			case p.Leading():
				leader = p
			case !p.Exited():
				standby = p
			}
		}
		return leader != nil && standby != nil, nil
	}); err != nil {
		return r, fmt.Errorf("no leader and standby: %w", err)
	}
	all, err := list(ctx, env)
	if err != nil {
		return r, err
	}
	var before []v1alpha1.DistributedLock
	measured := map[string]bool{}
	for _, l := range all {
		if l.Status.Holder != nil {
			before = append(before, l)
			measured[l.Name] = true
		}
	}
	r.held = len(before)
	late0, _ := benchenv.Metric(standby.MetricsAddr, "redlock_status_writes_late_total")
	throttled0, _ := benchenv.Metric(standby.MetricsAddr, "rest_client_rate_limiter_duration_seconds_sum")
	procs := benchenv.ControlPlane()
	procs["new leader"] = []int{standby.Cmd.Process.Pid}
	cpu0 := benchenv.CPUTimes(procs)

	// Watch every version: a lapse is a lock whose shown validity passed
	// before a version that showed it again was seen.
	w := &watcher{shown: map[string]time.Time{}, only: measured}
	for _, l := range before {
		if l.Status.ValidUntil != nil {
			w.shown[l.Name] = l.Status.ValidUntil.Time
		}
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var wg sync.WaitGroup
	wg.Go(func() { w.run(wctx, env) })

	r.leastAhead = time.Duration(1<<63 - 1)
	for _, l := range before {
		if l.Status.ValidUntil != nil {
			r.leastAhead = min(r.leastAhead, time.Until(l.Status.ValidUntil.Time))
		}
	}
	fmt.Printf("%v to the leader %s...\n", sig, leader.Name)
	if *profile != "" {
		path := filepath.Join(*profile, fmt.Sprintf("%s-%s.pprof", standby.Name, r.signal))
		wg.Go(func() {
			if err := standby.Profile(ctx, 20*time.Second, path); err != nil {
				fmt.Fprintln(os.Stderr, "benchfailover:", err)
				return
			}
			fmt.Println("profile of the new leader:", path)
		})
	}
	at := time.Now()
	if err := leader.Cmd.Process.Signal(sig); err != nil {
		return r, err
	}
	err = waitAll(ctx, env, measured, func(l v1alpha1.DistributedLock) bool {
		if standby.Exited() {
			return true // checked below: nobody is left to refresh it
		}
		return writtenSince(l, at)
	})
	if err == nil && standby.Exited() {
		err = fmt.Errorf("the new leader %s exited before it refreshed every lock (its log says why; -keep-logs keeps it)", standby.Name)
	}
	r.adopted = time.Since(at)
	cpu1 := benchenv.CPUTimes(procs)
	r.cpu = map[string]float64{}
	for name, t := range cpu1 {
		r.cpu[name] = (t - cpu0[name]).Seconds() / r.adopted.Seconds()
	}
	throttled1, _ := benchenv.Metric(standby.MetricsAddr, "rest_client_rate_limiter_duration_seconds_sum")
	r.throttled = time.Duration((throttled1 - throttled0) * float64(time.Second))
	stopWatch()
	wg.Wait()
	if err != nil {
		return r, fmt.Errorf("after %v: %w", sig, err)
	}
	after, err := list(ctx, env)
	if err != nil {
		return r, err
	}
	grants := map[string]string{}
	for _, l := range before {
		grants[l.Name] = l.Status.GrantID
	}
	for _, l := range after {
		switch {
		case !measured[l.Name]:
		case l.Status.Holder == nil:
			r.shed++
		case l.Status.GrantID != grants[l.Name]:
			r.regranted++
		}
	}
	r.expired = expiredAdoptions(ctx, env, at)
	late1, _ := benchenv.Metric(standby.MetricsAddr, "redlock_status_writes_late_total")
	r.late = late1 - late0
	r.seenLapses, r.worstLapse, r.errors = w.result()

	fmt.Printf("restarting %s as the standby...\n", leader.Name)
	<-leader.Done()
	if err := env.Restart(leader); err != nil {
		return r, err
	}
	return r, nil
}

// watcher records, per lock, the validity status last showed and the lapses
// seen: a version arriving after the validity before it had passed.
type watcher struct {
	only   map[string]bool // the locks watched
	mu     sync.Mutex
	shown  map[string]time.Time
	lapses map[string]time.Duration
	errors int
}

func (w *watcher) run(ctx context.Context, env *benchenv.Env) {
	for ctx.Err() == nil {
		var list v1alpha1.DistributedLockList
		wi, err := env.Client.Watch(ctx, &list, client.InNamespace(env.Namespace))
		if err != nil {
			w.mu.Lock()
			w.errors++
			w.mu.Unlock()
			continue
		}
		for ev := range wi.ResultChan() {
			l, ok := ev.Object.(*v1alpha1.DistributedLock)
			if !ok || ev.Type == watch.Error || !w.only[l.Name] {
				continue
			}
			now := time.Now()
			w.mu.Lock()
			if prev, ok := w.shown[l.Name]; ok && now.After(prev) {
				if w.lapses == nil {
					w.lapses = map[string]time.Duration{}
				}
				w.lapses[l.Name] = max(w.lapses[l.Name], now.Sub(prev))
			}
			if l.Status.ValidUntil != nil && l.Status.Holder != nil {
				w.shown[l.Name] = l.Status.ValidUntil.Time
			}
			w.mu.Unlock()
			if ctx.Err() != nil {
				break
			}
		}
		wi.Stop()
	}
}

func (w *watcher) result() (n int, worst time.Duration, errors int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for name, prev := range w.shown {
		if now.After(prev) { // passed and never shown again
			w.lapses[name] = max(w.lapses[name], now.Sub(prev))
		}
	}
	for _, d := range w.lapses {
		worst = max(worst, d)
	}
	return len(w.lapses), worst, w.errors
}

// expiredAdoptions counts the Lost events since at whose note says the
// validity had passed before the adoption.
func expiredAdoptions(ctx context.Context, env *benchenv.Env, at time.Time) int {
	var evs eventsv1.EventList
	if err := env.Client.List(ctx, &evs, client.InNamespace(env.Namespace)); err != nil {
		return -1
	}
	n := 0
	for _, ev := range evs.Items {
		if ev.Reason == "Lost" && ev.EventTime.After(at) && strings.Contains(ev.Note, "at its adoption") && strings.Contains(ev.Note, "expired") {
			n++
		}
	}
	return n
}

func list(ctx context.Context, env *benchenv.Env) ([]v1alpha1.DistributedLock, error) {
	var l v1alpha1.DistributedLockList
	if err := env.Client.List(ctx, &l, client.InNamespace(env.Namespace)); err != nil {
		return nil, err
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items, nil
}

// writtenSince says whether the lock's status was written after at: a
// refresh or a grant (renewedAt), or a change of its Held condition (a shed).
func writtenSince(l v1alpha1.DistributedLock, at time.Time) bool {
	if l.Status.Holder != nil && l.Status.RenewedAt != nil && l.Status.RenewedAt.After(at) {
		return true
	}
	c := meta.FindStatusCondition(l.Status.Conditions, v1alpha1.ConditionHeld)
	return l.Status.Holder == nil && c != nil && c.LastTransitionTime.After(at)
}

// waitAll waits until every lock (every lock named in only, when it is not
// nil) satisfies ok.
func waitAll(ctx context.Context, env *benchenv.Env, only map[string]bool, ok func(v1alpha1.DistributedLock) bool) error {
	return benchenv.WaitFor(ctx, *grantTimeout, func() (bool, error) {
		items, err := list(ctx, env)
		if err != nil {
			return false, nil // counted by the caller's timeout: the API server is busy
		}
		if len(items) < *nLocks {
			return false, nil
		}
		for _, l := range items {
			if (only == nil || only[l.Name]) && !ok(l) {
				return false, nil
			}
		}
		return true, nil
	})
}

// waitGranting waits until every lock is held, or until the number held
// has not grown for -settle, and returns the number held.
func waitGranting(ctx context.Context, env *benchenv.Env) (int, error) {
	most, grew := 0, time.Now()
	err := benchenv.WaitFor(ctx, *grantTimeout, func() (bool, error) {
		items, err := list(ctx, env)
		if err != nil {
			return false, nil // counted by the timeout: the API server is busy
		}
		held := 0
		for _, l := range items {
			if l.Status.Holder != nil {
				held++
			}
		}
		if held > most {
			most, grew = held, time.Now()
		}
		return held == *nLocks || most > 0 && time.Since(grew) >= *settleFlag, nil
	})
	return most, err
}
