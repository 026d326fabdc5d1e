//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

// activity follows, through watches (every committed version, in order),
// the pods of one app and the EndpointSlices of its Service: which pods
// carry the holder mark of a lock, in what order, and any moment at which
// two were marked or the Service had two ready endpoints.
type activity struct {
	mu         sync.Mutex
	marked     map[string]bool
	marks      []string // pods in the order they were marked
	ready      map[string]int
	violations []string
}

func watchActivity(app, lock, service string) *activity {
	a := &activity{marked: map[string]bool{}, ready: map[string]int{}}
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	Expect(err).NotTo(HaveOccurred())
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: k8s.Scheme()})
	Expect(err).NotTo(HaveOccurred())
	pods, err := wc.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns), client.MatchingLabels{"app": app})
	Expect(err).NotTo(HaveOccurred())
	endpoints, err := wc.Watch(ctx, &discoveryv1.EndpointSliceList{}, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: service})
	Expect(err).NotTo(HaveOccurred())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for ev := range pods.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			a.mu.Lock()
			on := ev.Type != watch.Deleted && p.Labels[v1alpha1.HoldsLabel] == lock
			if on && !a.marked[p.Name] {
				a.marks = append(a.marks, p.Name)
			}
			a.marked[p.Name] = on
			if n := count(a.marked); n > 1 {
				a.violations = append(a.violations, fmt.Sprintf("%d pods marked at once (pod resourceVersion %s)", n, p.ResourceVersion))
			}
			a.mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		for ev := range endpoints.ResultChan() {
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok {
				continue
			}
			a.mu.Lock()
			a.ready[s.Name] = 0
			if ev.Type != watch.Deleted {
				for _, e := range s.Endpoints {
					if e.Conditions.Ready != nil && *e.Conditions.Ready {
						a.ready[s.Name]++
					}
				}
			}
			total := 0
			for _, n := range a.ready {
				total += n
			}
			if total > 1 {
				a.violations = append(a.violations, fmt.Sprintf("Service %s had %d ready endpoints (EndpointSlice %s, resourceVersion %s)", service, total, s.Name, s.ResourceVersion))
			}
			a.mu.Unlock()
		}
	}()
	DeferCleanup(func() { pods.Stop(); endpoints.Stop(); wg.Wait() })
	return a
}

func count(m map[string]bool) int {
	n := 0
	for _, on := range m {
		if on {
			n++
		}
	}
	return n
}

// seen returns the pods marked so far, in order, and the violations.
func (a *activity) seen() (marks, violations []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.marks), slices.Clone(a.violations)
}

// holder is the pod marked now, when exactly one is.
func (a *activity) holder() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name, on := range a.marked {
		if on && count(a.marked) == 1 {
			return name
		}
	}
	return ""
}

// readyEndpoints is how many ready endpoints the Service has now.
func (a *activity) readyEndpoints() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	total := 0
	for _, n := range a.ready {
		total += n
	}
	return total
}

// activeService selects the pod of app marked as holding lock.
func activeService(name, app, lock string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": app, v1alpha1.HoldsLabel: lock},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

// holderLabelTemplate is a pod template of app in holder-label mode: no
// gate, Ready on its own health (no probe: once its container runs).
func holderLabelTemplate(app, lock string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app, v1alpha1.LockLabel: lock, v1alpha1.GateModeLabel: v1alpha1.GateModeHolderLabel}},
		Spec:       demo.Workload(`trap "exit 0" TERM; while true; do sleep 1; done`),
	}
}

// changeTemplate makes a new revision of a workload's pod template.
func changeTemplate(obj client.Object, template *corev1.PodTemplateSpec, revision string) {
	Eventually(func() error {
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
		if template.Annotations == nil {
			template.Annotations = map[string]string{}
		}
		template.Annotations["e2e/revision"] = revision
		return k8s.Update(ctx, obj)
	}).Should(Succeed(), "new revision %s of %s", revision, obj.GetName())
}

// activePassive creates the lock app and (service) the Service app that
// selects its holder among the pods labelled app=app, and watches them.
func activePassive(app string, service bool) *activity {
	resetActive(app)
	l := podLock(app, "e2e/"+app)
	Expect(k8s.Create(ctx, l)).To(Succeed())
	removeAfterSpec(l)
	if service {
		svc := activeService(app, app, app)
		Expect(k8s.Create(ctx, svc)).To(Succeed())
		removeAfterSpec(svc)
	}
	return watchActivity(app, app, app)
}

// waitRollout waits until `kubectl rollout status` returns for workload
// (kind/name), then until complete holds, and prints how long it took.
func waitRollout(what, workload string, complete func(g Gomega)) {
	By("waiting for " + what + " to complete: kubectl rollout status returns, then every pod is of the new revision and Ready")
	start := time.Now()
	out, err := exec.Command(os.Getenv("KUBECTL"), "rollout", "status", workload, "-n", ns, "--timeout=3m").CombinedOutput() //nolint:gosec // the suite's kubectl, on the suite's own workloads
	Expect(err).NotTo(HaveOccurred(), "kubectl rollout status %s: %s", workload, out)
	Eventually(complete, time.Minute, 200*time.Millisecond).Should(Succeed(), "%s to complete: every pod of the new revision and Ready", workload)
	GinkgoWriter.Printf("%s complete %v after it started waiting\n", what, time.Since(start).Round(time.Millisecond))
}

// apVariant is one way of running the active/passive specs: plain pods
// with a network of their own, whose Service endpoints are checked, or
// pods whose app the in-pod agent starts, on the host network (their only
// way to the API server here), whose reported active periods are checked
// instead: the node's address is loopback here (--node-ip 127.0.0.1), and
// the API server refuses a loopback endpoint, so no Service is made.
type apVariant struct {
	suffix   string
	template func(app string) corev1.PodTemplateSpec
	agent    bool
}

var apVariants = []apVariant{
	{"", func(app string) corev1.PodTemplateSpec { return holderLabelTemplate(app, app) }, false},
	{"-agent", func(app string) corev1.PodTemplateSpec { return agentTemplate(app, app, 23460) }, true},
}

// settled checks, once a rollout is complete, what variant v watches: one
// ready endpoint, or the holder's app the only one running.
func (v apVariant) settled(g Gomega, a *activity, app string) {
	if !v.agent {
		g.Expect(a.readyEndpoints()).To(Equal(1), "ready endpoints of Service %s", app)
		return
	}
	holder := a.holder()
	g.Expect(holder).NotTo(BeEmpty(), "one pod of %s marked", app)
	pod := &corev1.Pod{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: holder}, pod)).To(Succeed())
	g.Expect(pod.DeletionTimestamp).To(BeNil(), "the marked pod %s is not on its way out", holder)
}

// checkHolder checks what variant v watches after a rollout: the agents'
// apps never active at once, the holder's running.
func (v apVariant) checkHolder(app, holder string) {
	if v.agent {
		expectActive(app, holder)
	}
}

var _ = Describe("active/passive workloads in holder-label mode", Ordered, func() {
	for _, v := range apVariants {
		what := "never with two ready endpoints"
		if v.agent {
			what = "their apps started through the in-pod agent never active at once"
		}
		It("completes two rollouts of a default-strategy Deployment, handing over once each, "+what, func() {
			app, replicas := "ap-deploy"+v.suffix, 2
			a := activePassive(app, !v.agent)
			d := &appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: app},
				Spec: appsv1.DeploymentSpec{ // the default RollingUpdate: maxSurge 1, maxUnavailable 0 at two replicas
					Replicas: new(int32(replicas)),
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
					Template: v.template(app),
				},
			}
			Expect(k8s.Create(ctx, d)).To(Succeed())
			removeAfterSpec(d)

			rolledOut := func(what string) {
				waitRollout(what, "deployment/"+app, func(g Gomega) {
					cur := &appsv1.Deployment{}
					g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(d), cur)).To(Succeed())
					g.Expect(meta.IsStatusConditionTrue(conditionsOf(cur), string(appsv1.DeploymentAvailable))).To(BeTrue(), "Deployment %s Available", app)
					g.Expect(cur.Status.UpdatedReplicas).To(Equal(int32(replicas)), "updated replicas of %s", app)
					g.Expect(cur.Status.Replicas).To(Equal(int32(replicas)), "replicas of %s (old ones gone)", app)
					v.settled(g, a, app)
				})
			}
			rolledOut("the first rollout")
			marks, _ := a.seen()
			Expect(marks).To(HaveLen(1), "one pod marked once the Deployment is up")
			v.checkHolder(app, marks[0])

			for i, rev := range []string{"2", "3"} {
				changeTemplate(d, &d.Spec.Template, rev)
				rolledOut("the rollout to revision " + rev)
				marks, violations := a.seen()
				Expect(violations).To(BeEmpty())
				Expect(marks).To(HaveLen(2+i), "handovers so far (pods marked in order: %v): one per rollout", marks)
				holder := marks[len(marks)-1]
				pod := &corev1.Pod{}
				Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: holder}, pod)).To(Succeed(), "the holder %s survived the rollout", holder)
				Expect(pod.Annotations).To(HaveKeyWithValue("e2e/revision", rev), "the holder %s is of the new revision", holder)
				v.checkHolder(app, holder)
			}
			if v.agent {
				hb := &v1alpha1.LockHeartbeat{}
				Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: app}, hb)).To(Succeed(), "LockHeartbeat %s", app)
				Expect(hb.Spec.StoppedGrant).NotTo(BeEmpty(), "an old holder's agent, its container's first process, said its app stopped (the lock passed on its word)")
			}
		})

		It("completes a rolling update of a StatefulSet, "+what, func() {
			app, replicas := "ap-sts"+v.suffix, 2
			a := activePassive(app, !v.agent)
			sts := &appsv1.StatefulSet{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: app},
				Spec: appsv1.StatefulSetSpec{ // the default: OrderedReady, RollingUpdate
					Replicas:    new(int32(replicas)),
					ServiceName: app,
					Selector:    &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
					Template:    v.template(app),
				},
			}
			Expect(k8s.Create(ctx, sts)).To(Succeed())
			removeAfterSpec(sts)
			rolledOut := func(what string) {
				waitRollout(what, "statefulset/"+app, func(g Gomega) {
					cur := &appsv1.StatefulSet{}
					g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(sts), cur)).To(Succeed())
					g.Expect(cur.Status.UpdatedReplicas).To(Equal(int32(replicas)), "updated replicas of %s", app)
					g.Expect(cur.Status.ReadyReplicas).To(Equal(int32(replicas)), "ready replicas of %s: passive pods are Ready too", app)
					v.settled(g, a, app)
				})
			}
			rolledOut("the StatefulSet's creation")
			changeTemplate(sts, &sts.Spec.Template, "2")
			rolledOut("the rolling update to revision 2")
			marks, violations := a.seen()
			Expect(violations).To(BeEmpty())
			// Ordinal 1 goes first: one handover if ordinal 0 held the lock,
			// two if ordinal 1 did (the lock goes to ordinal 0, the only pod
			// left, then back to the new ordinal 1 when ordinal 0 is replaced).
			Expect(len(marks)).To(BeNumerically("<=", 3), "pods marked in order: %v", marks)
			v.checkHolder(app, marks[len(marks)-1])
			GinkgoWriter.Printf("StatefulSet %s: pods marked in order %s\n", app, strings.Join(marks, ", "))
		})
	}
})

// expectActive checks the active periods app's agents reported: never two
// at once, and the last one, still running, the holder's.
func expectActive(app, holder string) {
	var periods []activePeriod
	Eventually(func(g Gomega) {
		periods = activePeriods(app)
		g.Expect(periods).NotTo(BeEmpty(), "active periods of app %s", app)
		last := periods[len(periods)-1]
		g.Expect(last.Pod).To(Equal(holder), "app %s: the last active period is the holder's", app)
		g.Expect(last.Stop).To(BeZero(), "app %s: the holder's app runs", app)
	}, 30*time.Second, 200*time.Millisecond).Should(Succeed(), "app %s: the holder %s's app to run in the last active period", app, holder)
	Expect(overlaps(periods)).To(BeEmpty(), "app %s: two pods active at once", app)
	GinkgoWriter.Printf("app %s: %d active periods, none overlapping\n", app, len(periods))
}

func conditionsOf(d *appsv1.Deployment) []metav1.Condition {
	out := make([]metav1.Condition, 0, len(d.Status.Conditions))
	for _, c := range d.Status.Conditions {
		out = append(out, metav1.Condition{Type: string(c.Type), Status: metav1.ConditionStatus(c.Status)})
	}
	return out
}
