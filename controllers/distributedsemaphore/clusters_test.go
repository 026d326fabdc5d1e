package distributedsemaphore_test

import (
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/podsim"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

// Issue 42, semaphores across clusters: the pods of one semaphore key in
// two clusters, each run by its own manager, take the key's slots first
// come, first served across both clusters, the first N (its slots) at a
// time, and never more than N at once.
var _ = Describe("A semaphore whose key two clusters' managers share", func() {
	// lineBound is the operator's (distributedlock lines.go): a waiter
	// ahead holds a free slot up for no longer.
	const lineBound = 6 * time.Second

	It("gives a freed slot to the other cluster's pod that came first, not to this cluster's later one", func() {
		const key, name = "two-clusters", "shared"
		By("starting cluster A's manager, and cluster B: a second API server with its own manager")
		mgrA := env.StartManager()
		DeferCleanup(mgrA.Stop)
		b := testenv.Start()
		DeferCleanup(b.Stop)
		Expect(podsim.NodeReady(suiteCtx, b.Client, "node-1", corev1.ConditionTrue)).To(Succeed(), "node node-1 of cluster B to be reported Ready")
		// Cluster B hears no release notice and tries again every 500ms
		// (well within the line's bound, for which a waiter ahead holds a
		// free slot up): without the line, cluster A's later pod, given
		// the freed slot at once, would take it first.
		mgrB := b.StartScopedManager(testenv.Scope{RetryDelay: 500 * time.Millisecond, NoReleaseNotices: true}, nil)
		DeferCleanup(mgrB.Stop)

		By("naming the same three masters in both clusters, and semaphore " + name + " of two slots of key " + key + " in each")
		msA := env.NewServingMasters(env.NewNamespace(), "shared", 3, 10*time.Second)
		msB := &testenv.MasterSet{Servers: msA.Servers, Name: "shared", NS: b.NewNamespace()}
		b.CreateMasterSet(msB, 10*time.Second)
		b.WaitServing(msB, 0)
		A, B := inCluster{k8s, msA.NS}, inCluster{b.Client, msB.NS}
		patientMasters(A.c, msA)
		patientMasters(B.c, msB)
		Expect(A.c.Create(suiteCtx, newSemaphore(msA, name, key, 2))).To(Succeed())
		Expect(B.c.Create(suiteCtx, newSemaphore(msB, name, key, 2))).To(Succeed())
		running := watchRunningIn(2, name, A, B)

		podIn := func(in inCluster, pod string) *corev1.Pod {
			p := podsim.Gated(in.ns, pod, map[string]string{v1alpha1.SemaphoreLabel: name})
			ExpectWithOffset(1, in.c.Create(suiteCtx, p)).To(Succeed())
			return p
		}
		// granted is pod p's fencing token (0: not granted, or still
		// gated: the token is written before the gate goes), and its
		// slot as its cluster shows it in cur.
		granted := func(g Gomega, in inCluster, p, cur *corev1.Pod) int64 {
			g.Expect(in.c.Get(suiteCtx, client.ObjectKeyFromObject(p), cur)).To(Succeed())
			if demo.Gated(cur) {
				return 0
			}
			token, _ := strconv.ParseInt(cur.Annotations[v1alpha1.FencingTokenAnnotation], 10, 64)
			return token
		}
		// run waits for p to be granted and ungated within the line's
		// bound and reports it running; it returns p's slot and token.
		run := func(in inCluster, p *corev1.Pod) (string, int64) {
			cur := &corev1.Pod{}
			var token int64
			EventuallyWithOffset(1, func(g Gomega) {
				token = granted(g, in, p, cur)
				g.Expect(token).To(BeNumerically(">", 0), "the fencing token of pod %s, ungated", p.Name)
			}).WithTimeout(lineBound+testenv.Timeout).Should(Succeed(), "pod %s/%s to be granted a slot of %s and ungated", p.Namespace, p.Name, key)
			ExpectWithOffset(1, podsim.Run(suiteCtx, in.c, p, "node-1")).To(Succeed())
			return cur.Annotations[v1alpha1.LockNameAnnotation], token
		}
		inLine := func(p *corev1.Pod) {
			EventuallyWithOffset(1, func(g Gomega) {
				seen, err := redistest.LineWaiters(suiteCtx, msA.Servers, redlock.LineKey(key), time.Second)
				g.Expect(err).NotTo(HaveOccurred(), "the line of %s", key)
				g.Expect(2*seen[string(p.UID)]).To(BeNumerically(">", len(msA.Servers)), "masters holding the ticket of pod %s", p.Name)
			}).WithTimeout(lineBound+testenv.Timeout).Should(Succeed(), "pod %s/%s to take a ticket in the line of %s on a majority of the masters", p.Namespace, p.Name, key)
		}

		By("pods a-1 and a-2 of cluster A taking both slots")
		a1, a2 := podIn(A, "a-1"), podIn(A, "a-2")
		slotA1, tokenA1 := run(A, a1)
		run(A, a2)

		By("pods b-1, then b-2, of cluster B finding both slots held: each takes a ticket in the semaphore's line")
		b1 := podIn(B, "b-1")
		inLine(b1)
		b2 := podIn(B, "b-2")
		inLine(b2)

		By("pod a-3 of cluster A coming last: it waits in cluster A's queue")
		a3 := podIn(A, "a-3")
		waits := testutil.ToFloat64(mgrA.Metrics.LineChecks.WithLabelValues("wait"))

		By("a-1 finishing: its slot goes to b-1, first in the line, though cluster A gives it to a-3 at once")
		Expect(podsim.Finish(suiteCtx, A.c, a1, 0)).To(Succeed())
		slotB1, tokenB1 := run(B, b1)
		Expect(slotB1).To(Equal(slotA1), "the slot b-1 took is the one a-1 gave back")
		Expect(tokenB1).To(BeNumerically(">", tokenA1), "the fencing token of slot %s across both clusters", slotA1)
		Eventually(func() float64 { return testutil.ToFloat64(mgrA.Metrics.LineChecks.WithLabelValues("wait")) }).
			Should(BeNumerically(">", waits), "a-3's slot lock in cluster A to have checked its turn and waited (redlock_lock_line_checks_total{result=wait})")

		By("a-2, then b-1, finishing: b-2 and a-3, the line's two heads now, take the slots as they free")
		Expect(podsim.Finish(suiteCtx, A.c, a2, 0)).To(Succeed())
		var first, second *corev1.Pod
		var firstIn, secondIn inCluster
		Eventually(func(g Gomega) {
			b2Token := granted(g, B, b2, &corev1.Pod{})
			a3Token := granted(g, A, a3, &corev1.Pod{})
			g.Expect(b2Token > 0 || a3Token > 0).To(BeTrue(), "b-2 or a-3 granted")
			first, firstIn, second, secondIn = b2, B, a3, A
			if a3Token > 0 {
				first, firstIn, second, secondIn = a3, A, b2, B
			}
		}).WithTimeout(lineBound+testenv.Timeout).Should(Succeed(), "the slot a-2 gave back to go to b-2 or a-3")
		run(firstIn, first)
		Expect(podsim.Finish(suiteCtx, B.c, b1, 0)).To(Succeed())
		run(secondIn, second)

		By("no more than two pods of both clusters could run at once")
		most, violations := running()
		Expect(violations).To(BeEmpty(), "moments more pods of semaphore %s than its 2 slots could run across both clusters", name)
		Expect(most).To(Equal(2), "the most pods of semaphore %s that could run at once across both clusters", name)
	})
})
