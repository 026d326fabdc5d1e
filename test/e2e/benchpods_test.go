//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// The pod failover benchmark (make bench-failover-pods), on the local
// cluster, each scenario read from the apps' own reports (host uptime):
//
//   - the active pod of an active/passive Deployment whose app runs
//     through the agent is deleted again and again: the time until the
//     next pod's app runs;
//   - the Deployment's pod template changes again and again: the time
//     until a pod of the new revision runs its app, and the longest time
//     no app runs during the rollout;
//   - the Kubernetes-native peer, client-go leaderelection on a Lease in
//     the same kind of Deployment (test/e2e/leasepeer): its active pod
//     deleted again and again;
//   - the API writes per held lock per second, agent-run lock and Lease,
//     over a quiet minute;
//   - the operator's leader SIGKILLed while agents run: the longest time
//     no app runs, at the suite's ttl (4s, shorter than twice the failover
//     slack) and at 30s (longer).
//
// It runs only when BENCH_FAILOVER_PODS names the number of rounds of each
// scenario; make e2e skips it. A round that fails (a handover that does not
// come, a rollout that does not complete) is counted and reported, and the
// benchmark goes on; two apps active at once fails it, after the tables.
var _ = Describe("pod failover benchmark", Label("bench"), Ordered, ContinueOnFailure, func() {
	var n int
	BeforeAll(func() {
		var err error
		n, err = strconv.Atoi(os.Getenv("BENCH_FAILOVER_PODS"))
		if err != nil || n <= 0 {
			Skip("set BENCH_FAILOVER_PODS to the number of rounds per scenario (make bench-failover-pods)")
		}
		By("creating a second managed RedisMasterSet, maxLockTTL " + longTTL.String() + ", for locks that keep the failover slack")
		longSet := &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: longSetName},
			Spec: v1alpha1.RedisMasterSetSpec{
				MaxLockTTL: metav1.Duration{Duration: longTTL},
				Managed:    &v1alpha1.ManagedMasters{Replicas: 5, Image: "redis:7-local", Port: basePort + 100, HostNetwork: true},
			},
		}
		Expect(k8s.Create(ctx, longSet)).To(Succeed())
		removeAfterSpec(longSet) // in BeforeAll: once every spec here has run
		Eventually(func(g Gomega) {
			cur := &v1alpha1.RedisMasterSet{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(longSet), cur)).To(Succeed(), "master set %s/%s", ns, longSet.Name)
			g.Expect(meta.IsStatusConditionTrue(cur.Status.Conditions, v1alpha1.ConditionAvailable)).To(BeTrue(), "availability of master set %s/%s", ns, longSet.Name)
			g.Expect(cur.Status.Serving).To(Equal(int32(5)), "serving members of master set %s/%s", ns, longSet.Name)
		}, 3*time.Minute, time.Second).Should(Succeed(), "master set %s/%s to serve with all 5 members", ns, longSet.Name)
		By("building the Lease peer (test/e2e/leasepeer) and importing it as leasepeer:local")
		importLeasePeer()
		leasePeerAccess()
	})

	It("(a) measures the time from deleting the active pod until the next pod's app runs", func() {
		const app = "bench-failover"
		a := activePassive(app, false)
		d := agentDeployment(app, agentTemplate(app, app, 23470))
		agentDelete = deleteActive(app, d, n)
		_, violations := a.seen()

		GinkgoWriter.Printf("\npod failover through the agent, active pod deleted (Deployment of 2, ttl %v, grace 100ms, skew 100ms), %d handovers, %d errors:\n\n", ttl, len(agentDelete.toRun), agentDelete.errors)
		printQuantiles(agentDelete.rows())
		Expect(violations).To(BeEmpty())
		Expect(overlaps(activePeriods(app))).To(BeEmpty(), "two apps active at once")
	})

	It("(b) measures the time from the active container failing for good, with holder liveness on, until the next pod's app runs", func() {
		const app = "bench-crash"
		a := activePassive(app, false)
		By("setting heartbeatTimeout " + crashTimeout.String() + " on lock " + app)
		Expect(poll(time.Minute, 100*time.Millisecond, func() error {
			l := &v1alpha1.DistributedLock{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: app}, l); err != nil {
				return err
			}
			l.Spec.HeartbeatTimeout = &metav1.Duration{Duration: crashTimeout}
			return k8s.Update(ctx, l)
		})).To(Succeed())
		template := agentTemplate(app, app, 23474)
		template.Spec.Containers[0].Command = []string{"/bin/sh", "-c", crashingScript}
		d := agentDeployment(app, template)
		c := crashActive(app, d, n)
		_, violations := a.seen()

		GinkgoWriter.Printf("\npod failover through the agent, active container failing for good (Deployment of 2, ttl %v, heartbeatTimeout %v, grace 100ms, skew 100ms), %d handovers, %d errors:\n\n", ttl, crashTimeout, len(c.toRun), c.errors)
		printQuantiles([]quantileRow{{"active app failed (its container crash-loops) → next pod's app runs", c.toRun}})
		Expect(violations).To(BeEmpty())
		Expect(overlaps(activePeriods(app))).To(BeEmpty(), "two apps active at once")
	})

	It("(c) measures a rollout step: template update until a pod of the new revision runs its app, and the longest time no app runs", func() {
		const app = "bench-rollout"
		a := activePassive(app, false)
		d := agentDeployment(app, agentTemplate(app, app, 23471))
		r := rolloutSteps(app, d, n)
		_, violations := a.seen()

		GinkgoWriter.Printf("\nrollout step of an agent-run Deployment (2 replicas, default RollingUpdate: maxSurge 1, maxUnavailable 0; ttl %v), %d rollouts completed, %d handovers, %d errors:\n\n", ttl, len(r.complete), r.handovers, r.errors)
		printQuantiles([]quantileRow{
			{"template update → a new-revision pod's app runs", r.toNew},
			{"longest time no app runs during the rollout", r.gaps},
			{"template update → rollout complete (Available, 2 updated, old pods gone)", r.complete},
		})
		Expect(violations).To(BeEmpty())
		Expect(overlaps(activePeriods(app))).To(BeEmpty(), "two apps active at once")
	})

	It("(peer) measures a client-go leaderelection Lease in the same cluster: deleting the active pod until the next pod's app runs", func() {
		const app = "bench-lease"
		resetActive(app)
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: app},
			Spec: appsv1.DeploymentSpec{
				Replicas: new(int32(2)),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
				Template: leasePeerTemplate(app, app, 23480),
			},
		}
		Expect(k8s.Create(ctx, d)).To(Succeed())
		removeAfterSpec(d)
		lease := deleteActive(app, d, n)
		overlapping := overlaps(activePeriods(app))

		GinkgoWriter.Printf("\nthe peer: client-go leaderelection Lease (15s/10s/2s, ReleaseOnCancel) in a Deployment of 2, active pod deleted, %d handovers, %d errors, %d overlaps:\n\n", len(lease.toRun), lease.errors, len(overlapping))
		printQuantiles(lease.rows())
		if len(agentDelete.toRun) > 0 && len(lease.toRun) > 0 {
			GinkgoWriter.Printf("\n| delete request → next pod's app runs | p50 | p99 | max |\n|---|---:|---:|---:|\n")
			GinkgoWriter.Printf("| agent (ttl %v) | %v | %v | %v |\n", ttl, quantile(agentDelete.toRun, 0.5), quantile(agentDelete.toRun, 0.99), quantile(agentDelete.toRun, 1))
			GinkgoWriter.Printf("| Lease (15s/10s/2s) | %v | %v | %v |\n", quantile(lease.toRun, 0.5), quantile(lease.toRun, 0.99), quantile(lease.toRun, 1))
			ratio := func(q float64) string {
				return fmt.Sprintf("%.2f", quantile(agentDelete.toRun, q).Seconds()/quantile(lease.toRun, q).Seconds())
			}
			GinkgoWriter.Printf("| ratio agent / Lease | %s | %s | %s |\n", ratio(0.5), ratio(0.99), ratio(1))
		}
		fmt.Fprintln(GinkgoWriter)
		for _, o := range overlapping {
			GinkgoWriter.Printf("Lease peer, two apps active at once: %s\n", o)
		}
	})

	It("(writes) counts the API writes per held lock per second over a quiet minute: agent-run locks and the Lease", func() {
		measureWrites()
	})

	It("(d) SIGKILLs the operator's leader while agents run and measures the longest time no app runs", func() {
		killLeader(n)
	})
})

const (
	longSetName = "masters-long"
	// longTTL is twice the manager's default failover slack (14.4 s,
	// docs/design/failover.md) and more: a crash of the leader must not lapse a
	// lock of this ttl.
	longTTL = 30 * time.Second
)

// agentDelete is scenario (a)'s result, for the ratio to the Lease's.
var agentDelete handovers

type handovers struct {
	toRun, gaps []time.Duration
	// toRun of the handovers to the pod that stood by, and to the pod the
	// Deployment made to replace the deleted one.
	toStandby, toReplacement []time.Duration
	errors                   int
}

// rows are h's rows of a table.
func (h handovers) rows() []quantileRow {
	return []quantileRow{
		{"delete request → next pod's app runs", h.toRun},
		{"… taken over by the pod that stood by", h.toStandby},
		{"… taken over by the Deployment's replacement pod", h.toReplacement},
		{"old app stopped → next pod's app runs (no app active)", h.gaps},
	}
}

type quantileRow struct {
	what string
	d    []time.Duration
}

// printQuantiles prints rows as a markdown table of p50, p99 and max.
func printQuantiles(rows []quantileRow) {
	GinkgoWriter.Printf("| measured | n | p50 | p99 | max |\n|---|---:|---:|---:|---:|\n")
	for _, row := range rows {
		slices.Sort(row.d)
		GinkgoWriter.Printf("| %s | %d | %v | %v | %v |\n", row.what, len(row.d), quantile(row.d, 0.5), quantile(row.d, 0.99), quantile(row.d, 1))
	}
	fmt.Fprintln(GinkgoWriter)
}

// lockOn is a pod lock of name on the set, with ttl.
func lockOn(name, set string, lockTTL time.Duration) *v1alpha1.DistributedLock {
	return &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.DistributedLockSpec{MasterSet: set, Key: "e2e/" + name, TTL: metav1.Duration{Duration: lockTTL}},
	}
}

// agentDeployment creates a Deployment of two pods of template, removed
// after the spec.
func agentDeployment(app string, template corev1.PodTemplateSpec) *appsv1.Deployment {
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: app},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
			Template: template,
		},
	}
	Expect(k8s.Create(ctx, d)).To(Succeed())
	removeAfterSpec(d)
	return d
}

// poll calls f every interval until it returns nil, for up to timeout;
// the last error otherwise. Rounds of the benchmark wait with it, not with
// Eventually: a round that does not come is counted, and the next begins.
func poll(timeout, interval time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(interval)
	}
}

// rounds runs round for each i in [0, n), the rounds of one scenario,
// and returns how many failed: a round that returns an error failed (the
// error is printed after what and i). After three failed in a row, the
// rest are counted as failed and not run: the scenario is broken, and
// the benchmark goes on with the next.
func rounds(what string, n int, round func(i int) error) (failed int) {
	inARow := 0
	for i := range n {
		if inARow == 3 {
			GinkgoWriter.Printf("%s: three rounds failed in a row, %d rounds left out\n", what, n-i)
			return failed + n - i
		}
		if err := round(i); err != nil {
			failed++
			inARow++
			GinkgoWriter.Printf("%s %d: %v\n", what, i, err)
			continue
		}
		inARow = 0
	}
	return failed
}

// running is app's period running now, once the Deployment d has both
// replicas Ready and no others.
func running(app string, d *appsv1.Deployment) (activePeriod, error) {
	cur := &appsv1.Deployment{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(d), cur); err != nil {
		return activePeriod{}, err
	}
	if cur.Status.ReadyReplicas != 2 || cur.Status.Replicas != 2 {
		return activePeriod{}, fmt.Errorf("Deployment %s: %d replicas, %d Ready", app, cur.Status.Replicas, cur.Status.ReadyReplicas)
	}
	periods := activePeriods(app)
	if len(periods) == 0 || periods[len(periods)-1].Stop != 0 {
		return activePeriod{}, fmt.Errorf("no app of %s runs", app)
	}
	return periods[len(periods)-1], nil
}

// deleteActive deletes the pod whose app runs n times, each time once the
// Deployment has both replicas again, and measures from the delete request
// until another pod's app runs.
func deleteActive(app string, d *appsv1.Deployment, n int) handovers {
	var h handovers
	h.errors = rounds(app+" handover", n, func(int) error {
		var holder activePeriod
		if err := poll(2*time.Minute, 100*time.Millisecond, func() (err error) { holder, err = running(app, d); return err }); err != nil {
			return fmt.Errorf("not ready: %w", err)
		}
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": app}); err != nil {
			return fmt.Errorf("listing the pods: %w", err)
		}
		deleted := uptimeNow()
		if err := k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holder.Pod}}); err != nil {
			return fmt.Errorf("delete %s: %w", holder.Pod, err)
		}
		// Polled by hand, not with Eventually: a handover that does not
		// come is counted, and the benchmark goes on.
		next, old, ok := nextRun(app, holder, time.Minute)
		if !ok {
			return fmt.Errorf("no other pod's app ran within a minute of deleting %s", holder.Pod)
		}
		h.toRun = append(h.toRun, seconds(next.Start-deleted))
		if slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool { return p.Name == next.Pod }) {
			h.toStandby = append(h.toStandby, seconds(next.Start-deleted))
		} else {
			h.toReplacement = append(h.toReplacement, seconds(next.Start-deleted))
		}
		h.gaps = append(h.gaps, seconds(next.Start-old.Stop))
		return nil
	})
	return h
}

// crashTimeout is the heartbeatTimeout of scenario (b).
const crashTimeout = 3 * time.Second

// crashingScript is activeScript whose app fails for good once the file
// /active/$APP.dead-<pod> exists: it exits 1 (its stop line is the failure)
// and, restarted, exits 1 at once, so that the container crash-loops.
const crashingScript = `log=/active/$APP.log; dead=/active/$APP.dead-$REDLOCK_POD_NAME
[ -e $dead ] && exit 1
read up rest < /proc/uptime; echo "start $up $REDLOCK_POD_NAME $REDLOCK_FENCING_TOKEN" >> $log
stop() { read up rest < /proc/uptime; echo "stop $up $REDLOCK_POD_NAME $REDLOCK_FENCING_TOKEN" >> $log; exit $1; }
trap 'stop 0' TERM
while :; do [ -e $dead ] && stop 1; sleep 0.1 & wait $!; done`

// crashActive makes the app that runs fail for good n times, each time
// once the Deployment has both replicas Ready again, and measures from its
// failure until another pod's app runs; then it deletes the failed pod
// (marked unresponsive, it would wait behind the others) for the
// Deployment to replace.
func crashActive(app string, d *appsv1.Deployment, n int) handovers {
	var h handovers
	h.errors = rounds(app+" round", n, func(int) error {
		var holder activePeriod
		if err := poll(3*time.Minute, 100*time.Millisecond, func() (err error) { holder, err = running(app, d); return err }); err != nil {
			return fmt.Errorf("not ready: %w", err)
		}
		dead := fmt.Sprintf("%s/%s.dead-%s", activeDir, app, holder.Pod)
		if err := os.WriteFile(dead, nil, 0o644); err != nil { //nolint:gosec // read by the apps, as other users
			return err
		}
		next, old, ok := nextRun(app, holder, 2*time.Minute)
		if ok {
			h.toRun = append(h.toRun, seconds(next.Start-old.Stop))
		}
		if err := k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holder.Pod}}); client.IgnoreNotFound(err) != nil {
			GinkgoWriter.Printf("%s: delete %s: %v\n", app, holder.Pod, err)
		}
		if !ok {
			return fmt.Errorf("no other pod's app ran within two minutes of %s failing", holder.Pod)
		}
		return nil
	})
	return h
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// nextRun polls app's report until another pod's app than holder's runs,
// for up to timeout: that period and holder's.
func nextRun(app string, holder activePeriod, timeout time.Duration) (next, old activePeriod, ok bool) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		periods := activePeriods(app)
		j := slices.IndexFunc(periods, func(p activePeriod) bool { return p.Pod == holder.Pod && p.Token == holder.Token })
		if last := periods[len(periods)-1]; j >= 0 && last.Pod != holder.Pod && periods[j].Stop != 0 {
			return last, periods[j], true
		}
	}
	return activePeriod{}, activePeriod{}, false
}

// quantile is the q-quantile of sorted d (nearest rank); 0 when empty.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(q*float64(len(d))+0.5) - 1
	return d[min(max(i, 0), len(d)-1)].Round(10 * time.Millisecond)
}

type rollouts struct {
	toNew, gaps, complete []time.Duration
	handovers, errors     int
}

// rolloutSteps changes the pod template of d (annotation e2e/revision) n
// times, each time once the previous rollout completed, and measures from
// the update until a pod of the new revision runs its app, the longest
// time no app ran meanwhile, and until the rollout completed: the
// Deployment Available with both replicas updated, the old pods gone and a
// new-revision pod's app running.
func rolloutSteps(app string, d *appsv1.Deployment, n int) rollouts {
	var r rollouts
	revisions := map[string]string{} // pod → its e2e/revision
	revision := func(pod string) (string, bool) {
		if rev, ok := revisions[pod]; ok {
			return rev, true
		}
		p := &corev1.Pod{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: pod}, p); err != nil {
			return "", false
		}
		revisions[pod] = p.Annotations["e2e/revision"]
		return revisions[pod], true
	}
	// complete is nil once the rollout to rev has completed.
	complete := func(rev string) error {
		cur := &appsv1.Deployment{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(d), cur); err != nil {
			return err
		}
		s := cur.Status
		if s.ObservedGeneration < cur.Generation || !meta.IsStatusConditionTrue(conditionsOf(cur), string(appsv1.DeploymentAvailable)) ||
			s.UpdatedReplicas != 2 || s.Replicas != 2 || s.AvailableReplicas != 2 {
			return fmt.Errorf("Deployment %s: generation %d observed %d, %d replicas, %d updated, %d available", app, cur.Generation, s.ObservedGeneration, s.Replicas, s.UpdatedReplicas, s.AvailableReplicas)
		}
		periods := activePeriods(app)
		if len(periods) == 0 || periods[len(periods)-1].Stop != 0 {
			return fmt.Errorf("no app of %s runs", app)
		}
		if got, _ := revision(periods[len(periods)-1].Pod); got != rev {
			return fmt.Errorf("the app of %s runs in pod %s of revision %q, not %q", app, periods[len(periods)-1].Pod, got, rev)
		}
		return nil
	}
	prev := ""
	r.errors = rounds(app+" rollout", n, func(i int) error {
		rev := strconv.Itoa(i + 2)
		if err := poll(3*time.Minute, 100*time.Millisecond, func() error { return complete(prev) }); err != nil {
			return fmt.Errorf("to revision %s: the previous one has not completed: %w", rev, err)
		}
		before := len(activePeriods(app))
		updated := uptimeNow()
		if err := setRevision(d, rev); err != nil {
			return fmt.Errorf("to revision %s: %w", rev, err)
		}
		prev = rev
		var firstNew float64
		err := poll(3*time.Minute, 50*time.Millisecond, func() error {
			if firstNew == 0 {
				for _, p := range activePeriods(app)[before:] {
					if got, _ := revision(p.Pod); got == rev {
						firstNew = p.Start
						break
					}
				}
				if firstNew == 0 {
					return fmt.Errorf("no pod of revision %s ran its app", rev)
				}
			}
			return complete(rev)
		})
		done := uptimeNow()
		periods := activePeriods(app)
		r.handovers += len(periods) - before
		if err != nil {
			return fmt.Errorf("to revision %s: not complete within 3 minutes: %w", rev, err)
		}
		var longest float64
		for k := before; k < len(periods); k++ {
			longest = max(longest, periods[k].Start-periods[k-1].Stop)
		}
		r.toNew = append(r.toNew, seconds(firstNew-updated))
		r.gaps = append(r.gaps, seconds(longest))
		r.complete = append(r.complete, seconds(done-updated))
		return nil
	})
	return r
}

// setRevision writes rev into d's pod template (a new revision), retrying
// conflicts for up to 30 s.
func setRevision(d *appsv1.Deployment, rev string) error {
	return poll(30*time.Second, 100*time.Millisecond, func() error {
		cur := &appsv1.Deployment{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(d), cur); err != nil {
			return err
		}
		if cur.Spec.Template.Annotations == nil {
			cur.Spec.Template.Annotations = map[string]string{}
		}
		cur.Spec.Template.Annotations["e2e/revision"] = rev
		if err := k8s.Update(ctx, cur); err != nil {
			return fmt.Errorf("updating the template of %s to revision %s: %w", d.Name, rev, err)
		}
		return nil
	})
}
