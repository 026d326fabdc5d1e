// Package history_test is a randomized history test of the operator: two
// manager processes on two API servers share five real Redis masters and
// serve DistributedLocks, some of which share keys, while a seeded schedule
// changes holders, deletes and re-creates locks, SIGSTOPs managers for
// longer than the TTL, SIGKILLs and restarts them, and kills masters and
// restarts them without persistence. Every grant is recorded from the
// watch of each API server (every status version, not samples) and the
// history is checked: no two grants of one key have overlapping validity,
// fencing tokens per key increase in grant order, and once the chaos stops
// and a quorum serves, every requested key is held again. The two clusters'
// master sets name the same servers by different addresses (127.0.0.1 and
// localhost) and with different maxLockTTLs (4s and 2s): a master restarted
// empty must not vote for cluster b while a grant of cluster a's longer
// ttl may still be valid. A set of cluster a's own has its list of masters
// edited by the schedule (one of two spare servers named in place of a
// listed one): each edit is a membership change with joint quorums, under
// the same manager pauses and kills. Semaphores run beside the locks: one
// key of 2 slots in both clusters, which a lock names too, one declared
// with 2 slots in one and 3 in the other; the schedule creates pods
// waiting for them, resizes them (spec.slots from 1 to 3), lets running
// pods finish and deletes pods, some at once, others with a grace period
// (a finalizer stands in for the kubelet's) that it ends later, and the
// test plays the kubelet: a pod runs from when its gate is seen lifted
// until it finishes or its grace period ends. The history is checked for
// more holders of a semaphore than its slots, for holders of two numbers
// of slots at once, for a lock's holder beside a semaphore's of its key,
// and, per semaphore, for more pods that may run at once than the number
// of slots they were given one of, or pods given slots of two numbers
// running at once (a slot is idle only when no pod that holds or held it
// may still run).
//
// `make test` runs it briefly; `make soak-controller SEED=… DURATION=10m`
// runs it longer and prints a table.
package history_test

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/history"
	"github.com/redlock-operator/redlock-operator/internal/harness/podsim"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/pkg/holding"
)

var (
	seedFlag     = flag.Uint64("seed", 0, "seed of the chaos schedule (0: random, printed)")
	durationFlag = flag.Duration("duration", 40*time.Second, "how long the chaos runs")
)

// The ttls (and maxLockTTLs) of cluster b's locks and of cluster a's.
const (
	ttl     = 2 * time.Second
	longTTL = 4 * time.Second
)

func TestHistory(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Operator history")
}

var managerBin string

var _ = BeforeSuite(func() {
	By("building the manager binary")
	managerBin = filepath.Join(GinkgoT().TempDir(), "manager")
	_, file, _, _ := runtime.Caller(0)
	build := exec.Command("go", "build", "-o", managerBin, "./cmd/manager")
	build.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), string(out))
})

// cluster is one API server with its manager process and locks.
type cluster struct {
	name       string
	ttl        time.Duration // of its locks, and its set's maxLockTTL
	env        *testenv.Env
	kubeconfig string
	logs       string
	ns         string
	args       []string // more flags of its manager (the last of a flag given twice wins)

	mu      sync.Mutex
	proc    *exec.Cmd
	exited  chan struct{}
	stopped bool
	starts  int
}

func (c *cluster) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starts++
	logf, err := os.Create(filepath.Join(c.logs, fmt.Sprintf("%s-manager-%d.log", c.name, c.starts)))
	Expect(err).NotTo(HaveOccurred())
	cmd := exec.Command(managerBin,
		"--kubeconfig", c.kubeconfig,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--leader-election-namespace", testenv.OperatorNamespace,
		"--lock-key-secret", testenv.LockKeySecret.String(),
		"--leader-elect-lease-duration", "2s", "--leader-elect-renew-deadline", "1500ms", "--leader-elect-retry-period", "200ms",
		"--probe-interval", "500ms", "--zap-log-level", "1", "--zap-time-encoding", "rfc3339nano",
		"--enable-webhook=false") // no webhook configuration on these API servers
	cmd.Args = append(cmd.Args, c.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	Expect(cmd.Start()).To(Succeed())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(exited)
	}()
	c.proc, c.exited, c.stopped = cmd, exited, false
}

// kill SIGKILLs the manager and waits for it.
func (c *cluster) kill() {
	c.mu.Lock()
	cmd, exited := c.proc, c.exited
	c.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-exited
}

// ensureRunning restarts a manager that exited (it exits when it loses its
// Lease, e.g. after a pause).
func (c *cluster) ensureRunning() bool {
	if !c.hasExited() {
		return false
	}
	c.start()
	return true
}

// hasExited reports whether the current manager process has exited.
func (c *cluster) hasExited() bool {
	c.mu.Lock()
	exited := c.exited
	c.mu.Unlock()
	select {
	case <-exited:
		return true
	default:
		return false
	}
}

func (c *cluster) signal(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.proc.Process.Signal(sig)
	c.stopped = sig == syscall.SIGSTOP
}

// lockSpec is one DistributedLock of the run.
type lockSpec struct {
	cluster *cluster
	name    string
	key     string        // "" for the default key
	set     string        // the master set ("" for the shared one)
	lease   time.Duration // spec.holderLease (0: none), renewed by the test
}

// leaseOf is the holderLease of the leased lock of the history.
const leaseOf = 3 * time.Second

// renewLease renews the lease of the grant lock l shows, as its static
// holder would (kubectl redlock renew), a sixth of the lease apart, until
// stop is closed.
func renewLease(l lockSpec, stop <-chan struct{}) {
	key := client.ObjectKey{Namespace: l.cluster.ns, Name: l.name}
	for {
		cur := &v1alpha1.DistributedLock{}
		if l.cluster.env.Client.Get(l.cluster.env.Ctx, key, cur) == nil && cur.Status.Holder != nil && cur.Status.GrantID != "" {
			_ = holding.Beat(l.cluster.env.Ctx, l.cluster.env.Client, key, cur.Status.GrantID, time.Now()) // a failed renewal is tried again
		}
		select {
		case <-stop:
			return
		case <-time.After(l.lease / 6):
		}
	}
}

// observed is a grant as the watches saw it.
type observed struct {
	g        history.Grant
	released bool
}

// recorder turns watched status versions into grants.
type recorder struct {
	mu     sync.Mutex
	grants map[string]*observed // cluster/uid/grantID
	events int
	// lineWaits counts, per key, the status versions that showed a lock
	// waiting for its turn in the key's line on the masters.
	lineWaits map[string]int
	versions  []version // every version seen, for the report of a violation
}

// version is one status version as a watch saw it.
type version struct {
	seen time.Time
	lock string // cluster/name
	text string
}

func newRecorder() *recorder {
	return &recorder{grants: map[string]*observed{}, lineWaits: map[string]int{}}
}

func (r *recorder) record(cl string, l *v1alpha1.DistributedLock) {
	st := l.Status
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHeld); c != nil && strings.Contains(c.Message, "waiting in the key's line") {
		r.mu.Lock()
		r.lineWaits[l.RedisKey()]++
		r.mu.Unlock()
	}
	if st.GrantID == "" {
		return
	}
	id := cl + "/" + string(l.UID) + "/" + st.GrantID
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events++
	r.versions = append(r.versions, version{seen: time.Now(), lock: cl + "/" + l.Name, text: describe(l)})
	o := r.grants[id]
	if st.Holder != nil && st.AcquiredAt != nil && st.ValidUntil != nil {
		if o == nil {
			// A grant is shown from the status version that first shows it:
			// no earlier than this watch saw it. (acquiredAt is when its
			// acquisition round began, before its quorum — a round that
			// began before another cluster's release and won after it is
			// not two grants at once.) It ends at releasedAt, the start of
			// the reconcile that hid it, before its keys were given back:
			// a grant shown before another one ended is a violation for
			// certain, whatever the watches' latency.
			seen := time.Now()
			if seen.After(st.ValidUntil.Time) { // seen late: shown until its validity at most
				seen = st.ValidUntil.Time
			}
			o = &observed{g: history.Grant{
				Key: st.Key, Holder: cl + "/" + l.Name + "/" + st.Holder.Identity,
				Start: seen, End: st.ValidUntil.Time, Token: st.FencingToken,
			}}
			if so := l.Spec.SlotOf; so != nil { // a semaphore's slot
				o.g.Semaphore, o.g.Slots = so.SemaphoreKey, int(so.Slots)
			}
			r.grants[id] = o
		}
		if !o.released && st.ValidUntil.After(o.g.End) {
			o.g.End = st.ValidUntil.Time
		}
		return
	}
	// The grant is no longer shown. It ended at releasedAt only on proof
	// that its holder stopped (its release, its pod's end: Held reason
	// Released or NotRequested); any other end (a deletion, a shed, a
	// loss, someone else's change) lasts until the validity shown, which
	// a holder may act on (docs/design/grant-life.md).
	if o != nil && !o.released && st.ReleasedAt != nil {
		o.released = true
		switch {
		case endedOnProof(l) && st.ReleasedAt.Before(o.g.End):
			o.g.End = st.ReleasedAt.Time
		case !endedOnProof(l) && st.LastValidUntil != nil && st.LastValidUntil.After(o.g.End):
			o.g.End = st.LastValidUntil.Time // the validity shown last, which a watch may have missed
		}
		if o.g.End.Before(o.g.Start) { // seen only after its hiding began
			o.g.End = o.g.Start
		}
	}
}

// endedOnProof reports whether the version that stopped showing l's grant
// says its holder stopped: released by its holder, or its pod ended.
func endedOnProof(l *v1alpha1.DistributedLock) bool {
	c := meta.FindStatusCondition(l.Status.Conditions, v1alpha1.ConditionHeld)
	return c != nil && (c.Reason == v1alpha1.ReasonReleased || c.Reason == v1alpha1.ReasonNotRequested)
}

// describe is one line of a lock's status version.
func describe(l *v1alpha1.DistributedLock) string {
	st := l.Status
	at := func(t *v1alpha1.PreciseTime) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format("15:04:05.000000")
	}
	holder := "-"
	if st.Holder != nil {
		holder = st.Holder.Identity
	}
	held := ""
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHeld); c != nil {
		held = fmt.Sprintf("%s/%s %q", c.Status, c.Reason, c.Message)
	}
	return fmt.Sprintf("uid %.8s rv %s grant %s holder %s token %d acquired %s valid %s released %s held %s",
		l.UID, l.ResourceVersion, st.GrantID, holder, st.FencingToken, at(st.AcquiredAt), at(st.ValidUntil), at(st.ReleasedAt), held)
}

// explain prints what the watches and the API servers' events say about
// the two grants of an overlap, from 10s before the first to 10s after the
// second.
func (r *recorder) explain(o *history.Overlap, clusters []*cluster) {
	from, to := o.Earlier.Start.Add(-10*time.Second), o.Later.Start.Add(10*time.Second)
	lockOf := func(holder string) string { // cluster/lock/identity
		parts := strings.SplitN(holder, "/", 3)
		return parts[0] + "/" + parts[1]
	}
	locks := []string{lockOf(o.Earlier.Holder), lockOf(o.Later.Holder)}
	var b strings.Builder
	fmt.Fprintf(&b, "\n== what the watches saw of %v (seen time, lock, status)\n", locks)
	r.mu.Lock()
	for _, v := range r.versions {
		if slices.Contains(locks, v.lock) && !v.seen.Before(from) && !v.seen.After(to) {
			fmt.Fprintf(&b, "%s %s %s\n", v.seen.UTC().Format("15:04:05.000000"), v.lock, v.text)
		}
	}
	r.mu.Unlock()
	fmt.Fprintf(&b, "== their events (event time, lock, reason, note)\n")
	for _, c := range clusters {
		var evs eventsv1.EventList
		if err := c.env.Client.List(context.Background(), &evs, client.InNamespace(c.ns)); err != nil {
			fmt.Fprintf(&b, "cluster %s: list events: %v\n", c.name, err)
			continue
		}
		slices.SortFunc(evs.Items, func(x, y eventsv1.Event) int { return x.EventTime.Compare(y.EventTime.Time) })
		for _, e := range evs.Items {
			name := c.name + "/" + e.Regarding.Name
			if slices.Contains(locks, name) && !e.EventTime.Time.Before(from) && !e.EventTime.After(to) {
				fmt.Fprintf(&b, "%s %s %s %s\n", e.EventTime.UTC().Format("15:04:05.000000"), name, e.Reason, e.Note)
			}
		}
	}
	fmt.Fprint(GinkgoWriter, b.String())
	_, _ = os.Stdout.WriteString(b.String())
}

func (r *recorder) all() []history.Grant {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]history.Grant, 0, len(r.grants))
	for _, o := range r.grants {
		out = append(out, o.g)
	}
	return out
}

// statusRecorder takes every status version a watch sees.
type statusRecorder interface {
	record(cluster string, l *v1alpha1.DistributedLock)
}

// watchLocks records every status version of the locks in c's namespace
// until stop is closed.
func watchLocks(c *cluster, rec statusRecorder, stop <-chan struct{}) {
	listWatch(c, func() client.ObjectList { return &v1alpha1.DistributedLockList{} }, stop, func(o apiruntime.Object, _ bool) {
		if l, isLock := o.(*v1alpha1.DistributedLock); isLock {
			rec.record(c.name, l)
		}
	})
}

// listWatch hands every object of c's namespace that opts select to seen
// (deleted: a watch's deletion event), from a list and then a watch from
// its version, re-listing when a watch ends, until stop is closed.
func listWatch(c *cluster, newList func() client.ObjectList, stop <-chan struct{}, seen func(o apiruntime.Object, deleted bool), opts ...client.ListOption) {
	defer GinkgoRecover()
	wc, err := client.NewWithWatch(c.env.Cfg, client.Options{Scheme: c.env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	opts = append(opts, client.InNamespace(c.ns))
	for {
		list := newList()
		err := wc.List(c.env.Ctx, list, opts...)
		var items []apiruntime.Object
		if err == nil {
			items, err = meta.ExtractList(list)
		}
		if err != nil {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond): // a retry's backoff
				continue
			}
		}
		for _, o := range items {
			seen(o, false)
		}
		w, err := wc.Watch(c.env.Ctx, newList(), append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}})...)
		if err != nil {
			continue
		}
	events:
		for {
			select {
			case <-stop:
				w.Stop()
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					break events
				}
				if ev.Type != watch.Error {
					seen(ev.Object, ev.Type == watch.Deleted)
				}
			}
		}
	}
}

// semSpec is a DistributedSemaphore of the schedule.
type semSpec struct {
	cluster *cluster
	name    string
	key     string
	slots   int32
}

var _ = Describe("The operator under chaos", func() {
	It("never shows two grants of a key at once, hands out increasing tokens per key, and serves every key again afterwards", func() {
		seed := *seedFlag
		if seed == 0 {
			seed = rand.Uint64()
		}
		fmt.Fprintf(GinkgoWriter, "history seed %d, duration %v\n", seed, *durationFlag)
		AddReportEntry("seed", seed)
		rnd := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		// The managers' logs: kept in $HISTORY_LOG_DIR when set.
		logs := os.Getenv("HISTORY_LOG_DIR")
		if logs == "" {
			logs = GinkgoT().TempDir()
		}
		fmt.Fprintf(GinkgoWriter, "manager logs in %s\n", logs)

		By("starting two API servers sharing five masters (under other addresses, with other maxLockTTLs), each with a manager process")
		a := &cluster{name: "a", ttl: longTTL, env: testenv.Start(), logs: logs}
		DeferCleanup(a.env.Stop)
		b := &cluster{name: "b", ttl: ttl, env: testenv.Start(), logs: logs}
		DeferCleanup(b.env.Stop)
		clusters := []*cluster{a, b}
		a.kubeconfig = a.env.Kubeconfig(filepath.Join(logs))
		bdir := filepath.Join(logs, "b")
		Expect(os.Mkdir(bdir, 0o700)).To(Succeed())
		b.kubeconfig = b.env.Kubeconfig(bdir)
		a.ns = a.env.NewNamespace()
		ms := a.env.NewMasters(a.ns, "masters", 5, a.ttl)
		b.ns = b.env.NewNamespace()
		b.env.CreateMasterSet(&testenv.MasterSet{Servers: ms.Servers, Name: ms.Name, NS: b.ns, Addresses: redistest.Aliases(ms.Servers)}, b.ttl)
		// A set of cluster a's own whose list of masters the chaos edits
		// (a membership change with joint quorums): three of five servers.
		moving := a.env.NewMasters(a.ns, "moving", 3, a.ttl)
		movingAddrs := redistest.Addrs(append(moving.Servers, testenv.StartServers(2, redistest.Options{})...))
		for _, c := range clusters {
			c.start()
			DeferCleanup(c.kill)
		}

		locks := []lockSpec{
			{a, "a-k1", "k1", "", 0}, {a, "a-k1-twin", "k1", "", 0}, {a, "a-k2", "k2", "", 0}, {a, "a-own", "", "", 0},
			{b, "b-k1", "k1", "", 0}, {b, "b-k2", "k2", "", 0},
			{a, "a-moved", "moved", moving.Name, 0}, {a, "a-moved-twin", "moved", moving.Name, 0},
			// The key of the semaphores "sem": a key is one kind, so the
			// lock and the semaphores' holders take turns.
			{a, "a-sem-lock", "sem", "", 0},
			// A leased static holder: the schedule's changes of its request
			// are someone else's (no release word), so its keys stay until
			// the validity shown; a manager paused past its lease ends it.
			{b, "b-leased", "k2", "", leaseOf},
		}
		// Semaphores: "sem" of 2 slots in both clusters; "semc" declared
		// with 2 slots in cluster a and 3 in b, which the masters must
		// refuse to serve at once; and a pool of each cluster's own, whose
		// key nothing else names, so that its pods run as many at once as
		// its slots allow: half the pods and half the resizes are theirs.
		// Their holders are gated pods, which the test's kubelet runs once
		// ungated (envtest has neither a scheduler nor a kubelet); a pod
		// runs until it finishes, its grace period ends, or it is gone.
		pools := []semSpec{{a, "a-pool", "pool-a", 2}, {b, "b-pool", "pool-b", 2}}
		sems := append([]semSpec{{a, "a-sem", "sem", 2}, {b, "b-sem", "sem", 2}, {a, "a-semc", "semc", 2}, {b, "b-semc", "semc", 3}}, pools...)
		pickSem := func() semSpec {
			if rnd.IntN(2) == 0 {
				return pools[rnd.IntN(len(pools))]
			}
			return sems[rnd.IntN(len(sems))]
		}
		for _, sm := range sems {
			Expect(sm.cluster.env.Client.Create(sm.cluster.env.Ctx, &v1alpha1.DistributedSemaphore{
				ObjectMeta: metav1.ObjectMeta{Namespace: sm.cluster.ns, Name: sm.name},
				Spec:       v1alpha1.DistributedSemaphoreSpec{MasterSet: ms.Name, Key: sm.key, Slots: sm.slots, TTL: metav1.Duration{Duration: sm.cluster.ttl}},
			})).To(Succeed(), "semaphore %s/%s", sm.cluster.ns, sm.name)
		}
		// semPods are the schedule's pods not deleted, terminating those
		// deleted in their grace period (graceFinalizer).
		var semPods, terminating []*podRun
		podSeq := 0
		kl := newKubelet()
		for _, c := range clusters {
			Expect(podsim.NodeReady(c.env.Ctx, c.env.Client, node, corev1.ConditionTrue)).To(Succeed(), "node %s of cluster %s", node, c.name)
		}
		holders := []string{"", "x", "y", "z"}
		create := func(l lockSpec, holder string) {
			spec := v1alpha1.DistributedLockSpec{MasterSet: cmp.Or(l.set, ms.Name), Key: l.key, TTL: metav1.Duration{Duration: l.cluster.ttl}, HolderIdentity: holder}
			if l.lease > 0 {
				spec.HolderLease = &metav1.Duration{Duration: l.lease}
			}
			err := l.cluster.env.Client.Create(l.cluster.env.Ctx, &v1alpha1.DistributedLock{
				ObjectMeta: metav1.ObjectMeta{Namespace: l.cluster.ns, Name: l.name},
				Spec:       spec,
			})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				Expect(err).NotTo(HaveOccurred())
			}
		}
		for _, l := range locks {
			create(l, "x")
		}

		rec := newRecorder()
		stop := make(chan struct{})
		var watchers sync.WaitGroup
		for _, c := range clusters {
			watchers.Go(func() { watchLocks(c, rec, stop) })
			watchers.Go(func() { kl.watch(c, stop) })
		}
		for _, l := range locks {
			if l.lease > 0 {
				watchers.Go(func() { renewLease(l, stop) })
			}
		}

		By("running the chaos schedule")
		actions := map[string]int{}
		deadline := time.Now().Add(*durationFlag)
		var pauses sync.WaitGroup
		downMasters := map[int]bool{}
		var mastersMu sync.Mutex
		for time.Now().Before(deadline) {
			for _, c := range clusters {
				if c.ensureRunning() {
					actions["manager exited and restarted"]++
				}
			}
			switch p := rnd.IntN(100); {
			case p < 30:
				l := locks[rnd.IntN(len(locks))]
				h := holders[rnd.IntN(len(holders))]
				cur := &v1alpha1.DistributedLock{}
				if err := l.cluster.env.Client.Get(l.cluster.env.Ctx, client.ObjectKey{Namespace: l.cluster.ns, Name: l.name}, cur); err != nil {
					create(l, h)
					actions["create a lock"]++
					break
				}
				cur.Spec.HolderIdentity = h
				if l.cluster.env.Client.Update(l.cluster.env.Ctx, cur) == nil {
					actions["change the holder"]++
				}
			case p < 39:
				l := locks[rnd.IntN(len(locks))]
				err := l.cluster.env.Client.Delete(l.cluster.env.Ctx, &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: l.cluster.ns, Name: l.name}})
				if err == nil {
					actions["delete a lock"]++
				}
			case p < 45:
				c := clusters[rnd.IntN(len(clusters))]
				c.mu.Lock()
				paused := c.stopped
				c.mu.Unlock()
				if paused {
					break
				}
				pause := c.ttl + time.Duration(rnd.IntN(1500))*time.Millisecond
				c.signal(syscall.SIGSTOP)
				actions["SIGSTOP a manager for longer than the TTL"]++
				pauses.Go(func() {
					time.Sleep(pause) // the pause is the fault being injected
					c.signal(syscall.SIGCONT)
				})
			case p < 50:
				c := clusters[rnd.IntN(len(clusters))]
				c.kill()
				c.start()
				actions["SIGKILL and restart a manager"]++
			case p < 58:
				i := rnd.IntN(len(ms.Servers))
				mastersMu.Lock()
				if downMasters[i] {
					mastersMu.Unlock()
					break
				}
				downMasters[i] = true
				mastersMu.Unlock()
				Expect(ms.Servers[i].Kill()).To(Succeed())
				actions["kill a master (restarted without persistence)"]++
				down := time.Duration(200+rnd.IntN(2000)) * time.Millisecond
				pauses.Go(func() {
					defer GinkgoRecover()
					time.Sleep(down) // how long the master stays dead
					Expect(ms.Servers[i].Restart(false)).To(Succeed())
					mastersMu.Lock()
					delete(downMasters, i)
					mastersMu.Unlock()
				})
			case p < 62:
				// Name one of the two spare servers in place of a listed one.
				cur := &v1alpha1.RedisMasterSet{}
				if a.env.Client.Get(a.env.Ctx, client.ObjectKey{Namespace: a.ns, Name: moving.Name}, cur) != nil {
					break
				}
				listed := cur.Spec.External.Addresses
				var spares []string
				for _, addr := range movingAddrs {
					if !slices.Contains(listed, addr) {
						spares = append(spares, addr)
					}
				}
				listed = slices.Clone(listed)
				listed[rnd.IntN(len(listed))] = spares[rnd.IntN(len(spares))]
				cur.Spec.External.Addresses = listed
				if a.env.Client.Update(a.env.Ctx, cur) == nil {
					actions["replace a master of a set (membership change)"]++
				}
			case p < 72 && len(semPods)+len(terminating) < 14:
				sm := pickSem()
				podSeq++
				grace := rnd.IntN(2) == 0
				pod, err := kl.create(sm, fmt.Sprintf("%s-%d", sm.name, podSeq), grace)
				if err == nil {
					semPods = append(semPods, pod)
					actions["create a pod waiting for a semaphore"]++
				}
			case p < 79 && len(semPods) > 0:
				// Mostly a pod that runs: a holder, or one that held.
				i := rnd.IntN(len(semPods))
				if running := kl.running(semPods); len(running) > 0 && rnd.IntN(3) > 0 {
					i = slices.Index(semPods, running[rnd.IntN(len(running))])
				}
				pod := semPods[i]
				if kl.remove(pod) != nil {
					break
				}
				semPods = slices.Delete(semPods, i, i+1)
				if pod.grace {
					terminating = append(terminating, pod)
					actions["delete a semaphore's pod, with a grace period"]++
				} else {
					actions["delete a semaphore's pod, gone at once"]++
				}
			case p < 85:
				running := kl.finishable(semPods)
				if len(running) == 0 {
					break
				}
				if kl.finish(running[rnd.IntN(len(running))]) == nil {
					actions["a semaphore's running pod finishes"]++
				}
			case p < 92 && len(terminating) > 0:
				i := rnd.IntN(len(terminating))
				pod := terminating[i]
				if rnd.IntN(2) == 0 {
					if stopped, err := kl.stopInGrace(pod); stopped && err == nil {
						actions["stop the containers of a pod in its grace period"]++
						break
					}
				}
				if kl.endGrace(pod) == nil {
					terminating = slices.Delete(terminating, i, i+1)
					actions["end a pod's grace period (finalizer removed)"]++
				}
			case p < 98:
				// Half the time, when some are, one whose pod runs in its
				// grace period.
				sm := pickSem()
				if inGrace := slices.DeleteFunc(slices.Clone(terminating), func(p *podRun) bool { return !kl.inGrace(p) }); len(inGrace) > 0 && rnd.IntN(2) == 0 {
					pod := inGrace[rnd.IntN(len(inGrace))]
					sm = sems[slices.IndexFunc(sems, func(sm semSpec) bool { return sm.cluster == pod.cluster && sm.name == pod.sem })]
				}
				cur := &v1alpha1.DistributedSemaphore{}
				if sm.cluster.env.Client.Get(sm.cluster.env.Ctx, client.ObjectKey{Namespace: sm.cluster.ns, Name: sm.name}, cur) != nil {
					break
				}
				cur.Spec.Slots = cur.Spec.Slots%3 + 1 + int32(rnd.IntN(2)) // another number from 1 to 3
				if cur.Spec.Slots > 3 {
					cur.Spec.Slots -= 3
				}
				if sm.cluster.env.Client.Update(sm.cluster.env.Ctx, cur) != nil {
					break
				}
				actions["resize a semaphore (spec.slots)"]++
				if slices.ContainsFunc(terminating, func(p *podRun) bool { return p.cluster == sm.cluster && p.sem == sm.name && kl.inGrace(p) }) {
					actions["resize a semaphore while a pod it gave a slot runs in its grace period"]++
				}
			}
			time.Sleep(time.Duration(100+rnd.IntN(400)) * time.Millisecond) // the schedule's pace
		}

		By("stopping the chaos: every manager and master running again, every semaphore's pod gone, every lock requested")
		pauses.Wait()
		for _, c := range clusters {
			c.signal(syscall.SIGCONT)
			c.ensureRunning()
		}
		// The lock a-sem-lock is served once the semaphores of its key
		// have no holders.
		for _, pod := range semPods {
			Expect(kl.remove(pod)).To(Succeed(), "delete pod %s/%s", pod.cluster.name, pod.name)
		}
		for _, pod := range slices.Concat(semPods, terminating) {
			if pod.grace {
				Expect(kl.endGrace(pod)).To(Succeed(), "end the grace period of pod %s/%s", pod.cluster.name, pod.name)
			}
		}
		final := map[string]string{}
		for _, l := range locks {
			final[l.cluster.name+"/"+l.name] = "final"
			Eventually(func() error {
				// A manager that lost its Lease exits: the deletions it
				// finishes wait for its restart.
				if l.cluster.ensureRunning() {
					actions["manager exited and restarted"]++
				}
				cur := &v1alpha1.DistributedLock{}
				if err := l.cluster.env.Client.Get(l.cluster.env.Ctx, client.ObjectKey{Namespace: l.cluster.ns, Name: l.name}, cur); err != nil {
					create(l, "final")
					return err
				}
				if !cur.DeletionTimestamp.IsZero() {
					// A deletion from the chaos is still waiting for its
					// grant to expire: re-create the lock once it is gone.
					return fmt.Errorf("%s is still being deleted", l.name)
				}
				cur.Spec.HolderIdentity = "final"
				return l.cluster.env.Client.Update(l.cluster.env.Ctx, cur)
			}, 30*time.Second).Should(Succeed(), "lock %s/%s to take holder final (a deletion waits at most a TTL + 5s for its grant)", l.cluster.ns, l.name)
		}

		By("serving every key again once a quorum serves")
		keyOf := func(l lockSpec) string {
			if l.key == "" {
				return "redlock:" + l.cluster.ns + "/" + l.name
			}
			return l.key
		}
		Eventually(func(g Gomega) {
			for _, c := range clusters {
				c.ensureRunning()
			}
			held := map[string][]string{}
			for _, l := range locks {
				cur := &v1alpha1.DistributedLock{}
				g.Expect(l.cluster.env.Client.Get(l.cluster.env.Ctx, client.ObjectKey{Namespace: l.cluster.ns, Name: l.name}, cur)).To(Succeed())
				if cur.Status.Holder != nil && cur.Status.ValidUntil != nil && time.Now().Before(cur.Status.ValidUntil.Time) {
					held[keyOf(l)] = append(held[keyOf(l)], l.cluster.name+"/"+l.name)
				}
			}
			for _, l := range locks {
				g.Expect(held[keyOf(l)]).To(HaveLen(1), "key %s: held by %v", keyOf(l), held[keyOf(l)])
			}
		}, 60*time.Second, 100*time.Millisecond).Should(Succeed(), "every key of the %d locks to be held by exactly one lock once a quorum serves", len(locks))
		close(stop)
		watchers.Wait()
		kl.wg.Wait()

		By("checking the history")
		grants, runs := rec.all(), kl.runs()
		report(seed, *durationFlag, actions, grants, runs, rec.events, rec.lineWaits)
		err := history.Check(grants)
		if o := (*history.Overlap)(nil); errors.As(err, &o) {
			rec.explain(o, clusters)
		}
		Expect(err).To(Succeed())
		err = history.CheckRuns(runs)
		if v := (*history.SlotsViolation)(nil); errors.As(err, &v) {
			kl.explain(v.Semaphore, v.At, rec)
		}
		Expect(err).To(Succeed(), "the pods that may run of every semaphore")
		Expect(runs).NotTo(BeEmpty(), "no semaphore's pod ran: the pods' part of the history means nothing")
		Expect(len(grants)).To(BeNumerically(">=", len(locks)), "too few grants to mean anything")
		slotGrants := 0
		for _, g := range grants {
			if g.Semaphore != "" {
				slotGrants++
			}
		}
		Expect(slotGrants).To(BeNumerically(">", 0), "no grant of a semaphore's slot: the semaphores' part of the history means nothing")
	})
})

// report prints the run's table.
func report(seed uint64, d time.Duration, actions map[string]int, grants []history.Grant, runs []history.Run, events int, lineWaits map[string]int) {
	var b strings.Builder
	fmt.Fprintf(&b, "\nhistory run: seed %d, chaos %v, %d status versions watched\n\n", seed, d, events)
	fmt.Fprintf(&b, "| fault or change | count |\n|---|---:|\n")
	names := make([]string, 0, len(actions))
	for n := range actions {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "| %s | %d |\n", n, actions[n])
	}
	perKey := map[string]int{}
	for _, g := range grants {
		perKey[g.Key]++
	}
	keys := make([]string, 0, len(perKey))
	for k := range perKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(&b, "\n| key | grants | status versions waiting in its line |\n|---|---:|---:|\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "| %s | %d | %d |\n", k, perKey[k], lineWaits[k])
	}
	perSem := map[string]int{}
	for _, r := range runs {
		perSem[r.Semaphore]++
	}
	most := mostAtOnce(runs)
	fmt.Fprintf(&b, "\n| semaphore | pods run | most running at once |\n|---|---:|---:|\n")
	for _, sem := range slices.Sorted(maps.Keys(perSem)) {
		fmt.Fprintf(&b, "| %s | %d | %d |\n", sem, perSem[sem], most[sem])
	}
	verdict := "none"
	if err := errors.Join(history.Check(grants), history.CheckRuns(runs)); err != nil {
		verdict = err.Error()
	}
	fmt.Fprintf(&b, "\nviolations: %s\n", verdict)
	fmt.Fprint(GinkgoWriter, b.String())
	_, _ = os.Stdout.WriteString(b.String())
}
