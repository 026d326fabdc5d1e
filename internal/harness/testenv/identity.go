package testenv

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	. "github.com/onsi/ginkgo/v2" //nolint:staticcheck // a Ginkgo harness
	. "github.com/onsi/gomega"    //nolint:staticcheck // a Ginkgo harness
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// OperatorUser is the manager's ServiceAccount as config/default installs
// it, and as config/admission-policy names it: the only identity the
// admission policy lets mark holders. A manager run as it
// (Scope{Cfg: ConfigAs(OperatorUser, Admin)}) may write what the policy
// keeps for the operator.
const OperatorUser = "system:serviceaccount:" + OperatorNamespace + ":redlock-operator-controller-manager"

// Admin is the group of the control plane's administrators: a user
// impersonated in it has every right, so that only its name matters.
const Admin = "system:masters"

// ConfigAs returns a copy of the administrator's connection that acts as
// user in groups (impersonated): what the API server's admission sees.
func (e *Env) ConfigAs(user string, groups ...string) *rest.Config {
	cfg := rest.CopyConfig(e.Cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cfg
}

// ClientAs is a client of ConfigAs(user, groups...).
func (e *Env) ClientAs(user string, groups ...string) client.Client {
	c, err := client.New(e.ConfigAs(user, groups...), client.Options{Scheme: e.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// PodEditor gives user the right to read, update and patch pods (and
// their status) in ns, and nothing else (once: again, it reuses the
// Role), and returns a client acting as user: someone who may edit
// workloads but is not the operator.
func (e *Env) PodEditor(ns, user string) client.Client {
	e.Allow(ns, user, "pod-editor-"+strings.ToLower(user), rbacv1.PolicyRule{
		APIGroups: []string{""},
		Resources: []string{"pods", "pods/status"},
		Verbs:     []string{"get", "list", "watch", "update", "patch"},
	})
	return e.ClientAs(user, "system:authenticated")
}

// Allow binds user to a Role named name in ns with rules (once: again, it
// reuses the Role), and waits until the API server authorizes the first
// verb on the last resource of the first rule.
func (e *Env) Allow(ns, user, name string, rules ...rbacv1.PolicyRule) {
	again := func(err error) error {
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}
	Expect(again(e.Client.Create(e.Ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Rules:      rules,
	}))).To(Succeed(), "Role %s/%s", ns, name)
	Expect(again(e.Client.Create(e.Ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
	}))).To(Succeed(), "RoleBinding %s/%s", ns, name)
	r := rules[0]
	resource, sub, _ := strings.Cut(r.Resources[len(r.Resources)-1], "/")
	attrs := &authorizationv1.ResourceAttributes{Namespace: ns, Group: r.APIGroups[0], Resource: resource, Subresource: sub, Verb: r.Verbs[0]}
	// The authorizer learns of the binding from a watch: wait for it.
	Eventually(func(g Gomega) {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:authenticated"}, ResourceAttributes: attrs,
		}}
		g.Expect(e.Client.Create(e.Ctx, review)).To(Succeed())
		g.Expect(review.Status.Allowed).To(BeTrue(), "%s may %s %s/%s in %s", user, attrs.Verb, attrs.Resource, attrs.Subresource, ns)
	}).Should(Succeed(), "the API server to authorize %s by Role %s/%s", user, ns, name)
}

// InstallAdmissionPolicy creates the objects of
// config/admission-policy/policy.yaml as they are (the operator named
// OperatorUser) and waits until the API server enforces them: a dry run of
// a pod created in ns with the holder mark is refused. They are removed
// when the spec or container ends, and the cleanup waits until the API
// server no longer enforces them, so that the next specs' managers (which
// may run as another user) are not refused.
func (e *Env) InstallAdmissionPolicy(ns string) {
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "..", "config", "admission-policy", "policy.yaml"))
	Expect(err).NotTo(HaveOccurred())
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "policy-probe", Labels: map[string]string{v1alpha1.HoldsLabel: "probe"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "work", Image: "busybox"}}},
	}
	create := func() error { return e.Client.Create(e.Ctx, probe.DeepCopy(), client.DryRunAll) }
	var objs []*unstructured.Unstructured
	DeferCleanup(func() {
		for _, obj := range objs {
			Expect(client.IgnoreNotFound(e.Client.Delete(context.Background(), obj))).To(Succeed(), "delete %s %s", obj.GetKind(), obj.GetName())
		}
		Eventually(create).Should(Succeed(), "the admission policy to be lifted: pod %s/%s, created with the holder mark, admitted (dry run)", ns, probe.Name)
	})
	for _, doc := range strings.Split(string(data), "\n---\n") {
		obj := &unstructured.Unstructured{}
		Expect(yaml.Unmarshal([]byte(doc), &obj.Object)).To(Succeed())
		Expect(e.Client.Create(e.Ctx, obj)).To(Succeed())
		objs = append(objs, obj)
	}
	Eventually(create).Should(MatchError(ContainSubstring("redlock.dev/holds marks the pod")), "the admission policy to refuse pod %s/%s, created with the holder mark (dry run)", ns, probe.Name)
}

// LabelPatch reads pod p now and returns it with label key set to value
// ("" removes it), and the merge patch from the version read, for a
// client acting as someone (ClientAs) to send, through the pod or its
// status. The patch carries no resourceVersion: the operator writes the
// pod too.
func (e *Env) LabelPatch(p *corev1.Pod, key, value string) (*corev1.Pod, client.Patch) {
	cur := &corev1.Pod{}
	Expect(e.Client.Get(e.Ctx, client.ObjectKeyFromObject(p), cur)).To(Succeed())
	patch := client.MergeFrom(cur.DeepCopy())
	if cur.Labels == nil {
		cur.Labels = map[string]string{}
	}
	if value == "" {
		delete(cur.Labels, key)
	} else {
		cur.Labels[key] = value
	}
	return cur, patch
}
