package redismasterset_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// Issue 42, masters across zones: a managed set shows each member's zone
// (its node's topology.kubernetes.io/zone) and whether losing one zone
// leaves a quorum; Strict renders a rule the scheduler keeps.
var _ = Describe("Managed members across zones", Ordered, func() {
	var (
		mgr *testenv.Manager
		ns  string
		ms  *v1alpha1.RedisMasterSet
	)
	BeforeAll(func() {
		mgr = startManager()
		ns = newNamespace()
		ms = createManaged(ns, "zoned", v1alpha1.ManagedMasters{Replicas: 3, ZoneSpread: v1alpha1.SpreadStrict})
	})
	AfterAll(func() { mgr.Stop() })

	// node creates a node in zone ("" for none), named after the test's
	// namespace.
	node := func(name, zone string) string {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name, Labels: map[string]string{}}}
		if zone != "" {
			n.Labels[corev1.LabelTopologyZone] = zone
		}
		Expect(k8s.Create(suiteCtx, n)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(suiteCtx, n))).To(Succeed()) })
		return n.Name
	}
	// runOn creates member ordinal's pod, scheduled on node.
	runOn := func(ordinal, node string) {
		pod := memberPod(ms, ordinal)
		pod.Spec.NodeName = node
		Expect(k8s.Create(suiteCtx, pod)).To(Succeed())
	}
	zoneLoss := func(g Gomega) (*metav1.Condition, []string) {
		set := fetchSet(ns, "zoned")
		zones := make([]string, len(set.Status.Members))
		for i, m := range set.Status.Members {
			zones[i] = m.Zone
		}
		c := meta.FindStatusCondition(set.Status.Conditions, v1alpha1.ConditionSurvivesZoneLoss)
		g.Expect(c).NotTo(BeNil(), "master set %s/zoned has no %s condition", ns, v1alpha1.ConditionSurvivesZoneLoss)
		return c, zones
	}

	It("renders Strict as at most a quorum less one member per zone, and none on a node without a zone", func() {
		sts := &appsv1.StatefulSet{}
		Eventually(func() error { return k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "zoned"}, sts) }).
			Should(Succeed(), "StatefulSet %s/zoned to be created", ns)
		var zone *corev1.TopologySpreadConstraint
		for i, c := range sts.Spec.Template.Spec.TopologySpreadConstraints {
			if c.TopologyKey == corev1.LabelTopologyZone {
				zone = &sts.Spec.Template.Spec.TopologySpreadConstraints[i]
			}
		}
		Expect(zone).NotTo(BeNil(), "the members' zone rule")
		Expect(zone.MaxSkew).To(Equal(int32(1)), "3 members: a quorum of 2, at most 1 per zone")
		Expect(zone.MinDomains).To(HaveValue(Equal(int32(3))))
		Expect(zone.WhenUnsatisfiable).To(Equal(corev1.DoNotSchedule))
	})

	It("shows each member's zone, and whether one zone holds a quorum", func() {
		a, b, none := node("a", "zone-a"), node("b", "zone-b"), node("none", "")

		By("two members scheduled in two zones, the third running nowhere: losing either zone leaves one")
		runOn("0", a)
		runOn("1", b)
		Eventually(func(g Gomega) {
			c, zones := zoneLoss(g)
			g.Expect(zones).To(Equal([]string{"zone-a", "zone-b", ""}))
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Message).To(ContainSubstring("not running: member 2"))
		}).Should(Succeed(), "master set %s/zoned to show members 0 and 1 in zones a and b, and that it cannot lose a zone", ns)

		By("the third on a node without a zone: not known")
		runOn("2", none)
		Eventually(func(g Gomega) {
			c, _ := zoneLoss(g)
			g.Expect(c.Status).To(Equal(metav1.ConditionUnknown))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonZonesUnknown))
			g.Expect(c.Message).To(ContainSubstring("the zones of member 2 are not known"))
		}).Should(Succeed(), "master set %s/zoned to say member 2's zone is not known", ns)

		By("its node labelled zone-a: zone-a holds a quorum")
		setZone := func(name, zone string) {
			n := &corev1.Node{}
			Expect(k8s.Get(suiteCtx, client.ObjectKey{Name: name}, n)).To(Succeed())
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			n.Labels[corev1.LabelTopologyZone] = zone
			Expect(k8s.Update(suiteCtx, n)).To(Succeed())
		}
		setZone(none, "zone-a")
		Eventually(func(g Gomega) {
			c, zones := zoneLoss(g)
			g.Expect(zones).To(Equal([]string{"zone-a", "zone-b", "zone-a"}))
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonQuorumInOneZone))
			g.Expect(c.Message).To(ContainSubstring("losing zone zone-a (members 0 and 2) leaves 1 of 3 members running"))
		}).Should(Succeed(), "master set %s/zoned to say zone-a holds a quorum", ns)

		By("relabelled zone-c: no zone holds a quorum")
		setZone(none, "zone-c")
		Eventually(func(g Gomega) {
			c, zones := zoneLoss(g)
			g.Expect(zones).To(Equal([]string{"zone-a", "zone-b", "zone-c"}))
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonNoZoneHoldsQuorum))
		}).Should(Succeed(), "master set %s/zoned to survive the loss of a zone", ns)
	})
})
