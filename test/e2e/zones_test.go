//go:build e2e

package e2e

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/managed"
)

// Issue 42, masters across zones, on the real scheduler: the local
// cluster's one node labelled with a zone. A Strict set of three may run
// one member there (two would be a quorum); a Preferred set runs all three
// and says its quorum sits in one zone.
var _ = Describe("managed members across zones", func() {
	const zone = "e2e-zone-a"

	zoned := func(name string, port int32, spread string) *v1alpha1.RedisMasterSet {
		ms := &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.RedisMasterSetSpec{
				MaxLockTTL: metav1.Duration{Duration: ttl},
				Managed:    &v1alpha1.ManagedMasters{Replicas: 3, Image: "redis:7-local", Port: port, HostNetwork: true, ZoneSpread: spread},
			},
		}
		Expect(k8s.Create(ctx, ms)).To(Succeed())
		removeAfterSpec(ms)
		return ms
	}
	condition := func(g Gomega, ms *v1alpha1.RedisMasterSet) (*metav1.Condition, []string) {
		cur := &v1alpha1.RedisMasterSet{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ms), cur)).To(Succeed())
		zones := []string{}
		for _, m := range cur.Status.Members {
			zones = append(zones, m.Zone)
		}
		c := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionSurvivesZoneLoss)
		g.Expect(c).NotTo(BeNil(), "master set %s/%s has no %s condition", ns, ms.Name, v1alpha1.ConditionSurvivesZoneLoss)
		return c, zones
	}

	It("keeps a Strict set's quorum out of the node's one zone, and says a Preferred set's quorum sits in it", func() {
		By("labelling the node with a zone")
		var nodes corev1.NodeList
		Expect(k8s.List(ctx, &nodes)).To(Succeed())
		Expect(nodes.Items).To(HaveLen(1), "the local cluster's nodes")
		node := &nodes.Items[0]
		setZone := func(z string) {
			Eventually(func() error {
				cur := &corev1.Node{}
				if err := k8s.Get(ctx, client.ObjectKeyFromObject(node), cur); err != nil {
					return err
				}
				if z == "" {
					delete(cur.Labels, corev1.LabelTopologyZone)
				} else {
					cur.Labels[corev1.LabelTopologyZone] = z
				}
				return k8s.Update(ctx, cur)
			}).Should(Succeed(), "node %s to be labelled zone %q", node.Name, z)
		}
		setZone(zone)
		DeferCleanup(setZone, "")

		By("a Strict set of three: one member scheduled, two Pending, unschedulable")
		strict := zoned("zones-strict", 17400, v1alpha1.SpreadStrict)
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels(managed.Labels(strict)))).To(Succeed())
			g.Expect(pods.Items).To(HaveLen(3), "pods of master set %s/zones-strict", ns)
			scheduled, unschedulable := 0, 0
			for _, p := range pods.Items {
				if p.Spec.NodeName != "" {
					scheduled++
				}
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
						unschedulable++
					}
				}
			}
			g.Expect(scheduled).To(Equal(1), "members of %s/zones-strict scheduled", ns)
			g.Expect(unschedulable).To(Equal(2), "members of %s/zones-strict the scheduler found unschedulable", ns)
		}, 2*time.Minute, time.Second).Should(Succeed(), "one member of master set %s/zones-strict to be scheduled, two to be unschedulable", ns)
		Eventually(func(g Gomega) {
			c, zones := condition(g, strict)
			g.Expect(zones).To(ConsistOf(zone, "", ""))
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse), "losing %s leaves none of the three", zone)
		}, time.Minute, time.Second).Should(Succeed(), "master set %s/zones-strict to show its one scheduled member in %s", ns, zone)

		By("a Preferred set of three: all scheduled in the one zone, a quorum in it")
		preferred := zoned("zones-preferred", 17410, v1alpha1.SpreadPreferred)
		Eventually(func(g Gomega) {
			c, zones := condition(g, preferred)
			g.Expect(zones).To(Equal([]string{zone, zone, zone}))
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonQuorumInOneZone))
		}, 2*time.Minute, time.Second).Should(Succeed(), "master set %s/zones-preferred to say its quorum sits in %s", ns, zone)
	})
})
