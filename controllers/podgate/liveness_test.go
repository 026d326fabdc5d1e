package podgate_test

import (
	"context"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
	"github.com/redlock-operator/redlock-operator/pkg/holding"
)

// agentPod is a pod in holder-label mode with the agent, as the webhook
// makes it.
func agentPod(ns, name, lock string) *corev1.Pod {
	p := holderLabelPod(ns, name, lock)
	p.Spec.Containers[0].Command = []string{"/app"}
	p.Annotations = map[string]string{v1alpha1.AgentAnnotation: v1alpha1.AgentRun}
	_, err := podagent.Inject(p, podagent.Options{Image: "redlock-operator:test"})
	Expect(err).NotTo(HaveOccurred())
	return p
}

// grants follows every committed version of a lock and records, per grant
// ID, the latest validity status showed for it and when it was acquired.
type grants struct {
	mu         sync.Mutex
	validUntil map[string]time.Time
	acquiredAt map[string]time.Time
}

func watchGrants(ns, name string) *grants {
	gr := &grants{validUntil: map[string]time.Time{}, acquiredAt: map[string]time.Time{}}
	wc, err := client.NewWithWatch(env.Cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	w, err := wc.Watch(suiteCtx, &v1alpha1.DistributedLockList{}, client.InNamespace(ns))
	Expect(err).NotTo(HaveOccurred())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*v1alpha1.DistributedLock)
			if !ok || ev.Type == watch.Deleted || l.Name != name || l.Status.Holder == nil || l.Status.GrantID == "" {
				continue
			}
			gr.mu.Lock()
			if vu := l.Status.ValidUntil; vu != nil && vu.After(gr.validUntil[l.Status.GrantID]) {
				gr.validUntil[l.Status.GrantID] = vu.Time
			}
			if at := l.Status.AcquiredAt; at != nil {
				gr.acquiredAt[l.Status.GrantID] = at.Time
			}
			gr.mu.Unlock()
		}
	}()
	DeferCleanup(func() { w.Stop(); <-done })
	return gr
}

func (gr *grants) of(grantID string) (validUntil, acquiredAt time.Time) {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	return gr.validUntil[grantID], gr.acquiredAt[grantID]
}

// beat plays the holder's agent: it renews the heartbeat of grantID on
// lock every interval until the returned function is called.
func beat(ns, lock, grantID string, interval time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(suiteCtx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_ = holding.Beat(ctx, k8s, client.ObjectKey{Namespace: ns, Name: lock}, grantID, time.Now())
			select {
			case <-ctx.Done():
				return
			case <-time.After(interval):
			}
		}
	}()
	return func() { cancel(); <-done }
}

var _ = Describe("Holder liveness (spec.heartbeatTimeout)", func() {
	It("keeps the lock with a holder that renews its heartbeat, gives it up once the heartbeat stops or the containers crash-loop, and grants the next pod only after the validity shown", func() {
		mgr := env.StartManager()
		DeferCleanup(mgr.Stop)
		ns := env.NewNamespace()
		ms := env.NewServingMasters(ns, "masters", 3, 4*time.Second)
		const name, timeout = "live", 6 * time.Second
		gr := watchGrants(ns, name)
		m := watchMarks(ns, name)

		By("creating lock live (ttl 3s, heartbeatTimeout 6s) and three running agent pods in holder-label mode")
		Expect(k8s.Create(suiteCtx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.DistributedLockSpec{MasterSet: ms.Name, TTL: metav1.Duration{Duration: 3 * time.Second},
				HeartbeatTimeout: &metav1.Duration{Duration: timeout}},
		})).To(Succeed())
		pods := []*corev1.Pod{agentPod(ns, "live-a", name), agentPod(ns, "live-b", name), agentPod(ns, "live-c", name)}
		for _, p := range pods {
			Expect(k8s.Create(suiteCtx, p)).To(Succeed())
			kubeletRuns(p)
		}
		// holder waits for pod i to hold the lock: a verdict comes within
		// two timeouts of the holder's last sign of life (looks come at
		// least once per timeout), the next grant after the ttl.
		holder := func(i int) *v1alpha1.DistributedLock {
			var l *v1alpha1.DistributedLock
			Eventually(func(g Gomega) {
				expectHolds(g, ns, name, pods[i])
				l = fetchLock(ns, name)
				g.Expect(heldOf(l)).To(Equal("True/Acquired"), "lock %s shows %s held", name, pods[i].Name)
			}).WithTimeout(4*timeout).Should(Succeed(), "lock %s/%s to be held by pod %s", ns, name, pods[i].Name)
			return l
		}
		first := holder(0)

		By("renewing live-a's heartbeat every second: it keeps the lock for more than twice the timeout")
		stop := beat(ns, name, first.Status.GrantID, time.Second)
		Consistently(func(g Gomega) {
			l := fetchLock(ns, name)
			g.Expect(l.Status.GrantID).To(Equal(first.Status.GrantID), "lock %s still shows live-a's grant", name)
		}, 2*timeout+time.Second, 200*time.Millisecond).Should(Succeed(), "lock %s/%s to stay with live-a on its heartbeats", ns, name)

		By("marking live-a as a deposed leader might have: the leader, counting live-a alive, takes the mark off and keeps the grant")
		Eventually(func() error {
			cur := getPod(pods[0])
			cur.Annotations[v1alpha1.UnresponsiveAnnotation] = first.Status.GrantID
			return k8s.Update(suiteCtx, cur)
		}).Should(Succeed(), "pod %s/%s to be marked unresponsive by hand", ns, pods[0].Name)
		Eventually(func() map[string]string { return getPod(pods[0]).Annotations }).WithTimeout(2*timeout).
			ShouldNot(HaveKey(v1alpha1.UnresponsiveAnnotation), "the stale mark on live-a")
		Expect(fetchLock(ns, name).Status.GrantID).To(Equal(first.Status.GrantID), "lock %s still shows live-a's grant", name)

		By("stopping live-a's heartbeat: its grant is given up, it is marked, and live-b is granted only after live-a's validity passed")
		stop()
		Eventually(func(g Gomega) {
			g.Expect(getPod(pods[0]).Annotations).To(HaveKeyWithValue(v1alpha1.UnresponsiveAnnotation, first.Status.GrantID), "pod live-a is marked unresponsive")
		}).WithTimeout(3*timeout).Should(Succeed(), "pod %s/%s to be marked unresponsive once its heartbeat stopped", ns, pods[0].Name)
		Eventually(func() []string { return env.EventReasons(ns, name) }).Should(ContainElement("HolderUnresponsive"), "lock %s/%s to get event HolderUnresponsive", ns, name)
		second := holder(1)
		stop = beat(ns, name, second.Status.GrantID, time.Second)
		DeferCleanup(stop)
		Expect(second.Status.FencingToken).To(BeNumerically(">", first.Status.FencingToken))
		shown, _ := gr.of(first.Status.GrantID)
		_, acquired := gr.of(second.Status.GrantID)
		Expect(acquired).To(BeTemporally(">", shown), "live-b acquired after the last validity shown for live-a")

		By("reporting live-b's container in CrashLoopBackOff while its heartbeat goes on: live-c, not the older marked live-a, is granted next")
		Eventually(func() error {
			cur := getPod(pods[1])
			cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "work", Image: "busybox", RestartCount: 3,
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}
			return k8s.Status().Update(suiteCtx, cur)
		}).Should(Succeed(), "pod %s/%s to be reported in CrashLoopBackOff", ns, pods[1].Name)
		third := holder(2)
		Expect(getPod(pods[1]).Annotations).To(HaveKeyWithValue(v1alpha1.UnresponsiveAnnotation, second.Status.GrantID))
		shown, _ = gr.of(second.Status.GrantID)
		_, acquired = gr.of(third.Status.GrantID)
		Expect(acquired).To(BeTemporally(">", shown), "live-c acquired after the last validity shown for live-b")
		Expect(third.Status.Queue).NotTo(BeNil())
		Expect(third.Status.Queue.Waiting).To(HaveExactElements(HaveField("Name", "live-a"), HaveField("Name", "live-b")),
			"the marked pods wait behind every other pod")

		// The holder's mark follows its grant (the pod gate sets it once
		// the grant is committed): wait for live-c's.
		Eventually(func() []string { order, _ := m.seen(); return order }).Should(Equal([]string{"live-a", "live-b", "live-c"}),
			"pods of lock %s/%s marked redlock.dev/holds, in order", ns, name)
		_, violations := m.seen()
		Expect(violations).To(BeEmpty(), "never two pods marked redlock.dev/holds at once")
	})
})

// heldOf is the Held condition of l as status/reason.
func heldOf(l *v1alpha1.DistributedLock) string {
	for _, c := range l.Status.Conditions {
		if c.Type == v1alpha1.ConditionHeld {
			return string(c.Status) + "/" + c.Reason
		}
	}
	return ""
}
