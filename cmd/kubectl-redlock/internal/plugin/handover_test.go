package plugin_test

import (
	"io"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// background runs the plugin while the spec plays the operator.
func background(s session, args ...string) <-chan result {
	done := make(chan result, 1)
	go func() {
		defer GinkgoRecover()
		done <- s.run(args...)
	}()
	return done
}

// answerAfter is a terminal's stdin on which the user types answer once
// meanwhile ran: what happens while the question is open.
func answerAfter(answer string, meanwhile func()) io.Reader {
	return &typing{answer: answer, meanwhile: meanwhile}
}

type typing struct {
	answer    string
	meanwhile func()
	done      bool
}

func (t *typing) Read(p []byte) (int, error) {
	if t.done {
		return 0, io.EOF
	}
	t.meanwhile()
	t.done = true
	return copy(p, t.answer), nil
}

// read returns the lock as the API server has it now.
func read(l *v1alpha1.DistributedLock) *v1alpha1.DistributedLock {
	fresh := &v1alpha1.DistributedLock{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(l), fresh)).To(Succeed())
	return fresh
}

// staticLock creates a lock reserved for the static holder identity and
// granted to it, with pods waiting.
func staticLock(ns, name, identity string, waiting ...string) *v1alpha1.DistributedLock {
	l := newLock(ns, name, func(s *v1alpha1.DistributedLockSpec) { s.HolderIdentity = identity })
	var pods []*corev1.Pod
	for _, w := range waiting {
		pods = append(pods, waitingPod(ns, w, name))
	}
	writeStatus(l, func(st *v1alpha1.DistributedLockStatus) {
		grant(st, identity, nil, "grant-"+identity, 100, 30*time.Second)
		queue(st, pods...)
	})
	return l
}

var _ = Describe("kubectl redlock handover", func() {
	var ns string
	BeforeEach(func() { ns = namespace("") })

	It("clears a static holder's spec.holderIdentity, never status, and prints the next grant once status shows it", func() {
		lock := staticLock(ns, "backup", "backup-script", "restore-0")
		restore := &corev1.Pod{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "restore-0"}, restore)).To(Succeed())
		statusBefore := read(lock).Status

		done := background(session{}, "handover", "backup", "-n", ns, "--yes")
		By("seeing spec.holderIdentity cleared while status still shows the static grant")
		Eventually(func() string { return read(lock).Spec.HolderIdentity }).Should(BeEmpty(), "spec.holderIdentity of lock %s/backup", ns)
		Expect(read(lock).Status).To(Equal(statusBefore), "the plugin wrote nothing into the status of lock %s/backup", ns)
		Consistently(done).WithTimeout(300*time.Millisecond).ShouldNot(Receive(), "the handover of lock %s/backup waits for the next grant", ns)

		By("playing the operator: granting restore-0")
		writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) {
			grant(st, restore.Name, restore, "grant-restore", 101, 30*time.Second)
			queue(st)
		})
		var r result
		Eventually(done).Should(Receive(&r), "the handover of lock %s/backup returns", ns)
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(HavePrefix(`lock ` + ns + `/backup: spec.holderIdentity "backup-script" cleared.` + "\n"))
		Expect(r.out).To(ContainSubstring("lock " + ns + "/backup handed over: held by pod/restore-0 with fencing token 101 (grant grant-restore, valid for "))
	})

	It("evicts a holder pod through the Eviction API, and prints the next grant once status shows it", func() {
		lock := newLock(ns, "jobs", nil)
		holder := holderPod(ns, "job-a", "jobs", 200)
		next := waitingPod(ns, "job-b", "jobs")
		writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) {
			grant(st, holder.Name, holder, "grant-a", 200, 30*time.Second)
			queue(st, next)
		})
		statusBefore := read(lock).Status

		done := background(session{}, "handover", "jobs", "-n", ns, "--yes")
		By("seeing the holder pod evicted: on a node, it is deleted gracefully, so it is Terminating")
		Eventually(podState(ns, holder.Name, holder.UID)).Should(Equal("terminating"), "pod %s/job-a evicted", ns)
		Expect(read(lock).Status).To(Equal(statusBefore), "the plugin wrote nothing into the status of lock %s/jobs", ns)
		Expect(read(lock).Spec.HolderIdentity).To(BeEmpty())

		By("playing the operator: granting job-b")
		writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) {
			grant(st, next.Name, next, "grant-b", 201, 30*time.Second)
			queue(st)
		})
		var r result
		Eventually(done).Should(Receive(&r), "the handover of lock %s/jobs returns", ns)
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(HavePrefix("pod/job-a evicted (the Eviction API accepted it).\n"))
		Expect(r.out).To(ContainSubstring("handed over: held by pod/job-b with fencing token 201"))
	})

	It("reports a PodDisruptionBudget that forbids the eviction, and leaves the pod and the lock alone", func() {
		lock := newLock(ns, "jobs", nil)
		holder := holderPod(ns, "job-a", "jobs", 300)
		writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) {
			grant(st, holder.Name, holder, "grant-a", 300, 30*time.Second)
		})
		one := intstr.FromInt32(1)
		pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "jobs"},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "jobs"}}}}
		Expect(k8s.Create(ctx, pdb)).To(Succeed())
		By("writing the budget's status as the disruption controller would: no disruption allowed")
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
		Expect(k8s.Status().Update(ctx, pdb)).To(Succeed())

		r := kubectlRedlock("handover", "jobs", "-n", ns, "--yes")
		Expect(r.err).To(MatchError(And(
			ContainSubstring("eviction of holder pod "+ns+"/job-a refused by a PodDisruptionBudget"),
			ContainSubstring("The disruption budget jobs needs 1 healthy pods and has 1 currently"),
			ContainSubstring("the lock stays with the pod"))))
		Expect(r.out).To(BeEmpty(), "nothing was done, so nothing is reported done")
		Expect(podState(ns, holder.Name, holder.UID)()).To(Equal("present"))
		Expect(read(lock).Status.GrantID).To(Equal("grant-a"))
	})

	It("says the lock was released when no pod waits for it", func() {
		lock := newLock(ns, "solo", nil)
		holder := holderPod(ns, "solo-0", "solo", 400)
		writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) {
			grant(st, holder.Name, holder, "grant-solo", 400, 30*time.Second)
		})

		done := background(session{}, "handover", "solo", "-n", ns, "--yes")
		Eventually(podState(ns, holder.Name, holder.UID)).Should(Equal("terminating"), "pod %s/solo-0 evicted", ns)
		By("playing the operator: releasing the grant once the holder stopped")
		writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) { st.Holder, st.ValidUntil = nil, nil })
		var r result
		Eventually(done).Should(Receive(&r), "the handover of lock %s/solo returns", ns)
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(HaveSuffix("lock " + ns + "/solo released: no pod waits for it.\n"))
	})

	It("asks for confirmation: 'n' leaves the lock alone, no terminal and no --yes is refused, 'y' goes ahead", func() {
		lock := staticLock(ns, "backup", "backup-script")

		By("answering n")
		r := session{stdin: strings.NewReader("n\n"), terminal: true}.run("handover", "backup", "-n", ns)
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(Equal("hand over lock " + ns + "/backup held by backup-script? [y/N] Handover cancelled: lock " + ns + "/backup stays with backup-script.\n"))
		Expect(read(lock).Spec.HolderIdentity).To(Equal("backup-script"))

		By("giving no terminal and no --yes")
		r = session{stdin: strings.NewReader("y\n")}.run("handover", "backup", "-n", ns)
		Expect(r.err).To(MatchError(ContainSubstring("refusing to hand over lock " + ns + "/backup held by backup-script: stdin is not a terminal to confirm on; pass --yes")))
		Expect(r.out).To(BeEmpty(), "no question asked")
		Expect(read(lock).Spec.HolderIdentity).To(Equal("backup-script"))

		By("answering y, without waiting (--timeout 0)")
		r = session{stdin: strings.NewReader("y\n"), terminal: true}.run("handover", "backup", "-n", ns, "--timeout", "0")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(HaveSuffix(`lock ` + ns + `/backup: spec.holderIdentity "backup-script" cleared.` + "\n"))
		Expect(read(lock).Spec.HolderIdentity).To(BeEmpty())
	})

	It("acts only on the grant that was confirmed: a lock that moved on while the question was open is left alone, a status refresh is no change", func() {
		lock := newLock(ns, "jobs", nil)
		holder := holderPod(ns, "job-a", "jobs", 300)
		next := holderPod(ns, "job-b", "jobs", 301)
		writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) {
			grant(st, holder.Name, holder, "grant-a", 300, 30*time.Second)
		})

		By("granting job-b while the question is open, then answering y")
		moved := answerAfter("y\n", func() {
			writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) { grant(st, next.Name, next, "grant-b", 301, 30*time.Second) })
		})
		r := session{stdin: moved, terminal: true}.run("handover", "jobs", "-n", ns, "--timeout", "0")
		Expect(r.err).To(MatchError(ContainSubstring("lock " + ns + "/jobs changed while you were asked (now held by pod/job-b, token 301); nothing done")))
		for _, p := range []*corev1.Pod{holder, next} {
			cur := &corev1.Pod{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(p), cur)).To(Succeed())
			Expect(cur.DeletionTimestamp).To(BeNil(), "pod %s not evicted", p.Name)
		}

		By("refreshing the validity of job-b's grant while the question is open, then answering y: job-b is evicted")
		refreshed := answerAfter("y\n", func() {
			writeStatus(lock, func(st *v1alpha1.DistributedLockStatus) { grant(st, next.Name, next, "grant-b", 301, 40*time.Second) })
		})
		r = session{stdin: refreshed, terminal: true}.run("handover", "jobs", "-n", ns, "--timeout", "0")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(HaveSuffix("pod/job-b evicted (the Eviction API accepted it).\n"))
	})

	It("fails after --timeout when no next grant comes, saying what status shows", func() {
		staticLock(ns, "backup", "backup-script", "restore-0")
		r := kubectlRedlock("handover", "backup", "-n", ns, "--yes", "--timeout", "1s")
		Expect(r.err).To(MatchError(MatchRegexp(`^no next grant of lock ` + ns + `/backup within 1s: status shows it held by backup-script with fencing token 100 \(grant grant-backup-script, valid for \d+s\)`)))
	})

	It("refuses a lock nobody holds and one that does not exist", func() {
		newLock(ns, "idle", nil)
		r := kubectlRedlock("handover", "idle", "-n", ns, "--yes")
		Expect(r.err).To(MatchError("lock " + ns + "/idle is not held (status shows no holder): nothing to hand over"))
		r = kubectlRedlock("handover", "nope", "-n", ns, "--yes")
		Expect(r.err).To(MatchError(ContainSubstring(`DistributedLock "nope" not found in namespace ` + ns)))
	})
})
