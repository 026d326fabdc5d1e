// Command benchcrosscluster measures how one key passes between two
// clusters that share its masters: two kube-apiservers with their etcds
// (envtest), five redis-server masters named by an external RedisMasterSet
// in each, and one manager process per API server. Each cluster has a
// DistributedLock of the key; the program plays both clusters' schedulers
// and kubelets.
//
// It runs four configurations: the managers as before release notices and
// waiting lines (--release-notices=false --waiting-lines=false), then with
// both (the defaults); each with every master serving, then with one
// master paused (SIGSTOP). In each:
//
//   - Handovers: the holder pod is marked Succeeded while one pod waits,
//     alternately in the holder's cluster (within) and in the other
//     (across). A handover ends when a watch shows the waiter ungated.
//   - Contended handovers: a pod waits in each cluster. The other cluster's
//     lock came first (its attempt found the key held, and with lines its
//     ticket is on a majority of the masters); the holder's cluster has its
//     next pod queued behind the holder. When the holder finishes, the key
//     is the other cluster's turn: the holder's cluster taking it again is
//     an inversion against ticket order.
//
// A round that fails (a waiter never ungated) is counted, both locks are
// emptied, and the next round starts from a fresh holder.
//
//	KUBEBUILDER_ASSETS=$(hack/build-envtest.sh) go run ./hack/benchcrosscluster
//
// (`make bench-cross-cluster` does this.)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/benchenv"
	"github.com/redlock-operator/redlock-operator/internal/harness/podsim"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

var (
	handovers = flag.Int("handovers", 40, "handovers with one pod waiting in each configuration, half within the holder's cluster, half across")
	contended = flag.Int("contended", 20, "handovers with a pod waiting in each cluster, in each configuration")
	ttl       = flag.Duration("ttl", 10*time.Second, "lock TTL (the masters' maxLockTTL too)")
	keepLogs  = flag.Bool("keep-logs", false, "keep the managers' logs")
)

const (
	ns   = "bench"
	node = "node-1"
	// roundTimeout is how long a round waits for its pod: past the
	// retry delays (at most 5 s), the line's bound (6 s) and the ttl of a
	// grant that was lost.
	roundTimeout = time.Minute
)

func main() {
	flag.Parse()
	benchenv.Quiet()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchcrosscluster:", err)
		os.Exit(1)
	}
}

// result is one configuration's measurements.
type result struct {
	name                    string
	within, across, contest []time.Duration
	inversions, contendedN  int
	errs                    []error
}

func run() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "benchcrosscluster")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	bin, err := benchenv.BuildManager(dir)
	if err != nil {
		return err
	}
	configs := []struct {
		name  string
		args  []string
		lines bool
	}{
		{"before: no release notices, no waiting lines", []string{"--release-notices=false", "--waiting-lines=false"}, false},
		{"release notices and waiting lines (the defaults)", nil, true},
	}
	var results []result
	for _, c := range configs {
		p, err := startPair(ctx, bin, c.args)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		fmt.Printf("%s...\n", c.name)
		results = append(results, p.measure(ctx, c.name, c.lines, len(results)))
		paused := p.servers()[0]
		if err := paused.Stop(); err != nil {
			p.close()
			return err
		}
		fmt.Printf("%s, master %s paused...\n", c.name, paused.Addr())
		results = append(results, p.measure(ctx, c.name+"; one master paused", c.lines, len(results)))
		_ = paused.Cont()
		p.close()
	}

	fmt.Printf("\ntwo envtest API servers, one manager process each, 5 shared masters, lock ttl %v, %d CPUs\n\n", *ttl, runtime.NumCPU())
	fmt.Println("| managers | within: p50 / p99 | across: p50 / p99 | across / within (p50) | contended: inversions / handovers | contended across: p50 / p99 | failed rounds |")
	fmt.Println("|---|---|---|---:|---|---|---:|")
	for _, r := range results {
		fmt.Printf("| %s | %v / %v | %v / %v | %.1f× | %d / %d | %v / %v | %d |\n", r.name,
			round(pct(r.within, 0.5)), round(pct(r.within, 0.99)), round(pct(r.across, 0.5)), round(pct(r.across, 0.99)),
			ratio(pct(r.across, 0.5), pct(r.within, 0.5)), r.inversions, r.contendedN,
			round(pct(r.contest, 0.5)), round(pct(r.contest, 0.99)), len(r.errs))
	}
	for _, r := range results {
		for _, err := range r.errs {
			fmt.Printf("failed round (%s): %v\n", r.name, err)
		}
	}
	return nil
}

// pair is two clusters sharing the masters.
type pair struct {
	clusters [2]*cluster
	gates    *podsim.GateWatch
	envs     [2]*benchenv.Env
}

// cluster is one API server, its manager and its lock of the measured key.
type cluster struct {
	name string
	env  *benchenv.Env
	lock *v1alpha1.DistributedLock
}

func startPair(ctx context.Context, bin string, args []string) (*pair, error) {
	o := benchenv.Options{MaxLockTTL: *ttl, Workers: 4, Namespace: ns, ManagerBinary: bin, ManagerProcesses: 1, ManagerArgs: args, KeepLogs: *keepLogs}
	a, err := benchenv.Start(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("cluster a: %w", err)
	}
	o.Servers = a.Servers
	b, err := benchenv.Start(ctx, o)
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("cluster b: %w", err)
	}
	p := &pair{envs: [2]*benchenv.Env{a, b}, gates: podsim.NewGateWatch()}
	for i, e := range p.envs {
		if err := p.gates.Watch(ctx, e.Client, ns); err != nil {
			p.close()
			return nil, err
		}
		p.clusters[i] = &cluster{name: string(rune('a' + i)), env: e}
	}
	return p, nil
}

func (p *pair) servers() []*redistest.Server { return p.envs[0].Servers }

// close stops cluster b, then cluster a and the masters.
func (p *pair) close() {
	p.envs[1].Close()
	p.envs[0].Close()
}

// keyRun is the state of a measurement: who holds, and who waits.
type keyRun struct {
	p       *pair
	key     string
	lines   bool
	seq     int
	holder  *corev1.Pod
	holderC *cluster
	// waiting is the pod each cluster has waiting, if any.
	waiting map[*cluster]*corev1.Pod
}

// measure runs the handovers of one configuration on a fresh key.
func (p *pair) measure(ctx context.Context, name string, lines bool, n int) result {
	r := result{name: name}
	st := &keyRun{p: p, key: fmt.Sprintf("bench-%d", n), lines: lines, waiting: map[*cluster]*corev1.Pod{}}
	for _, c := range p.clusters {
		c.lock = &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: st.key},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: benchenv.MasterSet, Key: st.key, TTL: metav1.Duration{Duration: *ttl}},
		}
		if err := c.env.Client.Create(ctx, c.lock); err != nil {
			r.errs = append(r.errs, fmt.Errorf("create lock in cluster %s: %w", c.name, err))
			return r
		}
	}
	// Done, the key's pods and locks go: the managers neither renew nor
	// check its line in the next measurement.
	defer func() {
		for _, c := range p.clusters {
			_ = c.env.Client.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LockLabel: c.lock.Name}, client.GracePeriodSeconds(0))
			_ = c.env.Client.Delete(ctx, c.lock)
		}
	}()
	if err := st.fresh(ctx); err != nil {
		r.errs = append(r.errs, err)
		return r
	}
	// A failed round is counted; one that cannot start again ends the
	// measurement.
	failed := func(err error) bool {
		fmt.Fprintf(os.Stderr, "failed round: %v\n", err)
		r.errs = append(r.errs, err)
		if err := st.fresh(ctx); err != nil {
			r.errs = append(r.errs, fmt.Errorf("start again: %w", err))
			return true
		}
		return false
	}
	for i := range *handovers {
		to := st.holderC
		if i%2 == 1 {
			to = st.other()
		}
		within := to == st.holderC
		d, err := st.handover(ctx, to)
		if err != nil {
			if failed(err) {
				return r
			}
			continue
		}
		if within {
			r.within = append(r.within, d)
		} else {
			r.across = append(r.across, d)
		}
	}
	for range *contended {
		d, inverted, err := st.contest(ctx)
		if err != nil {
			if failed(err) {
				return r
			}
			continue
		}
		r.contendedN++
		if inverted {
			r.inversions++
		} else {
			r.contest = append(r.contest, d)
		}
	}
	return r
}

func (st *keyRun) other() *cluster {
	if st.holderC == st.p.clusters[0] {
		return st.p.clusters[1]
	}
	return st.p.clusters[0]
}

// handover queues one pod in cluster to, finishes the holder once it
// waits, and returns how long until the watch showed it ungated. The pod
// then holds (and st.holderC is its cluster).
func (st *keyRun) handover(ctx context.Context, to *cluster) (time.Duration, error) {
	w, err := st.queue(ctx, to)
	if err != nil {
		return 0, err
	}
	t0, err := st.finishHolder(ctx)
	if err != nil {
		return 0, err
	}
	_, t1, err := st.p.gates.Wait(ctx, roundTimeout, w.Name)
	if err != nil {
		return 0, err
	}
	return t1.Sub(t0), st.hold(ctx, to, w)
}

// contest has a pod wait in the other cluster (it came first) and one
// queued behind the holder, finishes the holder, and reports which was
// ungated first: the holder's cluster's is an inversion.
func (st *keyRun) contest(ctx context.Context) (time.Duration, bool, error) {
	other, own := st.other(), st.holderC
	w := st.waiting[other]
	if w == nil {
		var err error
		if w, err = st.queue(ctx, other); err != nil {
			return 0, false, err
		}
	} else if err := st.waits(ctx, other, w); err != nil {
		return 0, false, err
	}
	next, err := st.queue(ctx, own)
	if err != nil {
		return 0, false, err
	}
	t0, err := st.finishHolder(ctx)
	if err != nil {
		return 0, false, err
	}
	first, t1, err := st.p.gates.Wait(ctx, roundTimeout, w.Name, next.Name)
	if err != nil {
		return 0, false, err
	}
	if first == next.Name {
		return t1.Sub(t0), true, st.hold(ctx, own, next)
	}
	return t1.Sub(t0), false, st.hold(ctx, other, w)
}

// queue creates a gated pod for cluster c's lock and returns once it
// waits: behind the holder in its own cluster (in the lock's queue), or,
// in the other, with its lock's attempt for it having found the key held
// (and, with lines, its ticket on a majority of the masters).
func (st *keyRun) queue(ctx context.Context, c *cluster) (*corev1.Pod, error) {
	pod, err := st.create(ctx, c)
	if err != nil {
		return nil, err
	}
	st.waiting[c] = pod
	return pod, st.waits(ctx, c, pod)
}

// create creates the next gated pod for cluster c's lock.
func (st *keyRun) create(ctx context.Context, c *cluster) (*corev1.Pod, error) {
	st.seq++
	pod := podsim.Gated(ns, fmt.Sprintf("%s-%s-%03d", c.name, st.key, st.seq), map[string]string{v1alpha1.LockLabel: c.lock.Name})
	if err := c.env.Client.Create(ctx, pod); err != nil {
		return nil, fmt.Errorf("create pod %s in cluster %s: %w", pod.Name, c.name, err)
	}
	return pod, nil
}

// waits returns once pod waits for cluster c's lock, as queue says.
func (st *keyRun) waits(ctx context.Context, c *cluster, pod *corev1.Pod) error {
	err := benchenv.WaitFor(ctx, roundTimeout, func() (bool, error) {
		l := &v1alpha1.DistributedLock{}
		if err := c.env.Client.Get(ctx, client.ObjectKeyFromObject(c.lock), l); err != nil {
			return false, err
		}
		if c == st.holderC {
			return l.Status.Queue != nil && slices.ContainsFunc(l.Status.Queue.Waiting, func(q v1alpha1.QueuedPod) bool { return q.Name == pod.Name }), nil
		}
		// pod is the lock's only pod: the one it requests.
		held := meta.FindStatusCondition(l.Status.Conditions, v1alpha1.ConditionHeld)
		if held == nil || held.Status != metav1.ConditionFalse || held.Reason != v1alpha1.ReasonHeldElsewhere {
			return false, nil
		}
		return l.Status.Holder == nil && (!st.lines || st.inLine(ctx, string(l.UID))), nil
	})
	if err != nil {
		return fmt.Errorf("pod %s waiting in cluster %s: %w", pod.Name, c.name, err)
	}
	return nil
}

// inLine reports whether waiter's ticket is on a majority of the masters
// (a paused one counts as not showing it).
func (st *keyRun) inLine(ctx context.Context, waiter string) bool {
	servers := st.p.servers()
	seen, _ := redistest.LineWaiters(ctx, servers, redlock.LineKey(st.key), 200*time.Millisecond)
	return 2*seen[waiter] > len(servers)
}

// finishHolder marks the holder pod Succeeded and returns when.
func (st *keyRun) finishHolder(ctx context.Context) (time.Time, error) {
	t0 := time.Now()
	if err := podsim.Finish(ctx, st.holderC.env.Client, st.holder, 0); err != nil {
		return t0, fmt.Errorf("finish holder %s: %w", st.holder.Name, err)
	}
	return t0, nil
}

// hold runs ungated pod w of cluster c: it is the holder now.
func (st *keyRun) hold(ctx context.Context, c *cluster, w *corev1.Pod) error {
	if err := podsim.Run(ctx, c.env.Client, w, node); err != nil {
		return err
	}
	st.holder, st.holderC = w, c
	delete(st.waiting, c)
	return nil
}

// fresh finishes every pod of the key in both clusters, waits until
// neither lock has a holder, and has a new pod of cluster a take the key.
func (st *keyRun) fresh(ctx context.Context) error {
	for _, c := range st.p.clusters {
		var pods corev1.PodList
		if err := c.env.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LockLabel: c.lock.Name}); err != nil {
			return err
		}
		for i := range pods.Items {
			if pod := &pods.Items[i]; pod.Status.Phase != corev1.PodSucceeded {
				if err := c.env.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
					return err
				}
			}
		}
		if err := benchenv.WaitFor(ctx, 2*roundTimeout, func() (bool, error) {
			l := &v1alpha1.DistributedLock{}
			err := c.env.Client.Get(ctx, client.ObjectKeyFromObject(c.lock), l)
			return err == nil && l.Status.Holder == nil, err
		}); err != nil {
			return fmt.Errorf("lock of cluster %s not free: %w", c.name, err)
		}
	}
	clear(st.waiting)
	a := st.p.clusters[0]
	st.holderC = a
	pod, err := st.create(ctx, a)
	if err != nil {
		return err
	}
	if _, _, err := st.p.gates.Wait(ctx, roundTimeout, pod.Name); err != nil {
		return err
	}
	return st.hold(ctx, a, pod)
}

func pct(d []time.Duration, p float64) time.Duration { return benchenv.Percentile(d, p) }

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func round(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
