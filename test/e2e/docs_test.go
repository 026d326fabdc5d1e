//go:build e2e

package e2e

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// The task pages for Jobs, Deployments and StatefulSets are run here as a
// reader would run them: their example objects are read from the pages
// themselves (every ```yaml block), so that a page cannot drift from what
// works on a real cluster. What this cluster needs is changed, and only
// that (docObjects):
//
//   - every object goes into the suite's namespace;
//   - a DistributedLock names the suite's RedisMasterSet "masters" (a
//     managed set of five with maxLockTTL 4s), takes the suite's ttl (4s)
//     and a key of its own;
//   - containers run the imported busybox:local image, never pulled;
//   - pods whose app the in-pod agent runs go on the host network with the
//     API server's loopback address (pods here have no network to reach
//     it), with an agent grace and skew allowance that fit a tenth of the
//     4s ttl; the Services selecting them are left out, since the API
//     server refuses a loopback endpoint.

// docObjects reads the example objects of page (relative to the
// repository) and fits them to this cluster.
func docObjects(page string) []*unstructured.Unstructured {
	data, err := os.ReadFile(filepath.Join(root, page)) //nolint:gosec // a page of this repository
	Expect(err).NotTo(HaveOccurred())
	var objs []*unstructured.Unstructured
	for _, block := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(data, -1) {
		objs = append(objs, decodeObjects(block[1])...)
	}
	Expect(objs).NotTo(BeEmpty(), "example objects in %s", page)

	var out []*unstructured.Unstructured
	agentApps := map[string]bool{} // app label values of pods the agent runs
	for _, u := range objs {
		u.SetNamespace(ns)
		switch u.GetKind() {
		case "DistributedLock", "DistributedSemaphore":
			Expect(unstructured.SetNestedField(u.Object, "masters", "spec", "masterSet")).To(Succeed())
			Expect(unstructured.SetNestedField(u.Object, ttl.String(), "spec", "ttl")).To(Succeed())
			Expect(unstructured.SetNestedField(u.Object, "e2e/docs/"+u.GetName(), "spec", "key")).To(Succeed())
			unstructured.RemoveNestedField(u.Object, "spec", "renewInterval")
		case "Job", "Deployment", "StatefulSet":
			if app, ok := fitTemplate(u); ok {
				agentApps[app] = true
			}
		}
		out = append(out, u)
	}
	var kept []*unstructured.Unstructured
	for _, u := range out {
		if u.GetKind() == "Service" {
			sel, _, _ := unstructured.NestedStringMap(u.Object, "spec", "selector")
			if agentApps[sel["app"]] {
				continue
			}
		}
		kept = append(kept, u)
	}
	return kept
}

// fitTemplate fits the pod template of workload u to this cluster; it
// says whether the agent runs its app, and the pods' app label.
func fitTemplate(u *unstructured.Unstructured) (app string, agent bool) {
	tpl, found, err := unstructured.NestedMap(u.Object, "spec", "template")
	Expect(err).NotTo(HaveOccurred())
	Expect(found).To(BeTrue(), "%s %s has a pod template", u.GetKind(), u.GetName())
	pod := &corev1.PodTemplateSpec{}
	Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(tpl, pod)).To(Succeed())
	for i := range pod.Spec.Containers {
		pod.Spec.Containers[i].Image = "busybox:local"
		pod.Spec.Containers[i].ImagePullPolicy = corev1.PullNever
	}
	if pod.Annotations[v1alpha1.AgentAnnotation] == v1alpha1.AgentRun {
		agent = true
		pod.Annotations[v1alpha1.AgentGraceAnnotation] = "100ms"
		pod.Annotations[v1alpha1.AgentSkewAllowanceAnnotation] = "100ms"
		pod.Spec.HostNetwork = true
		pod.Spec.DNSPolicy = corev1.DNSClusterFirstWithHostNet
		for i := range pod.Spec.Containers {
			pod.Spec.Containers[i].Env = append(pod.Spec.Containers[i].Env,
				corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"}, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: apiPort()})
		}
	}
	fitted, err := runtime.DefaultUnstructuredConverter.ToUnstructured(pod)
	Expect(err).NotTo(HaveOccurred())
	Expect(unstructured.SetNestedMap(u.Object, fitted, "spec", "template")).To(Succeed())
	return pod.Labels["app"], agent
}

// createDocObjects creates objs and deletes them, with their pods, when the
// spec ends.
func createDocObjects(objs []*unstructured.Unstructured) {
	for _, u := range objs {
		Expect(k8s.Create(ctx, u)).To(Succeed(), "%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
		DeferCleanup(func() {
			err := k8s.Delete(ctx, u, client.PropagationPolicy("Background"))
			if err != nil && !apierrors.IsNotFound(err) {
				Expect(err).NotTo(HaveOccurred())
			}
		})
	}
}

// waitForJobs waits until every Job of jobs (from page) has completed.
func waitForJobs(page string, jobs []*unstructured.Unstructured) {
	for _, u := range jobs {
		Eventually(func(g Gomega) {
			job := &batchv1.Job{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: u.GetName()}, job)).To(Succeed(), "Job %s/%s", ns, u.GetName())
			completions := int32(1)
			if job.Spec.Completions != nil {
				completions = *job.Spec.Completions
			}
			g.Expect(job.Status.Succeeded).To(Equal(completions), "succeeded pods of Job %s", job.Name)
		}, 4*time.Minute, time.Second).Should(Succeed(), "Job %s/%s of %s to complete", ns, u.GetName(), page)
	}
}

// finishedRuns are the runs, from their status and annotations, of the
// pods in ns matching labels: every one must have finished its container.
func finishedRuns(labels client.MatchingLabels) []lockRun {
	var pods corev1.PodList
	Expect(k8s.List(ctx, &pods, client.InNamespace(ns), labels)).To(Succeed())
	Expect(pods.Items).NotTo(BeEmpty(), "pods labelled %v", labels)
	runs := make([]lockRun, 0, len(pods.Items))
	for _, p := range pods.Items {
		Expect(p.Status.ContainerStatuses).To(HaveLen(1), "pod %s ran its container", p.Name)
		term := p.Status.ContainerStatuses[0].State.Terminated
		Expect(term).NotTo(BeNil(), "pod %s finished", p.Name)
		token, err := strconv.ParseInt(p.Annotations[v1alpha1.FencingTokenAnnotation], 10, 64)
		Expect(err).NotTo(HaveOccurred(), "pod %s's fencing token", p.Name)
		runs = append(runs, lockRun{name: p.Name, start: term.StartedAt.Time, finish: term.FinishedAt.Time, token: token, key: p.Annotations[v1alpha1.LockKeyAnnotation]})
	}
	return runs
}

// ofKind are the objects of objs of kind.
func ofKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() == kind {
			out = append(out, u)
		}
	}
	return out
}

// lockOf is the lock a workload's pod template asks for.
func lockOf(u *unstructured.Unstructured) string {
	lock, _, _ := unstructured.NestedString(u.Object, "spec", "template", "metadata", "labels", v1alpha1.LockLabel)
	Expect(lock).NotTo(BeEmpty(), "%s %s: its pods are labelled %s", u.GetKind(), u.GetName(), v1alpha1.LockLabel)
	return lock
}

var _ = Describe("the task pages of the docs, run on a real cluster", Ordered, func() {
	It("are fitted to this cluster as the getting-started section the pages link to tells a reader", func() {
		data, err := os.ReadFile(filepath.Join(root, "docs", "getting-started.md"))
		Expect(err).NotTo(HaveOccurred())
		page := string(data)
		start := strings.Index(page, "### Run the task pages on the demo cluster")
		Expect(start).To(BeNumerically(">=", 0), "docs/getting-started.md has the section")
		section := page[start:]
		section = section[:strings.Index(section[1:], "\n#")+1]
		// What docObjects and fitTemplate change, said with this cluster's
		// own values.
		for _, change := range []string{"`busybox:local`", "`imagePullPolicy: Never`", "`hostNetwork: true`", "`dnsPolicy: ClusterFirstWithHostNet`",
			"`KUBERNETES_SERVICE_HOST=127.0.0.1`", "`KUBERNETES_SERVICE_PORT=" + apiPort() + "`", "image: redis:7-local", "hostNetwork: true"} {
			Expect(section).To(ContainSubstring(change), "the section of docs/getting-started.md says %s", change)
		}
	})

	It("runs docs/tasks/jobs.md: every Job completes, the pods of each lock one after another with rising tokens", func() {
		objs := docObjects("docs/tasks/jobs.md")
		jobs := ofKind(objs, "Job")
		Expect(jobs).NotTo(BeEmpty())
		createDocObjects(objs)

		By("waiting for every Job of the page to complete")
		locks := map[string]bool{}
		for _, u := range jobs {
			locks[lockOf(u)] = true
		}
		waitForJobs("docs/tasks/jobs.md", jobs)

		By("checking from the pods' status that the pods of each lock ran one after another, each with a larger token")
		for lock := range locks {
			runs := finishedRuns(client.MatchingLabels{v1alpha1.LockLabel: lock})
			GinkgoWriter.Printf("lock %s: %d pods ran\n", lock, len(runs))
			expectOneAfterAnother(runs)
		}
	})

	It("runs docs/tasks/semaphores.md: every Job completes, never more than the semaphore's slots at once, each slot's pods one after another with rising tokens", func() {
		const page = "docs/tasks/semaphores.md"
		objs := docObjects(page)
		jobs := ofKind(objs, "Job")
		sems := ofKind(objs, "DistributedSemaphore")
		Expect(sems).To(HaveLen(1), "%s has one DistributedSemaphore", page)
		Expect(len(jobs)).To(BeNumerically(">=", 3), "%s has more Jobs than slots", page)
		sem := &v1alpha1.DistributedSemaphore{}
		Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(sems[0].Object, sem)).To(Succeed())
		slots := int(sem.Spec.Slots)
		Expect(slots).To(Equal(2), "%s's semaphore has 2 slots", page)
		createDocObjects(objs)

		By("waiting for every Job of the page to complete")
		waitForJobs(page, jobs)

		By("checking from the pods' status that at most 2 ran at once, and each slot's pods one after another with rising tokens")
		runs := finishedRuns(client.MatchingLabels{v1alpha1.SemaphoreLabel: sem.Name})
		Expect(runs).To(HaveLen(len(jobs)), "one pod per Job of %s", page)
		most := 0
		for _, r := range runs {
			at := 0 // runs going on when r started: [start, finish)
			for _, o := range runs {
				if !o.start.After(r.start) && r.start.Before(o.finish) {
					at++
				}
			}
			most = max(most, at)
		}
		GinkgoWriter.Printf("semaphore %s: %d pods ran, at most %d at once\n", sem.Name, len(runs), most)
		Expect(most).To(BeNumerically("<=", slots), "pods of semaphore %s running at once", sem.Name)
		bySlot := map[string][]lockRun{}
		for _, r := range runs {
			bySlot[r.key] = append(bySlot[r.key], r)
		}
		Expect(len(bySlot)).To(BeNumerically("<=", slots), "slot keys the pods held: %v", slices.Collect(maps.Keys(bySlot)))
		for key, rs := range bySlot {
			Expect(key).To(MatchRegexp(`:slot:[0-9]+$`), "pods' %s is a slot's key", v1alpha1.LockKeyAnnotation)
			expectOneAfterAnother(rs)
		}
	})

	It("runs docs/tasks/wait-limits.md: a Job whose pod waited past the limit fails through its podFailurePolicy; with Keep the pod waits on and completes", func() {
		const page = "docs/tasks/wait-limits.md"
		objs := docObjects(page)
		locks, jobs := ofKind(objs, "DistributedLock"), ofKind(objs, "Job")
		Expect(locks).To(HaveLen(1), "%s has one DistributedLock", page)
		Expect(jobs).To(HaveLen(1), "%s has one Job", page)
		policy, _, _ := unstructured.NestedString(locks[0].Object, "spec", "onWaitTimeout")
		Expect(policy).To(Equal("Fail"), "the page's lock fails pods that waited too long")
		// The lock is held by someone else, and the limit fits a test.
		fit := func(u *unstructured.Unstructured, name, onWaitTimeout string) *unstructured.Unstructured {
			c := u.DeepCopy()
			c.SetName(name)
			switch c.GetKind() {
			case "DistributedLock":
				Expect(unstructured.SetNestedField(c.Object, "e2e/docs/"+name, "spec", "key")).To(Succeed())
				Expect(unstructured.SetNestedField(c.Object, "maintenance-window", "spec", "holderIdentity")).To(Succeed())
				Expect(unstructured.SetNestedField(c.Object, "10s", "spec", "waitTimeout")).To(Succeed())
				Expect(unstructured.SetNestedField(c.Object, onWaitTimeout, "spec", "onWaitTimeout")).To(Succeed())
			case "Job":
				Expect(unstructured.SetNestedField(c.Object, name, "spec", "template", "metadata", "labels", v1alpha1.LockLabel)).To(Succeed())
			}
			return c
		}
		failing := []*unstructured.Unstructured{fit(locks[0], "wait-fail", "Fail"), fit(jobs[0], "wait-fail", "")}
		keeping := []*unstructured.Unstructured{fit(locks[0], "wait-keep", "Keep"), fit(jobs[0], "wait-keep", "")}
		createDocObjects(append(failing, keeping...))

		podOf := func(g Gomega, job string) *corev1.Pod {
			var pods corev1.PodList
			g.Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"batch.kubernetes.io/job-name": job})).To(Succeed())
			g.Expect(pods.Items).To(HaveLen(1), "pods of Job %s", job)
			return &pods.Items[0]
		}
		waitCondition := func(p *corev1.Pod) *corev1.PodCondition {
			for i := range p.Status.Conditions {
				if string(p.Status.Conditions[i].Type) == v1alpha1.ConditionLockWaitTimeout {
					return &p.Status.Conditions[i]
				}
			}
			return nil
		}

		By("failing the Job whose pod waited past 10s, through its podFailurePolicy")
		Eventually(func(g Gomega) {
			job := &batchv1.Job{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "wait-fail"}, job)).To(Succeed())
			var failed *batchv1.JobCondition
			for i := range job.Status.Conditions {
				if job.Status.Conditions[i].Type == batchv1.JobFailed && job.Status.Conditions[i].Status == corev1.ConditionTrue {
					failed = &job.Status.Conditions[i]
				}
			}
			g.Expect(failed).NotTo(BeNil(), "Job wait-fail's Failed condition")
			g.Expect(failed.Reason).To(Equal(batchv1.JobReasonPodFailurePolicy), "reason of Job wait-fail's failure")
			p := podOf(g, "wait-fail")
			g.Expect(p.Status.Phase).To(Equal(corev1.PodFailed), "phase of pod %s", p.Name)
			c := waitCondition(p)
			g.Expect(c).NotTo(BeNil(), "condition %s of pod %s", v1alpha1.ConditionLockWaitTimeout, p.Name)
			g.Expect(c.Status).To(Equal(corev1.ConditionTrue))
			g.Expect(p.Spec.NodeName).To(BeEmpty(), "pod %s never ran", p.Name)
		}, 2*time.Minute, time.Second).Should(Succeed(), "Job %s/wait-fail to fail with reason PodFailurePolicy", ns)

		By("leaving the pod of the Keep lock waiting with the condition, then completing it once the lock is free")
		Eventually(func(g Gomega) {
			p := podOf(g, "wait-keep")
			c := waitCondition(p)
			g.Expect(c).NotTo(BeNil(), "condition %s of pod %s", v1alpha1.ConditionLockWaitTimeout, p.Name)
			g.Expect(c.Status).To(Equal(corev1.ConditionTrue))
			g.Expect(p.Status.Phase).To(Equal(corev1.PodPending), "pod %s keeps waiting", p.Name)
		}, time.Minute, time.Second).Should(Succeed(), "pod of Job %s/wait-keep to be told it waited past its limit", ns)
		Eventually(func() error {
			l := &v1alpha1.DistributedLock{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "wait-keep"}, l); err != nil {
				return err
			}
			l.Spec.HolderIdentity = ""
			return k8s.Update(ctx, l)
		}, 30*time.Second, time.Second).Should(Succeed(), "lock %s/wait-keep to drop its static holder", ns)
		waitForJobs(page, keeping[1:])
		Eventually(func(g Gomega) {
			c := waitCondition(podOf(g, "wait-keep"))
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(corev1.ConditionFalse), "condition %s once granted", v1alpha1.ConditionLockWaitTimeout)
		}, 30*time.Second, time.Second).Should(Succeed(), "pod of Job %s/wait-keep to show it was granted after its limit", ns)
	})

	for _, page := range []string{"docs/tasks/deployments.md", "docs/tasks/statefulsets.md"} {
		It("runs "+page+": every pod Ready, exactly one marked as the holder, never two", func() {
			objs := docObjects(page)
			workloads := append(ofKind(objs, "Deployment"), ofKind(objs, "StatefulSet")...)
			Expect(workloads).NotTo(BeEmpty())
			watched := map[string]*activity{}
			for _, u := range workloads {
				app, _, _ := unstructured.NestedString(u.Object, "spec", "template", "metadata", "labels", "app")
				Expect(app).NotTo(BeEmpty(), "%s %s: its pods are labelled app", u.GetKind(), u.GetName())
				watched[u.GetName()] = watchActivity(app, lockOf(u), app)
			}
			createDocObjects(objs)

			for _, u := range workloads {
				a, lock := watched[u.GetName()], lockOf(u)
				replicas, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas")
				By("waiting for " + u.GetKind() + " " + u.GetName() + ": every pod Ready, one marked holding " + lock)
				Eventually(func(g Gomega) {
					var ready int32
					switch u.GetKind() {
					case "Deployment":
						d := &appsv1.Deployment{}
						g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: u.GetName()}, d)).To(Succeed())
						ready = d.Status.ReadyReplicas
					default:
						s := &appsv1.StatefulSet{}
						g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: u.GetName()}, s)).To(Succeed())
						ready = s.Status.ReadyReplicas
					}
					g.Expect(ready).To(BeEquivalentTo(replicas), "ready replicas of %s %s: passive pods are Ready too", u.GetKind(), u.GetName())
					holder := a.holder()
					g.Expect(holder).NotTo(BeEmpty(), "exactly one pod of %s marked %s=%s", u.GetName(), v1alpha1.HoldsLabel, lock)
					l := &v1alpha1.DistributedLock{}
					g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, l)).To(Succeed(), "lock %s/%s", ns, lock)
					g.Expect(l.Status.Holder).NotTo(BeNil(), "holder of lock %s", lock)
					g.Expect(l.Status.Holder.Pod).NotTo(BeNil(), "holder pod of lock %s", lock)
					g.Expect(l.Status.Holder.Pod.Name).To(Equal(holder), "the marked pod holds lock %s", lock)
				}, 3*time.Minute, 200*time.Millisecond).Should(Succeed(), "%s %s/%s of %s: every pod Ready, the holder of lock %s marked", u.GetKind(), ns, u.GetName(), page, lock)
				Consistently(a.holder, 5*time.Second, 200*time.Millisecond).ShouldNot(BeEmpty(), "exactly one pod of %s/%s to stay marked holding %s", ns, u.GetName(), lock)
				_, violations := a.seen()
				Expect(violations).To(BeEmpty(), "%s %s: never two pods marked, never two ready endpoints", u.GetKind(), u.GetName())
			}
		})
	}
})
