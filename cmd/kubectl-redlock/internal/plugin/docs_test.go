package plugin_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/cmd/kubectl-redlock/internal/report"
)

// The page docs/tasks/kubectl-plugin.md shows each command with its output
// in blocks marked <!-- sample: NAME -->:
//
//	```console
//	$ kubectl redlock ARGS…
//	OUTPUT
//	```
//
// The spec below builds the cluster the page describes, runs every sample's
// command, in page order, and compares what it printed with the page, the
// times (ages, validities, timestamps) and the column padding aside. Run
// with REDLOCK_UPDATE_DOCS=1 to write the outputs into the page instead.

// docPage is the page, relative to this package.
const docPage = "docs/tasks/kubectl-plugin.md"

var sampleBlock = regexp.MustCompile("(?s)(<!-- sample: ([a-z0-9-]+) -->\n```console\n\\$ kubectl redlock ([^\n]*)\n)(.*?)(```)")

var (
	timestamps = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	durations  = regexp.MustCompile(`\b\d+(ms|s|m|h|d|y)(\d+(ms|s|m|h))*\b`)
	blanks     = regexp.MustCompile(`[ \t]+`)
)

// normalized is out without what changes from run to run: times, and the
// padding of table columns that follows their width.
func normalized(out string) string {
	out = timestamps.ReplaceAllString(out, "<time>")
	out = durations.ReplaceAllString(out, "<duration>")
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(blanks.ReplaceAllString(l, " "))
	}
	return strings.Join(lines, "\n")
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "..")
}

var _ = Describe("The kubectl-plugin page", Ordered, func() {
	var (
		shop, billing                    string
		holder, next, third, indexer     *corev1.Pod
		migrations, nightly, searchIndex *v1alpha1.DistributedLock
		reportPod                        *corev1.Pod
		page                             []byte
		update                           = os.Getenv("REDLOCK_UPDATE_DOCS") == "1"
	)

	BeforeAll(func() {
		var err error
		page, err = os.ReadFile(filepath.Join(repoRoot(), docPage))
		Expect(err).NotTo(HaveOccurred())

		By("creating namespaces shop and billing")
		shop, billing = namespace("shop"), namespace("billing")

		By("creating lock shop/migrations, held by pod migrate-7f9c2, with two pods waiting behind their scheduling gates")
		migrations = newLock(shop, "migrations", nil)
		holder = holderPod(shop, "migrate-7f9c2", "migrations", 1796020759067016)
		next = waitingPod(shop, "migrate-b81d4", "migrations")
		third = waitingPod(shop, "migrate-c02aa", "migrations")
		writeStatus(migrations, func(st *v1alpha1.DistributedLockStatus) {
			grant(st, holder.Name, holder, "4f1c9a2e-b81d", 1796020759067016, 25*time.Second)
			queue(st, next, third)
		})
		event(migrations, "DistributedLock", corev1.EventTypeNormal, "Granted", "Acquire", "granted to migrate-7f9c2 with fencing token 1796020759067016", 3*time.Minute)
		event(holder, "Pod", corev1.EventTypeNormal, "LockGranted", "Ungate", "holds migrations with fencing token 1796020759067016: scheduling gate removed", 3*time.Minute)

		By("creating lock shop/nightly-report, reserved for the static holder report-cron, with pod report-0 waiting")
		nightly = newLock(shop, "nightly-report", func(s *v1alpha1.DistributedLockSpec) { s.HolderIdentity = "report-cron" })
		reportPod = waitingPod(shop, "report-0", "nightly-report")
		writeStatus(nightly, func(st *v1alpha1.DistributedLockStatus) {
			grant(st, "report-cron", nil, "9d03e6b1-77aa", 1796020759067102, 28*time.Second)
			queue(st, reportPod)
		})

		By("creating lock shop/cache-warmup, not held: its masters lost their quorum")
		warmup := newLock(shop, "cache-warmup", nil)
		warmupPod := waitingPod(shop, "warmup-0", "cache-warmup")
		writeStatus(warmup, func(st *v1alpha1.DistributedLockStatus) {
			st.FencingToken, st.GrantID = 1796020759066881, "0be7d5c3-1f42"
			queue(st, warmupPod)
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionHeld, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonQuorumUnavailable,
				Message: "1 of 3 masters answered, 2 needed: redis-1.masters:6379: i/o timeout; redis-2.masters:6379: connection refused"})
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid, Message: "the spec is valid and the master set serves"})
		})
		event(warmup, "DistributedLock", corev1.EventTypeWarning, "Lost", "Renew", "grant 1796020759066881 to warmup-0: the grant was lost: quorum unavailable", 90*time.Second)

		By("creating locks on one Redis key, payments-ledger, in shop (held by ledger-sync) and billing (held elsewhere)")
		ledger := newLock(shop, "ledger", func(s *v1alpha1.DistributedLockSpec) { s.Key, s.HolderIdentity = "payments-ledger", "ledger-sync" })
		writeStatus(ledger, func(st *v1alpha1.DistributedLockStatus) {
			grant(st, "ledger-sync", nil, "c2d9a0f7-5e11", 1796020759067230, 22*time.Second)
		})
		billingLedger := newLock(billing, "ledger", func(s *v1alpha1.DistributedLockSpec) { s.Key, s.HolderIdentity = "payments-ledger", "invoicer" })
		writeStatus(billingLedger, func(st *v1alpha1.DistributedLockStatus) {
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionHeld, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonHeldElsewhere,
				Message: "2 of 3 masters hold another value of payments-ledger"})
		})

		By("creating lock shop/search-index, held by pod indexer-0, whose PodDisruptionBudget allows no disruption")
		searchIndex = newLock(shop, "search-index", nil)
		indexer = holderPod(shop, "indexer-0", "search-index", 1796020759067177)
		indexer1 := waitingPod(shop, "indexer-1", "search-index")
		writeStatus(searchIndex, func(st *v1alpha1.DistributedLockStatus) {
			grant(st, indexer.Name, indexer, "71e5b0aa-03cd", 1796020759067177, 27*time.Second)
			queue(st, indexer1)
		})
		one := intstr.FromInt32(1)
		pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: shop, Name: "indexer"},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "search-index"}}}}
		Expect(k8s.Create(ctx, pdb)).To(Succeed())
		By("writing the budget's status as the disruption controller would: 1 healthy pod, 1 desired, no disruption allowed")
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1, DisruptionsAllowed: 0}
		Expect(k8s.Status().Update(ctx, pdb)).To(Succeed())

		By("creating semaphore shop/report-slots of 2 slots, both held, with pods report-a and report-b waiting for a slot")
		sem := &v1alpha1.DistributedSemaphore{ObjectMeta: metav1.ObjectMeta{Namespace: shop, Name: "report-slots"},
			Spec: v1alpha1.DistributedSemaphoreSpec{MasterSet: "masters", Slots: 2, TTL: metav1.Duration{Duration: 30 * time.Second}}}
		Expect(k8s.Create(ctx, sem)).To(Succeed())
		var slotHolders, slotWaiters []*corev1.Pod
		for i, name := range []string{"report-gen-1", "report-gen-2"} {
			p := holderPod(shop, name, fmt.Sprintf("report-slots-2-%d", i), 1796020759067400+int64(i))
			slotHolders = append(slotHolders, p)
		}
		for _, name := range []string{"report-a", "report-b"} {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: shop, Name: name, Labels: map[string]string{v1alpha1.SemaphoreLabel: "report-slots", "app": "report-slots"}},
				Spec:       corev1.PodSpec{SchedulingGates: []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGate}}, Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
			}
			Expect(k8s.Create(ctx, p)).To(Succeed())
			slotWaiters = append(slotWaiters, p)
		}
		By("writing the semaphore's status as the operator would")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(sem), sem)).To(Succeed())
		sem.Status.Slots, sem.Status.Held = 2, 2
		for i, p := range slotHolders {
			sem.Status.Holders = append(sem.Status.Holders, v1alpha1.SemaphoreHolder{Slot: int32(i), Lock: fmt.Sprintf("report-slots-2-%d", i),
				Holder: v1alpha1.LockHolder{Identity: p.Name, Pod: &v1alpha1.PodReference{Name: p.Name, UID: p.UID}}, FencingToken: 1796020759067400 + int64(i)})
		}
		sem.Status.Queue = &v1alpha1.LockQueue{Count: 2}
		for _, p := range slotWaiters {
			sem.Status.Queue.Waiting = append(sem.Status.Queue.Waiting, v1alpha1.QueuedPod{Name: p.Name, UID: p.UID})
		}
		meta.SetStatusCondition(&sem.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid, Message: "the spec is valid and the master set serves"})
		Expect(k8s.Status().Update(ctx, sem)).To(Succeed(), "status of semaphore %s/report-slots", shop)

		By("publishing, as the leading manager does, its status writer's report in redlock-system/redlock-operator-status")
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "redlock-system"}}))).To(Succeed())
		data, err := json.Marshal(v1alpha1.StatusWriterReport{
			Manager: "redlock-operator-5d8f6-x2k4q", Published: metav1.NewTime(time.Now().Add(-4 * time.Second)),
			BudgetPerSecond: 150, CapacityPerSecond: 150, TargetPerSecond: 120, DemandPerSecond: 0.3, Kept: 6,
		})
		Expect(err).NotTo(HaveOccurred())
		report := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "redlock-system", Name: v1alpha1.StatusConfigMap},
			Data: map[string]string{v1alpha1.StatusWriterKey: string(data)}}
		Expect(k8s.Create(ctx, report)).To(Succeed())
		// The other specs read status with the default operator namespace.
		DeferCleanup(func() { Expect(k8s.Delete(ctx, report)).To(Succeed()) })
	})

	// during plays the operator's part while a sample's command waits.
	during := map[string]func(){
		"handover-static": func() {
			By("playing the operator: once spec.holderIdentity of shop/nightly-report is cleared, granting report-0")
			Eventually(func() string {
				l := &v1alpha1.DistributedLock{}
				Expect(k8s.Get(ctx, client.ObjectKeyFromObject(nightly), l)).To(Succeed())
				return l.Spec.HolderIdentity
			}).Should(BeEmpty(), "spec.holderIdentity of lock shop/nightly-report cleared by the handover")
			writeStatus(nightly, func(st *v1alpha1.DistributedLockStatus) {
				grant(st, reportPod.Name, reportPod, "2a7e4c19-d0f3", 1796020759067311, 30*time.Second)
				queue(st)
			})
		},
		"handover-pod": func() {
			By("playing the operator: once pod migrate-7f9c2 is evicted, granting migrate-b81d4")
			Eventually(podState(shop, holder.Name, holder.UID)).Should(Or(Equal("terminating"), Equal("gone")), "pod shop/migrate-7f9c2 evicted by the handover")
			writeStatus(migrations, func(st *v1alpha1.DistributedLockStatus) {
				grant(st, next.Name, next, "e5b8f2d6-3c70", 1796020759067342, 30*time.Second)
				queue(st, third)
			})
		},
	}

	It("shows the real output of every command", func() {
		samples := sampleBlock.FindAllSubmatchIndex(page, -1)
		var names []string
		for _, m := range samples {
			names = append(names, string(page[m[4]:m[5]]))
		}
		Expect(names).To(ContainElements("status", "status-json", "why", "why-json", "why-static", "why-quorum", "why-semaphore", "queue", "queue-json", "queue-semaphore",
			"who", "who-yaml", "who-semaphore", "token", "token-json", "token-none", "handover-refused", "handover-static", "handover-pod"),
			"the samples of %s", docPage)

		var updated []byte
		last := 0
		for _, m := range samples {
			name, args, shown := string(page[m[4]:m[5]]), string(page[m[6]:m[7]]), string(page[m[8]:m[9]])
			By("running the sample " + name + ": kubectl redlock " + args)
			done := make(chan result, 1)
			go func() {
				defer GinkgoRecover()
				done <- kubectlRedlock(strings.Fields(args)...)
			}()
			if f := during[name]; f != nil {
				f()
			}
			var r result
			Eventually(done).WithTimeout(time.Minute).Should(Receive(&r), "the sample %s of %s returns", name, docPage)
			got := r.combined()
			updated = append(append(append(updated, page[last:m[8]]...), got...), page[m[9]:m[10]]...)
			last = m[10]
			if !update {
				Expect(normalized(got)).To(Equal(normalized(shown)),
					"the sample %s of %s (kubectl redlock %s) shows what the command prints; REDLOCK_UPDATE_DOCS=1 rewrites it", name, docPage, args)
			}
		}
		if update {
			updated = append(updated, page[last:]...)
			Expect(os.WriteFile(filepath.Join(repoRoot(), docPage), updated, 0o600)).To(Succeed())
		}
	})

	It("checks the headers of the page's tables against the commands' headers", func() {
		page, err := os.ReadFile(filepath.Join(repoRoot(), docPage))
		Expect(err).NotTo(HaveOccurred())
		for name, headers := range map[string][]string{"status": report.StatusHeaders, "who": report.WhoHeaders, "queue": report.QueueHeaders} {
			Expect(string(page)).To(MatchRegexp(`(?s)<!-- sample: `+name+` -->\n`+"```console\n"+`\$ kubectl redlock [^\n]*\n`+strings.Join(headers, ` +`)+` *\n`),
				"the %s sample's table header on %s", name, docPage)
		}
	})
})
