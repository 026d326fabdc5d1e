package podgate_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// marks follows every committed version of the pods of one namespace, in
// the API server's order (a watch, not samples), and records which of the
// pods labelled for a lock carried its holder mark: what an EndpointSlice
// controller selecting the mark would see.
type marks struct {
	mu         sync.Mutex
	marked     map[string]bool
	order      []string // pods in the order they were marked
	violations []string
	any        map[string]bool // every pod carrying the mark, labelled for the lock or not
	changes    []string        // "+pod" when a pod got the mark, "-pod" when it lost it, in order
}

func watchMarks(ns, lock string) *marks {
	m := &marks{marked: map[string]bool{}, any: map[string]bool{}}
	wc, err := client.NewWithWatch(env.Cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	w, err := wc.Watch(suiteCtx, &corev1.PodList{}, client.InNamespace(ns))
	Expect(err).NotTo(HaveOccurred())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			m.mu.Lock()
			carries := ev.Type != watch.Deleted && p.Labels[v1alpha1.HoldsLabel] == lock
			if carries != m.any[p.Name] {
				m.any[p.Name] = carries
				sign := "-"
				if carries {
					sign = "+"
				}
				m.changes = append(m.changes, sign+p.Name)
			}
			now := carries && p.Labels[v1alpha1.LockLabel] == lock
			if now && !m.marked[p.Name] {
				m.order = append(m.order, p.Name)
			}
			m.marked[p.Name] = now
			var all []string
			for name, on := range m.marked {
				if on {
					all = append(all, name)
				}
			}
			if len(all) > 1 {
				slices.Sort(all)
				m.violations = append(m.violations, fmt.Sprintf("%s marked at once (resourceVersion %s)", strings.Join(all, ", "), p.ResourceVersion))
			}
			m.mu.Unlock()
		}
	}()
	DeferCleanup(func() { w.Stop(); <-done })
	return m
}

func (m *marks) seen() (order, violations []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.order), slices.Clone(m.violations)
}

// changesOf returns the mark changes of the named pods, in order.
func (m *marks) changesOf(pods ...string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(m.changes), func(c string) bool { return !slices.Contains(pods, c[1:]) })
}

// holderLabelSpecs are the specs of holder-label mode, run inside the
// Describe that starts the manager and the masters (podgate_test.go);
// setup returns its namespace and master set.
func holderLabelSpecs(setup func() (string, *testenv.MasterSet)) {
	It("marks only the holder, and takes the mark off before the next pod is granted", func() {
		ns, ms := setup()
		m := watchMarks(ns, "marked")
		Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "marked"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: ms.Name, TTL: metav1.Duration{Duration: 2 * time.Second}},
		})).To(Succeed())
		pods := []*corev1.Pod{holderLabelPod(ns, "marked-a", "marked"), holderLabelPod(ns, "marked-b", "marked"), holderLabelPod(ns, "marked-c", "marked")}
		for _, p := range pods {
			Expect(k8s.Create(suiteCtx, p)).To(Succeed())
			kubeletRuns(p) // no gate: every pod runs, passive ones too
		}
		expectMarked := func(i int) {
			By("marking " + pods[i].Name + " once its grant is committed, with its token on it")
			Eventually(func(g Gomega) {
				cur := getPod(pods[i])
				g.Expect(cur.Labels).To(HaveKeyWithValue(v1alpha1.HoldsLabel, "marked"), "pod %s not marked", pods[i].Name)
				lock := fetchLock(ns, "marked")
				g.Expect(lock.Status.Holder).NotTo(BeNil(), "lock marked shows no holder")
				g.Expect(lock.Status.Holder.Pod).NotTo(BeNil(), "lock marked is held by no pod")
				g.Expect(lock.Status.Holder.Pod.UID).To(Equal(cur.UID), "lock marked held by another pod than %s", pods[i].Name)
				g.Expect(cur.Annotations).To(HaveKeyWithValue(v1alpha1.FencingTokenAnnotation, fmt.Sprint(lock.Status.FencingToken)), "fencing token on pod %s", pods[i].Name)
				g.Expect(cur.Annotations).To(HaveKey(corev1.PodDeletionCost), "the holder %s is the last its ReplicaSet removes", pods[i].Name)
			}).Should(Succeed(), "pod %s/%s to be marked holder of lock marked, with its token on it", ns, pods[i].Name)
			for _, p := range pods[i+1:] { // earlier holders: the watch checks them
				Expect(getPod(p).Labels).NotTo(HaveKey(v1alpha1.HoldsLabel), "%s marked while %s holds", p.Name, pods[i].Name)
				Expect(getPod(p).Annotations).NotTo(HaveKey(corev1.PodDeletionCost), "%s has the holder's deletion cost", p.Name)
			}
			Expect(getPod(pods[i]).Spec.ReadinessGates).To(BeEmpty(), "a pod in holder-label mode has no readiness gate")
		}
		expectMarked(0)

		By("taking the mark off the holder as soon as its deletion starts, and granting nobody while its container runs")
		Expect(k8s.Delete(suiteCtx, getPod(pods[0]))).To(Succeed())
		Eventually(func() map[string]string { return getPod(pods[0]).Labels }).ShouldNot(HaveKey(v1alpha1.HoldsLabel), "mark of the terminating pod marked-a")
		Expect(getPod(pods[0]).Annotations).NotTo(HaveKey(corev1.PodDeletionCost), "the deletion cost goes with the mark")
		Consistently(func() map[string]string { return getPod(pods[1]).Labels }, time.Second).ShouldNot(HaveKey(v1alpha1.HoldsLabel),
			"marked-b marked while marked-a's container still runs")
		kubeletStops(pods[0], "")
		expectMarked(1)
		Expect(k8s.Delete(suiteCtx, getPod(pods[0]), client.GracePeriodSeconds(0))).To(Succeed())

		By("granting nobody while another pod still carries the mark: one no longer labelled for the lock, whose mark the lock controller removes")
		stray := gatedPod(ns, "stray", "", false)
		stray.Spec.SchedulingGates = nil
		stray.Labels = map[string]string{v1alpha1.HoldsLabel: "marked"} // not labelled for the lock: the pod gate controller never sees it
		Expect(k8s.Create(suiteCtx, stray)).To(Succeed())
		kubeletStops(pods[1], corev1.PodSucceeded)
		expectMarked(2)
		Expect(getPod(stray).Labels).NotTo(HaveKey(v1alpha1.HoldsLabel), "the stray mark removed")
		Expect(m.changesOf("stray", "marked-c")).To(Equal([]string{"+stray", "-stray", "+marked-c"}),
			"the stray mark went before marked-c got its own, in the API server's order")

		order, violations := m.seen()
		Expect(order).To(Equal([]string{"marked-a", "marked-b", "marked-c"}), "pods of lock marked in the order they were marked")
		Expect(violations).To(BeEmpty())
	})

	It("hands a lock over to a pod of its Deployment's current revision before older ones", func() {
		ns, ms := setup()
		Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "rollout"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: ms.Name, TTL: metav1.Duration{Duration: 2 * time.Second}},
		})).To(Succeed())
		By("a Deployment at revision 2 with the ReplicaSets of revisions 1 and 2 (no Deployment controller here: written as it would)")
		selector := map[string]string{"app": "rollout"}
		template := corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: selector},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "work", Image: "busybox"}}},
		}
		deploy := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "rollout", Annotations: map[string]string{"deployment.kubernetes.io/revision": "2"}},
			Spec:       appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: selector}, Template: template},
		}
		Expect(k8s.Create(suiteCtx, deploy)).To(Succeed())
		replicaSet := func(revision, hash string) *appsv1.ReplicaSet {
			rs := &appsv1.ReplicaSet{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "rollout-" + hash, Annotations: map[string]string{"deployment.kubernetes.io/revision": revision}},
				Spec:       appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: selector}, Template: template},
			}
			Expect(controllerutil.SetControllerReference(deploy, rs, env.Scheme)).To(Succeed())
			Expect(k8s.Create(suiteCtx, rs)).To(Succeed())
			return rs
		}
		v1, v2 := replicaSet("1", "v1hash"), replicaSet("2", "v2hash")
		podOf := func(name string, rs *appsv1.ReplicaSet) *corev1.Pod {
			p := holderLabelPod(ns, name, "rollout")
			p.Labels["app"] = "rollout"
			p.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = strings.TrimPrefix(rs.Name, "rollout-")
			Expect(controllerutil.SetControllerReference(rs, p, env.Scheme)).To(Succeed())
			Expect(k8s.Create(suiteCtx, p)).To(Succeed())
			kubeletRuns(p)
			return p
		}
		holder := podOf("rollout-0", v1)
		Eventually(func() map[string]string { return getPod(holder).Labels }).Should(HaveKeyWithValue(v1alpha1.HoldsLabel, "rollout"), "rollout-0 marked")
		// Created in this order and named so that first come, first served
		// (creation time, then name) picks rollout-a.
		older := podOf("rollout-a", v1)
		newer := podOf("rollout-b", v2)

		By("handing over when the old holder stops: to rollout-b of revision 2, though rollout-a of revision 1 waited longer")
		Expect(k8s.Delete(suiteCtx, getPod(holder))).To(Succeed())
		kubeletStops(holder, "")
		Eventually(func() map[string]string { return getPod(newer).Labels }).Should(HaveKeyWithValue(v1alpha1.HoldsLabel, "rollout"), "rollout-b marked")
		Expect(getPod(older).Labels).NotTo(HaveKey(v1alpha1.HoldsLabel), "rollout-a marked")
		Expect(k8s.Delete(suiteCtx, getPod(holder), client.GracePeriodSeconds(0))).To(Succeed())
	})
}
