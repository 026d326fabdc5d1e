package manifests_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/podsim"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// A Service selecting redlock.dev/holds sends traffic to every pod that
// carries it: only the operator may mark a pod, as the API server checks
// with the admission policy each install renders, naming the manager's
// ServiceAccount of that install.
var _ = Describe("The holder mark redlock.dev/holds", func() {
	It("may be set only by the ServiceAccount each install runs the manager as", func(ctx SpecContext) {
		ns := env.NewNamespace()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", Labels: map[string]string{"app": "web"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "busybox"}}},
		}
		Expect(env.Client.Create(ctx, pod)).To(Succeed())
		// mark tries, as user, to mark the pod (a dry run: the pod stays
		// as it is for the next install).
		mark := func(user string) error {
			cur, patch := env.LabelPatch(pod, v1alpha1.HoldsLabel, "web-leader")
			return env.ClientAs(user, testenv.Admin).Patch(ctx, cur, patch, client.DryRunAll)
		}

		// config/default with another namespace and name prefix.
		dir := GinkgoT().TempDir()
		Expect(os.CopyFS(filepath.Join(dir, "config"), os.DirFS(filepath.Join(root, "config")))).To(Succeed())
		k := filepath.Join(dir, "config", "default", "kustomization.yaml")
		data, err := os.ReadFile(k) //nolint:gosec // a copy of this repository's file
		Expect(err).NotTo(HaveOccurred())
		for from, to := range map[string]string{"\nnamespace: redlock-system\n": "\nnamespace: locks\n", "\nnamePrefix: redlock-operator-\n": "\nnamePrefix: team-\n"} {
			Expect(string(data)).To(ContainSubstring(from))
			data = bytes.Replace(data, []byte(from), []byte(to), 1)
		}
		Expect(os.WriteFile(k, data, 0o600)).To(Succeed())

		for _, install := range []struct {
			what, operator string
			objs           []*unstructured.Unstructured
		}{
			{"kustomize build config/default", testenv.OperatorUser, objects(kustomize("config/default"))},
			{"config/default with namespace locks and namePrefix team-", "system:serviceaccount:locks:team-controller-manager", objects(kustomize(filepath.Join(dir, "config", "default")))},
			{"the chart released into locks-operator", "system:serviceaccount:locks-operator:redlock-operator-controller-manager", objects(helmTemplate("locks-operator", "image.tag=dev"))},
		} {
			By("installing the admission policy of " + install.what + " for real")
			remove := installPolicy(ctx, install.objs)
			Eventually(func() error { return mark("system:serviceaccount:" + ns + ":default") }).
				Should(MatchError(ContainSubstring("only redlock-operator ("+install.operator+") adds or changes it")), "the policy of %s to refuse the mark by another account, naming %s", install.what, install.operator)
			// Until the previous install's policy is gone, it refuses this one's operator.
			Eventually(func() error { return mark(install.operator) }).Should(Succeed(), "the policy of %s to let %s mark a pod", install.what, install.operator)
			remove()
		}
	})

	It("is set by the operator's pod gate, refused to a user who may patch pods, and removable by that user", func(ctx SpecContext) {
		ns := env.NewNamespace()
		// A pod of before the policy that waits behind the gate with no
		// label: nothing lifts its gate, but its kubelet can still report.
		// (Retried: a policy another spec removed may still be in force.)
		legacy := podsim.Gated(ns, "legacy", nil)
		Eventually(func() error { return env.Client.Create(ctx, legacy.DeepCopy()) }).Should(Succeed(), "pod %s/legacy, gated without a label, created before the policy", ns)

		By("installing the admission policy of kustomize build config/default for real, and running the manager as its ServiceAccount " + testenv.OperatorUser)
		installPolicy(ctx, objects(kustomize("config/default")))
		Eventually(func() error { return env.Client.Create(ctx, podsim.Gated(ns, "unlabelled", nil), client.DryRunAll) }).
			Should(MatchError(ContainSubstring("has no label redlock.dev/lock")), "the policy to refuse a pod gated without a label (dry run)")
		Expect(podsim.Finish(ctx, env.Client, legacy, 1)).To(Succeed(), "the status of pod %s/legacy, created before the policy", ns)
		mgr := env.StartScopedManager(testenv.Scope{Cfg: env.ConfigAs(testenv.OperatorUser, testenv.Admin)}, nil)
		DeferCleanup(mgr.Stop)

		By("creating a lock and two pods in holder-label mode, both running")
		Expect(podsim.NodeReady(ctx, env.Client, "node-1", corev1.ConditionTrue)).To(Succeed())
		ms := env.NewServingMasters(ns, "masters", 3, 2*time.Second)
		const ttl = 2 * time.Second
		Expect(env.Client.Create(ctx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "leader"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: ms.Name, TTL: metav1.Duration{Duration: ttl}},
		})).To(Succeed())
		pods := map[string]*corev1.Pod{}
		for _, name := range []string{"web-a", "web-b"} {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
					v1alpha1.LockLabel: "leader", v1alpha1.GateModeLabel: v1alpha1.GateModeHolderLabel,
				}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "work", Image: "busybox"}}},
			}
			Expect(env.Client.Create(ctx, p)).To(Succeed())
			Expect(podsim.Run(ctx, env.Client, p, "node-1")).To(Succeed())
			pods[name] = p
		}
		get := func(p *corev1.Pod) *corev1.Pod {
			cur := &corev1.Pod{}
			Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(p), cur)).To(Succeed())
			return cur
		}
		var holder, passive *corev1.Pod
		Eventually(func(g Gomega) {
			lock := &v1alpha1.DistributedLock{}
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "leader"}, lock)).To(Succeed())
			g.Expect(lock.Status.Holder).NotTo(BeNil(), "holder of lock %s/leader", ns)
			g.Expect(lock.Status.Holder.Pod).NotTo(BeNil(), "holder pod of lock %s/leader", ns)
			holder = pods[lock.Status.Holder.Pod.Name]
			g.Expect(holder).NotTo(BeNil(), "lock %s/leader held by pod %s", ns, lock.Status.Holder.Pod.Name)
			g.Expect(get(holder).Labels).To(HaveKeyWithValue(v1alpha1.HoldsLabel, "leader"), "mark of the holder %s", holder.Name)
		}).Should(Succeed(), "the pod gate, running as %s, to mark the holder of lock %s/leader", testenv.OperatorUser, ns)
		for _, p := range pods {
			if p != holder {
				passive = p
			}
		}

		By("refusing a user who may patch pods the mark on the passive pod, through the pod or its status, and a change of the holder's mark")
		user := env.PodEditor(ns, "alice")
		patchAs := func(sub string, p *corev1.Pod, value string) error {
			cur, patch := env.LabelPatch(p, v1alpha1.HoldsLabel, value)
			if sub == "status" {
				return user.Status().Patch(ctx, cur, patch)
			}
			return user.Patch(ctx, cur, patch)
		}
		refused := MatchError(ContainSubstring("only redlock-operator (" + testenv.OperatorUser + ") adds or changes it"))
		Expect(patchAs("", passive, "leader")).To(refused, "alice marking the passive pod %s", passive.Name)
		Expect(patchAs("status", passive, "leader")).To(refused, "alice marking the passive pod %s through pods/status", passive.Name)
		Expect(patchAs("", holder, "other")).To(refused, "alice changing the mark of the holder %s", holder.Name)
		Expect(get(passive).Labels).NotTo(HaveKey(v1alpha1.HoldsLabel), "the passive pod %s carries no mark", passive.Name)

		By("letting the user remove the holder's mark, which the pod gate puts back while the grant stands")
		Expect(patchAs("", holder, "")).To(Succeed(), "alice removing the mark of the holder %s", holder.Name)
		Eventually(func() map[string]string { return get(holder).Labels }).Should(HaveKeyWithValue(v1alpha1.HoldsLabel, "leader"),
			"the pod gate to mark the holder %s/%s again", ns, holder.Name)
		Expect(get(passive).Labels).NotTo(HaveKey(v1alpha1.HoldsLabel), "the passive pod %s carries no mark", passive.Name)
	})
})

// installPolicy creates, for real, the ValidatingAdmissionPolicy and its
// binding among objs, removed when the spec ends or, before, by the
// function it returns.
func installPolicy(ctx context.Context, objs []*unstructured.Unstructured) func() {
	var created []*unstructured.Unstructured
	remove := func() {
		for _, u := range created {
			Expect(client.IgnoreNotFound(env.Client.Delete(context.Background(), u))).To(Succeed(), "delete %s %s", u.GetKind(), u.GetName())
		}
	}
	DeferCleanup(remove)
	for _, u := range objs {
		if u.GetKind() == "ValidatingAdmissionPolicy" || u.GetKind() == "ValidatingAdmissionPolicyBinding" {
			u.SetNamespace("") // kustomize sets one; both are cluster-scoped
			Expect(env.Client.Create(ctx, u)).To(Succeed(), "create %s %s", u.GetKind(), u.GetName())
			created = append(created, u)
		}
	}
	Expect(created).To(HaveLen(4), "two policies (holder marks and labels; the release word), each with its binding")
	return remove
}
