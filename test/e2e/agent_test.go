//go:build e2e

package e2e

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// activeDir is the host directory the apps of agent workloads report
// their active periods to (hostPath): one file per app, a line when the
// agent starts the app and one when it stops it, stamped with the host's
// /proc/uptime (every pod of this one-node cluster reads the same clock).
// The stamps sit inside each app's life (after its start, before its
// exit): an overlap shorter than a shell's start is not seen.
var activeDir = filepath.Join(state, "active")

// activeScript is an app that reports its active period: it runs only as
// the agent's child, so its start and stop lines bound the time the pod
// acted as the holder.
const activeScript = `log=/active/$APP.log
read up rest < /proc/uptime; echo "start $up $REDLOCK_POD_NAME $REDLOCK_FENCING_TOKEN" >> $log
stop() { read up rest < /proc/uptime; echo "stop $up $REDLOCK_POD_NAME $REDLOCK_FENCING_TOKEN" >> $log; exit 0; }
trap stop TERM
while :; do sleep 1 & wait $!; done`

// apiPort is the API server's port, from the suite's kubeconfig: pods on
// the host network reach it on loopback.
func apiPort() string {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	Expect(err).NotTo(HaveOccurred())
	u, err := url.Parse(cfg.Host)
	Expect(err).NotTo(HaveOccurred())
	return u.Port()
}

// agentTemplate is a pod template of app in holder-label mode whose
// container the webhook starts through the agent (run mode), as user uid,
// on the host network: a pod's own network here has loopback only, and the
// agent must reach the API server.
func agentTemplate(app, lock string, uid int64) corev1.PodTemplateSpec {
	hostDir := corev1.HostPathDirectory
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{
			Labels: map[string]string{"app": app, v1alpha1.LockLabel: lock, v1alpha1.GateModeLabel: v1alpha1.GateModeHolderLabel},
			// The grace and skew fit a tenth of the suite's ttl (4s).
			Annotations: map[string]string{v1alpha1.AgentAnnotation: v1alpha1.AgentRun,
				v1alpha1.AgentGraceAnnotation: "100ms", v1alpha1.AgentSkewAllowanceAnnotation: "100ms"},
		},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			DNSPolicy:                     corev1.DNSClusterFirstWithHostNet,
			TerminationGracePeriodSeconds: new(int64(5)),
			SecurityContext:               &corev1.PodSecurityContext{RunAsUser: new(uid), RunAsGroup: new(uid)},
			Containers: []corev1.Container{{
				Name: "app", Image: "busybox:local", ImagePullPolicy: corev1.PullNever,
				Command: []string{"/bin/sh", "-c", activeScript},
				Env: []corev1.EnvVar{{Name: "APP", Value: app},
					{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"}, {Name: "KUBERNETES_SERVICE_PORT", Value: apiPort()}},
				VolumeMounts: []corev1.VolumeMount{{Name: "active", MountPath: "/active"}},
			}},
			Volumes: []corev1.Volume{{Name: "active", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: activeDir, Type: &hostDir}}}},
		},
	}
}

// resetActive starts app's report afresh (a file a run before left),
// in the cluster's state directory (removed with the cluster).
func resetActive(app string) {
	Expect(os.MkdirAll(activeDir, 0o750)).To(Succeed())
	Expect(os.Chmod(activeDir, 0o1777)).To(Succeed()) //nolint:gosec // the apps write as their own users; sticky
	file := fmt.Sprintf("%s/%s.log", activeDir, app)
	Expect(os.Remove(file)).To(Or(Succeed(), MatchError(os.ErrNotExist)))
	// Made here, writable by all: the apps of one report may run as
	// different users. Never through a link someone put there.
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600) //nolint:gosec // the suite's own directory
	Expect(err).NotTo(HaveOccurred())
	Expect(f.Chmod(0o666)).To(Succeed())
	Expect(f.Close()).To(Succeed())
}

// activePeriod is one run of an app as the holder, in host uptime seconds;
// stop is 0 while it runs.
type activePeriod struct {
	Pod, Token  string
	Start, Stop float64
}

// activePeriods reads app's report: its periods in the order their start
// lines were written (a line still being written is left for later).
func activePeriods(app string) []activePeriod {
	data, err := os.ReadFile(fmt.Sprintf("%s/%s.log", activeDir, app))
	Expect(err).NotTo(HaveOccurred())
	var out []activePeriod
	for line := range strings.Lines(string(data)) {
		if !strings.HasSuffix(line, "\n") {
			break
		}
		f := strings.Fields(line)
		Expect(f).To(HaveLen(4), "report line %q of %s", line, app)
		at, err := strconv.ParseFloat(f[1], 64)
		Expect(err).NotTo(HaveOccurred())
		switch f[0] {
		case "start":
			out = append(out, activePeriod{Pod: f[2], Token: f[3], Start: at})
		case "stop":
			i := slices.IndexFunc(out, func(p activePeriod) bool { return p.Pod == f[2] && p.Token == f[3] && p.Stop == 0 })
			Expect(i).To(BeNumerically(">=", 0), "app %s: a stop without a start: %q", app, line)
			out[i].Stop = at
		}
	}
	return out
}

// overlaps lists every period that started before the one before it had
// stopped: two apps active at once. Passing it for every pair in write
// order means the periods are disjoint and in time order.
func overlaps(periods []activePeriod) []string {
	var out []string
	for i := 1; i < len(periods); i++ {
		prev, cur := periods[i-1], periods[i]
		if prev.Stop == 0 || cur.Start < prev.Stop {
			out = append(out, fmt.Sprintf("%s (token %s) started at %.2f while %s (token %s) ran (%.2f–%.2f)",
				cur.Pod, cur.Token, cur.Start, prev.Pod, prev.Token, prev.Start, prev.Stop))
		}
	}
	return out
}

// uptimeNow is the host's uptime in seconds.
func uptimeNow() float64 {
	data, err := os.ReadFile("/proc/uptime")
	Expect(err).NotTo(HaveOccurred())
	now, err := strconv.ParseFloat(strings.Fields(string(data))[0], 64)
	Expect(err).NotTo(HaveOccurred())
	return now
}

// uptimeAt converts a host uptime to wall time.
func uptimeAt(up float64) time.Time {
	return time.Now().Add(-time.Duration((uptimeNow() - up) * float64(time.Second)))
}

var _ = Describe("the in-pod agent on a real kubelet", Ordered, func() {
	It("stops the app of a holder cut off from the API server before its validity passes, and the next pod's app starts only after", func() {
		const app, lockName = "agent-cut", "agent-cut"
		const cutUID, otherUID = 23457, 23458
		resetActive(app)
		l := podLock(lockName, "e2e/"+lockName)
		Expect(k8s.Create(ctx, l)).To(Succeed())
		removeAfterSpec(l)
		pod := func(name string, uid int64) *corev1.Pod {
			t := agentTemplate(app, lockName, uid)
			p := &corev1.Pod{ObjectMeta: t.ObjectMeta, Spec: t.Spec}
			p.Namespace, p.Name = ns, name
			Eventually(func() error { return k8s.Create(ctx, p) }, time.Minute, time.Second).Should(Succeed(),
				"pod %s admitted (the webhook serves once the manager is up)", name)
			removeAfterSpec(p)
			return p
		}

		By("creating pod agent-cut-a (user 23457) and waiting until its app runs as the holder, then agent-cut-b (user 23458)")
		a := pod("agent-cut-a", cutUID)
		Eventually(func() []activePeriod { return activePeriods(app) }, 2*time.Minute, 200*time.Millisecond).
			Should(ContainElement(HaveField("Pod", a.Name)), "pod %s's app started through its agent", a.Name)
		pod("agent-cut-b", otherUID)

		By("cutting agent-cut-a's agent off from the API server: iptables drops both ways every connection its user opened to the API port")
		// The owner match sees only the agent's own packets: its open watch
		// would still receive events. Its connections are marked instead,
		// and every packet of a marked connection dropped, the API
		// server's included. The rules carry a comment by which
		// `cluster.sh down` removes them if this run is killed.
		// The app runs as the cut begins (under load a late refresh may
		// have stopped it a moment before: that stop is not the cut's).
		Eventually(func(g Gomega) {
			periods := activePeriods(app)
			last := periods[len(periods)-1]
			g.Expect(last.Pod).To(Equal(a.Name), "pod of app %s's last active period", app)
			g.Expect(last.Stop).To(BeZero(), "pod %s's app runs", a.Name)
		}, 30*time.Second, 50*time.Millisecond).Should(Succeed(), "pod %s's app to run as the holder of lock %s when the cut begins", a.Name, lockName)
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(a), a)).To(Succeed())
		Expect(a.Status.ContainerStatuses).To(HaveLen(1))
		container := a.Status.ContainerStatuses[0].ContainerID
		cutAt := uptimeNow()
		tag := []string{"-m", "comment", "--comment", "redlock-e2e"}
		for _, rule := range [][]string{
			append([]string{"-t", "mangle", "OUTPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport", apiPort(), "-m", "owner", "--uid-owner", strconv.Itoa(cutUID)},
				append(tag, "-j", "CONNMARK", "--set-mark", "0x2345")...),
			append([]string{"-t", "filter", "OUTPUT", "-p", "tcp", "-m", "connmark", "--mark", "0x2345"}, append(tag, "-j", "DROP")...),
		} {
			insert := append(slices.Clone(rule[:2]), append([]string{"-I"}, rule[2:]...)...)
			out, err := exec.Command("iptables", insert...).CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), "iptables %v: %s", insert, out)
			remove := append(slices.Clone(rule[:2]), append([]string{"-D"}, rule[2:]...)...)
			DeferCleanup(func() { _ = exec.Command("iptables", remove...).Run() })
		}
		cur := &v1alpha1.DistributedLock{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(l), cur)).To(Succeed())
		Expect(cur.Status.Holder).NotTo(BeNil())
		Expect(cur.Status.Holder.Pod).NotTo(BeNil())
		Expect(cur.Status.Holder.Pod.Name).To(Equal(a.Name), "pod %s holds lock %s", a.Name, lockName)
		// A connection is marked at the agent's next packet, normally the
		// (delayed, tens of ms) ACK of the next event it reads: it may read
		// that one, and what else arrives within the ACK's delay. Refreshes
		// come seconds apart: the first after the cut bounds what it saw.
		before := cur.Status.ValidUntil.Time
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(l), cur)).To(Succeed(), "lock %s", lockName)
			g.Expect(cur.Status.ValidUntil.Time).To(BeTemporally(">", before), "lock %s refreshed after the cut", lockName)
		}, 2*ttl, 50*time.Millisecond).Should(Succeed(), "lock %s/%s to be refreshed after the cut", ns, lockName)
		seen := cur.Status.ValidUntil.Time // no earlier than the last validity the agent could have read

		By("waiting for agent-cut-a's app to stop by itself while the operator keeps the lock held")
		var stopped activePeriod
		Eventually(func(g Gomega) {
			periods := activePeriods(app)
			g.Expect(periods).NotTo(BeEmpty(), "active periods of app %s", app)
			stopped = periods[len(periods)-1]
			g.Expect(stopped.Pod).To(Equal(a.Name), "pod of app %s's last active period", app)
			g.Expect(stopped.Stop).To(BeNumerically(">", cutAt), "pod %s's app stopped after the cut", a.Name)
		}, 30*time.Second, 100*time.Millisecond).Should(Succeed(), "pod %s's app to stop by itself after the cut, lock %s still held", a.Name, lockName)
		Expect(stopped.Start).To(BeNumerically("<", cutAt), "the period that stopped is the one that ran at the cut, not a stop before it")
		Expect(stopped.Stop).To(BeNumerically(">", cutAt))
		Expect(uptimeAt(stopped.Stop)).To(BeTemporally("<", seen), "the app stopped before the validity its agent could last have seen (%s)", seen.Format(time.StampMilli))
		Consistently(func() []activePeriod { return activePeriods(app) }, ttl, 200*time.Millisecond).Should(HaveLen(len(activePeriods(app))),
			"no app starts while agent-cut-a is cut off and holds the lock")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(l), cur)).To(Succeed())
		Expect(cur.Status.Holder.Pod.Name).To(Equal(a.Name), "the operator still holds the lock for pod %s, which runs", a.Name)
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(a), a)).To(Succeed())
		Expect(a.Status.ContainerStatuses).To(HaveExactElements(And(HaveField("ContainerID", container), HaveField("LastTerminationState.Terminated", BeNil()))),
			"the agent of %s stopped the app and kept running: the same container", a.Name)

		By("deleting agent-cut-a: the lock passes to agent-cut-b, whose app starts after agent-cut-a's stopped")
		Expect(k8s.Delete(ctx, a)).To(Succeed())
		Eventually(func(g Gomega) {
			periods := activePeriods(app)
			g.Expect(periods[len(periods)-1].Pod).To(Equal("agent-cut-b"), "pod of app %s's last active period", app)
		}, 2*time.Minute, 200*time.Millisecond).Should(Succeed(), "agent-cut-b's app runs as the holder")
		periods := activePeriods(app)
		Expect(overlaps(periods)).To(BeEmpty())
		GinkgoWriter.Printf("agent cut: app of %s stopped %v before the validity seen; periods %+v\n", a.Name, seen.Sub(uptimeAt(stopped.Stop)).Round(time.Millisecond), periods)
	})
})
