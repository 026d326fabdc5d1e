//go:build e2e

package e2e

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

var _ = Describe("a managed set in a namespace enforcing Pod Security restricted", func() {
	It("runs its members there: admitted, Redis up as a non-root user on a read-only root filesystem", func() {
		// There is no pod network here, so these members run in their own
		// network namespaces where the operator cannot reach them (the set
		// is not Available); what is checked is that the kubelet runs them
		// under the restricted level and Redis answers its own probes.
		const restricted = "e2e-restricted"
		namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: restricted, Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
		}}
		Expect(k8s.Create(ctx, namespace)).To(Succeed())
		removeAfterSpec(namespace)
		Expect(k8s.Create(ctx, &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: restricted, Name: "masters"},
			Spec: v1alpha1.RedisMasterSetSpec{
				MaxLockTTL: metav1.Duration{Duration: 2 * time.Second},
				Managed:    &v1alpha1.ManagedMasters{Replicas: 3, Image: "redis:7-local", Port: 6379},
			},
		})).To(Succeed())
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8s.List(ctx, &pods, client.InNamespace(restricted))).To(Succeed(), "pods of namespace %s", restricted)
			g.Expect(pods.Items).To(HaveLen(3), "pods of master set %s/masters", restricted)
			for _, p := range pods.Items {
				g.Expect(p.Status.ContainerStatuses).To(HaveLen(1), p.Name)
				s := p.Status.ContainerStatuses[0]
				g.Expect(s.Ready).To(BeTrue(), "%s: %+v", p.Name, s.State)
				g.Expect(s.RestartCount).To(BeZero(), p.Name)
				sc := p.Spec.SecurityContext
				g.Expect(sc.RunAsNonRoot).To(HaveValue(BeTrue()), "runAsNonRoot of pod %s", p.Name)
				g.Expect(p.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()), "readOnlyRootFilesystem of pod %s", p.Name)
			}
		}, 2*time.Minute, time.Second).Should(Succeed(), "the 3 members of master set %s/masters to run Ready under the restricted Pod Security Standard", restricted)
	})
})
