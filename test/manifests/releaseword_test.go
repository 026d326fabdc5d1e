package manifests_test

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// A leased static holder's release word (LockHeartbeat releasedGrant) lets
// the keys go before the validity status showed: only who may patch the
// lock, and so withdraw its request anyway, may write it.
var _ = Describe("The release word of a leased static holder", func() {
	It("may be written by who may patch the lock, not by the agents of its pods", func(ctx SpecContext) {
		ns := env.NewNamespace()
		Expect(env.Client.Create(ctx, &v1alpha1.LockHeartbeat{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "freeze"}})).To(Succeed())
		agent := userWith(ctx, ns, "agent", []string{"get", "list", "watch"})
		holder := userWith(ctx, ns, "holder", []string{"get", "list", "watch", "patch"})
		installPolicy(ctx, objects(kustomize("config/default")))

		say := func(c client.Client, field func(*v1alpha1.LockHeartbeatSpec), dryRun bool) error {
			hb := &v1alpha1.LockHeartbeat{}
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "freeze"}, hb); err != nil {
				return err
			}
			field(&hb.Spec)
			var opts []client.UpdateOption
			if dryRun {
				opts = append(opts, client.DryRunAll)
			}
			return c.Update(ctx, hb, opts...)
		}
		released := func(s *v1alpha1.LockHeartbeatSpec) { s.ReleasedGrant = "grant-1" }
		Eventually(func() error { return say(agent, released, true) }).Should(MatchError(ContainSubstring("only who may patch the DistributedLock")),
			"the policy to refuse the release word of a pod's agent on LockHeartbeat %s/freeze", ns)
		Expect(say(agent, func(s *v1alpha1.LockHeartbeatSpec) { s.StoppedGrant = "grant-0" }, false)).To(Succeed(), "the agent's own word")
		Expect(say(holder, released, false)).To(Succeed(), "the release word of who may patch lock %s/freeze", ns)
	})
})

// userWith gives user, in ns, the verbs lockVerbs on the DistributedLock
// freeze and get and update on its LockHeartbeat, as the agents' Role or a
// static holder's does, and returns a client acting as user.
func userWith(ctx SpecContext, ns, user string, lockVerbs []string) client.Client {
	name := "lock-" + user
	Expect(env.Client.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"distributedlocks"}, ResourceNames: []string{"freeze"}, Verbs: lockVerbs},
			{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"lockheartbeats"}, ResourceNames: []string{"freeze"}, Verbs: []string{"get", "update"}},
		},
	})).To(Succeed())
	Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
	})).To(Succeed())
	Eventually(func(g Gomega) {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Group: v1alpha1.GroupVersion.Group, Resource: "lockheartbeats", Name: "freeze", Verb: "update"},
		}}
		g.Expect(env.Client.Create(ctx, review)).To(Succeed())
		g.Expect(review.Status.Allowed).To(BeTrue(), fmt.Sprintf("%s may update LockHeartbeat %s/freeze", user, ns))
	}).Should(Succeed(), "the API server to authorize %s in %s", user, ns)
	return env.ClientAs(user, "system:authenticated")
}
