package manifests_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

// The operator's ServiceAccount as config/watch-namespaces binds it.
const operatorSA = "system:serviceaccount:redlock-system:redlock-operator-controller-manager"

// The operator limited to namespaces runs on the Roles config/watch-namespaces
// renders and nothing else: the manager's ServiceAccount, impersonated, is
// bound to no ClusterRole at all (metrics and the webhook, the two
// cluster-scoped rules the overlay keeps, are off here).
var _ = Describe("The operator watching only some namespaces", func() {
	It("serves a lock and its pod in a watched namespace with namespaced Roles only, and never touches those of another", func(ctx SpecContext) {
		const watched, other = "team-a", "team-b"

		By("creating, for real, the ServiceAccount, Roles and RoleBindings config/watch-namespaces renders, and none of its cluster-scoped objects")
		var bindings []string
		for _, u := range objects(kustomize("config/watch-namespaces")) {
			switch u.GetKind() {
			case "ClusterRoleBinding":
				bindings = append(bindings, u.GetName())
			case "ServiceAccount", "Role", "RoleBinding":
				createFor(ctx, u)
			}
		}
		Expect(bindings).To(ConsistOf("redlock-operator-metrics-auth-rolebinding", "redlock-operator-webhook-ca-rolebinding"),
			"the overlay binds the manager cluster-wide for metrics authentication and the webhook's CA bundle only")

		By("checking that the account may not list pods or locks cluster-wide, nor in a namespace without the Role, but may in a watched one")
		Expect(allowed(ctx, "", "", "pods", "list")).To(BeFalse())
		Expect(allowed(ctx, "", "coordination.redlock.dev", "distributedlocks", "watch")).To(BeFalse())
		Expect(allowed(ctx, "", "", "nodes", "list")).To(BeFalse())
		Expect(allowed(ctx, "default", "", "pods", "list")).To(BeFalse())
		Expect(allowed(ctx, watched, "", "pods", "patch")).To(BeTrue())
		Expect(allowed(ctx, watched, "coordination.redlock.dev", "distributedlocks", "update")).To(BeTrue())
		Expect(allowed(ctx, watched, "", "pods", "update")).To(BeFalse(), "pods are patched, never updated")

		By("running the manager as that account, with --watch-namespaces=" + watched)
		cfg := rest.CopyConfig(env.Cfg)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: operatorSA}
		mgr := env.StartScopedManager(testenv.Scope{Cfg: cfg, WatchNamespaces: []string{watched}}, nil)
		DeferCleanup(mgr.Stop)

		By("creating an external master set of three redis-server processes in both namespaces, the same lock and a gated pod asking for it in each")
		ms := env.NewServingMasters(watched, "masters", 3, 2*time.Second)
		env.CreateMasterSet(&testenv.MasterSet{Name: ms.Name, NS: other, Servers: ms.Servers}, 2*time.Second)
		for _, ns := range []string{watched, other} {
			Expect(env.Client.Create(ctx, &v1alpha1.DistributedLock{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "jobs"},
				Spec:       v1alpha1.DistributedLockSpec{MasterSet: ms.Name, TTL: metav1.Duration{Duration: 2 * time.Second}},
			})).To(Succeed())
			Expect(env.Client.Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job", Labels: map[string]string{v1alpha1.LockLabel: "jobs"}},
				Spec: corev1.PodSpec{
					Containers:      []corev1.Container{{Name: "work", Image: "busybox"}},
					SchedulingGates: []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGate}},
				},
			})).To(Succeed())
		}

		By("granting the lock in " + watched + " to its pod, and ungating the pod with its token")
		Eventually(func(g Gomega) {
			lock := &v1alpha1.DistributedLock{}
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: watched, Name: "jobs"}, lock)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(lock.Status.Conditions, v1alpha1.ConditionHeld)).To(BeTrue(), "conditions %v", lock.Status.Conditions)
			g.Expect(lock.Status.Holder).NotTo(BeNil(), "holder of lock %s/jobs", watched)
			g.Expect(lock.Status.Holder.Pod).NotTo(BeNil(), "holder pod of lock %s/jobs", watched)
			g.Expect(lock.Status.Holder.Pod.Name).To(Equal("job"))
			g.Expect(lock.Finalizers).NotTo(BeEmpty())
			pod := &corev1.Pod{}
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: watched, Name: "job"}, pod)).To(Succeed())
			g.Expect(demo.Gated(pod)).To(BeFalse())
			g.Expect(pod.Annotations).To(HaveKey(v1alpha1.FencingTokenAnnotation))
			g.Expect(ms.ValuesOn(lock.Status.Key)).To(HaveEach(Not(BeEmpty())), "the lock is held on every master")
		}, 30*time.Second).Should(Succeed(), "lock %s/jobs in the watched namespace to be held by pod job, ungated with its token", watched)

		By("leaving the lock, the pod and the master set in " + other + " as they were created")
		Consistently(func(g Gomega) {
			lock := &v1alpha1.DistributedLock{}
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: other, Name: "jobs"}, lock)).To(Succeed())
			g.Expect(lock.Finalizers).To(BeEmpty(), "finalizers of lock %s/jobs", other)
			g.Expect(lock.Status).To(Equal(v1alpha1.DistributedLockStatus{}))
			set := &v1alpha1.RedisMasterSet{}
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: other, Name: ms.Name}, set)).To(Succeed())
			g.Expect(set.Status.Conditions).To(BeEmpty())
			g.Expect(set.Status.Members).To(BeEmpty())
			pod := &corev1.Pod{}
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: other, Name: "job"}, pod)).To(Succeed())
			g.Expect(demo.Gated(pod)).To(BeTrue(), "gate of pod %s/job", other)
			g.Expect(pod.Annotations).To(BeEmpty())
			g.Expect(env.EventReasons(other, "jobs")).To(BeEmpty())
		}, 3*time.Second).Should(Succeed(), "lock %s/jobs and pod job in the unwatched namespace to stay untouched", other)
	})
})

// createFor creates u for real, in a namespace created first when missing;
// an object left by an earlier run is kept.
func createFor(ctx SpecContext, u *unstructured.Unstructured) {
	if ns := u.GetNamespace(); ns != "" {
		err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metaName(ns)})
		Expect(err == nil || apierrors.IsAlreadyExists(err)).To(BeTrue(), "create namespace %s: %v", ns, err)
	}
	err := env.Client.Create(ctx, u)
	Expect(err == nil || apierrors.IsAlreadyExists(err)).To(BeTrue(), "create %s %s/%s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
}

// allowed asks the API server whether the operator's ServiceAccount may
// do verb on resource in ns ("": in every namespace).
func allowed(ctx SpecContext, ns, group, resource, verb string) bool {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               operatorSA,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:redlock-system", "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Group: group, Resource: resource, Verb: verb},
	}}
	Expect(env.Client.Create(ctx, sar)).To(Succeed())
	return sar.Status.Allowed
}
