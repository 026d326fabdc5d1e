// Command benchlocks measures one operator manager holding many locks: it
// starts a real kube-apiserver and etcd (envtest), five redis-server masters
// and the manager in this process, creates the locks, and watches them for a
// while. It prints a table: time to grant them all (or as many as the
// manager admits: a manager grants no more than it can keep refreshed, and
// sheds the youngest grants when the API server takes fewer writes than the
// held locks need), renewals on time, lapses of the locks kept by cause, the
// locks shed or waiting apart, API writes per second and CPU of each
// component. With -hog, a CPU-burning process runs on every core beside it.
// With -api-writes (and -api-latency, -api-step-writes) the manager calls
// an API server of known capacity: internal/harness/apiproxy in front of
// kube-apiserver.
//
//	KUBEBUILDER_ASSETS=$(hack/build-envtest.sh) go run ./hack/benchlocks -locks 1000 -duration 2m [-hog] [-api-writes 75]
//
// (`make bench-locks BENCH_LOCKS_FLAGS=-hog` does this.)
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/harness/apiproxy"
	"github.com/redlock-operator/redlock-operator/internal/harness/benchenv"
	"github.com/redlock-operator/redlock-operator/internal/harness/hog"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
)

var (
	nLocks   = flag.Int("locks", 1000, "locks to hold")
	duration = flag.Duration("duration", 2*time.Minute, "how long to watch the held locks")
	ttl      = flag.Duration("ttl", 10*time.Second, "lock TTL")
	workers  = flag.Int("workers", 8, "parallel reconciles")
	sample   = flag.Duration("sample", 2*time.Second, "how often every lock's status is checked")
	hogFlag  = flag.Bool("hog", false, "run a CPU-burning process on every core beside the benchmark")
	// grantTimeout bounds the wait for every lock to be granted.
	grantTimeout = flag.Duration("grant-timeout", 5*time.Minute, "how long to wait for every lock to be granted")
	mgrQPS       = flag.Float64("kube-api-qps", 200, "the manager's --kube-api-qps")
	// An API server of known capacity (internal/harness/apiproxy) for the
	// manager: the benchmark's own requests go to kube-apiserver directly.
	apiWrites     = flag.Float64("api-writes", 0, "writes a second the API server takes from the manager (an apiproxy in front of it); 0: kube-apiserver as it is")
	apiLatency    = flag.Duration("api-latency", 0, "latency the apiproxy adds to each of the manager's requests")
	apiStepWrites = flag.Float64("api-step-writes", 0, "writes a second the apiproxy takes from halfway through the watched period on (a step of capacity); 0: no step")
	writeQPS      = flag.Float64("status-write-qps", 0, "the manager's --status-write-qps (0: three quarters of -kube-api-qps)")
	drain         = flag.Duration("drain", 3*time.Minute, "after the watch, how long to wait for every lapsed lock to be held again or shown Shed")
)

func main() {
	hog.IfAsked()
	flag.Parse()
	benchenv.Quiet()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchlocks:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := benchenv.Options{
		MaxLockTTL: *ttl, Workers: *workers, Namespace: "bench", ManagerQPS: float32(*mgrQPS), StatusWriteQPS: *writeQPS,
	}
	if *apiWrites > 0 || *apiLatency > 0 || *apiStepWrites > 0 {
		opts.API = &apiproxy.Limits{WritesPerSecond: *apiWrites, Latency: *apiLatency}
	}
	env, err := benchenv.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer env.Close()
	k8s, reg, servers := env.Client, env.Registry, env.Servers
	if *hogFlag {
		stop, err := hog.Start()
		if err != nil {
			return err
		}
		defer stop()
	}

	procs := findProcs(servers)
	cpu0 := cpuTimes(procs)
	wall0 := time.Now()
	writes0 := counterSum(reg, "redlock_status_writes_total")

	ov := watchOverloads(reg, *ttl)

	// Create the locks.
	createStart := time.Now()
	cpuC := cpuTimes(procs)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range *nLocks {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_ = k8s.Create(ctx, &v1alpha1.DistributedLock{
				ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("lock-%04d", i)},
				Spec: v1alpha1.DistributedLockSpec{
					MasterSet: benchenv.MasterSet, TTL: metav1.Duration{Duration: *ttl}, HolderIdentity: fmt.Sprintf("holder-%d", i),
				},
			})
		}()
	}
	wg.Wait()
	var allHeld time.Duration
	// While granting, a lock shown held once and not held and valid later
	// has lapsed: those are classified too.
	lastReport, held, grantCauses := time.Now(), 0, map[string]int{}
	t := &tally{everHeld: map[string]bool{}, shed: map[string]bool{}}
	// Granting ends when every lock is held, or when the others wait to
	// be admitted (or were shed) and no grant was made for a while.
	settle := max(3**ttl, 30*time.Second)
	lastGrowth, most := time.Now(), 0
	if err := benchenv.WaitFor(ctx, *grantTimeout, func() (bool, error) {
		var err error
		var bad []badLock
		held, bad, err = census(ctx, k8s)
		if err != nil {
			return false, err
		}
		lapsed, waiting := t.sort(bad)
		if held > most {
			most, lastGrowth = held, time.Now()
		}
		if time.Since(lastReport) > 15*time.Second {
			reasons := map[string]int{}
			for _, b := range lapsed {
				reasons[b.reason]++
			}
			fmt.Printf("%v after creating them: %d of %d locks shown held and valid; %d shown lapsed after a grant %v; %d waiting to be granted; %d shed\n",
				time.Since(createStart).Round(time.Second), held, *nLocks, len(lapsed), reasons, waiting, len(t.shed))
			for cause, n := range classify(ctx, servers, lapsed) {
				grantCauses[cause] += n
			}
			lastReport = time.Now()
		}
		return held == *nLocks || (len(lapsed) == 0 && time.Since(lastGrowth) > settle), nil
	}); err != nil {
		for _, cause := range []string{causeRedis, causeShownLost, causeLate, causeStale} {
			fmt.Printf("lapses after a grant, in the progress reports: %s: %d\n", cause, grantCauses[cause])
		}
		return fmt.Errorf("%d of %d locks granted after %v: %w", held, *nLocks, time.Since(createStart).Round(time.Second), err)
	}
	allHeld = time.Since(createStart)
	if held < *nLocks {
		allHeld = lastGrowth.Sub(createStart) // the last grant, not the settling wait
	}
	granted := held
	cpuG := cpuTimes(procs)
	fmt.Printf("%d of %d locks held after %v; watching for %v\n", held, *nLocks, allHeld.Round(time.Millisecond), *duration)

	// Watch: every sample, every lock must show Held with a validity that
	// has not passed.
	watchStart := time.Now()
	cpuW := cpuTimes(procs)
	writesW := counterSum(reg, "redlock_status_writes_total")
	renewalsW := histCount(reg, "redlock_lock_renew_lateness_seconds")
	extendsW := opCount(reg, "extend")
	var proxyW, proxyEnd apiproxy.Stats // the proxy's counts over the watch
	if env.Proxy != nil {
		proxyW = env.Proxy.Stats()
	}
	// Lapses by lock: a lock shed later in the run lapsed before its Shed
	// showed (counted apart from the locks kept).
	lapsedBy, samples := map[string]int{}, 0
	lastReason := map[string]string{}
	causes := map[string]int{}
	var stepAt time.Time
	// The proxy's counts at the step and stepWindow after it.
	atStep, afterStepStats := make(chan apiproxy.Stats, 1), make(chan apiproxy.Stats, 1)
	// After the step, which locks each sample did not find held.
	type afterStep struct {
		at  time.Time
		bad map[string]bool
	}
	var samplesAfter []afterStep
	var lastBad map[string]bool
	demandAtStep := 0.0
	if *apiStepWrites > 0 {
		stepAt = watchStart.Add(*duration / 2)
		env.Proxy.SetAt(stepAt, apiproxy.Limits{WritesPerSecond: *apiStepWrites, Latency: *apiLatency})
		time.AfterFunc(time.Until(stepAt), func() { atStep <- env.Proxy.Stats() })
		time.AfterFunc(time.Until(stepAt.Add(stepWindow)), func() { afterStepStats <- env.Proxy.Stats() })
		fmt.Printf("the API server's capacity steps from %v to %v writes/s at %v\n", *apiWrites, *apiStepWrites, *duration/2)
	}
	for time.Since(watchStart) < *duration {
		time.Sleep(*sample)
		if !stepAt.IsZero() && time.Now().Before(stepAt) {
			demandAtStep = gaugeValue(reg, "redlock_status_write_demand_per_second") // the last before the step
		}
		held, bad, err := census(ctx, k8s)
		if err != nil {
			return err
		}
		samples++
		lapsed, waiting := t.sort(bad)
		lastBad = map[string]bool{}
		for _, b := range bad {
			lastBad[b.name] = true
		}
		if !stepAt.IsZero() && time.Now().After(stepAt) {
			samplesAfter = append(samplesAfter, afterStep{at: time.Now(), bad: lastBad})
		}
		if len(lapsed) > 0 {
			for _, b := range lapsed {
				if !b.stale {
					lapsedBy[b.name]++
					lastReason[b.name] = b.reason
				}
			}
			var eg []string
			for _, b := range lapsed[:min(3, len(lapsed))] {
				eg = append(eg, b.name+":"+b.reason)
			}
			fmt.Printf("sample %d: %d of %d held, %d waiting, %d shed, lead floor %.2fs, %.0f late so far; lapsed e.g. %s\n", samples, held, *nLocks, waiting, len(t.shed),
				gaugeValue(reg, "redlock_status_write_lead_floor_seconds"), counterSum(reg, "redlock_status_writes_late_total"), strings.Join(eg, ", "))
			for cause, n := range classify(ctx, servers, lapsed) {
				causes[cause] += n
			}
		}
	}
	watched := time.Since(watchStart)
	nOverloads, overloadBound := ov.since(watchStart, *ttl)
	if env.Proxy != nil {
		proxyEnd = env.Proxy.Stats()
	}
	// A lock shed while the API server is short of writes may lapse before
	// its Shed shows (its write waits behind the kept grants' refreshes):
	// the samples go on, uncounted, until every lock that lapsed is held
	// again or shows Shed, so that each lapse is told apart as a kept
	// lock's or a shed one's.
	drainStart, stillLapsed := time.Now(), 0
	for {
		_, bad, err := census(ctx, k8s)
		if err != nil {
			return err
		}
		lapsed, _ := t.sort(bad)
		stillLapsed = 0
		for _, b := range lapsed {
			if lapsedBy[b.name] > 0 {
				stillLapsed++
			}
		}
		if stillLapsed == 0 || time.Since(drainStart) > *drain {
			break
		}
		time.Sleep(*sample)
	}
	drained := time.Since(drainStart)
	cpu1 := cpuTimes(procs)
	writes1 := counterSum(reg, "redlock_status_writes_total")
	extends := opCount(reg, "extend") - extendsW
	failures := counterSum(reg, "redlock_lock_renew_failures_total")
	lateP50, lateP99, lateMax := histQuantiles(reg, "redlock_lock_renew_lateness_seconds")
	_, slackLow, _ := histQuantiles(reg, "redlock_status_write_slack_seconds", 0.01)
	_, _, lapseMax := histQuantiles(reg, "redlock_status_write_lapse_seconds")
	lateWrites := counterSum(reg, "redlock_status_writes_late_total")
	demand, budget := gaugeValue(reg, "redlock_status_write_demand_per_second"), gaugeValue(reg, "redlock_status_write_budget_per_second")
	rss, heap := memory()

	fmt.Printf("\n%d locks, ttl %v (renewal every %v), 5 masters, envtest kube-apiserver + etcd, %d CPUs%s, watched %v\n\n",
		*nLocks, *ttl, *ttl/3, runtime.NumCPU(), hog.Describe(*hogFlag), watched.Round(time.Second))
	fmt.Println("| measure | value |")
	fmt.Println("|---|---:|")
	if env.Proxy != nil {
		s := env.Proxy.Stats()
		step := "none"
		if *apiStepWrites > 0 {
			step = fmt.Sprintf("%v at %v", *apiStepWrites, *duration/2)
		}
		fmt.Printf("| API server (apiproxy): writes/s / latency / step | %v / %v / %s |\n", *apiWrites, *apiLatency, step)
		fmt.Printf("| … the manager's writes / reads through it, whole run; time writes waited for their turn | %d / %d; %v |\n", s.Writes, s.Reads, s.WriteWait.Round(time.Second))
		fmt.Printf("| … its writes by kind, whole run | %s |\n", byKind(s.WritesBy, nil, 0))
		fmt.Printf("| … its writes by kind while watched (per second) | %s |\n", byKind(proxyEnd.WritesBy, proxyW.WritesBy, watched))
		if len(atStep) > 0 && len(afterStepStats) > 0 { // both taken: the watch went on that long
			before, after := <-atStep, <-afterStepStats
			fmt.Printf("| … its writes by kind in the %v after the step (per second) | %s |\n", stepWindow, byKind(after.WritesBy, before.WritesBy, stepWindow))
		}
	}
	fmt.Printf("| time to grant all locks (or the last grant the manager admitted) | %v |\n", allHeld.Round(time.Millisecond))
	fmt.Printf("| locks granted when granting settled / waiting to be admitted | %d / %d |\n", granted, *nLocks-granted)
	fmt.Printf("| locks shed (Held=False, reason Shed), whole run | %d |\n", len(t.shed))
	fmt.Printf("| manager overloaded at the end / capacity estimated (writes/s) | %.0f / %.1f |\n",
		gaugeValue(reg, "redlock_status_writer_overloaded"), gaugeValue(reg, "redlock_status_write_capacity_per_second"))
	fmt.Printf("| refreshes allowed in flight at the end / locks counted waiting for room | %.0f / %.0f |\n",
		gaugeValue(reg, "redlock_status_write_concurrency"), gaugeValue(reg, "redlock_grants_waiting_for_status_writes"))
	fmt.Printf("| lead floor at the end (3 mean or 2 × p90 round trips once refreshes land tight; applied up to ttl/4) | %.2fs |\n",
		gaugeValue(reg, "redlock_status_write_lead_floor_seconds"))
	fmt.Printf("| samples × locks checked | %d × %d |\n", samples, *nLocks)
	lapses, shedLate, shedLateSamples := 0, 0, 0
	var keptLapsed []string
	for name, n := range lapsedBy {
		if t.shed[name] {
			shedLate, shedLateSamples = shedLate+1, shedLateSamples+n
			continue
		}
		lapses += n
		keptLapsed = append(keptLapsed, name)
	}
	fmt.Printf("| lapses of locks kept (status showed a granted lock never shed not Held, or past its validity, in a sample) | %d |\n", lapses)
	fmt.Printf("| … kept locks that lapsed / the most samples first (lock: samples, reason last shown) | %d / %s |\n", len(keptLapsed), mostLapsed(keptLapsed, lapsedBy, lastReason, 5))
	// A kept lock may lapse when the API server takes fewer writes than
	// the kept locks need, faster than a lead (the machine's own API
	// server beside a hog, or a step): what no control can rule out.
	fmt.Printf("| overloads of the status writer while watched / kept locks they may lapse (demand × (2 s + lead), summed) | %d / %d |\n", nOverloads, overloadBound)
	fmt.Printf("| locks shed whose validity passed before Shed showed / their lapses in samples | %d / %d |\n", shedLate, shedLateSamples)
	fmt.Printf("| after the watch: time until every lapsed lock was held again or shown Shed / still lapsed then | %v / %d |\n", drained.Round(time.Second), stillLapsed)
	if !stepAt.IsZero() {
		// After a drop, every grant needs one write (a refresh, or the
		// write showing it Shed) before its validity passes: within one
		// refresh period (ttl less the lead) the API server takes
		// C × period of them, and the rest cannot be written in time.
		period := (*ttl - grants.StatusLead(*ttl)).Seconds()
		bound := max(0, demandAtStep-*apiStepWrites) * period
		// The kept set: the locks held at the last sample. It is stable
		// from the first sample after the last one that found one of them
		// not held.
		settle := "none lost"
		for _, a := range samplesAfter {
			for name := range a.bad {
				if !lastBad[name] {
					settle = a.at.Sub(stepAt).Round(time.Second).String()
					break
				}
			}
		}
		fmt.Printf("| step: demand at the step / grants that no write can reach in time (demand − C) × (ttl − lead) / time from the step to a stable kept set | %.1f/s / %.0f / %s |\n",
			demandAtStep, bound, settle)
	}
	for _, cause := range []string{causeRedis, causeShownLost, causeLate} {
		fmt.Printf("| … %s | %d |\n", cause, causes[cause])
	}
	fmt.Printf("| not lapses: %s | %d |\n", causeStale, causes[causeStale])
	fmt.Printf("| renewals (extends) while watched | %d (%.1f/s; %.1f/s at one every ttl/3, more with those timed for status refreshes) |\n", extends, float64(extends)/watched.Seconds(), float64(*nLocks)/(*ttl/3).Seconds())
	fmt.Printf("| renewal failures | %.0f |\n", failures)
	fmt.Printf("| renewal lateness p50 / p99 / max bucket | %s / %s / %s |\n", lateP50, lateP99, lateMax)
	perSec := (writes1 - writesW) / watched.Seconds()
	fmt.Printf("| status writes while watched | %.0f (%.1f/s) |\n", writes1-writesW, perSec)
	fmt.Printf("| status writes per lock per ttl | %.2f |\n", perSec*ttl.Seconds()/float64(*nLocks))
	fmt.Printf("| status write demand / budget (writes/s) | %.1f / %.0f |\n", demand, budget)
	fmt.Printf("| refreshes landed late, whole run | %.0f |\n", lateWrites)
	fmt.Printf("| validity left when a refresh landed in time, 1st percentile | %s |\n", slackLow)
	fmt.Printf("| longest lapse a late refresh ended (max bucket) | %s |\n", lapseMax)
	fmt.Printf("| status writes, whole run | %.0f |\n", writes1-writes0)
	_ = renewalsW
	names := make([]string, 0, len(cpu1))
	for n := range cpu1 {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Printf("| CPU %s while watched (share of one core) | %.1f%% |\n", n, 100*(cpu1[n]-cpuW[n]).Seconds()/watched.Seconds())
	}
	total := time.Since(wall0)
	fmt.Printf("| CPU manager, whole run incl. granting (share of one core) | %.1f%% |\n", 100*(cpu1["manager (+ this program)"]-cpu0["manager (+ this program)"]).Seconds()/total.Seconds())
	for _, n := range names {
		fmt.Printf("| CPU %s while granting (share of one core) | %.1f%% |\n", n, 100*(cpuG[n]-cpuC[n]).Seconds()/allHeld.Seconds())
	}
	for _, n := range names {
		fmt.Printf("| CPU %s per 1,000 locks while watched (share of one core) | %.1f%% |\n", n, 100*(cpu1[n]-cpuW[n]).Seconds()/watched.Seconds()*1000/float64(*nLocks))
	}
	fmt.Printf("| memory of manager (+ this program): RSS / Go heap in use after GC | %.0f MiB / %.0f MiB |\n", rss/(1<<20), heap/(1<<20))
	return nil
}

// badLock is a lock a sample did not find held and valid.
type badLock struct {
	name, key string
	// reason is the Held condition's reason, or "validity passed".
	reason string
	// stale: status showed it held and valid when the list began; the
	// validity passed while the list was served.
	stale bool
	// shownLost: status says not held (else it says held, but its
	// validity has passed).
	shownLost bool
}

// tally sorts what samples find: a lock ever shown held that then shows
// Shed was shed (counted apart, not a lapse); one never held that waits to
// be admitted is waiting; anything else not held and valid is a lapse.
type tally struct {
	everHeld, shed map[string]bool
}

// sort returns the lapses among bad (the locks a census did not find held
// and valid) and how many wait to be granted, and records which locks were
// held and which shed.
func (t *tally) sort(bad []badLock) (lapsed []badLock, waiting int) {
	notHeld := map[string]bool{}
	for _, b := range bad {
		notHeld[b.name] = true
		switch {
		case b.reason == v1alpha1.ReasonShed:
			t.shed[b.name] = true
		case t.shed[b.name] || (!t.everHeld[b.name] && b.shownLost):
			waiting++ // shed before, or never granted: waits to be admitted
		default:
			lapsed = append(lapsed, b)
		}
	}
	for i := range *nLocks {
		if name := fmt.Sprintf("lock-%04d", i); !notHeld[name] {
			t.everHeld[name] = true
		}
	}
	return lapsed, waiting
}

// census counts the locks whose status shows them held and valid, and
// returns the others.
func census(ctx context.Context, k8s client.Client) (int, []badLock, error) {
	var list v1alpha1.DistributedLockList
	start := time.Now()
	if err := k8s.List(ctx, &list, client.InNamespace("bench")); err != nil {
		return 0, nil, err
	}
	// The list shows status at some instant between start and end: a
	// validity that passed before start had passed in status; one that
	// passed between start and end may have been refreshed in time, and
	// the reader's view went stale while the list was served.
	end := time.Now()
	held := 0
	var bad []badLock
	for _, l := range list.Items {
		c := meta.FindStatusCondition(l.Status.Conditions, v1alpha1.ConditionHeld)
		isHeld := c != nil && c.Status == metav1.ConditionTrue && l.Status.ValidUntil != nil
		if isHeld && end.Before(l.Status.ValidUntil.Time) {
			held++
			continue
		}
		b := badLock{name: l.Name, key: l.RedisKey(), reason: "validity passed", shownLost: !isHeld,
			stale: isHeld && !l.Status.ValidUntil.Before(start)}
		switch {
		case c == nil:
			b.reason = "no condition"
		case !isHeld:
			b.reason = c.Reason
		case b.stale:
			b.reason = "validity passed while listing"
		}
		bad = append(bad, b)
	}
	return held, bad, nil
}

// Causes of a lapse.
const (
	causeRedis     = "Redis: the key was on fewer than a quorum of masters (renewal failed, grant lost)"
	causeShownLost = "status: a quorum held the key, status said not held"
	causeLate      = "status: a quorum held the key, the validity shown had passed before the list began (status written late)"
	causeStale     = "reader: the validity shown passed while the list was being served (the reader's view went stale)"
)

// classify tells, for each lock a sample found lapsed, whether Redis still
// held it (the key, with a TTL left, on a quorum of masters): if so the
// lapse was the status's, else the renewal's.
func classify(ctx context.Context, servers []*redistest.Server, bad []badLock) map[string]int {
	onMasters := make([]int, len(bad))
	for _, s := range servers {
		c := s.Client()
		pipe := c.Pipeline()
		cmds := make([]*redis.DurationCmd, len(bad))
		for i, b := range bad {
			cmds[i] = pipe.PTTL(ctx, b.key)
		}
		_, _ = pipe.Exec(ctx)
		for i, cmd := range cmds {
			if d, err := cmd.Result(); err == nil && d > 0 {
				onMasters[i]++
			}
		}
		_ = c.Close()
	}
	out := map[string]int{}
	quorum := len(servers)/2 + 1
	for i, b := range bad {
		switch {
		case onMasters[i] < quorum:
			out[causeRedis]++
		case b.stale:
			out[causeStale]++
		case b.shownLost:
			out[causeShownLost]++
		default:
			out[causeLate]++
		}
	}
	return out
}

// findProcs maps component names to PIDs: this process (the manager),
// kube-apiserver and etcd (children of this process), and the masters.
func findProcs(servers []*redistest.Server) map[string][]int {
	procs := map[string][]int{"manager (+ this program)": {os.Getpid()}}
	for comm, pids := range benchenv.ControlPlane() {
		procs[comm] = pids
	}
	for _, s := range servers {
		procs["redis-server ×5"] = append(procs["redis-server ×5"], s.PID())
	}
	return procs
}

// cpuTimes returns user+system CPU time per component.
func cpuTimes(procs map[string][]int) map[string]time.Duration { return benchenv.CPUTimes(procs) }

func gather(reg *prometheus.Registry, name string) []*dto.Metric {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

func counterSum(reg *prometheus.Registry, name string) float64 {
	sum := 0.0
	for _, m := range gather(reg, name) {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

func opCount(reg *prometheus.Registry, op string) uint64 {
	var n uint64
	for _, m := range gather(reg, "redlock_operation_duration_seconds") {
		for _, l := range m.GetLabel() {
			if l.GetName() == "op" && l.GetValue() == op {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

func histCount(reg *prometheus.Registry, name string) uint64 {
	var n uint64
	for _, m := range gather(reg, name) {
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}

func gaugeValue(reg *prometheus.Registry, name string) float64 {
	sum := 0.0
	for _, m := range gather(reg, name) {
		sum += m.GetGauge().GetValue()
	}
	return sum
}

// memory returns this process's resident set and its Go heap in use
// after a collection, in bytes.
func memory() (rss, heap float64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			rss = kb * 1024
		}
	}
	return rss, float64(ms.HeapInuse)
}

// histQuantiles reads p50, p99 (or the given quantiles) and the highest
// non-empty bucket bound from a histogram, as bucket upper bounds ("≤ x").
func histQuantiles(reg *prometheus.Registry, name string, quantiles ...float64) (string, string, string) {
	if len(quantiles) == 0 {
		quantiles = []float64{0.5, 0.99}
	}
	ms := gather(reg, name)
	if len(ms) == 0 || ms[0].GetHistogram().GetSampleCount() == 0 {
		return "n/a", "n/a", "n/a"
	}
	h := ms[0].GetHistogram()
	total := float64(h.GetSampleCount())
	q := func(p float64) string {
		for _, b := range h.GetBucket() {
			if float64(b.GetCumulativeCount()) >= p*total {
				return fmt.Sprintf("≤ %gs", b.GetUpperBound())
			}
		}
		return "> last bucket"
	}
	top := "≤ first bucket"
	prev := uint64(0)
	for _, b := range h.GetBucket() {
		if b.GetCumulativeCount() > prev {
			top = fmt.Sprintf("≤ %gs", b.GetUpperBound())
		}
		prev = b.GetCumulativeCount()
	}
	if prev < h.GetSampleCount() {
		top = "> last bucket"
	}
	if len(quantiles) == 1 {
		return "", q(quantiles[0]), top
	}
	return q(quantiles[0]), q(quantiles[1]), top
}

// stepWindow is how long after a step the writes by kind are reported:
// the time in which the writer measures the drop and chooses what to
// shed.
const stepWindow = 10 * time.Second

// byKind lists the writes counted in now less those in before, most first,
// as rates over span when it is not zero.
func byKind(now, before map[string]int64, span time.Duration) string {
	type kind struct {
		name string
		n    int64
	}
	var ks []kind
	for name, n := range now {
		if n -= before[name]; n > 0 {
			ks = append(ks, kind{name, n})
		}
	}
	slices.SortFunc(ks, func(a, b kind) int { return cmp.Compare(b.n, a.n) })
	var out []string
	for _, k := range ks {
		if span > 0 {
			out = append(out, fmt.Sprintf("%s %.1f", k.name, float64(k.n)/span.Seconds()))
			continue
		}
		out = append(out, fmt.Sprintf("%s %d", k.name, k.n))
	}
	return strings.Join(out, ", ")
}

// mostLapsed names up to n of locks, those lapsed in the most samples
// first, each with its count and the reason it last showed lapsed.
func mostLapsed(locks []string, samples map[string]int, reason map[string]string, n int) string {
	if len(locks) == 0 {
		return "none"
	}
	slices.SortFunc(locks, func(a, b string) int {
		if c := cmp.Compare(samples[b], samples[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	var out []string
	for _, l := range locks[:min(n, len(locks))] {
		out = append(out, fmt.Sprintf("%s: %d, %s", l, samples[l], reason[l]))
	}
	return strings.Join(out, "; ")
}
