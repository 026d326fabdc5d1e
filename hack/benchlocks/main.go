// Command benchlocks measures one operator manager holding many locks: it
// starts a real kube-apiserver and etcd (envtest), five redis-server masters
// and the manager in this process, creates the locks, and watches them for a
// while. It prints a table: time to grant them all, renewals on time, lapses,
// API writes per second and CPU of each component.
//
//	KUBEBUILDER_ASSETS=$(hack/build-envtest.sh) go run ./hack/benchlocks -locks 1000 -duration 2m
//
// (`make bench-locks` does this.)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/benchenv"
	"github.com/redlock-operator/redlock-operator/pkg/redistest"
)

var (
	nLocks   = flag.Int("locks", 1000, "locks to hold")
	duration = flag.Duration("duration", 2*time.Minute, "how long to watch the held locks")
	ttl      = flag.Duration("ttl", 10*time.Second, "lock TTL")
	workers  = flag.Int("workers", 8, "parallel reconciles")
	sample   = flag.Duration("sample", 2*time.Second, "how often every lock's status is checked")
)

func main() {
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
	env, err := benchenv.Start(ctx, benchenv.Options{MaxLockTTL: *ttl, Workers: *workers, Namespace: "bench"})
	if err != nil {
		return err
	}
	defer env.Close()
	k8s, reg, servers := env.Client, env.Registry, env.Servers

	procs := findProcs(servers)
	cpu0 := cpuTimes(procs)
	wall0 := time.Now()
	writes0 := counterSum(reg, "redlock_status_writes_total")

	// Create the locks.
	createStart := time.Now()
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
	if err := benchenv.WaitFor(ctx, 5*time.Minute, func() (bool, error) {
		held, _, err := census(ctx, k8s)
		return held == *nLocks, err
	}); err != nil {
		return fmt.Errorf("not every lock was granted: %w", err)
	}
	allHeld = time.Since(createStart)
	fmt.Printf("all %d locks held after %v; watching for %v\n", *nLocks, allHeld.Round(time.Millisecond), *duration)

	// Watch: every sample, every lock must show Held with a validity that
	// has not passed.
	watchStart := time.Now()
	cpuW := cpuTimes(procs)
	writesW := counterSum(reg, "redlock_status_writes_total")
	renewalsW := histCount(reg, "redlock_lock_renew_lateness_seconds")
	extendsW := opCount(reg, "extend")
	lapses, samples := 0, 0
	for time.Since(watchStart) < *duration {
		time.Sleep(*sample)
		held, bad, err := census(ctx, k8s)
		if err != nil {
			return err
		}
		samples++
		if held != *nLocks {
			lapses += *nLocks - held
			fmt.Printf("sample %d: %d of %d held; e.g. %s\n", samples, held, *nLocks, strings.Join(bad, ", "))
		}
	}
	watched := time.Since(watchStart)
	cpu1 := cpuTimes(procs)
	writes1 := counterSum(reg, "redlock_status_writes_total")
	extends := opCount(reg, "extend") - extendsW
	failures := counterSum(reg, "redlock_lock_renew_failures_total")
	lateP50, lateP99, lateMax := histQuantiles(reg, "redlock_lock_renew_lateness_seconds")

	fmt.Printf("\n%d locks, ttl %v (renewal every %v), 5 masters, envtest kube-apiserver + etcd, %d CPUs, watched %v\n\n",
		*nLocks, *ttl, *ttl/3, runtime.NumCPU(), watched.Round(time.Second))
	fmt.Println("| measure | value |")
	fmt.Println("|---|---:|")
	fmt.Printf("| time to grant all locks | %v |\n", allHeld.Round(time.Millisecond))
	fmt.Printf("| samples × locks checked | %d × %d |\n", samples, *nLocks)
	fmt.Printf("| lapses (a lock not Held, or past its validity, in a sample) | %d |\n", lapses)
	fmt.Printf("| renewals (extends) while watched | %d (%.1f/s; expected %.1f/s) |\n", extends, float64(extends)/watched.Seconds(), float64(*nLocks)/(*ttl/3).Seconds())
	fmt.Printf("| renewal failures | %.0f |\n", failures)
	fmt.Printf("| renewal lateness p50 / p99 / max bucket | %s / %s / %s |\n", lateP50, lateP99, lateMax)
	fmt.Printf("| status writes while watched | %.0f (%.1f/s) |\n", writes1-writesW, (writes1-writesW)/watched.Seconds())
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
	return nil
}

// census counts the locks whose status shows them held and valid.
func census(ctx context.Context, k8s client.Client) (int, []string, error) {
	var list v1alpha1.DistributedLockList
	if err := k8s.List(ctx, &list, client.InNamespace("bench")); err != nil {
		return 0, nil, err
	}
	now := time.Now()
	held := 0
	var bad []string
	for _, l := range list.Items {
		c := meta.FindStatusCondition(l.Status.Conditions, v1alpha1.ConditionHeld)
		// validUntil is stored in whole seconds, rounded down.
		if c != nil && c.Status == metav1.ConditionTrue && l.Status.ValidUntil != nil && now.Before(l.Status.ValidUntil.Add(time.Second)) {
			held++
		} else if len(bad) < 3 {
			reason := "no condition"
			if c != nil {
				reason = c.Reason
			}
			bad = append(bad, l.Name+":"+reason)
		}
	}
	return held, bad, nil
}

// findProcs maps component names to PIDs: this process (the manager),
// kube-apiserver and etcd (children of this process), and the masters.
func findProcs(servers []*redistest.Server) map[string][]int {
	procs := map[string][]int{"manager (+ this program)": {os.Getpid()}}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, ppid := statOf(pid)
		if ppid != os.Getpid() {
			continue
		}
		switch comm {
		case "kube-apiserver", "etcd":
			procs[comm] = append(procs[comm], pid)
		}
	}
	for _, s := range servers {
		procs["redis-server ×5"] = append(procs["redis-server ×5"], s.PID())
	}
	return procs
}

// statOf returns a process's command name and parent PID.
func statOf(pid int) (string, int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0
	}
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < 0 {
		return "", 0
	}
	fields := strings.Fields(s[closing+2:])
	ppid, _ := strconv.Atoi(fields[1])
	return s[open+1 : closing], ppid
}

// cpuTimes returns user+system CPU time per component.
func cpuTimes(procs map[string][]int) map[string]time.Duration {
	tick := 100.0 // USER_HZ on Linux
	out := map[string]time.Duration{}
	for name, pids := range procs {
		for _, pid := range pids {
			if pid == os.Getpid() {
				var ru syscall.Rusage
				_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
				out[name] += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
				continue
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				continue
			}
			s := string(b)
			fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
			ut, _ := strconv.ParseFloat(fields[11], 64)
			st, _ := strconv.ParseFloat(fields[12], 64)
			out[name] += time.Duration((ut + st) / tick * float64(time.Second))
		}
	}
	return out
}

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

// histQuantiles reads p50, p99 and the highest non-empty bucket bound from a
// histogram, as bucket upper bounds ("≤ x").
func histQuantiles(reg *prometheus.Registry, name string) (string, string, string) {
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
	return q(0.5), q(0.99), top
}
