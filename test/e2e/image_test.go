//go:build e2e

package e2e

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The release's image itself (its platforms, binaries, user and
// entrypoint, held to the Dockerfile) is checked by make test
// (test/manifests, make release); here, that it is what the cluster runs.
var _ = Describe("the operator the cluster runs", func() {
	It("is the release's image, imported from its OCI layout and run by digest, by the manager and by the pods it makes", func() {
		image := releaseImage()
		By("the manager's pods run " + image + " and pass it on as OPERATOR_IMAGE")
		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace("redlock-system"), client.MatchingLabels{"control-plane": "controller-manager"})).To(Succeed())
		Expect(pods.Items).NotTo(BeEmpty(), "manager pods")
		for _, p := range pods.Items {
			c := p.Spec.Containers[0]
			Expect(c.Image).To(Equal(image), "manager pod %s's image", p.Name)
			Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: "OPERATOR_IMAGE", Value: image}), "manager pod %s's OPERATOR_IMAGE", p.Name)
			Expect(p.Status.ContainerStatuses).NotTo(BeEmpty(), "manager pod %s reports its container", p.Name)
			// containerd reports the image by the digest it was imported
			// under: the layout's index, not one built or pulled here.
			Expect(p.Status.ContainerStatuses[0].ImageID).To(Equal(image), "manager pod %s's image ID", p.Name)
		}

		By("the managed members of set " + ns + "/" + set.Name + " copy the gate from the same image")
		for i := range 5 {
			p := &corev1.Pod{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("%s-%d", set.Name, i)}, p)).To(Succeed())
			Expect(p.Spec.InitContainers).NotTo(BeEmpty(), "member pod %s has the gate's init container", p.Name)
			Expect(p.Spec.InitContainers[0].Image).To(Equal(image), "member pod %s's gate image", p.Name)
			Expect(p.Status.InitContainerStatuses).NotTo(BeEmpty(), "member pod %s reports its init container", p.Name)
			Expect(p.Status.InitContainerStatuses[0].ImageID).To(Equal(image), "member pod %s's gate image ID", p.Name)
		}
	})
})
