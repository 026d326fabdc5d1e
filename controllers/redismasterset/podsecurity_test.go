package redismasterset_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/managed"
)

// The API server's PodSecurity admission decides: a member pod, as the
// StatefulSet's template renders it, is created directly in a namespace
// that enforces a level.
var _ = Describe("Managed member pods under Pod Security admission", func() {
	memberPod := func(ns string, mutate func(*v1alpha1.ManagedMasters)) *corev1.Pod {
		ms := &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "locks"},
			Spec: v1alpha1.RedisMasterSetSpec{
				MaxLockTTL: metav1.Duration{Duration: 10 * time.Second},
				Managed:    &v1alpha1.ManagedMasters{Replicas: 5, Image: "redis:7.2", Port: 6379, Persistence: v1alpha1.PersistenceNone},
			},
		}
		if mutate != nil {
			mutate(ms.Spec.Managed)
		}
		opts := managed.Options{GateImage: "redlock-operator:test", ACLSecret: "locks-acl-0"} //nolint:gosec // a Secret's name
		tpl := managed.StatefulSet(ms, opts).Spec.Template
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "locks-0", Labels: tpl.Labels}, Spec: tpl.Spec}
	}
	enforcing := func(level string) string {
		ns := newNamespace()
		n := &corev1.Namespace{}
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Name: ns}, n)).To(Succeed())
		n.Labels = map[string]string{"pod-security.kubernetes.io/enforce": level}
		Expect(k8s.Update(suiteCtx, n)).To(Succeed())
		return ns
	}

	It("admits a member pod, as rendered, into a namespace enforcing restricted", func() {
		ns := enforcing("restricted")
		Expect(k8s.Create(suiteCtx, memberPod(ns, nil))).To(Succeed())
	})

	It("refuses it there when its security context is overridden with a weaker one, and a host-network member", func() {
		ns := enforcing("restricted")
		err := k8s.Create(suiteCtx, memberPod(ns, func(m *v1alpha1.ManagedMasters) {
			m.PodSecurityContext = &corev1.PodSecurityContext{}
			m.ContainerSecurityContext = &corev1.SecurityContext{}
		}))
		Expect(err).To(MatchError(ContainSubstring("violates PodSecurity \"restricted")))
		err = k8s.Create(suiteCtx, memberPod(enforcing("baseline"), func(m *v1alpha1.ManagedMasters) { m.HostNetwork = true }))
		Expect(err).To(MatchError(ContainSubstring("host namespaces")))
	})

	It("renders members that are never BestEffort, with no service account token, at the set's priority", func() {
		pod := memberPod("x", func(m *v1alpha1.ManagedMasters) { m.PriorityClassName = "locks-critical" })
		Expect(pod.Spec.AutomountServiceAccountToken).To(HaveValue(BeFalse()))
		Expect(pod.Spec.PriorityClassName).To(Equal("locks-critical"))
		Expect(pod.Spec.Containers[0].Resources.Requests).To(HaveKey(corev1.ResourceCPU))
		Expect(pod.Spec.Containers[0].Resources.Requests).To(HaveKey(corev1.ResourceMemory))
	})
})
