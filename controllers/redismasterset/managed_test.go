package redismasterset_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/internal/managed"
)

// envtest runs no kube-controller-manager: the StatefulSet creates no pods
// here, so the tests create member pods themselves, as the StatefulSet
// controller would.
func memberPod(ms *v1alpha1.RedisMasterSet, ordinal string) *corev1.Pod {
	labels := managed.Labels(ms)
	labels[managed.PodIndexLabel] = ordinal
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ms.Namespace, Name: ms.Name + "-" + ordinal, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "redis", Image: "redis:7.2"}}},
	}
}

// createManaged creates a managed set of maxLockTTL 20s.
func createManaged(ns, name string, m v1alpha1.ManagedMasters) *v1alpha1.RedisMasterSet {
	ms := &v1alpha1.RedisMasterSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.RedisMasterSetSpec{MaxLockTTL: metav1.Duration{Duration: 20 * time.Second}, Managed: &m},
	}
	ExpectWithOffset(1, k8s.Create(suiteCtx, ms)).To(Succeed())
	return ms
}

func admission(pod *corev1.Pod) func() time.Time {
	return func() time.Time {
		cur := &corev1.Pod{}
		if err := k8s.Get(suiteCtx, client.ObjectKeyFromObject(pod), cur); err != nil {
			return time.Time{}
		}
		at, err := time.Parse(time.RFC3339Nano, cur.Annotations[managed.ServeAfter])
		if err != nil {
			return time.Time{}
		}
		return at
	}
}

var _ = Describe("Managed RedisMasterSet", Ordered, func() {
	var (
		mgr *testenv.Manager
		ns  string
		ms  *v1alpha1.RedisMasterSet
	)
	BeforeAll(func() {
		mgr = startManager()
		ns = newNamespace()
		ms = createManaged(ns, "locks", v1alpha1.ManagedMasters{Replicas: 3, Persistence: v1alpha1.PersistenceAOFEverySec})
	})
	AfterAll(func() { mgr.Stop() })

	It("creates the StatefulSet, Service, config, PDB and a generated Secret, owned by the set", func() {
		key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }
		sts := &appsv1.StatefulSet{}
		Eventually(func() error { return k8s.Get(suiteCtx, key("locks"), sts) }).Should(Succeed(), "StatefulSet %s/locks to be created for master set locks", ns)
		Expect(*sts.Spec.Replicas).To(Equal(int32(3)))
		Expect(sts.Spec.PodManagementPolicy).To(Equal(appsv1.ParallelPodManagement))
		Expect(sts.Spec.VolumeClaimTemplates).To(HaveLen(1))
		Expect(sts.Spec.Template.Spec.InitContainers[0].Image).To(Equal("redlock-operator:test"))
		Expect(sts.Spec.Template.Spec.Containers[0].Args).To(ContainElements("--persistence=AOFEverySec", "--restart-delay=21.202s"))
		Expect(metav1.IsControlledBy(sts, fetchSet(ns, "locks"))).To(BeTrue())

		svc := &corev1.Service{}
		Expect(k8s.Get(suiteCtx, key("locks"), svc)).To(Succeed())
		Expect(svc.Spec.ClusterIP).To(Equal(corev1.ClusterIPNone))
		cm := &corev1.ConfigMap{}
		Expect(k8s.Get(suiteCtx, key("locks-config"), cm)).To(Succeed())
		Expect(cm.Data["redis.conf"]).To(ContainSubstring("maxmemory-policy noeviction"))
		Expect(cm.Data["redis.conf"]).To(ContainSubstring("appendfsync everysec"))
		pdb := &policyv1.PodDisruptionBudget{}
		Expect(k8s.Get(suiteCtx, key("locks"), pdb)).To(Succeed())
		Expect(pdb.Spec.MaxUnavailable.IntValue()).To(Equal(1))
		np := &networkingv1.NetworkPolicy{}
		Expect(k8s.Get(suiteCtx, key("locks"), np)).To(Succeed())
		Expect(np.Spec.PodSelector.MatchLabels).To(Equal(sts.Spec.Selector.MatchLabels), "it covers the members")
		Expect(np.Spec.Ingress).To(HaveLen(1))
		Expect(np.Spec.Ingress[0].Ports[0].Port.IntValue()).To(Equal(6379))
		Expect(np.Spec.Ingress[0].From).To(HaveLen(1), "only the operator's pods")
		Expect(np.Spec.Ingress[0].From[0].NamespaceSelector.MatchLabels).To(HaveKeyWithValue(corev1.LabelMetadataName, testenv.OperatorNamespace))
		Expect(np.Spec.Ingress[0].From[0].PodSelector.MatchLabels).To(HaveKeyWithValue("control-plane", "controller-manager"))
		secret := &corev1.Secret{}
		Expect(k8s.Get(suiteCtx, key("locks-auth"), secret)).To(Succeed())
		Expect(len(secret.Data["password"])).To(BeNumerically(">=", 32))
		Expect(metav1.IsControlledBy(secret, fetchSet(ns, "locks"))).To(BeTrue())

		// Status is written at the end of the reconcile that created them.
		Eventually(func() []v1alpha1.MemberStatus { return fetchSet(ns, "locks").Status.Members }).Should(HaveLen(3), "master set %s/locks to show its 3 members", ns)
		set := fetchSet(ns, "locks")
		Expect(set.Status.Members[2].Address).To(Equal("locks-2.locks." + ns + ".svc:6379"))
		Expect(set.Status.Members[0].NeverServed).To(BeTrue(), "%+v", set.Status.Members)
	})

	It("reverts a hand edit of the StatefulSet, Service, ConfigMap and PDB it owns (server-side apply)", func() {
		key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }
		By("editing the fields the operator sets, by hand")
		sts := &appsv1.StatefulSet{}
		Expect(k8s.Get(suiteCtx, key("locks"), sts)).To(Succeed())
		sts.Spec.UpdateStrategy = appsv1.StatefulSetUpdateStrategy{Type: appsv1.RollingUpdateStatefulSetStrategyType}
		sts.Spec.Template.Spec.Containers[0].Image = "redis:hand-edited"
		Expect(k8s.Update(suiteCtx, sts)).To(Succeed())
		svc := &corev1.Service{}
		Expect(k8s.Get(suiteCtx, key("locks"), svc)).To(Succeed())
		svc.Spec.PublishNotReadyAddresses = false
		Expect(k8s.Update(suiteCtx, svc)).To(Succeed())
		cm := &corev1.ConfigMap{}
		Expect(k8s.Get(suiteCtx, key("locks-config"), cm)).To(Succeed())
		cm.Data["redis.conf"] = "maxmemory-policy allkeys-lru\n"
		Expect(k8s.Update(suiteCtx, cm)).To(Succeed())
		pdb := &policyv1.PodDisruptionBudget{}
		Expect(k8s.Get(suiteCtx, key("locks"), pdb)).To(Succeed())
		three := intstr.FromInt32(3)
		pdb.Spec.MaxUnavailable = &three
		Expect(k8s.Update(suiteCtx, pdb)).To(Succeed())

		By("seeing each put back as rendered")
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(suiteCtx, key("locks"), sts)).To(Succeed(), "StatefulSet %s/locks", ns)
			g.Expect(sts.Spec.UpdateStrategy.Type).To(Equal(appsv1.OnDeleteStatefulSetStrategyType))
			g.Expect(sts.Spec.Template.Spec.Containers[0].Image).NotTo(Equal("redis:hand-edited"))
			g.Expect(k8s.Get(suiteCtx, key("locks"), svc)).To(Succeed(), "Service %s/locks", ns)
			g.Expect(svc.Spec.PublishNotReadyAddresses).To(BeTrue())
			g.Expect(k8s.Get(suiteCtx, key("locks-config"), cm)).To(Succeed(), "ConfigMap %s/locks-config", ns)
			g.Expect(cm.Data["redis.conf"]).To(ContainSubstring("maxmemory-policy noeviction"))
			g.Expect(k8s.Get(suiteCtx, key("locks"), pdb)).To(Succeed(), "PodDisruptionBudget %s/locks", ns)
			g.Expect(pdb.Spec.MaxUnavailable.IntValue()).To(Equal(1))
		}, 30*time.Second).Should(Succeed(), "master set %s/locks to put its StatefulSet, Service, ConfigMap and PDB back as rendered", ns)
	})

	It("keeps its gate image across an operator upgrade, and rolls to a new one only when spec.managed.gateImage asks", func() {
		key := client.ObjectKey{Namespace: ns, Name: "locks"}
		initImage := func() string {
			sts := &appsv1.StatefulSet{}
			Expect(k8s.Get(suiteCtx, key, sts)).To(Succeed())
			return sts.Spec.Template.Spec.InitContainers[0].Image
		}
		Eventually(func() string { return fetchSet(ns, "locks").Status.GateImage }).Should(Equal("redlock-operator:test"), "master set %s/locks to show gate image redlock-operator:test", ns)
		Expect(initImage()).To(Equal("redlock-operator:test"))

		By("upgrading the operator: the set keeps the gate it was created with")
		mgr.Stop()
		env.GateImage = "redlock-operator:next"
		DeferCleanup(func() { env.GateImage = "redlock-operator:test" })
		mgr = startManager()
		Consistently(initImage, 3*time.Second).Should(Equal("redlock-operator:test"), "StatefulSet %s/locks to keep gate image redlock-operator:test across the upgrade", ns)

		By("asking for the new gate in the spec")
		Eventually(func() error { // retried: the controller writes status meanwhile
			set := fetchSet(ns, "locks")
			set.Spec.Managed.GateImage = "redlock-operator:next"
			return k8s.Update(suiteCtx, set)
		}).Should(Succeed(), "master set %s/locks to take gate image redlock-operator:next", ns)
		Eventually(initImage).Should(Equal("redlock-operator:next"), "StatefulSet %s/locks to roll to gate image redlock-operator:next", ns)
		Eventually(func() string { return fetchSet(ns, "locks").Status.GateImage }).Should(Equal("redlock-operator:next"), "master set %s/locks to show gate image redlock-operator:next", ns)
	})

	It("admits the first pod of a member that never served at once", func() {
		pod := memberPod(ms, "0")
		created := time.Now()
		Expect(k8s.Create(suiteCtx, pod)).To(Succeed())
		Eventually(admission(pod)).ShouldNot(BeZero(), "member pod %s/%s to be admitted", ns, pod.Name)
		Expect(admission(pod)()).To(BeTemporally("~", created, 3*time.Second))
		Eventually(func() []string { return eventReasons(ns, "locks") }).Should(ContainElement("MemberAdmitted"), "master set %s/locks to get event MemberAdmitted", ns)
	})

	It("admits a replacement pod a full restart delay from now when another process saw the member serving (an operator restart)", func() {
		By("recording that member 1 served until 5s ago, as an earlier operator process would have")
		lastServing := time.Now().Add(-5 * time.Second).Truncate(time.Second)
		set := fetchSet(ns, "locks")
		base := set.DeepCopy()
		set.Status.Members[1].LastServingAt = &metav1.Time{Time: lastServing}
		set.Status.Members[1].NeverServed = false
		mgr.Stop() // the operator is down while the member's pod is replaced
		Expect(k8s.Status().Patch(suiteCtx, set, client.MergeFrom(base))).To(Succeed())
		pod := memberPod(ms, "1")
		Expect(k8s.Create(suiteCtx, pod)).To(Succeed())
		mgr = startManager()
		created := time.Now()
		Eventually(admission(pod)).ShouldNot(BeZero(), "member pod %s/%s to be admitted", ns, pod.Name)
		seen := time.Now()
		By("admitting it a whole restart delay (20s + drift + 1s) from now: the earlier process stamped lastServingAt on its own clock, which this one does not compare with its own")
		// "Now" is when the manager decided: between the pod's creation and
		// this test seeing the admission, however loaded the machine.
		Expect(admission(pod)()).To(And(
			BeTemporally(">=", created.Add(21202*time.Millisecond-100*time.Millisecond)),
			BeTemporally("<=", seen.Add(21202*time.Millisecond))),
			"admission of member pod %s/%s: a restart delay after the manager decided, between %v and %v", ns, pod.Name, created, seen)
		Expect(admission(pod)()).To(BeTemporally(">", lastServing.Add(20*time.Second+200*time.Millisecond+2*time.Millisecond+time.Second+1700*time.Millisecond)))
		By("telling the gate the delay, which it counts on its own clock")
		cur := &corev1.Pod{}
		Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(pod), cur)).To(Succeed())
		d, err := time.ParseDuration(cur.Annotations[managed.ServeDelay])
		Expect(err).NotTo(HaveOccurred(), "pod %s annotation %s", pod.Name, managed.ServeDelay)
		Expect(d).To(BeNumerically("~", 21202*time.Millisecond, 3*time.Second))
	})

	It("admits a pod of a member with no history only after a full restart delay", func() {
		set := fetchSet(ns, "locks")
		base := set.DeepCopy()
		set.Status.Members[2].NeverServed = false
		set.Status.Members[2].LastServingAt = nil
		Expect(k8s.Status().Patch(suiteCtx, set, client.MergeFrom(base))).To(Succeed())
		pod := memberPod(ms, "2")
		created := time.Now()
		Expect(k8s.Create(suiteCtx, pod)).To(Succeed())
		Eventually(admission(pod)).ShouldNot(BeZero(), "member pod %s/%s to be admitted", ns, pod.Name)
		Expect(admission(pod)()).To(BeTemporally("~", created.Add(21202*time.Millisecond), 3*time.Second))
	})

	It("reports members it cannot reach as Down, never as serving", func() {
		// The DNS names of envtest members resolve nowhere.
		Eventually(func() []string { return memberStates(fetchSet(ns, "locks")) }).
			Should(HaveEach(v1alpha1.MemberDown), "every member of master set %s/locks to be Down", ns)
		Expect(availability(fetchSet(ns, "locks"))).To(Equal("False/" + v1alpha1.ReasonQuorumLost))
	})
})

var _ = Describe("Rolling update of a managed set", Ordered, func() {
	var (
		mgr *testenv.Manager
		ns  string
		sts *appsv1.StatefulSet
	)
	// outdatedPod is member pod ord of the set's StatefulSet at revision
	// rev, as the StatefulSet controller would create it (envtest runs none).
	outdatedPod := func(ord, rev string) *corev1.Pod {
		pod := memberPod(fetchSet(ns, "roll"), ord)
		pod.Labels[appsv1.ControllerRevisionHashLabelKey] = rev
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID, Controller: new(true)}}
		return pod
	}
	exists := func(name string) func() bool {
		return func() bool {
			return k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, &corev1.Pod{}) == nil
		}
	}
	BeforeAll(func() {
		mgr = startManager()
		ns = newNamespace()
		Expect(k8s.Create(suiteCtx, &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "roll"},
			Spec:       v1alpha1.RedisMasterSetSpec{MaxLockTTL: metav1.Duration{Duration: maxLockTTL}, Managed: &v1alpha1.ManagedMasters{Replicas: 3}},
		})).To(Succeed())
		sts = &appsv1.StatefulSet{}
		Eventually(func() error { return k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "roll"}, sts) }).Should(Succeed(), "StatefulSet %s/roll to be created for master set roll", ns)
		Expect(sts.Spec.UpdateStrategy.Type).To(Equal(appsv1.OnDeleteStatefulSetStrategyType), "the operator rolls the members itself")
	})
	AfterAll(func() { mgr.Stop() })

	It("replaces outdated members that cast no vote one at a time, waiting while a replaced one is missing", func() {
		By("three member pods of the old revision, none Ready, their members Down (envtest has no kubelet)")
		for _, ord := range []string{"0", "1", "2"} {
			Expect(k8s.Create(suiteCtx, outdatedPod(ord, "roll-old"))).To(Succeed())
		}
		Eventually(func() []string { return memberStates(fetchSet(ns, "roll")) }).Should(HaveEach(v1alpha1.MemberDown), "every member of master set %s/roll to be Down", ns)
		By("the StatefulSet controller's view: a new revision to roll to")
		sts.Status = appsv1.StatefulSetStatus{ObservedGeneration: sts.Generation, Replicas: 3, CurrentRevision: "roll-old", UpdateRevision: "roll-new"}
		Expect(k8s.Status().Update(suiteCtx, sts)).To(Succeed())

		By("replacing the highest ordinal first, and nothing else while it is missing")
		Eventually(exists("roll-2")).Should(BeFalse(), "outdated member pod %s/roll-2 to be replaced (deleted) first", ns)
		Consistently(func() bool { return exists("roll-0")() && exists("roll-1")() }, 3*time.Second).Should(BeTrue(), "member pods %s/roll-0 and roll-1 to stay while roll-2 is missing", ns)
		Eventually(func() []string { return eventReasons(ns, "roll") }).Should(ContainElement("MemberReplaced"), "master set %s/roll to get event MemberReplaced", ns)

		By("the next once the replacement exists, at the new revision")
		Expect(k8s.Create(suiteCtx, outdatedPod("2", "roll-new"))).To(Succeed())
		Eventually(exists("roll-1")).Should(BeFalse(), "outdated member pod %s/roll-1 to be replaced next", ns)
		Consistently(func() bool { return exists("roll-0")() && exists("roll-2")() }, 3*time.Second).Should(BeTrue(), "member pods %s/roll-0 and roll-2 to stay while roll-1 is missing", ns)
	})
})
