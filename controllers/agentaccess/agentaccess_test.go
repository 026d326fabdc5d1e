package agentaccess_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/agentaccess"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
	"github.com/redlock-operator/redlock-operator/pkg/holding"
)

var _ = Describe("The agents' access to their lock", Ordered, func() {
	var ns string
	BeforeAll(func() {
		ns = env.NewNamespace()
		mgr := env.StartManager()
		DeferCleanup(mgr.Stop)
	})

	lock := func(name string) *v1alpha1.DistributedLock {
		l := &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: "masters", TTL: metav1.Duration{Duration: 10 * time.Second}},
		}
		Expect(k8s.Create(suiteCtx, l)).To(Succeed())
		return l
	}
	pod := func(name, lock, sa string, agent bool) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.LockLabel: lock}},
			Spec: corev1.PodSpec{
				ServiceAccountName: sa,
				Containers:         []corev1.Container{{Name: "app", Image: "app", Command: []string{"/app"}}},
				SchedulingGates:    []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGate}},
			},
		}
		if agent { // as the webhook adds it
			p.Annotations = map[string]string{v1alpha1.AgentAnnotation: v1alpha1.AgentRun}
			_, err := podagent.Inject(p, podagent.Options{Image: "redlock-operator:test"})
			Expect(err).NotTo(HaveOccurred())
		}
		Expect(k8s.Create(suiteCtx, p)).To(Succeed())
		return p
	}
	// as is a client acting as ServiceAccount sa of the namespace.
	as := func(sa string) client.WithWatch {
		cfg := rest.CopyConfig(env.Cfg)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa}
		c, err := client.NewWithWatch(cfg, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		return c
	}
	binding := func(g Gomega, lock string) *rbacv1.RoleBinding {
		b := &rbacv1.RoleBinding{}
		g.Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: agentaccess.Name(lock)}, b)).To(Succeed())
		return b
	}

	It("lets the agents' ServiceAccounts read their own lock and nothing else, and takes that back when no agent is left", func() {
		By("creating lock jobs, another lock, pods of jobs with the agent (ServiceAccounts worker, worker, default) and one without (ServiceAccount plain, annotated as if it asked for the agent)")
		jobs, other := lock("jobs"), lock("other")
		for _, sa := range []string{"worker", "plain"} {
			Expect(k8s.Create(suiteCtx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}})).To(Succeed())
		}
		p1, p2 := pod("a", jobs.Name, "worker", true), pod("b", jobs.Name, "worker", true)
		p3 := pod("c", jobs.Name, "", true)
		d := pod("d", jobs.Name, "plain", false)
		d.Annotations = map[string]string{v1alpha1.AgentAnnotation: v1alpha1.AgentRun} // anyone who may edit the pod can add it
		Expect(k8s.Update(suiteCtx, d)).To(Succeed())

		Eventually(func(g Gomega) {
			b := binding(g, jobs.Name)
			g.Expect(b.Subjects).To(HaveExactElements(
				rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "default"},
				rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "worker"},
			), "RoleBinding %s binds the agents' ServiceAccounts, each once", b.Name)
			g.Expect(metav1.IsControlledBy(b, jobs)).To(BeTrue(), "RoleBinding %s is owned by lock jobs", b.Name)
		}).Should(Succeed(), "RoleBinding %s/%s to bind the agents' ServiceAccounts of lock jobs", ns, agentaccess.Name(jobs.Name))

		By("reading as ServiceAccount worker: its lock by name, by list and watch with a field selector; not the other lock")
		worker := as("worker")
		Expect(worker.Get(suiteCtx, client.ObjectKeyFromObject(jobs), &v1alpha1.DistributedLock{})).To(Succeed())
		byName := client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", jobs.Name)}
		var list v1alpha1.DistributedLockList
		Expect(worker.List(suiteCtx, &list, client.InNamespace(ns), byName)).To(Succeed())
		Expect(list.Items).To(HaveLen(1))
		w, err := worker.Watch(suiteCtx, &v1alpha1.DistributedLockList{}, client.InNamespace(ns), byName)
		Expect(err).NotTo(HaveOccurred(), "the agent's watch of its lock is allowed")
		w.Stop()
		Expect(apierrors.IsForbidden(worker.Get(suiteCtx, client.ObjectKeyFromObject(other), &v1alpha1.DistributedLock{}))).To(BeTrue(), "another lock is forbidden")
		Expect(apierrors.IsForbidden(worker.List(suiteCtx, &list, client.InNamespace(ns)))).To(BeTrue(), "listing every lock is forbidden")
		Expect(apierrors.IsForbidden(worker.List(suiteCtx, &corev1.PodList{}, client.InNamespace(ns)))).To(BeTrue(), "pods are forbidden")

		By("reading as ServiceAccount plain, whose pod has no agent")
		Expect(apierrors.IsForbidden(as("plain").Get(suiteCtx, client.ObjectKeyFromObject(jobs), &v1alpha1.DistributedLock{}))).To(BeTrue())

		By("finishing the pods of ServiceAccount worker, then deleting the last agent pod")
		for _, p := range []*corev1.Pod{p1, p2} {
			p.Status.Phase = corev1.PodSucceeded
			Expect(k8s.Status().Update(suiteCtx, p)).To(Succeed())
		}
		Eventually(func(g Gomega) {
			g.Expect(binding(g, jobs.Name).Subjects).To(HaveExactElements(HaveField("Name", "default")), "subjects of RoleBinding %s", agentaccess.Name(jobs.Name))
		}).Should(Succeed(), "RoleBinding %s/%s to unbind the finished pods' ServiceAccount worker", ns, agentaccess.Name(jobs.Name))
		Expect(k8s.Delete(suiteCtx, p3)).To(Succeed())
		Eventually(func(g Gomega) {
			for _, o := range []client.Object{&rbacv1.Role{}, &rbacv1.RoleBinding{}} {
				err := k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: agentaccess.Name(jobs.Name)}, o)
				g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the %T of lock jobs is deleted once no agent needs it: %v", o, err)
			}
		}).Should(Succeed(), "Role and RoleBinding %s/%s to be deleted once no agent of lock jobs is left", ns, agentaccess.Name(jobs.Name))
		Eventually(func() bool {
			return apierrors.IsForbidden(worker.Get(suiteCtx, client.ObjectKeyFromObject(jobs), &v1alpha1.DistributedLock{}))
		}).Should(BeTrue(), "ServiceAccount worker can no longer read lock jobs")
	})

	It("keeps the LockHeartbeat of a lock whose pods run the agent or that sets heartbeatTimeout, lets its agents renew it and say an app stopped and nothing else, and takes both back when neither holds", func() {
		By("creating lock beats with heartbeatTimeout 30s and no pod yet, lock quiet without a timeout and a pod with the agent (ServiceAccount beater), and lock bare with neither")
		beats := &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "beats"},
			Spec: v1alpha1.DistributedLockSpec{MasterSet: "masters", TTL: metav1.Duration{Duration: 10 * time.Second},
				HeartbeatTimeout: &metav1.Duration{Duration: 30 * time.Second}},
		}
		Expect(k8s.Create(suiteCtx, beats)).To(Succeed())
		quiet, bare := lock("quiet"), lock("bare")
		hq := pod("hq", quiet.Name, "beater", true)
		for _, l := range []*v1alpha1.DistributedLock{beats, quiet} {
			Eventually(func(g Gomega) {
				hb := &v1alpha1.LockHeartbeat{}
				g.Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(l), hb)).To(Succeed(), "LockHeartbeat %s exists", l.Name)
				g.Expect(metav1.IsControlledBy(hb, l)).To(BeTrue(), "LockHeartbeat %s is owned by lock %s", l.Name, l.Name)
			}).Should(Succeed(), "LockHeartbeat %s/%s to be made, owned by its lock", ns, l.Name)
		}
		Eventually(func(g Gomega) { binding(g, quiet.Name) }).Should(Succeed(), "RoleBinding of lock quiet")
		Consistently(func() error {
			return k8s.Get(suiteCtx, client.ObjectKeyFromObject(bare), &v1alpha1.LockHeartbeat{})
		}, 2*time.Second).Should(MatchError(ContainSubstring("not found")), "lock bare has no agent pod and no timeout: no LockHeartbeat")

		By("renewing the heartbeat of lock quiet and saying an app stopped there, as ServiceAccount beater")
		beater := as("beater")
		Eventually(func() error {
			return holding.Beat(suiteCtx, beater, client.ObjectKeyFromObject(quiet), "grant-1", time.Now())
		}).Should(Succeed(), "ServiceAccount beater to renew LockHeartbeat %s/quiet of its lock", ns)
		Expect(holding.SayStopped(suiteCtx, beater, client.ObjectKeyFromObject(quiet), "grant-1")).To(Succeed(), "the agent may say its app stopped")
		hb := &v1alpha1.LockHeartbeat{}
		Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(quiet), hb)).To(Succeed())
		Expect(hb.Spec.HolderIdentity).To(Equal("grant-1"))
		Expect(hb.Spec.RenewTime).NotTo(BeNil())
		Expect(hb.Spec.StoppedGrant).To(Equal("grant-1"))

		By("trying, as beater, to read another lock's heartbeat, to create one, and to delete its own")
		other := &v1alpha1.LockHeartbeat{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"}}
		Expect(k8s.Create(suiteCtx, other)).To(Succeed())
		Expect(apierrors.IsForbidden(beater.Get(suiteCtx, client.ObjectKeyFromObject(other), &v1alpha1.LockHeartbeat{}))).To(BeTrue(), "another heartbeat is forbidden")
		Expect(apierrors.IsForbidden(beater.Get(suiteCtx, client.ObjectKeyFromObject(beats), &v1alpha1.LockHeartbeat{}))).To(BeTrue(), "the heartbeat of a lock none of its pods requests is forbidden")
		Expect(apierrors.IsForbidden(beater.Create(suiteCtx, &v1alpha1.LockHeartbeat{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "made"}}))).To(BeTrue(), "creating heartbeats is forbidden")
		Expect(apierrors.IsForbidden(beater.Delete(suiteCtx, hb))).To(BeTrue(), "deleting its heartbeat is forbidden")
		Expect(apierrors.IsForbidden(beater.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "node-lease"}, &coordinationv1.Lease{}))).To(BeTrue(), "Leases are forbidden")

		By("unsetting the timeout of lock beats, which no pod requests, and deleting the pod of lock quiet")
		Eventually(func() error {
			cur := &v1alpha1.DistributedLock{}
			if err := k8s.Get(suiteCtx, client.ObjectKeyFromObject(beats), cur); err != nil {
				return err
			}
			cur.Spec.HeartbeatTimeout = nil
			return k8s.Update(suiteCtx, cur)
		}).Should(Succeed(), "lock %s/beats to drop its heartbeatTimeout", ns)
		Expect(k8s.Delete(suiteCtx, hq)).To(Succeed())
		for _, l := range []*v1alpha1.DistributedLock{beats, quiet} {
			Eventually(func() bool {
				return apierrors.IsNotFound(k8s.Get(suiteCtx, client.ObjectKeyFromObject(l), &v1alpha1.LockHeartbeat{}))
			}).Should(BeTrue(), "LockHeartbeat %s is deleted", l.Name)
		}
		Eventually(func() bool {
			return apierrors.IsForbidden(holding.Beat(suiteCtx, beater, client.ObjectKeyFromObject(quiet), "grant-1", time.Now()))
		}).Should(BeTrue(), "Role %s/%s to no longer let ServiceAccount beater renew LockHeartbeat quiet", ns, agentaccess.Name(quiet.Name))
	})

	It("leaves a Role of the same name that the lock does not own, and says so on the lock", func() {
		By("creating a Role redlock-agent:taken by hand, then lock taken and a pod with the agent")
		mine := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: agentaccess.Name("taken")},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}}}}
		Expect(k8s.Create(suiteCtx, mine)).To(Succeed())
		taken := lock("taken")
		pod("e", taken.Name, "", true)
		Eventually(func() []string { return env.EventReasons(ns, taken.Name) }).Should(ContainElement(agentaccess.EventConflict), "lock %s/taken to get event %s", ns, agentaccess.EventConflict)
		cur := &rbacv1.Role{}
		Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(mine), cur)).To(Succeed())
		Expect(cur.Rules).To(Equal(mine.Rules), "the Role made by hand is left as it was")
		Expect(cur.OwnerReferences).To(BeEmpty())
		Consistently(func() error {
			return k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: agentaccess.Name("taken")}, &rbacv1.RoleBinding{})
		}, 2*time.Second).Should(MatchError(ContainSubstring("not found")), "RoleBinding %s/%s not to be made to a Role lock taken does not own", ns, agentaccess.Name("taken"))
	})

	It("adopts the Role and RoleBinding of an earlier lock of the same name that are not collected yet", func() {
		// envtest runs no garbage collector: the objects an earlier lock
		// "again" left are made by hand, as it made them.
		By("creating the Role and RoleBinding of an earlier lock again, labelled as the operator's and owned by its UID")
		earlier := &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "again", UID: "0a0a0a0a-0000-4000-8000-000000000000"}}
		left := []client.Object{agentaccess.Role(earlier), agentaccess.Binding(earlier, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "gone"}})}
		for _, o := range left {
			Expect(k8s.Create(suiteCtx, o)).To(Succeed())
		}

		By("creating lock again anew, and a pod of it with the agent")
		again := lock("again")
		pod("f", again.Name, "", true)
		Eventually(func(g Gomega) {
			b := binding(g, again.Name)
			g.Expect(metav1.IsControlledBy(b, again)).To(BeTrue(), "RoleBinding %s is adopted by the new lock", b.Name)
			g.Expect(b.Subjects).To(HaveExactElements(HaveField("Name", "default")), "RoleBinding %s binds the new pod's ServiceAccount only", b.Name)
			g.Expect(b.OwnerReferences).To(HaveLen(1), "owners of RoleBinding %s", b.Name)
			r := &rbacv1.Role{}
			g.Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(b), r)).To(Succeed(), "Role %s", b.Name)
			g.Expect(metav1.IsControlledBy(r, again)).To(BeTrue(), "Role %s is adopted by the new lock", r.Name)
		}).Should(Succeed(), "Role and RoleBinding %s/%s to be adopted by the new lock again", ns, agentaccess.Name(again.Name))
		Expect(env.EventReasons(ns, again.Name)).NotTo(ContainElement(agentaccess.EventConflict))
	})
})
