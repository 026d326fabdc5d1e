//go:build e2e

package e2e

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

// lockRun is one container run of a pod that held a lock, as the kubelet
// reported it, and the token it printed.
type lockRun struct {
	name          string
	start, finish time.Time
	token         int64
	key           string // the Redis key held, where known
}

// runOf is the finished run of a demo.Workload pod.
func runOf(p *corev1.Pod) lockRun {
	token, err := demo.PrintedToken(p)
	Expect(err).NotTo(HaveOccurred())
	term := p.Status.ContainerStatuses[0].State.Terminated
	return lockRun{name: p.Name, start: term.StartedAt.Time, finish: term.FinishedAt.Time, token: token}
}

// lockJob is a Job of one pod, labelled for lock (the webhook adds the
// gate), that prints its fencing token (demo.PrintedToken reads it) and
// runs script.
func lockJob(name, lock, script string) *batchv1.Job {
	spec := demo.Workload(script)
	spec.RestartPolicy = corev1.RestartPolicyNever
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: new(int32(0)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1alpha1.LockLabel: lock}},
				Spec:       spec,
			},
		},
	}
}

// waitJobsSucceeded waits until each of the Jobs named succeeded once.
func waitJobsSucceeded(names ...string) {
	Eventually(func(g Gomega) {
		for _, name := range names {
			job := &batchv1.Job{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, job)).To(Succeed(), "Job %s/%s", ns, name)
			g.Expect(job.Status.Succeeded).To(BeEquivalentTo(1), "job %s", job.Name)
		}
	}, 3*time.Minute, time.Second).Should(Succeed(), "Jobs %v in %s to succeed once each", names, ns)
}

// expectOneAfterAnother checks that runs never overlapped and that each
// later one had a larger token.
func expectOneAfterAnother(runs []lockRun) {
	// Whole-second times can tie: a run that started and ended within the
	// second another started goes first.
	slices.SortFunc(runs, func(a, b lockRun) int { return cmp.Or(a.start.Compare(b.start), a.finish.Compare(b.finish)) })
	for i := 1; i < len(runs); i++ {
		prev, r := runs[i-1], runs[i]
		Expect(r.start).NotTo(BeTemporally("<", prev.finish), "%s started before %s finished", r.name, prev.name)
		Expect(r.token).To(BeNumerically(">", prev.token), "%s's token after %s's", r.name, prev.name)
	}
}

func podLock(name, key string) *v1alpha1.DistributedLock {
	return &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.DistributedLockSpec{MasterSet: "masters", Key: key, TTL: metav1.Duration{Duration: ttl}},
	}
}

// sampler polls f every 100ms until the spec ends and keeps what it
// reports.
func sampler(f func() []string) func() []string {
	var mu sync.Mutex
	var seen []string
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if got := f(); len(got) > 0 {
				mu.Lock()
				seen = append(seen, got...)
				mu.Unlock()
			}
		}
	}()
	DeferCleanup(func() { close(stop); <-done })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

var _ = Describe("pods gated on locks", Ordered, func() {
	It("runs three Jobs gated on one lock strictly one after another, each with the token of its grant", func() {
		Expect(k8s.Create(ctx, podLock("steps", "e2e/steps"))).To(Succeed())
		holders := map[string][]int64{} // holder pod → the tokens status showed it holding
		var holdersMu sync.Mutex
		violations := sampler(func() []string {
			var pods corev1.PodList
			if k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LockLabel: "steps"}) != nil {
				return nil
			}
			var bad, running []string
			for _, p := range pods.Items {
				switch {
				case demo.Gated(&p) && p.Spec.NodeName != "":
					bad = append(bad, p.Name+" was scheduled while gated")
				case demo.MayRun(&p):
					running = append(running, p.Name)
				}
			}
			if len(running) > 1 {
				bad = append(bad, fmt.Sprintf("%v may run at once", running))
			}
			l := &v1alpha1.DistributedLock{}
			if k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "steps"}, l) == nil && l.Status.Holder != nil && l.Status.Holder.Pod != nil {
				holdersMu.Lock()
				if ts := holders[l.Status.Holder.Pod.Name]; len(ts) == 0 || ts[len(ts)-1] != l.Status.FencingToken {
					holders[l.Status.Holder.Pod.Name] = append(ts, l.Status.FencingToken)
				}
				holdersMu.Unlock()
			}
			return bad
		})
		// Created last first: the first pod the operator sees is then often
		// not the first in line (same-second creation times go by name),
		// and the holder must keep its grant while its gate is lifted.
		for i := 3; i >= 1; i-- {
			Expect(k8s.Create(ctx, lockJob(fmt.Sprintf("step-%d", i), "steps", "sleep 2"))).To(Succeed())
		}

		By("waiting for the three Jobs to complete")
		waitJobsSucceeded("step-1", "step-2", "step-3")
		Expect(violations()).To(BeEmpty())

		By("checking from the pods' status that their containers ran one after another")
		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LockLabel: "steps"})).To(Succeed())
		Expect(pods.Items).To(HaveLen(3))
		var runs []lockRun
		for _, p := range pods.Items {
			runs = append(runs, runOf(&p))
			if printed := strconv.FormatInt(runs[len(runs)-1].token, 10); printed != p.Annotations[v1alpha1.FencingTokenAnnotation] {
				// A second grant to the same pod: its first was lost. Say
				// what status showed and why the lock says it was lost.
				holdersMu.Lock()
				shown := holders[p.Name]
				holdersMu.Unlock()
				events, _ := exec.Command(os.Getenv("KUBECTL"), "get", "events", "-n", ns, "--field-selector", "involvedObject.name=steps",
					"-o", "custom-columns=REASON:.reason,MESSAGE:.message", "--no-headers").CombinedOutput()
				Fail(fmt.Sprintf("pod %s printed token %s, but its annotation is %s (status showed it holding %v); the lock's events: %s",
					p.Name, printed, p.Annotations[v1alpha1.FencingTokenAnnotation], shown, strings.Join(strings.Fields(string(events)), " ")))
			}
		}
		holdersMu.Lock()
		defer holdersMu.Unlock()
		for _, r := range runs {
			Expect(holders[r.name]).To(ContainElement(r.token), "the lock's status never showed %s holding with the token it printed", r.name)
		}
		expectOneAfterAnother(runs)
	})

	It("runs the Jobs made by hand from a CronJob (kubectl create job --from=cronjob/...) one at a time, which concurrencyPolicy: Forbid does not see", func() {
		l := podLock("report", "e2e/report")
		Expect(k8s.Create(ctx, l)).To(Succeed())
		removeAfterSpec(l)
		spec := demo.Workload("sleep 2")
		spec.RestartPolicy = corev1.RestartPolicyNever
		cron := &batchv1.CronJob{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report"},
			Spec: batchv1.CronJobSpec{
				Schedule: "0 2 * * *", Suspend: new(true), ConcurrencyPolicy: batchv1.ForbidConcurrent,
				JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
					BackoffLimit: new(int32(0)),
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1alpha1.LockLabel: "report"}},
						Spec:       spec,
					},
				}},
			},
		}
		Expect(k8s.Create(ctx, cron)).To(Succeed())
		removeAfterSpec(cron)

		By("running kubectl create job --from=cronjob/report three times at once")
		for i := 1; i <= 3; i++ {
			name := fmt.Sprintf("report-by-hand-%d", i)
			out, err := exec.Command(os.Getenv("KUBECTL"), "create", "job", name, "--from=cronjob/report", "-n", ns).CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), "kubectl create job %s: %s", name, out)
			removeAfterSpec(&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
		}

		By("waiting for the three Jobs to complete, then checking from the pods' status that they ran one after another")
		waitJobsSucceeded("report-by-hand-1", "report-by-hand-2", "report-by-hand-3")
		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LockLabel: "report"})).To(Succeed())
		Expect(pods.Items).To(HaveLen(3))
		runs := make([]lockRun, 0, len(pods.Items))
		for _, p := range pods.Items {
			r := runOf(&p)
			Expect(strconv.FormatInt(r.token, 10)).To(Equal(p.Annotations[v1alpha1.FencingTokenAnnotation]), "pod %s printed the token of its grant", p.Name)
			runs = append(runs, r)
		}
		expectOneAfterAnother(runs)
	})

	It("keeps exactly one pod of a two-replica Deployment Ready, and moves readiness when that pod is deleted", func() {
		Expect(k8s.Create(ctx, podLock("active", "e2e/active"))).To(Succeed())
		labels := map[string]string{"app": "active", v1alpha1.LockLabel: "active", v1alpha1.GateModeLabel: v1alpha1.GateModeReadiness}
		Expect(k8s.Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "active"},
			Spec: appsv1.DeploymentSpec{
				Replicas: new(int32(2)),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "active"}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec:       demo.Workload(`trap "exit 0" TERM; while true; do sleep 1; done`),
				},
			},
		})).To(Succeed())
		ready := func() []corev1.Pod {
			var pods corev1.PodList
			Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "active"})).To(Succeed())
			return slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return !demo.Ready(&p) })
		}
		violations := sampler(func() []string {
			if r := ready(); len(r) > 1 {
				return []string{fmt.Sprintf("%d pods Ready at once", len(r))}
			}
			return nil
		})
		expectOneReadyHolder := func() string {
			var name string
			Eventually(func(g Gomega) {
				r := ready()
				g.Expect(r).To(HaveLen(1), "Ready pods of app active")
				l := get(podLock("active", ""))
				g.Expect(l.Status.Holder).NotTo(BeNil(), "holder of lock active")
				g.Expect(l.Status.Holder.Pod).NotTo(BeNil(), "holder pod of lock active")
				g.Expect(l.Status.Holder.Pod.UID).To(Equal(r[0].UID), "the Ready pod is not the holder")
				name = r[0].Name
			}, 2*time.Minute, 200*time.Millisecond).Should(Succeed(), "exactly one pod of app active in %s to be Ready, the holder of lock active", ns)
			return name
		}
		first := expectOneReadyHolder()
		Consistently(func() int { return len(ready()) }, 3*time.Second, 200*time.Millisecond).Should(Equal(1), "exactly one pod of app active in %s to stay Ready", ns)

		By("deleting the Ready pod: readiness moves to another pod")
		Expect(k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: first}})).To(Succeed())
		Eventually(func(g Gomega) {
			r := ready()
			g.Expect(r).To(HaveLen(1), "Ready pods of app active")
			g.Expect(r[0].Name).NotTo(Equal(first))
		}, 2*time.Minute, 200*time.Millisecond).Should(Succeed(), "readiness to move from deleted pod %s/%s to another pod of app active", ns, first)
		expectOneReadyHolder()
		Expect(violations()).To(BeEmpty())
	})
})
