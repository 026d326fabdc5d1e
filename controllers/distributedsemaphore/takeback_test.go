package distributedsemaphore_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/distributedsemaphore"
	"github.com/redlock-operator/redlock-operator/internal/harness/podsim"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

// A deposed leader woken after a resize can label a waiting pod for a slot
// of the old number whose lock was since deleted. The admission policy
// keeps that label while the pod waits, and the name comes back only if
// spec.slots does: the semaphore takes the pod back into its queue.
var _ = Describe("A semaphore's pod labelled for a slot that no longer exists", Ordered, func() {
	var (
		mgr *testenv.Manager
		ns  string
		ms  *testenv.MasterSet
	)
	BeforeAll(func() {
		ns = env.NewNamespace()
		env.InstallAdmissionPolicy(ns)
		mgr = env.StartScopedManager(testenv.Scope{Cfg: env.ConfigAs(testenv.OperatorUser, testenv.Admin)}, nil)
		ms = env.NewServingMasters(ns, "masters", 3, 4*time.Second)
	})
	AfterAll(func() { mgr.Stop() })

	It("is taken back into the queue by the operator, under the admission policy, and granted a live slot", func() {
		By("labelling a waiting pod, as the operator's deposed leader would, for the slot lock stranded-3-1 that does not exist")
		pod := podsim.Gated(ns, "stranded-pod", map[string]string{v1alpha1.SemaphoreLabel: "stranded"})
		Expect(k8s.Create(suiteCtx, pod)).To(Succeed())
		label := func(c client.Client, value string) error {
			cur, patch := env.LabelPatch(pod, v1alpha1.LockLabel, value)
			return c.Patch(suiteCtx, cur, patch)
		}
		Expect(label(env.ClientAs(testenv.OperatorUser, testenv.Admin), "stranded-3-1")).To(Succeed(), "the operator labelling pod %s/%s for a slot", ns, pod.Name)
		Expect(label(env.PodEditor(ns, "carol"), "")).To(MatchError(ContainSubstring("redlock.dev/lock cannot change")),
			"a user who may edit pods taking pod %s/%s back", ns, pod.Name)

		By("creating the semaphore with 2 slots: stranded-3-1 is not one of them")
		sem := newSemaphore(ms, "stranded", "", 2)
		Expect(k8s.Create(suiteCtx, sem)).To(Succeed())
		Eventually(func(g Gomega) {
			cur := getPod(pod)
			g.Expect(cur.Labels[v1alpha1.LockLabel]).To(HavePrefix("stranded-2-"), "the slot of pod %s", pod.Name)
			g.Expect(demo.Gated(cur)).To(BeFalse(), "gate of pod %s", pod.Name)
			g.Expect(cur.Annotations).To(HaveKey(v1alpha1.FencingTokenAnnotation), "token of pod %s", pod.Name)
			g.Expect(cur.Annotations).To(HaveKeyWithValue(v1alpha1.LockNameAnnotation, cur.Labels[v1alpha1.LockLabel]), "the lock that granted pod %s", pod.Name)
			g.Expect(fetchSemaphore(sem).Status.Held).To(Equal(int32(1)), "held")
		}).WithTimeout(20*time.Second).Should(Succeed(), "pod %s/%s to be given a slot of semaphore stranded and granted it", ns, pod.Name)
		Eventually(func() []string { return env.EventReasons(ns, pod.Name) }).Should(ContainElement(distributedsemaphore.EventSlotTakenBack), "events of pod %s", pod.Name)

		Expect(podsim.Run(suiteCtx, k8s, pod, "node-1")).To(Succeed())
		Expect(podsim.Finish(suiteCtx, k8s, pod, 0)).To(Succeed())
		Eventually(func() int32 { return fetchSemaphore(sem).Status.Held }).WithTimeout(20*time.Second).Should(BeZero(), "semaphore %s/stranded to be free", ns)
	})
})
