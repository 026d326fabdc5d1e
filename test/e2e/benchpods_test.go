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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The pod failover benchmark (make bench-failover-pods): the active pod of
// an active/passive Deployment whose app runs through the agent is deleted
// again and again, and the time until the next pod's app runs is taken from
// the apps' own reports (host uptime). It runs only when
// BENCH_FAILOVER_PODS names the number of handovers; make e2e skips it.
var _ = Describe("pod failover benchmark", Label("bench"), func() {
	It("measures the time from deleting the active pod until the next pod's app runs", func() {
		n, err := strconv.Atoi(os.Getenv("BENCH_FAILOVER_PODS"))
		if err != nil || n <= 0 {
			Skip("set BENCH_FAILOVER_PODS to the number of handovers (make bench-failover-pods)")
		}
		const app = "bench-failover"
		a := activePassive(app, false)
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: app},
			Spec: appsv1.DeploymentSpec{
				Replicas: new(int32(2)),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
				Template: agentTemplate(app, app, 23470),
			},
		}
		Expect(k8s.Create(ctx, d)).To(Succeed())
		removeAfterSpec(d)

		// ready waits until both replicas are Ready and one app runs, and
		// returns the pod whose app runs.
		ready := func() activePeriod {
			var running activePeriod
			Eventually(func(g Gomega) {
				cur := &appsv1.Deployment{}
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(d), cur)).To(Succeed())
				g.Expect(cur.Status.ReadyReplicas).To(Equal(int32(2)), "Deployment %s has a standby", app)
				g.Expect(cur.Status.Replicas).To(Equal(int32(2)))
				periods := activePeriods(app)
				g.Expect(periods).NotTo(BeEmpty())
				running = periods[len(periods)-1]
				g.Expect(running.Stop).To(BeZero(), "an app of %s runs", app)
			}, 2*time.Minute, 100*time.Millisecond).Should(Succeed())
			return running
		}
		var toRun, gaps []time.Duration
		errors := 0
		for i := range n {
			holder := ready()
			deleted := uptimeNow()
			err := k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holder.Pod}})
			if err != nil {
				errors++
				GinkgoWriter.Printf("handover %d: delete %s: %v\n", i, holder.Pod, err)
				continue
			}
			// Polled by hand, not with Eventually: a handover that does not
			// come is counted, and the benchmark goes on.
			next, old, ok := nextRun(app, holder, time.Minute)
			if !ok {
				errors++
				GinkgoWriter.Printf("handover %d: no other pod's app ran within a minute of deleting %s\n", i, holder.Pod)
				continue
			}
			toRun = append(toRun, time.Duration((next.Start-deleted)*float64(time.Second)))
			gaps = append(gaps, time.Duration((next.Start-old.Stop)*float64(time.Second)))
		}
		_, violations := a.seen()
		Expect(violations).To(BeEmpty())
		Expect(overlaps(activePeriods(app))).To(BeEmpty(), "two apps active at once")

		GinkgoWriter.Printf("\npod failover through the agent, active pod deleted (Deployment of 2, ttl %v, grace 100ms, skew 100ms), %d handovers, %d errors:\n\n", ttl, len(toRun), errors)
		GinkgoWriter.Printf("| measured | p50 | p99 | max |\n|---|---:|---:|---:|\n")
		for _, row := range []struct {
			what string
			d    []time.Duration
		}{
			{"delete request → next pod's app runs", toRun},
			{"old app stopped → next pod's app runs (no app active)", gaps},
		} {
			slices.Sort(row.d)
			GinkgoWriter.Printf("| %s | %v | %v | %v |\n", row.what, quantile(row.d, 0.5), quantile(row.d, 0.99), quantile(row.d, 1))
		}
		fmt.Fprintln(GinkgoWriter)
	})
})

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
