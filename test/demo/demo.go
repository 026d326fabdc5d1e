// Package demo is the scripted tour `make demo` gives of the operator on
// the local single-node cluster (hack/local-cluster): a managed set of five
// Redis masters, a lock held by an identity with a rival lock of the same
// key waiting, three Jobs gated on one lock running one after another with
// their fencing tokens, an active/passive Deployment in holder-label mode
// (every pod Ready, exactly one marked as the holder), and a Redis member
// crashed and kept out for its restart delay while the lock stays held
// with the same token.
//
// Run drives the script and samples the cluster four times a second: it
// draws a compact view (refreshed in place on a terminal) and checks, at
// every sample, what the operator promises — one holder per key, one Job
// pod running at a time, at most one marked holder, the held lock keeping its
// token through the crash. The Report says what was seen; `make e2e` runs
// the demo bounded and asserts the Report.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/managed"
)

// Names of the demo's objects.
const (
	MasterSet   = "masters"
	IdentityLk  = "report-writer"
	RivalLk     = "report-writer-rival"
	Identity    = "ops-console"
	RivalID     = "nightly-batch"
	JobsLk      = "migrations"
	LeaderLk    = "leader"
	Deployment  = "web"
	CrashMember = 2
	jobCount    = 3
)

// Options configure Run.
type Options struct {
	// Namespace the demo's objects are created in.
	Namespace string
	// BasePort of the host-network Redis members (member i on BasePort+i).
	BasePort int
	// TTL of the locks, and the master set's maxLockTTL.
	TTL time.Duration
	// Duration bounds the run; 0 runs until ctx ends. A bounded run ends
	// as soon as the script is done.
	Duration time.Duration
	// Out receives the view.
	Out io.Writer
	// Live redraws the view in place (a terminal); otherwise events are
	// printed as lines and the view every 15 s.
	Live bool
	// ClusterState is hack/local-cluster's state directory (for crashing a
	// member through containerd).
	ClusterState string
	// Hint is printed under the title, e.g. how to inspect the cluster.
	Hint string
}

// JobRun is one Job pod's run as its status tells it.
type JobRun struct {
	Pod           string
	Token         int64
	Start, Finish time.Time
}

// Crash is what was seen of the crashed member.
type Crash struct {
	Member       int
	At           time.Time
	ServedAgain  time.Time     // first accepted connection after the crash
	OutOfService time.Duration // ServedAgain - At
	RestartDelay time.Duration
	States       []string // member states seen after the crash, in order
	TokenBefore  int64    // the identity lock's token before the crash
	TokenAfter   int64    // and once the member was counted again
}

// Report is what a run saw.
type Report struct {
	Elapsed        time.Duration
	IdentityHolder string
	IdentityToken  int64
	Jobs           []JobRun
	Crash          *Crash
	HolderPods     []string // pods seen as the one marked holder, in order
	Done           []string // script steps completed
	Missing        []string // script steps not completed
	Violations     []string // broken promises, as sampled
}

// Failures lists what makes the run a failure.
func (r *Report) Failures() []string {
	return append(slices.Clone(r.Violations), r.Missing...)
}

type demo struct {
	c     client.Client
	o     Options
	start time.Time

	mu         sync.Mutex
	snap       snapshot
	events     []string
	printed    int
	rep        Report
	heldBefore map[string]bool // lock → held at the last sample
}

type snapshot struct {
	at    time.Time
	set   *v1alpha1.RedisMasterSet
	locks []v1alpha1.DistributedLock
	pods  []corev1.Pod
	jobs  []batchv1.Job
}

// Run runs the demo until the script is done (bounded) or ctx ends.
func Run(ctx context.Context, c client.Client, o Options) (*Report, error) {
	d := &demo{c: c, o: o, start: time.Now(), heldBefore: map[string]bool{}}
	if o.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Duration)
		defer cancel()
	}
	scriptCtx, stopScript := context.WithCancel(ctx)
	defer stopScript()
	scriptDone := make(chan error, 1)
	go func() { scriptDone <- d.script(scriptCtx) }()

	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	// A terminal's view is redrawn every second; a log gets it every 15 s,
	// with the events as lines in between.
	drawEvery := 15 * time.Second
	if o.Live {
		drawEvery = time.Second
	}
	var lastDraw time.Time
	finished := false
	for {
		select {
		case <-ctx.Done():
			return d.finish(), nil
		case err := <-scriptDone:
			scriptDone = nil
			if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				d.event("script stopped: %v", err)
			}
			if o.Duration > 0 {
				finished = true
			}
		case <-tick.C:
		}
		if err := d.observe(ctx); err != nil && ctx.Err() == nil {
			d.event("cannot read the cluster: %v", err)
		}
		if time.Since(lastDraw) >= drawEvery || finished {
			d.draw()
			lastDraw = time.Now()
		} else if !o.Live {
			d.printEvents()
		}
		if finished {
			return d.finish(), nil
		}
	}
}

// step records a completed script step.
func (d *demo) step(what string) {
	d.mu.Lock()
	d.rep.Done = append(d.rep.Done, what)
	d.mu.Unlock()
	d.event("✓ %s", what)
}

func (d *demo) event(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.note(format, args...)
}

// until polls cond every 250 ms until it holds, ctx ends or timeout passes.
func (d *demo) until(ctx context.Context, timeout time.Duration, what string, cond func(snapshot) bool) error {
	deadline := time.Now().Add(timeout)
	for {
		d.mu.Lock()
		s := d.snap
		d.mu.Unlock()
		if s.set != nil && cond(s) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v", what, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (d *demo) lock(name, key, identity string) *v1alpha1.DistributedLock {
	return &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: d.o.Namespace, Name: name},
		Spec: v1alpha1.DistributedLockSpec{
			MasterSet: MasterSet, Key: key, TTL: metav1.Duration{Duration: d.o.TTL}, HolderIdentity: identity,
		},
	}
}

func (d *demo) create(ctx context.Context, objs ...client.Object) error {
	for _, o := range objs {
		if err := d.c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// script is the tour, one step after another.
func (d *demo) script(ctx context.Context) error {
	for _, scene := range []func(context.Context) error{d.masters, d.identityLock, d.workloads, d.crashMember, d.jobsDone, d.failover} {
		if err := scene(ctx); err != nil {
			return err
		}
	}
	return nil
}

// masters creates the managed master set and waits for five serving.
func (d *demo) masters(ctx context.Context) error {
	ns := d.o.Namespace
	set := &v1alpha1.RedisMasterSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: MasterSet},
		Spec: v1alpha1.RedisMasterSetSpec{
			MaxLockTTL: metav1.Duration{Duration: d.o.TTL},
			Managed: &v1alpha1.ManagedMasters{
				Replicas: 5, Image: "redis:7-local", Port: int32(d.o.BasePort), HostNetwork: true, //nolint:gosec // a port number
			},
		},
	}
	if err := d.create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, set); err != nil {
		return err
	}
	d.event("created RedisMasterSet %s: five managed Redis masters", MasterSet)
	if err := d.until(ctx, 3*time.Minute, "five masters serving", func(s snapshot) bool {
		return meta.IsStatusConditionTrue(s.set.Status.Conditions, v1alpha1.ConditionAvailable) && s.set.Status.Serving == 5
	}); err != nil {
		return err
	}
	d.step("five Redis masters serving")
	return nil
}

// identityLock grants a lock to a static identity, then creates a rival
// lock of the same key, which waits.
func (d *demo) identityLock(ctx context.Context) error {
	if err := d.create(ctx, d.lock(IdentityLk, "demo/report", Identity)); err != nil {
		return err
	}
	if err := d.until(ctx, time.Minute, "lock held by "+Identity, func(s snapshot) bool { return held(s.lockNamed(IdentityLk)) }); err != nil {
		return err
	}
	d.step("lock " + IdentityLk + " held by the identity " + Identity)
	return d.create(ctx, d.lock(RivalLk, "demo/report", RivalID))
}

// workloads creates the Jobs and the Deployment that gate on locks.
func (d *demo) workloads(ctx context.Context) error {
	ns := d.o.Namespace
	objs := []client.Object{d.lock(JobsLk, "demo/migrations", ""), d.lock(LeaderLk, "demo/leader", "")}
	for i := 1; i <= jobCount; i++ {
		spec := Workload("sleep 4")
		spec.RestartPolicy = corev1.RestartPolicyNever
		objs = append(objs, &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("migrate-%d", i)},
			Spec: batchv1.JobSpec{
				BackoffLimit: new(int32(0)),
				Template: corev1.PodTemplateSpec{
					// The operator's webhook adds the scheduling gate.
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1alpha1.LockLabel: JobsLk}},
					Spec:       spec,
				},
			},
		})
	}
	labels := map[string]string{"app": Deployment, v1alpha1.LockLabel: LeaderLk, v1alpha1.GateModeLabel: v1alpha1.GateModeHolderLabel}
	objs = append(objs, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: Deployment},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": Deployment}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       Workload(`trap "exit 0" TERM; while true; do sleep 1; done`),
			},
		},
	})
	if err := d.create(ctx, objs...); err != nil {
		return err
	}
	d.event("created %d Jobs gated on lock %s, and Deployment %s (2 replicas, holder-label mode on lock %s)", jobCount, JobsLk, Deployment, LeaderLk)
	return nil
}

// crashMember kills a member while the first Job runs and waits until it
// is serving and counted again.
func (d *demo) crashMember(ctx context.Context) error {
	if err := d.until(ctx, 2*time.Minute, "a Job pod holding "+JobsLk, func(s snapshot) bool {
		l := s.lockNamed(JobsLk)
		return held(l) && l.Status.Holder.Pod != nil
	}); err != nil {
		return err
	}
	if err := d.crash(ctx); err != nil {
		return err
	}
	if err := d.until(ctx, 3*time.Minute, "crashed member serving again and counted", func(s snapshot) bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return !d.rep.Crash.ServedAgain.IsZero() && s.memberState(CrashMember) == v1alpha1.MemberServing
	}); err != nil {
		return err
	}
	d.mu.Lock()
	c := d.rep.Crash
	c.TokenAfter = tokenOf(d.snap.lockNamed(IdentityLk))
	out, delay := c.OutOfService, c.RestartDelay
	d.mu.Unlock()
	d.step(fmt.Sprintf("member #%d out of service %s after its crash (restart delay %s), counted again", CrashMember, out.Round(100*time.Millisecond), delay.Round(10*time.Millisecond)))
	return nil
}

// jobsDone waits for the Jobs.
func (d *demo) jobsDone(ctx context.Context) error {
	if err := d.until(ctx, 3*time.Minute, "three Jobs complete", func(s snapshot) bool {
		n := 0
		for _, j := range s.jobs {
			if j.Status.Succeeded == 1 {
				n++
			}
		}
		return n == jobCount
	}); err != nil {
		return err
	}
	d.step(fmt.Sprintf("%d Jobs ran one after another, each with its own token", jobCount))
	return nil
}

// failover deletes the Deployment's marked holder and waits for the other
// pod to be marked.
func (d *demo) failover(ctx context.Context) error {
	var first string
	if err := d.until(ctx, 2*time.Minute, "one "+Deployment+" pod marked as the holder", func(s snapshot) bool {
		r := s.holderPods()
		if len(r) == 1 {
			first = r[0]
		}
		return len(r) == 1
	}); err != nil {
		return err
	}
	d.event("deleting the holder pod %s: the lock and its mark move to the passive pod", first)
	if err := d.c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.o.Namespace, Name: first}}); err != nil {
		return fmt.Errorf("delete pod %s: %w", first, err)
	}
	if err := d.until(ctx, 2*time.Minute, "another "+Deployment+" pod marked as the holder", func(s snapshot) bool {
		r := s.holderPods()
		return len(r) == 1 && r[0] != first
	}); err != nil {
		return err
	}
	d.step("active/passive: the holder mark moved to the other pod")
	return nil
}

// crash SIGKILLs member CrashMember's Redis container.
func (d *demo) crash(ctx context.Context) error {
	pod := &corev1.Pod{}
	if err := d.c.Get(ctx, client.ObjectKey{Namespace: d.o.Namespace, Name: fmt.Sprintf("%s-%d", MasterSet, CrashMember)}, pod); err != nil {
		return fmt.Errorf("get member pod: %w", err)
	}
	d.mu.Lock()
	set := d.snap.set
	token := tokenOf(d.snap.lockNamed(IdentityLk))
	d.mu.Unlock()
	at, err := KillContainer(ctx, d.o.ClusterState, pod)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.rep.Crash = &Crash{Member: CrashMember, At: at, RestartDelay: managed.RestartDelay(set), TokenBefore: token}
	d.mu.Unlock()
	d.event("killed Redis member #%d (kill -9): it must stay out for its restart delay", CrashMember)
	go d.watchServed(ctx, fmt.Sprintf("127.0.0.1:%d", d.o.BasePort+CrashMember))
	return nil
}

// watchServed waits for the crashed member to stop answering, then probes
// it every 20 ms until it serves again and records when. Measured from
// just before the kill to just after the first accepted connection, the
// gap is at least the real time out of service and at most 20 ms and one
// probe more: a gap shorter than the restart delay is a real violation,
// and a real one longer than that slack is not missed.
func (d *demo) watchServed(ctx context.Context, addr string) {
	if AwaitDown(ctx, addr, 10*time.Millisecond) != nil {
		return
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !Serves(ctx, addr) {
			continue
		}
		at := time.Now()
		d.mu.Lock()
		c := d.rep.Crash
		c.ServedAgain, c.OutOfService = at, at.Sub(c.At)
		d.mu.Unlock()
		return
	}
}

// observe samples the cluster, checks the promises and notes events.
func (d *demo) observe(ctx context.Context) error {
	ns := client.InNamespace(d.o.Namespace)
	s := snapshot{at: time.Now(), set: &v1alpha1.RedisMasterSet{}}
	var locks v1alpha1.DistributedLockList
	var pods corev1.PodList
	var jobs batchv1.JobList
	if err := errors.Join(
		ignoreNotFound(d.c.Get(ctx, client.ObjectKey{Namespace: d.o.Namespace, Name: MasterSet}, s.set)),
		d.c.List(ctx, &locks, ns), d.c.List(ctx, &pods, ns), d.c.List(ctx, &jobs, ns),
	); err != nil {
		return err
	}
	s.locks, s.pods, s.jobs = locks.Items, pods.Items, jobs.Items
	sort.Slice(s.locks, func(i, j int) bool { return s.locks[i].CreationTimestamp.Before(&s.locks[j].CreationTimestamp) })
	sort.Slice(s.jobs, func(i, j int) bool { return s.jobs[i].Name < s.jobs[j].Name })
	sort.Slice(s.pods, func(i, j int) bool { return s.pods[i].Name < s.pods[j].Name })

	d.mu.Lock()
	defer d.mu.Unlock()
	prev := d.snap
	d.snap = s
	d.check(prev, s)
	if c := d.rep.Crash; c != nil {
		if st := s.memberState(c.Member); len(c.States) == 0 || c.States[len(c.States)-1] != st {
			c.States = append(c.States, st)
		}
	}
	return nil
}

// check runs under d.mu: the promises, and the events between two samples.
func (d *demo) check(prev, s snapshot) {
	d.checkLocks(prev, s)
	d.checkPods(s)
	d.noteChanges(prev, s)
}

// violate records a broken promise once (under d.mu).
func (d *demo) violate(format string, args ...any) {
	d.violateWith("", format, args...)
}

// violateWith records a broken promise once (under d.mu), the first time
// with detail appended: what made it (a condition's message) tells the
// cause, but varies from sample to sample.
func (d *demo) violateWith(detail, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	for _, v := range d.rep.Violations {
		if v == msg || strings.HasPrefix(v, msg+" [") {
			return
		}
	}
	if detail != "" {
		msg += " [at " + clock(time.Since(d.start)) + ": " + detail + "]"
	}
	d.rep.Violations = append(d.rep.Violations, msg)
	d.note("✗ %s", msg)
}

// note records an event (under d.mu).
func (d *demo) note(format string, args ...any) {
	d.events = append(d.events, fmt.Sprintf("%5s  ", clock(time.Since(d.start)))+fmt.Sprintf(format, args...))
}

// checkLocks: one holder per key; the identity lock keeps its grant and
// token; grants and releases become events.
func (d *demo) checkLocks(prev, s snapshot) {
	byKey := map[string][]string{}
	for i := range s.locks {
		l := &s.locks[i]
		now, was := held(l), d.heldBefore[l.Name]
		if now {
			byKey[l.Status.Key] = append(byKey[l.Status.Key], l.Name)
		}
		switch {
		case now && !was:
			d.note("lock %s granted to %s, fencing token %d", l.Name, holderName(l), l.Status.FencingToken)
		case !now && was:
			d.note("lock %s released (%s)", l.Name, heldReason(l))
		case now && tokenOf(prev.lockNamed(l.Name)) != 0 && tokenOf(prev.lockNamed(l.Name)) != l.Status.FencingToken:
			d.note("lock %s handed to %s, fencing token %d", l.Name, holderName(l), l.Status.FencingToken)
		}
		d.heldBefore[l.Name] = now
	}
	for key, names := range byKey {
		if len(names) > 1 {
			d.violate("key %s held by %v at once", key, names)
		}
	}
	l := s.lockNamed(IdentityLk)
	switch {
	case held(l) && d.rep.IdentityToken == 0:
		d.rep.IdentityHolder, d.rep.IdentityToken = l.Status.Holder.Identity, l.Status.FencingToken
	case held(l) && l.Status.FencingToken != d.rep.IdentityToken:
		d.violateWith(heldMessage(l), "lock %s changed token %d → %d", IdentityLk, d.rep.IdentityToken, l.Status.FencingToken)
	case !held(l) && d.rep.IdentityToken != 0:
		d.violateWith(heldMessage(l), "lock %s lost its grant (%s)", IdentityLk, heldReason(l))
	}
}

// checkPods: one Job pod at a time, no gated pod scheduled, at most one
// pod of the Deployment marked as the holder.
func (d *demo) checkPods(s snapshot) {
	var running []string
	for i := range s.pods {
		p := &s.pods[i]
		if p.Labels[v1alpha1.LockLabel] == JobsLk && MayRun(p) {
			running = append(running, p.Name)
		}
		if Gated(p) && p.Spec.NodeName != "" {
			d.violate("pod %s scheduled while gated", p.Name)
		}
	}
	if len(running) > 1 {
		d.violate("Job pods %v may run at once", running)
	}
	marked := s.holderPods()
	if len(marked) > 1 {
		d.violate("%s pods %v marked as the holder at once", Deployment, marked)
	}
	if len(marked) == 1 && (len(d.rep.HolderPods) == 0 || d.rep.HolderPods[len(d.rep.HolderPods)-1] != marked[0]) {
		d.rep.HolderPods = append(d.rep.HolderPods, marked[0])
		d.note("pod %s marked: it holds lock %s", marked[0], LeaderLk)
	}
}

// noteChanges turns member state changes and finished Jobs into events.
func (d *demo) noteChanges(prev, s snapshot) {
	if s.set != nil && prev.set != nil {
		for i, m := range s.set.Status.Members {
			if before := prev.memberState(i); before != "" && before != m.State {
				d.note("member #%d %s → %s", i, before, m.State)
			}
		}
	}
	for _, j := range s.jobs {
		if p := prev.jobNamed(j.Name); j.Status.Succeeded == 1 && p != nil && p.Status.Succeeded == 0 {
			d.note("job %s complete", j.Name)
		}
	}
}

// finish completes the report from the pods' own status.
func (d *demo) finish() *Report {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := &d.rep
	r.Elapsed = time.Since(d.start)
	for i := range d.snap.pods {
		p := &d.snap.pods[i]
		if p.Labels[v1alpha1.LockLabel] != JobsLk {
			continue
		}
		t, err := PrintedToken(p)
		if err != nil {
			continue
		}
		term := p.Status.ContainerStatuses[0].State.Terminated
		if a := p.Annotations[v1alpha1.FencingTokenAnnotation]; a != strconv.FormatInt(t, 10) {
			r.Violations = append(r.Violations, fmt.Sprintf("pod %s printed token %d, its annotation says %q", p.Name, t, a))
		}
		r.Jobs = append(r.Jobs, JobRun{Pod: p.Name, Token: t, Start: term.StartedAt.Time, Finish: term.FinishedAt.Time})
	}
	sort.Slice(r.Jobs, func(i, j int) bool { return r.Jobs[i].Start.Before(r.Jobs[j].Start) })
	for i := 1; i < len(r.Jobs); i++ {
		a, b := r.Jobs[i-1], r.Jobs[i]
		if b.Start.Before(a.Finish) {
			r.Violations = append(r.Violations, fmt.Sprintf("%s started before %s finished", b.Pod, a.Pod))
		}
		if b.Token <= a.Token {
			r.Violations = append(r.Violations, fmt.Sprintf("%s ran with token %d, not above %s's %d", b.Pod, b.Token, a.Pod, a.Token))
		}
	}
	if c := r.Crash; c != nil && !c.ServedAgain.IsZero() && c.OutOfService < c.RestartDelay {
		r.Violations = append(r.Violations, fmt.Sprintf("member #%d served again %v after its crash, before its restart delay %v", c.Member, c.OutOfService, c.RestartDelay))
	}
	for _, want := range []string{"five Redis masters serving", "lock " + IdentityLk, "member #", "Jobs ran one after another", "holder mark moved"} {
		if !slices.ContainsFunc(r.Done, func(s string) bool { return contains(s, want) }) {
			r.Missing = append(r.Missing, "not reached: "+want)
		}
	}
	out := *r
	return &out
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func held(l *v1alpha1.DistributedLock) bool {
	return l != nil && meta.IsStatusConditionTrue(l.Status.Conditions, v1alpha1.ConditionHeld) && l.Status.Holder != nil
}

func tokenOf(l *v1alpha1.DistributedLock) int64 {
	if !held(l) {
		return 0
	}
	return l.Status.FencingToken
}

// heldCondition is l's Held condition, or nil (l too).
func heldCondition(l *v1alpha1.DistributedLock) *metav1.Condition {
	if l == nil {
		return nil
	}
	return meta.FindStatusCondition(l.Status.Conditions, v1alpha1.ConditionHeld)
}

func heldReason(l *v1alpha1.DistributedLock) string {
	if l == nil {
		return "deleted"
	}
	if c := heldCondition(l); c != nil {
		return c.Reason
	}
	return "not yet acquired"
}

// heldMessage is the message of l's Held condition, or "".
func heldMessage(l *v1alpha1.DistributedLock) string {
	if c := heldCondition(l); c != nil {
		return c.Message
	}
	return ""
}

func holderName(l *v1alpha1.DistributedLock) string {
	if l.Status.Holder == nil {
		return ""
	}
	if l.Status.Holder.Pod != nil {
		return "pod " + l.Status.Holder.Pod.Name
	}
	return l.Status.Holder.Identity
}

func (s snapshot) lockNamed(name string) *v1alpha1.DistributedLock {
	for i := range s.locks {
		if s.locks[i].Name == name {
			return &s.locks[i]
		}
	}
	return nil
}

func (s snapshot) jobNamed(name string) *batchv1.Job {
	for i := range s.jobs {
		if s.jobs[i].Name == name {
			return &s.jobs[i]
		}
	}
	return nil
}

func (s snapshot) memberState(i int) string {
	if s.set == nil || i >= len(s.set.Status.Members) {
		return ""
	}
	return s.set.Status.Members[i].State
}

// holderPods are the Deployment's pods marked as the holder of its lock.
func (s snapshot) holderPods() []string {
	var out []string
	for i := range s.pods {
		if s.pods[i].Labels["app"] == Deployment && s.pods[i].Labels[v1alpha1.HoldsLabel] == LeaderLk {
			out = append(out, s.pods[i].Name)
		}
	}
	return out
}
