package plugin_test

import (
	"encoding/json"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/cmd/kubectl-redlock/internal/report"
)

// decode reads a command's -o json output into v, failing on an error.
func decode(r result, v any) {
	Expect(r.err).NotTo(HaveOccurred(), "the command's stderr: %s", r.errOut)
	Expect(json.Unmarshal([]byte(r.out), v)).To(Succeed(), "the output is JSON: %s", r.out)
}

var _ = Describe("The read commands", Ordered, func() {
	var (
		ns, other          string
		jobs, keyed        *v1alpha1.DistributedLock
		a, b, c, unrelated *corev1.Pod
	)

	BeforeAll(func() {
		ns, other = namespace(""), namespace("")
		By("creating lock jobs held by pod job-a with job-b and job-c waiting, a lock nobody holds, and one with its own key in another namespace")
		jobs = newLock(ns, "jobs", nil)
		a = holderPod(ns, "job-a", "jobs", 501)
		b, c = waitingPod(ns, "job-b", "jobs"), waitingPod(ns, "job-c", "jobs")
		writeStatus(jobs, func(st *v1alpha1.DistributedLockStatus) {
			grant(st, a.Name, a, "grant-a", 501, 20*time.Second)
			queue(st, b, c)
		})
		event(jobs, "DistributedLock", corev1.EventTypeNormal, "Granted", "Acquire", "granted to job-a with fencing token 501", time.Minute)
		event(c, "Pod", corev1.EventTypeWarning, "LockRequestInvalid", "Gate", "a made-up warning about job-c", 10*time.Second)
		newLock(ns, "free", nil)
		keyed = newLock(other, "jobs", func(s *v1alpha1.DistributedLockSpec) { s.Key = "redlock:" + ns + "/jobs" })
		unrelated = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx"}}}}
		Expect(k8s.Create(ctx, unrelated)).To(Succeed())
	})

	It("status lists the namespace's locks, -A those of every namespace, in JSON and YAML alike", func() {
		By("reading status -n NS -o json")
		var list report.LockList
		decode(kubectlRedlock("status", "-n", ns, "-o", "json"), &list)
		Expect(list.Kind).To(Equal("LockList"))
		Expect(list.Items).To(HaveLen(2))
		Expect(list.Items[0].Name).To(Equal("free"))
		Expect(list.Items[0].Holder).To(BeNil())
		Expect(list.Items[0].ValidFor).To(Equal("-"))
		Expect(list.Items[0].Key).To(Equal("redlock:"+ns+"/free"), "the default key, before the operator wrote status.key")
		held := list.Items[1]
		Expect(held.Holder).To(Equal(&report.Holder{Identity: "job-a", Pod: "job-a"}))
		Expect(held.Held).To(BeTrue())
		Expect(held.ValidFor).To(MatchRegexp(`^1?[0-9]s$`), "the validity left of a 20s grant")
		Expect(held.FencingToken).To(BeEquivalentTo(501))
		Expect(held.Waiting).To(BeEquivalentTo(2))

		By("reading status with an operator namespace that has no status writer's report")
		decode(kubectlRedlock("status", "-n", ns, "--operator-namespace", namespace(""), "-o", "json"), &list)
		Expect(list.StatusWriter).To(BeNil(), "no status writer's report in the operator's namespace")

		By("reading the same as YAML")
		r := kubectlRedlock("status", "-n", ns, "-o", "yaml")
		Expect(r.err).NotTo(HaveOccurred())
		var fromYAML report.LockList
		Expect(yaml.Unmarshal([]byte(r.out), &fromYAML)).To(Succeed())
		Expect(fromYAML.Items).To(HaveLen(2))
		Expect(fromYAML.Items[1].GrantID).To(Equal("grant-a"))

		By("reading status -A: the lock of the other namespace too")
		decode(kubectlRedlock("status", "-A", "-o", "json"), &list)
		var names []string
		for _, l := range list.Items {
			names = append(names, l.Namespace+"/"+l.Name)
		}
		Expect(names).To(ContainElements(ns+"/jobs", ns+"/free", other+"/jobs"))

		By("reading status of a namespace without locks")
		empty := namespace("")
		r = kubectlRedlock("status", "-n", empty)
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(BeEmpty())
		Expect(r.errOut).To(Equal("No DistributedLocks found in namespace " + empty + ".\n"))
	})

	It("status shows what the leading manager's status writer published: capacity, demand, kept and shed, and when it is not current", func() {
		opNS := namespace("")
		By("publishing a report in ConfigMap redlock-operator-status of the operator's namespace, as an overloaded leader does")
		r := v1alpha1.StatusWriterReport{
			Manager: "redlock-operator-7f9c", Published: metav1.NewTime(time.Now().Add(-5 * time.Second)),
			BudgetPerSecond: 150, CapacityPerSecond: 25.04, Measured: true, TargetPerSecond: 15.02, DemandPerSecond: 23.44,
			Overloaded: true, OverloadedSince: &metav1.Time{Time: time.Now().Add(-2 * time.Minute)},
			Kept: 117, Shedding: 18, Waiting: 37, Shed: 120,
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: opNS, Name: v1alpha1.StatusConfigMap}, Data: map[string]string{}}
		publish := func(r v1alpha1.StatusWriterReport) {
			data, err := json.Marshal(r)
			Expect(err).NotTo(HaveOccurred())
			cm.Data[v1alpha1.StatusWriterKey] = string(data)
			if cm.ResourceVersion == "" {
				Expect(k8s.Create(ctx, cm)).To(Succeed())
				return
			}
			Expect(k8s.Update(ctx, cm)).To(Succeed())
		}
		publish(r)
		By("holding the leader Lease as that manager")
		holder := "redlock-operator-7f9c_3c1d2e4f"
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: opNS, Name: v1alpha1.LeaderLease}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
		Expect(k8s.Create(ctx, lease)).To(Succeed())

		By("reading status as a table: the writer's line after the locks")
		out := kubectlRedlock("status", "-n", ns, "--operator-namespace", opNS)
		Expect(out.err).NotTo(HaveOccurred(), "stderr: %s", out.errOut)
		Expect(out.out).To(MatchRegexp(`(?m)^STATUS-WRITER +STATE +CAPACITY/S +TARGET/S +DEMAND/S +BUDGET/S +KEPT +SHEDDING +WAITING +SHED$`))
		Expect(out.out).To(MatchRegexp(`(?m)^redlock-operator-7f9c +overloaded for 2m0?[0-9]s +25\.0 +15\.0 +23\.4 +150\.0 +117 +18 +37 +120$`))

		By("reading the same as JSON")
		var list report.LockList
		decode(kubectlRedlock("status", "-n", ns, "--operator-namespace", opNS, "-o", "json"), &list)
		Expect(list.StatusWriter).NotTo(BeNil())
		Expect(list.StatusWriter.Current).To(BeTrue())
		Expect(list.StatusWriter.CapacityPerSecond).To(Equal(25.04))
		Expect(list.StatusWriter.Kept).To(Equal(117))
		Expect(list.StatusWriter.Leader).To(Equal(holder))

		By("reading the same report once another manager leads")
		other := "redlock-operator-b2e1_77aa"
		lease.Spec.HolderIdentity = &other
		Expect(k8s.Update(ctx, lease)).To(Succeed())
		out = kubectlRedlock("status", "-n", ns, "--operator-namespace", opNS)
		Expect(out.err).NotTo(HaveOccurred(), "stderr: %s", out.errOut)
		Expect(out.out).To(MatchRegexp(`(?m)^redlock-operator-7f9c +not current \(redlock-operator-b2e1_77aa leads\) +25\.0 `))
		lease.Spec.HolderIdentity = &holder
		Expect(k8s.Update(ctx, lease)).To(Succeed())

		By("reading a report the writer has not renewed for five minutes, before it measured anything")
		r.Published = metav1.NewTime(time.Now().Add(-5 * time.Minute))
		r.Overloaded, r.OverloadedSince, r.Measured, r.CapacityPerSecond, r.TargetPerSecond = false, nil, false, 150, 120
		publish(r)
		out = kubectlRedlock("status", "-n", ns, "--operator-namespace", opNS)
		Expect(out.err).NotTo(HaveOccurred(), "stderr: %s", out.errOut)
		Expect(out.out).To(MatchRegexp(`(?m)^redlock-operator-7f9c +not current \(published 5m0?[0-9]s ago\) +150\.0 \(budget\) +120\.0 +23\.4 `))
		decode(kubectlRedlock("status", "-n", ns, "--operator-namespace", opNS, "-o", "json"), &list)
		Expect(list.StatusWriter.Current).To(BeFalse())

		By("reading status of a namespace without locks: the writer's line still")
		out = kubectlRedlock("status", "-n", namespace(""), "--operator-namespace", opNS)
		Expect(out.err).NotTo(HaveOccurred())
		Expect(out.out).To(ContainSubstring("redlock-operator-7f9c"))
	})

	It("why says where a waiting pod stands and what it waits for, with the events of the pod and its lock", func() {
		By("asking why job-c waits, as a description")
		r := kubectlRedlock("why", "job-c", "-n", ns)
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(ContainSubstring("Queue:     number 2 of 2 waiting\n"))
		Expect(r.out).To(MatchRegexp(`Holder: +pod/job-a \(Running\), token 501, valid for 1?[0-9]s\n`))
		Expect(r.out).To(MatchRegexp(`Why: +it waits for pod job-a \(Running\), which holds the lock .*; 1 pod is ahead of it in line \(job-b\)\n`))

		By("asking the same as JSON")
		var w report.Why
		decode(kubectlRedlock("why", "job-c", "-n", ns, "-o", "json"), &w)
		Expect(w.Reason).To(Equal(report.WhyWaitingForHolder))
		Expect(w.Position).To(Equal(2))
		Expect(w.Ahead).To(Equal([]string{"job-b"}))
		Expect(w.Gated).To(BeTrue())
		Expect(w.Gate).To(Equal(report.GateScheduling))
		Expect(w.Holder.Pod).To(Equal("job-a"))
		Expect(w.Holder.PodPhase).To(Equal("Running"))
		Expect(w.Events).To(HaveLen(2))
		Expect(w.Events[0].Object).To(Equal("distributedlock/jobs"), "the older event first")
		Expect(w.Events[1].Reason).To(Equal("LockRequestInvalid"))

		By("naming the pod as kubectl does, pod/job-c")
		decode(kubectlRedlock("why", "pod/job-c", "-n", ns, "-o", "json"), &w)
		Expect(w.Position).To(Equal(2))

		By("asking why the holder job-a is not gated")
		decode(kubectlRedlock("why", "job-a", "-n", ns, "-o", "json"), &w)
		Expect(w.Reason).To(Equal(report.WhyHolds))
		Expect(w.Holds).To(BeTrue())
	})

	It("why refuses a pod without the lock label and names a pod or lock that does not exist", func() {
		r := kubectlRedlock("why", "web", "-n", ns)
		Expect(r.err).To(MatchError(ContainSubstring("pod " + ns + "/web asks for no lock: no label redlock.dev/lock")))
		r = kubectlRedlock("why", "nope", "-n", ns)
		Expect(r.err).To(MatchError(`pod "nope" not found in namespace ` + ns))

		By("labelling a pod for a lock that does not exist")
		orphan := waitingPod(ns, "orphan", "missing")
		var w report.Why
		decode(kubectlRedlock("why", orphan.Name, "-n", ns, "-o", "json"), &w)
		Expect(w.Reason).To(Equal(report.WhyLockNotFound))
		Expect(w.LockFound).To(BeFalse())
	})

	It("queue lists the waiting pods in order, and names a lock that does not exist", func() {
		r := kubectlRedlock("queue", "jobs", "-n", ns)
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(MatchRegexp(`^# +POD +PRIORITY +PHASE +GATE +AGE\n1 +job-b +0 +Pending +scheduling +[0-9]+s\n2 +job-c +0 +Pending +scheduling +[0-9]+s\n$`))

		var q report.Queue
		decode(kubectlRedlock("queue", "jobs", "-n", ns, "-o", "json"), &q)
		Expect(q.Count).To(BeEquivalentTo(2))
		Expect(q.Waiting).To(HaveLen(2))
		Expect(q.Waiting[0].Pod).To(Equal("job-b"))
		Expect(q.Waiting[0].Created).NotTo(BeNil())
		Expect(q.Holder.String()).To(Equal("pod/job-a"))

		r = kubectlRedlock("queue", "free", "-n", ns)
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.errOut).To(Equal("No pods wait for lock " + ns + "/free.\n"))

		decode(kubectlRedlock("queue", "dlock/jobs", "-n", ns, "-o", "json"), &q)
		Expect(q.Lock).To(Equal("jobs"))

		r = kubectlRedlock("queue", "nope", "-n", ns)
		Expect(r.err).To(MatchError(ContainSubstring(`DistributedLock "nope" not found in namespace ` + ns)))
		r = kubectlRedlock("queue", "-n", ns)
		Expect(r.err).To(MatchError(ContainSubstring("queue takes exactly one argument, LOCK")))
	})

	It("who finds every lock on a key in every namespace: by the default key and by spec.key", func() {
		var k report.KeyHolders
		decode(kubectlRedlock("who", "redlock:"+ns+"/jobs", "-o", "json"), &k)
		Expect(k.Items).To(HaveLen(2))
		byNamespace := map[string]report.Lock{}
		for _, l := range k.Items {
			byNamespace[l.Namespace] = l
		}
		Expect(byNamespace[ns].Holder.String()).To(Equal("pod/job-a"))
		Expect(byNamespace[other].Name).To(Equal(keyed.Name))
		Expect(byNamespace[other].Holder).To(BeNil())

		r := kubectlRedlock("who", "redlock:"+ns+"/jobs")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(MatchRegexp(`^NAMESPACE +NAME +HOLDER +VALID-FOR +TOKEN +HELD +WAITING\n`))

		r = kubectlRedlock("who", "no-such-key")
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.errOut).To(Equal("No DistributedLock nor held semaphore slot in this cluster uses key \"no-such-key\".\n"))
	})

	It("token gives the holder's token and says that a waiting pod holds nothing", func() {
		var t report.Token
		decode(kubectlRedlock("token", "job-a", "-n", ns, "-o", "json"), &t)
		Expect(t.Holds).To(BeTrue())
		Expect(t.FencingToken).To(BeEquivalentTo(501))
		Expect(t.AnnotatedToken).To(Equal("501"))

		decode(kubectlRedlock("token", "job-b", "-n", ns, "-o", "json"), &t)
		Expect(t.Holds).To(BeFalse())
		Expect(t.FencingToken).To(BeZero())
		Expect(t.Explanation).To(Equal("pod " + ns + "/job-b holds nothing: lock jobs is held by pod/job-a"))

		r := kubectlRedlock("token", "web", "-n", ns)
		Expect(r.err).NotTo(HaveOccurred())
		Expect(r.out).To(ContainSubstring("holds nothing: it asks for no lock (no label redlock.dev/lock)"))
	})

	It("refuses an output format it does not print, before it reads anything", func() {
		for _, cmd := range [][]string{{"status"}, {"why", "job-a"}, {"queue", "jobs"}, {"who", "k"}, {"token", "job-a"}, {"check"}} {
			r := kubectlRedlock(append(cmd, "-n", ns, "-o", "table")...)
			Expect(r.err).To(MatchError(ContainSubstring(`unable to match a printer suitable for the output format "table"`)), "kubectl redlock %v -o table", cmd)
			Expect(r.out).To(BeEmpty())
		}
		for _, cmd := range [][]string{{"why", "job-a"}, {"token", "job-a"}, {"check"}} {
			r := kubectlRedlock(append(cmd, "-n", ns, "-o", "wide")...)
			Expect(r.err).To(MatchError(ContainSubstring(`unable to match a printer suitable for the output format "wide"`)), "kubectl redlock %v -o wide: a description, no table", cmd)
		}
	})
})
