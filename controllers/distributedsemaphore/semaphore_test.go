package distributedsemaphore_test

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/podsim"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

// newSemaphore is a semaphore with a 2s ttl, so that a lost holder's slot
// passes on quickly.
func newSemaphore(ms *testenv.MasterSet, name, key string, slots int32) *v1alpha1.DistributedSemaphore {
	return &v1alpha1.DistributedSemaphore{
		ObjectMeta: metav1.ObjectMeta{Namespace: ms.NS, Name: name},
		Spec: v1alpha1.DistributedSemaphoreSpec{
			MasterSet: ms.Name, Key: key, Slots: slots, TTL: metav1.Duration{Duration: 2 * time.Second},
		},
	}
}

func fetchSemaphore(s *v1alpha1.DistributedSemaphore) *v1alpha1.DistributedSemaphore {
	out := &v1alpha1.DistributedSemaphore{}
	Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(s), out)).To(Succeed())
	return out
}

func getPod(p *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{}
	Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(p), out)).To(Succeed())
	return out
}

// semPods creates n gated pods labelled for the semaphore sem, named
// <prefix>-1 … <prefix>-n (first come, first served is then their order).
func semPods(ns, sem, prefix string, n int) []*corev1.Pod {
	var pods []*corev1.Pod
	for i := 1; i <= n; i++ {
		p := podsim.Gated(ns, fmt.Sprintf("%s-%d", prefix, i), map[string]string{v1alpha1.SemaphoreLabel: sem})
		Expect(k8s.Create(suiteCtx, p)).To(Succeed())
		pods = append(pods, p)
	}
	return pods
}

// ungated returns the names of pods no longer gated, sorted.
func ungated(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		if !demo.Gated(getPod(p)) {
			out = append(out, p.Name)
		}
	}
	slices.Sort(out)
	return out
}

// watchRunning polls the pods labelled for sem in ns until the spec ends
// and returns a function that reports the most that could run at once,
// and every moment more than limit could.
func watchRunning(ns, sem string, limit int) func() (int, []string) {
	return watchRunningIn(limit, sem, inCluster{k8s, ns})
}

// inCluster is a namespace of one cluster's API server.
type inCluster struct {
	c  client.Client
	ns string
}

// watchRunningIn is watchRunning over the pods of sem in every namespace
// of ins (clusters sharing the semaphore's key), counted together.
func watchRunningIn(limit int, sem string, ins ...inCluster) func() (int, []string) {
	var mu sync.Mutex
	most, violations := 0, []string{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			var running []string
			listed := true
			for _, in := range ins {
				var list corev1.PodList
				if err := in.c.List(suiteCtx, &list, client.InNamespace(in.ns), client.MatchingLabels{v1alpha1.SemaphoreLabel: sem}); err != nil {
					listed = false
					break
				}
				for i := range list.Items {
					if demo.MayRun(&list.Items[i]) {
						running = append(running, list.Items[i].Name)
					}
				}
			}
			if listed {
				mu.Lock()
				most = max(most, len(running))
				if len(running) > limit {
					violations = append(violations, fmt.Sprintf("%s: %v may run", time.Now().Format(time.RFC3339Nano), running))
				}
				mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	stop := sync.OnceFunc(func() { close(done); wg.Wait() })
	DeferCleanup(stop)
	return func() (int, []string) {
		stop()
		mu.Lock()
		defer mu.Unlock()
		return most, violations
	}
}

// tokenOf reads the fencing token and the slot's lock the operator wrote
// on a granted pod.
func tokenOf(p *corev1.Pod) (lock string, token int64) {
	cur := getPod(p)
	token, _ = strconv.ParseInt(cur.Annotations[v1alpha1.FencingTokenAnnotation], 10, 64)
	return cur.Annotations[v1alpha1.LockNameAnnotation], token
}

// holdingOne creates a semaphore of one slot and a pod given it, reported
// running.
func holdingOne(ms *testenv.MasterSet, name string) (*v1alpha1.DistributedSemaphore, *corev1.Pod) {
	sem := newSemaphore(ms, name, "", 1)
	Expect(k8s.Create(suiteCtx, sem)).To(Succeed())
	holder := semPods(ms.NS, name, name, 1)[0]
	Eventually(func() bool { return !demo.Gated(getPod(holder)) }).WithTimeout(20*time.Second).Should(BeTrue(), "pod %s to be given the slot of semaphore %s", holder.Name, name)
	Expect(podsim.Run(suiteCtx, k8s, holder, "node-1")).To(Succeed())
	return sem, holder
}

func semCondition(s *v1alpha1.DistributedSemaphore, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(s.Status.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

var _ = Describe("DistributedSemaphore", Ordered, func() {
	var (
		mgr *testenv.Manager
		ns  string
		ms  *testenv.MasterSet
	)
	BeforeAll(func() {
		mgr = env.StartManager()
		ns = env.NewNamespace()
		ms = env.NewServingMasters(ns, "masters", 3, 4*time.Second)
	})
	AfterAll(func() { mgr.Stop() })

	It("runs at most its number of pods at once, first come first served, each with a token of its slot", func() {
		sem := newSemaphore(ms, "batch", "", 2)
		Expect(k8s.Create(suiteCtx, sem)).To(Succeed())
		watch := watchRunning(ns, "batch", 2)
		pods := semPods(ns, "batch", "job", 5)

		By("ungating job-1 and job-2, each with its own slot's lock and token")
		Eventually(func() []string { return ungated(pods) }).WithTimeout(20*time.Second).Should(Equal([]string{"job-1", "job-2"}), "the first two pods of semaphore %s/batch to be ungated", ns)
		tokens := map[string]int64{}  // slot lock → last token
		slotOf := map[string]string{} // pod → slot lock
		for _, p := range pods[:2] {
			lock, token := tokenOf(p)
			Expect(lock).To(HavePrefix("batch-2-"), "pod %s's slot lock", p.Name)
			Expect(token).To(BeNumerically(">", 0), "pod %s's token", p.Name)
			Expect(tokens).NotTo(HaveKey(lock), "pod %s shares slot %s", p.Name, lock)
			tokens[lock], slotOf[p.Name] = token, lock
			Expect(podsim.Run(suiteCtx, k8s, p, "node-1")).To(Succeed())
		}
		Eventually(func(g Gomega) {
			st := fetchSemaphore(sem).Status
			g.Expect(st.Held).To(Equal(int32(2)), "held")
			g.Expect(st.Holders).To(HaveLen(2), "holders")
			g.Expect(st.Queue).NotTo(BeNil(), "queue")
			g.Expect(st.Queue.Count).To(Equal(int32(3)), "waiting")
			g.Expect(st.Queue.Waiting[0].Name).To(Equal("job-3"), "first in line")
			g.Expect(semCondition(fetchSemaphore(sem), v1alpha1.ConditionReady).Status).To(Equal(metav1.ConditionTrue), "Ready")
		}).Should(Succeed(), "semaphore %s/batch to show its two holders and three waiting pods", ns)
		Consistently(func() []string { return ungated(pods) }).WithTimeout(time.Second).Should(Equal([]string{"job-1", "job-2"}), "the other pods of semaphore %s/batch to stay gated", ns)

		By("passing each finished pod's slot to the next pod in line, with a greater token of that slot")
		for i, next := range pods[2:] {
			done := pods[i]
			Expect(podsim.Finish(suiteCtx, k8s, done, 0)).To(Succeed())
			Eventually(func() bool { return !demo.Gated(getPod(next)) }).WithTimeout(20*time.Second).Should(BeTrue(), "pod %s to be ungated once %s finished", next.Name, done.Name)
			lock, token := tokenOf(next)
			Expect(lock).To(Equal(slotOf[done.Name]), "pod %s takes the slot %s freed", next.Name, done.Name)
			Expect(token).To(BeNumerically(">", tokens[lock]), "pod %s's token of slot %s", next.Name, lock)
			tokens[lock], slotOf[next.Name] = token, lock
			Expect(podsim.Run(suiteCtx, k8s, next, "node-1")).To(Succeed())
		}
		for _, p := range pods[3:] {
			Expect(podsim.Finish(suiteCtx, k8s, p, 0)).To(Succeed())
		}
		Eventually(func(g Gomega) {
			st := fetchSemaphore(sem).Status
			g.Expect(st.Held).To(BeZero(), "held")
			g.Expect(st.Queue).To(BeNil(), "queue")
		}).WithTimeout(20*time.Second).Should(Succeed(), "semaphore %s/batch to show nobody holding or waiting", ns)
		most, violations := watch()
		Expect(violations).To(BeEmpty(), "moments more than 2 pods of semaphore %s/batch could run", ns)
		Expect(most).To(Equal(2), "the most pods of semaphore %s/batch that ran at once", ns)
	})

	It("refuses a semaphore of the same key that declares another number while a slot is held, and serves it after", func() {
		first := newSemaphore(ms, "two", "shared-sem", 2)
		second := newSemaphore(ms, "three", "shared-sem", 3)
		Expect(k8s.Create(suiteCtx, first)).To(Succeed())
		Expect(k8s.Create(suiteCtx, second)).To(Succeed())
		holder := semPods(ns, "two", "two", 1)[0]
		Eventually(func() bool { return !demo.Gated(getPod(holder)) }).WithTimeout(20*time.Second).Should(BeTrue(), "pod %s of semaphore %s/two to be ungated", holder.Name, ns)
		Expect(podsim.Run(suiteCtx, k8s, holder, "node-1")).To(Succeed())

		By("showing the conflict on the second semaphore and keeping its pod gated")
		waiter := semPods(ns, "three", "three", 1)[0]
		Eventually(func(g Gomega) {
			c := semCondition(fetchSemaphore(second), v1alpha1.ConditionReady)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse), "Ready")
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonSlotsConflict), "reason")
			g.Expect(c.Message).To(ContainSubstring("declared with 2 slots"), "message")
		}).WithTimeout(20*time.Second).Should(Succeed(), "semaphore %s/three to show that the masters store 2 slots", ns)
		Consistently(func() bool { return demo.Gated(getPod(waiter)) }).WithTimeout(2*time.Second).Should(BeTrue(), "pod %s of semaphore %s/three to stay gated", waiter.Name, ns)

		By("granting it once the other number's holder finished")
		Expect(podsim.Finish(suiteCtx, k8s, holder, 0)).To(Succeed())
		Eventually(func() bool { return !demo.Gated(getPod(waiter)) }).WithTimeout(30*time.Second).Should(BeTrue(), "pod %s of semaphore %s/three to be ungated", waiter.Name, ns)
		Eventually(func() string { return semCondition(fetchSemaphore(second), v1alpha1.ConditionReady).Reason }).Should(Equal(v1alpha1.ReasonValid), "semaphore %s/three to be Ready", ns)
		Expect(podsim.Finish(suiteCtx, k8s, waiter, 0)).To(Succeed())
	})

	It("refuses a semaphore whose key a DistributedLock holds, and the lock while the semaphore holds: a key is one kind", func() {
		staticLock := func(name string) *v1alpha1.DistributedLock {
			return &v1alpha1.DistributedLock{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: v1alpha1.DistributedLockSpec{
					MasterSet: ms.Name, Key: "one-kind", TTL: metav1.Duration{Duration: 2 * time.Second}, HolderIdentity: "static",
				},
			}
		}
		heldCondition := func(l *v1alpha1.DistributedLock) metav1.Condition {
			cur := &v1alpha1.DistributedLock{}
			Expect(k8s.Get(suiteCtx, client.ObjectKeyFromObject(l), cur)).To(Succeed())
			if c := meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionHeld); c != nil {
				return *c
			}
			return metav1.Condition{}
		}
		lock := staticLock("kind-lock")
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		Eventually(func() metav1.ConditionStatus { return heldCondition(lock).Status }).WithTimeout(20*time.Second).
			Should(Equal(metav1.ConditionTrue), "lock %s/kind-lock to hold key one-kind", ns)

		By("showing KeyKindConflict on a semaphore of the held lock's key, and granting it nobody")
		sem := newSemaphore(ms, "kind-sem", "one-kind", 1)
		Expect(k8s.Create(suiteCtx, sem)).To(Succeed())
		pod := semPods(ns, "kind-sem", "kind", 1)[0]
		Eventually(func(g Gomega) {
			cur := fetchSemaphore(sem)
			c := semCondition(cur, v1alpha1.ConditionReady)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse), "Ready")
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonKeyKindConflict), "reason")
			g.Expect(c.Message).To(And(ContainSubstring("a key is one kind"), ContainSubstring("delete that lock")), "message")
			g.Expect(cur.Status.Held).To(BeZero(), "held")
		}).WithTimeout(20*time.Second).Should(Succeed(), "semaphore %s/kind-sem to show that a lock holds its key", ns)
		Consistently(func() bool { return demo.Gated(getPod(pod)) }).WithTimeout(2*time.Second).Should(BeTrue(), "pod %s of semaphore %s/kind-sem to stay gated", pod.Name, ns)

		By("granting the semaphore once the lock is deleted")
		Expect(k8s.Delete(suiteCtx, lock)).To(Succeed())
		Eventually(func() bool { return !demo.Gated(getPod(pod)) }).WithTimeout(30*time.Second).Should(BeTrue(), "pod %s of semaphore %s/kind-sem to be ungated once lock kind-lock is gone", pod.Name, ns)
		Expect(podsim.Run(suiteCtx, k8s, pod, "node-1")).To(Succeed())
		Eventually(func(g Gomega) {
			cur := fetchSemaphore(sem)
			g.Expect(semCondition(cur, v1alpha1.ConditionReady).Reason).To(Equal(v1alpha1.ReasonValid), "Ready")
			g.Expect(cur.Status.Held).To(Equal(int32(1)), "held")
		}).Should(Succeed(), "semaphore %s/kind-sem to be Ready and show its holder", ns)

		By("refusing a lock of the key while the semaphore holds it, and granting it once the holder finished")
		again := staticLock("kind-lock-again")
		Expect(k8s.Create(suiteCtx, again)).To(Succeed())
		Eventually(func(g Gomega) {
			c := heldCondition(again)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse), "Held")
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonKeyKindConflict), "reason")
			g.Expect(c.Message).To(And(ContainSubstring("a key is one kind"), ContainSubstring("delete that semaphore")), "message")
		}).WithTimeout(20*time.Second).Should(Succeed(), "lock %s/kind-lock-again to show that a semaphore holds its key", ns)
		Expect(podsim.Finish(suiteCtx, k8s, pod, 0)).To(Succeed())
		Eventually(func() metav1.ConditionStatus { return heldCondition(again).Status }).WithTimeout(30*time.Second).
			Should(Equal(metav1.ConditionTrue), "lock %s/kind-lock-again to hold key one-kind once the semaphore's holder finished", ns)
		Expect(k8s.Delete(suiteCtx, again)).To(Succeed())
	})

	It("applies a new number once the holders of the previous one finished, granting nobody new meanwhile", func() {
		sem := newSemaphore(ms, "resized", "", 1)
		Expect(k8s.Create(suiteCtx, sem)).To(Succeed())
		pods := semPods(ns, "resized", "rs", 3)
		Eventually(func() []string { return ungated(pods) }).WithTimeout(20*time.Second).Should(Equal([]string{"rs-1"}), "pod rs-1 of semaphore %s/resized to be ungated", ns)
		Expect(podsim.Run(suiteCtx, k8s, pods[0], "node-1")).To(Succeed())

		By("raising the number to 2: Resizing until rs-1 finishes, rs-2 still gated")
		cur := fetchSemaphore(sem)
		cur.Spec.Slots = 2
		Expect(k8s.Update(suiteCtx, cur)).To(Succeed())
		Eventually(func(g Gomega) {
			c := semCondition(fetchSemaphore(sem), v1alpha1.ConditionResizing)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "Resizing")
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonDraining), "reason")
		}).Should(Succeed(), "semaphore %s/resized to be draining", ns)
		Consistently(func() []string { return ungated(pods) }).WithTimeout(2*time.Second).Should(Equal([]string{"rs-1"}), "pods of semaphore %s/resized other than rs-1 to stay gated while it drains", ns)

		By("serving two at once after rs-1 finished, on the new slots")
		Expect(podsim.Finish(suiteCtx, k8s, pods[0], 0)).To(Succeed())
		Eventually(func() []string { return ungated(pods) }).WithTimeout(30*time.Second).Should(Equal([]string{"rs-1", "rs-2", "rs-3"}), "pods rs-2 and rs-3 of semaphore %s/resized to be ungated", ns)
		for _, p := range pods[1:] {
			lock, _ := tokenOf(p)
			Expect(lock).To(HavePrefix("resized-2-"), "pod %s's slot", p.Name)
		}
		Eventually(func(g Gomega) {
			s := fetchSemaphore(sem)
			g.Expect(semCondition(s, v1alpha1.ConditionResizing).Status).To(Equal(metav1.ConditionFalse), "Resizing")
			g.Expect(s.Status.Slots).To(Equal(int32(2)), "slots")
			var locks v1alpha1.DistributedLockList
			g.Expect(k8s.List(suiteCtx, &locks, client.InNamespace(ns), client.MatchingLabels{v1alpha1.SemaphoreLabel: "resized"})).To(Succeed())
			var names []string
			for _, l := range locks.Items {
				names = append(names, l.Name)
			}
			g.Expect(names).To(ConsistOf("resized-2-0", "resized-2-1"), "slots' locks")
		}).WithTimeout(20*time.Second).Should(Succeed(), "semaphore %s/resized to have resized to 2", ns)
	})

	It("gives slots to allowed pods only, higher priority first, and tells the others", func() {
		sem := newSemaphore(ms, "ranked", "", 1)
		sem.Spec.AllowedHolders = &v1alpha1.AllowedHolders{ServiceAccounts: []string{"app"}}
		Expect(k8s.Create(suiteCtx, sem)).To(Succeed())
		mk := func(name, sa, priority string) *corev1.Pod {
			p := podsim.Gated(ns, name, map[string]string{v1alpha1.SemaphoreLabel: "ranked"})
			p.Spec.ServiceAccountName = sa
			if priority != "" {
				p.Annotations = map[string]string{v1alpha1.PriorityAnnotation: priority}
			}
			Expect(k8s.Create(suiteCtx, p)).To(Succeed())
			return p
		}
		intruder := mk("ranked-intruder", "other", "100") // first, and of the highest priority
		first := mk("ranked-first", "app", "")
		By("giving the slot to the allowed pod and telling the other with a condition and an event")
		Eventually(func() []string { return ungated([]*corev1.Pod{intruder, first}) }).WithTimeout(20*time.Second).Should(Equal([]string{"ranked-first"}), "semaphore %s/ranked to grant ranked-first", ns)
		Expect(podsim.Run(suiteCtx, k8s, first, "node-1")).To(Succeed())
		Eventually(func(g Gomega) {
			var c *corev1.PodCondition
			for _, pc := range getPod(intruder).Status.Conditions {
				if string(pc.Type) == v1alpha1.ConditionHolderNotAllowed {
					c = &pc
				}
			}
			g.Expect(c).NotTo(BeNil(), "condition %s", v1alpha1.ConditionHolderNotAllowed)
			g.Expect(c.Status).To(Equal(corev1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonServiceAccountNotAllowed))
			g.Expect(env.EventReasons(ns, intruder.Name)).To(ContainElement(v1alpha1.ReasonServiceAccountNotAllowed), "events of pod %s", intruder.Name)
		}).Should(Succeed(), "pod %s/ranked-intruder to be told semaphore ranked never grants it", ns)

		By("queueing the allowed pods by priority, then first come first served")
		low := mk("ranked-low", "app", "")
		high := mk("ranked-high", "app", "10")
		Eventually(func(g Gomega) {
			q := fetchSemaphore(sem).Status.Queue
			g.Expect(q).NotTo(BeNil())
			g.Expect(q.Waiting).To(HaveLen(2))
			g.Expect(q.Waiting[0].Name).To(Equal("ranked-high"))
			g.Expect(q.Waiting[0].Priority).To(Equal(int32(10)))
			g.Expect(q.Waiting[1].Name).To(Equal("ranked-low"))
		}).Should(Succeed(), "semaphore %s/ranked to queue ranked-high before ranked-low, and not ranked-intruder", ns)
		for _, step := range []struct{ done, next *corev1.Pod }{{first, high}, {high, low}} {
			Expect(podsim.Finish(suiteCtx, k8s, step.done, 0)).To(Succeed())
			Eventually(func() bool { return !demo.Gated(getPod(step.next)) }).WithTimeout(20*time.Second).Should(BeTrue(), "pod %s to be given the slot after %s", step.next.Name, step.done.Name)
			Expect(podsim.Run(suiteCtx, k8s, step.next, "node-1")).To(Succeed())
		}
		Expect(podsim.Finish(suiteCtx, k8s, low, 0)).To(Succeed())
		Eventually(func() int32 { return fetchSemaphore(sem).Status.Held }).WithTimeout(20*time.Second).Should(BeZero(), "semaphore %s/ranked to be free", ns)
		Consistently(func() bool { return demo.Gated(getPod(intruder)) }, 2*time.Second).Should(BeTrue(), "pod %s/ranked-intruder to stay gated with the slot free", ns)
	})

	It("sets a pod that waited for a slot past its annotation's limit Failed, with the condition", func() {
		sem, holder := holdingOne(ms, "brief")
		waiter := podsim.Gated(ns, "brief-waiter", map[string]string{v1alpha1.SemaphoreLabel: "brief"})
		waiter.Annotations = map[string]string{v1alpha1.WaitTimeoutAnnotation: "2s", v1alpha1.OnWaitTimeoutAnnotation: "Fail"}
		Expect(k8s.Create(suiteCtx, waiter)).To(Succeed())
		Eventually(func(g Gomega) {
			cur := getPod(waiter)
			g.Expect(cur.Status.Phase).To(Equal(corev1.PodFailed), "phase")
			var found bool
			for _, c := range cur.Status.Conditions {
				if string(c.Type) == v1alpha1.ConditionLockWaitTimeout && c.Status == corev1.ConditionTrue {
					found = true
				}
			}
			g.Expect(found).To(BeTrue(), "condition %s True", v1alpha1.ConditionLockWaitTimeout)
			g.Expect(cur.Labels).NotTo(HaveKey(v1alpha1.LockLabel), "given no slot")
		}).WithTimeout(20*time.Second).Should(Succeed(), "pod %s/brief-waiter to be Failed past its 2s wait for a slot", ns)
		Expect(podsim.Finish(suiteCtx, k8s, holder, 0)).To(Succeed())
		Eventually(func() int32 { return fetchSemaphore(sem).Status.Held }).WithTimeout(20*time.Second).Should(BeZero(), "semaphore %s/brief to be free", ns)
		Consistently(func() string { return getPod(waiter).Labels[v1alpha1.LockLabel] }, time.Second).Should(BeEmpty(), "the failed pod is given no slot")
	})

	It("puts its holders back when another writer overwrote its status from an old view", func() {
		sem, holder := holdingOne(ms, "restored")
		_, token := tokenOf(holder)
		Eventually(func(g Gomega) {
			st := fetchSemaphore(sem).Status
			g.Expect(st.Holders).To(HaveLen(1), "holders")
			g.Expect(st.Holders[0].FencingToken).To(Equal(token), "the holder's token")
		}).WithTimeout(20*time.Second).Should(Succeed(), "semaphore %s/restored to show %s holding", ns, holder.Name)

		By("writing the status a paused, deposed leader computed before the grant: nobody holding")
		cur := fetchSemaphore(sem)
		stale := cur.DeepCopy()
		stale.Status.Held, stale.Status.Holders = 0, nil
		Expect(k8s.Status().Patch(suiteCtx, stale, client.MergeFrom(cur))).To(Succeed())
		Eventually(func(g Gomega) {
			st := fetchSemaphore(sem).Status
			g.Expect(st.Held).To(Equal(int32(1)), "held")
			g.Expect(st.Holders).To(HaveLen(1), "holders")
			g.Expect(st.Holders[0].FencingToken).To(Equal(token), "the holder's token")
		}).WithTimeout(20*time.Second).Should(Succeed(), "semaphore %s/restored to show %s holding again", ns, holder.Name)
		Expect(podsim.Finish(suiteCtx, k8s, holder, 0)).To(Succeed())
	})

	It("puts its label back on a slot's lock a user removed it from, and keeps showing the slot's holder", func() {
		sem, holder := holdingOne(ms, "relabelled")
		slotName, _ := tokenOf(holder)

		By("removing the label redlock.dev/semaphore from the slot's lock " + slotName)
		Eventually(func() error {
			l := &v1alpha1.DistributedLock{}
			if err := k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: slotName}, l); err != nil {
				return err
			}
			delete(l.Labels, v1alpha1.SemaphoreLabel)
			return k8s.Update(suiteCtx, l)
		}).Should(Succeed(), "removing the label from lock %s/%s", ns, slotName)
		Eventually(func(g Gomega) {
			l := &v1alpha1.DistributedLock{}
			g.Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: slotName}, l)).To(Succeed())
			g.Expect(l.Labels).To(HaveKeyWithValue(v1alpha1.SemaphoreLabel, "relabelled"), "the slot's label")
			st := fetchSemaphore(sem).Status
			g.Expect(st.Holders).To(HaveLen(1), "holders")
			g.Expect(st.Holders[0].Holder.Identity).To(Equal(holder.Name), "the holder")
			g.Expect(semCondition(fetchSemaphore(sem), v1alpha1.ConditionReady).Status).To(Equal(metav1.ConditionTrue), "Ready")
		}).WithTimeout(20*time.Second).Should(Succeed(), "lock %s/%s to be labelled for semaphore relabelled again, %s its holder", ns, slotName, holder.Name)
		Expect(podsim.Finish(suiteCtx, k8s, holder, 0)).To(Succeed())
	})
})
