package main_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/syncbuf"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
)

// The suite runs the operator in-process against a real kube-apiserver and
// etcd and real redis-server masters (internal/harness/testenv), and the agent as
// a real process per pod, built from this package. envtest has no
// kubelet: the specs create the pods, report their containers, and do
// what the kubelet does to the agent (signals).

var (
	env   *testenv.Env
	agent string // the built binary
)

func TestAgent(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "In-pod agent")
}

var _ = BeforeSuite(func() {
	env = testenv.Start()
	agent = filepath.Join(GinkgoT().TempDir(), "agent")
	out, err := exec.Command("go", "build", "-o", agent, ".").CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), string(out))
})

var _ = AfterSuite(func() { env.Stop() })

// appScript logs, with the host's wall clock, when the app starts (and its
// token) and when it stops on SIGTERM.
const appScript = `echo "start $(date +%s.%N) $REDLOCK_FENCING_TOKEN" >> "$APP_LOG"
trap 'echo "stop $(date +%s.%N)" >> "$APP_LOG"; exit 0' TERM
while :; do sleep 0.05; done`

// podAgent is one pod in holder-label mode and its agent process.
type podAgent struct {
	pod      *corev1.Pod
	cmd      *exec.Cmd
	log      string          // the app's start/stop log
	state    string          // the agent's --state-dir
	listen   string          // the agent's --listen
	exited   chan struct{}   // closed once the agent process exited
	agentLog *syncbuf.Buffer // what the agent logged (JSON lines)
	// exitedAt is when it exited (read once exited is closed).
	exitedAt time.Time
}

// startPod creates a labelled pod in holder-label mode, reports it running
// (as the kubelet would), and starts its agent with kubeconfig.
// mutate, if any, change the pod before it is created.
func startPod(ns, name, lock, kubeconfig string, mutate ...func(*corev1.Pod)) *podAgent {
	return startPodWith(ns, name, lock, kubeconfig, appScript, mutate...)
}

// injected gives a pod the agent in its spec, as the webhook adds it (the
// spec runs the agent as a process of its own all the same).
func injected(p *corev1.Pod) {
	p.Spec.Containers[0].Command = []string{"/app"}
	p.Annotations = map[string]string{v1alpha1.AgentAnnotation: v1alpha1.AgentRun}
	_, err := podagent.Inject(p, podagent.Options{Image: "redlock-operator:test"})
	Expect(err).NotTo(HaveOccurred())
}

// startPodWith is startPod with the app's shell script.
func startPodWith(ns, name, lock, kubeconfig, script string, mutate ...func(*corev1.Pod)) *podAgent {
	return launch(nil, nil, ns, name, lock, kubeconfig, script, mutate...)
}

// startInitPod is startPod whose agent is the first process of a PID
// namespace of its own, as in a container (unshare; root only). Signalled
// while its app runs, it waits up to 30s for its grant to be hidden.
func startInitPod(ns, name, lock, kubeconfig string, mutate ...func(*corev1.Pod)) *podAgent {
	return launch([]string{"unshare", "--pid", "--fork", "--mount-proc", "--kill-child"}, []string{"--word-wait", "30s"},
		ns, name, lock, kubeconfig, appScript, mutate...)
}

// initPid is the host's pid of the agent startInitPod started: the child
// of unshare, which passes no signal on.
func initPid(a *podAgent) int { return onlyChild(a.cmd.Process.Pid, "the agent, child of unshare") }

// onlyChild is the pid of the only child of process pid (what names it).
func onlyChild(pid int, what string) int {
	out, err := exec.Command("pgrep", "-P", strconv.Itoa(pid)).Output()
	Expect(err).NotTo(HaveOccurred(), what)
	child, err := strconv.Atoi(strings.Fields(string(out))[0])
	Expect(err).NotTo(HaveOccurred())
	return child
}

// launch creates the pod and starts its agent, with the flags extra,
// through the command wrap when it is not empty.
func launch(wrap, extra []string, ns, name, lock, kubeconfig, script string, mutate ...func(*corev1.Pod)) *podAgent {
	port, err := redistest.FreePort()
	Expect(err).NotTo(HaveOccurred())
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{v1alpha1.LockLabel: lock, v1alpha1.GateModeLabel: v1alpha1.GateModeHolderLabel}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}
	for _, m := range mutate {
		m(p)
	}
	Expect(env.Client.Create(env.Ctx, p)).To(Succeed())
	Expect(env.Client.SubResource("binding").Create(env.Ctx, p, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"},
	})).To(Succeed())
	Eventually(func() error {
		cur := &corev1.Pod{}
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(p), cur); err != nil {
			return err
		}
		cur.Status.Phase = corev1.PodRunning
		cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", Image: "app", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
		return env.Client.Status().Update(env.Ctx, cur)
	}).Should(Succeed(), "pod %s reported running", name)

	dir := GinkgoT().TempDir()
	a := &podAgent{pod: p, log: filepath.Join(dir, "app.log"), state: filepath.Join(dir, "state"), exited: make(chan struct{})}
	a.listen = "127.0.0.1:" + strconv.Itoa(port)
	args := []string{"run", "--kubeconfig", kubeconfig, "--state-dir", a.state, "--listen", a.listen,
		"--skew-allowance", "250ms", "--grace", "500ms"}
	args = append(append(args, extra...), "--", "/bin/sh", "-c", script)
	args = append([]string{agent}, args...)
	if len(wrap) > 0 {
		args = append(slices.Clone(wrap), args...)
	}
	a.cmd = exec.Command(args[0], args[1:]...)
	a.cmd.Env = append(os.Environ(), "REDLOCK_LOCK="+lock, "POD_NAMESPACE="+ns, "POD_NAME="+name, "POD_UID="+string(p.UID), "APP_LOG="+a.log)
	a.agentLog = &syncbuf.Buffer{}
	a.cmd.Stdout, a.cmd.Stderr = GinkgoWriter, io.MultiWriter(GinkgoWriter, a.agentLog)
	// Its own process group: the end of a spec kills the agent and its
	// app, as the end of a container kills every process in it.
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	a.cmd.WaitDelay = 5 * time.Second
	Expect(a.cmd.Start()).To(Succeed())
	go func() { _ = a.cmd.Wait(); a.exitedAt = time.Now(); close(a.exited) }()
	DeferCleanup(func() {
		// The app leads a process group of its own: killing the agent's
		// would leave it running (a container's end kills both). The
		// agent is stopped first, so that it starts no app meanwhile.
		_ = syscall.Kill(a.cmd.Process.Pid, syscall.SIGSTOP)
		if out, err := exec.Command("pgrep", "-P", strconv.Itoa(a.cmd.Process.Pid)).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(-pid, syscall.SIGKILL)
				}
			}
		}
		_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		<-a.exited
	})
	return a
}

// getGrant asks the agent's local endpoint for the grant.
func getGrant(a *podAgent) (int, string) {
	resp, err := http.Get("http://" + a.listen + "/grant") //nolint:noctx // the spec's own agent
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	return resp.StatusCode, string(body)
}

// stubbornScript is an app that logs SIGTERM but does not stop for it, and
// runs a child of its own (what a shell entrypoint does).
const stubbornScript = `echo "start $(date +%s.%N) $REDLOCK_FENCING_TOKEN" >> "$APP_LOG"
trap 'echo "term $(date +%s.%N)" >> "$APP_LOG"' TERM
trap 'echo "hup $(date +%s.%N)" >> "$APP_LOG"' HUP
sleep 1000 &
while :; do sleep 0.05; done`

// pgid is the process group of the agent's app: the app is the agent's
// only child, leading a group of its own.
func pgid(a *podAgent) int { return onlyChild(a.cmd.Process.Pid, "the agent's child") }

// alive reports whether a process with this pid exists.
func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// throughProxy returns a copy of kubeconfig that reaches the API server
// through a proxy, and the proxy (the spec stalls it to cut the agent off).
func throughProxy(kubeconfig string) (string, *redistest.Proxy) {
	u, err := url.Parse(env.Cfg.Host)
	Expect(err).NotTo(HaveOccurred())
	proxy := redistest.NewProxy(GinkgoT(), u.Host)
	kc, err := clientcmd.LoadFromFile(kubeconfig)
	Expect(err).NotTo(HaveOccurred())
	for _, c := range kc.Clusters {
		c.Server = "https://" + proxy.Addr()
	}
	proxied := filepath.Join(GinkgoT().TempDir(), "kubeconfig")
	Expect(clientcmd.WriteToFile(*kc, proxied)).To(Succeed())
	return proxied, proxy
}

// period is one run of the app: from its start to its stop (zero: still
// running).
type period struct {
	start, stop time.Time
	token       int64
}

// periods reads the app's log.
func (a *podAgent) periods() []period {
	f, err := os.Open(a.log)
	if os.IsNotExist(err) {
		return nil
	}
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = f.Close() }()
	var out []period
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		t, err := strconv.ParseFloat(fields[1], 64)
		Expect(err).NotTo(HaveOccurred())
		at := time.Unix(0, int64(t*1e9))
		switch fields[0] {
		case "start":
			token, _ := strconv.ParseInt(fields[2], 10, 64)
			out = append(out, period{start: at, token: token})
		case "stop":
			out[len(out)-1].stop = at
		}
	}
	// An app the agent SIGKILLed wrote no stop line (a loaded machine
	// may leave the agent no time for the SIGTERM's grace): it stopped
	// by the time the agent logged the kill, after reaping it.
	for _, killed := range a.kills() {
		for i := range out {
			if out[i].stop.IsZero() && out[i].start.Before(killed) {
				out[i].stop = killed
				break
			}
		}
	}
	return out
}

// kills are the times the agent logged "app killed".
func (a *podAgent) kills() []time.Time {
	var out []time.Time
	sc := bufio.NewScanner(bytes.NewReader(a.agentLog.Bytes()))
	for sc.Scan() {
		var line struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "app killed" {
			out = append(out, line.Time)
		}
	}
	return out
}

// running reports whether the app runs now, as its log and the agent's
// say.
func (a *podAgent) running() bool {
	p := a.periods()
	return len(p) > 0 && p[len(p)-1].stop.IsZero()
}

func fetchLock(ns, name string) *v1alpha1.DistributedLock {
	l := &v1alpha1.DistributedLock{}
	Expect(env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: name}, l)).To(Succeed())
	return l
}

// kubeletStops reports the pod's container terminated, as the kubelet does
// once the agent (the container's process) exited.
func kubeletStops(p *corev1.Pod) {
	Eventually(func() error {
		cur := &corev1.Pod{}
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(p), cur); err != nil {
			return err
		}
		cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", Image: "app", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}}}
		return env.Client.Status().Update(env.Ctx, cur)
	}).Should(Succeed(), "pod %s/%s reported terminated", p.Namespace, p.Name)
}

var _ = Describe("The agent in a pod in holder-label mode", Ordered, func() {
	var (
		ns         string
		ms         *testenv.MasterSet
		kubeconfig string
	)
	BeforeAll(func() {
		mgr := env.StartManager()
		DeferCleanup(mgr.Stop)
		ns = env.NewNamespace()
		ms = env.NewServingMasters(ns, "masters", 3, 10*time.Second)
		kubeconfig = env.Kubeconfig(GinkgoT().TempDir())
	})

	// Every lock's ttl is 10s: the operator refreshes the validity shown a
	// second before it passes, more than the agents' grace and skew
	// allowance (750ms) before their deadline, so that a refresh comes
	// before the agent would stop the app.
	createLock := func(name string, set *testenv.MasterSet, ttl time.Duration) {
		Expect(env.Client.Create(env.Ctx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: set.Name, TTL: metav1.Duration{Duration: ttl}},
		})).To(Succeed())
	}

	It("runs the app only in the pod that holds the lock, with its token, and hands over without overlap", func() {
		createLock("turns", ms, 10*time.Second)
		a := startPod(ns, "turns-a", "turns", kubeconfig)
		Eventually(a.running).Should(BeTrue(), "turns-a's app started")
		b := startPod(ns, "turns-b", "turns", kubeconfig)
		Consistently(b.running, time.Second).Should(BeFalse(), "turns-b's app started while turns-a holds the lock")
		l := fetchLock(ns, "turns")
		Expect(l.Status.Holder.Pod.Name).To(Equal("turns-a"))
		Expect(a.periods()[0].token).To(Equal(l.Status.FencingToken), "the app's REDLOCK_FENCING_TOKEN")
		token, err := os.ReadFile(filepath.Join(a.state, "token"))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(token)).To(Equal(strconv.FormatInt(l.Status.FencingToken, 10)), "turns-a's token file")
		status, body := getGrant(a)
		Expect(status).To(Equal(http.StatusOK), "GET /grant of turns-a's agent: %s", body)
		Expect(body).To(ContainSubstring(`"held":true`))
		Expect(body).To(ContainSubstring(fmt.Sprintf(`"token":%d`, l.Status.FencingToken)))
		status, body = getGrant(b)
		Expect(status).To(Equal(http.StatusServiceUnavailable), "GET /grant of turns-b's agent: %s", body)
		Expect(body).To(ContainSubstring(`"held":false`))

		By("deleting turns-a as the kubelet would: SIGTERM to its agent, the container reported stopped once it exited")
		Expect(env.Client.Delete(env.Ctx, a.pod)).To(Succeed())
		Expect(a.cmd.Process.Signal(syscall.SIGTERM)).To(Succeed())
		Eventually(a.exited, 10*time.Second).Should(BeClosed(), "turns-a's agent exited")
		Expect(a.running()).To(BeFalse(), "turns-a's app stopped with its agent")
		kubeletStops(a.pod)
		Eventually(b.running, 20*time.Second).Should(BeTrue(), "turns-b's app started after the handover")
		Expect(b.periods()[0].start).To(BeTemporally(">", a.periods()[0].stop), "turns-b started after turns-a stopped")
		Expect(b.periods()[0].token).To(BeNumerically(">", a.periods()[0].token))
	})

	It("stops the app by its fencing deadline when the renewals fail, and starts it again with the next grant", func() {
		fragile := env.NewServingMasters(ns, "fragile", 3, 10*time.Second)
		createLock("lossy", fragile, 10*time.Second)
		a := startPod(ns, "lossy-a", "lossy", kubeconfig)
		Eventually(a.running).Should(BeTrue(), "lossy-a's app started")

		By("stopping two of the three masters: the renewals fail and status shows the grant lost")
		for _, s := range fragile.Servers[:2] {
			Expect(s.Stop()).To(Succeed())
		}
		Eventually(a.running, 20*time.Second).Should(BeFalse(), "lossy-a's app stopped on the loss")
		first := a.periods()[0]
		Eventually(func() bool {
			return meta.IsStatusConditionTrue(fetchLock(ns, "lossy").Status.Conditions, v1alpha1.ConditionHeld)
		}, 20*time.Second).Should(BeFalse(), "lock lossy shown held")
		Expect(a.running()).To(BeFalse(), "lossy-a's app runs after the loss")
		Expect(fragile.Servers[0].Cont()).To(Succeed())
		Expect(fragile.Servers[1].Cont()).To(Succeed())
		var again period
		Eventually(func() int64 {
			p := a.periods()
			again = p[len(p)-1]
			return again.token
		}, 40*time.Second).Should(BeNumerically(">", first.token), "lossy-a's app started again with a new grant")
		Expect(again.start).To(BeTemporally(">", first.stop))
	})

	It("stops the app before the validity it last saw passes when it can no longer reach the API server", func() {
		createLock("cut", ms, 10*time.Second)
		proxied, proxy := throughProxy(kubeconfig)
		a := startPod(ns, "cut-a", "cut", proxied)
		Eventually(a.running).Should(BeTrue(), "cut-a's app started")

		By("cutting the agent off from the API server while the operator keeps the lock held")
		Expect(proxy.Stall()).To(Succeed())
		DeferCleanup(proxy.Resume)
		seen := fetchLock(ns, "cut").Status.ValidUntil.Time // the agent saw this one or an earlier one
		Eventually(a.running, 20*time.Second).Should(BeFalse(), "cut-a's app stopped, cut off")
		stop := a.periods()[0].stop
		Expect(stop).To(BeTemporally("<", seen), "cut-a's app stopped %v after the last validity it could have seen", stop.Sub(seen))
		Expect(fetchLock(ns, "cut").Status.Holder.Pod.Name).To(Equal("cut-a"), "the operator still holds the lock for cut-a")
		fmt.Fprintf(GinkgoWriter, "cut off: the app stopped %v before the validity read right after the cut\n", seen.Sub(stop))
	})

	It("renews the heartbeat once the lock sets heartbeatTimeout, and the lock passes on from an agent cut off from the API server: its app stops first, the next pod's starts after", func() {
		createLock("beat", ms, 10*time.Second)
		proxied, proxy := throughProxy(kubeconfig)
		a := startPod(ns, "beat-a", "beat", proxied, injected)
		Eventually(a.running).Should(BeTrue(), "beat-a's app started")
		b := startPod(ns, "beat-b", "beat", kubeconfig, injected)

		By("setting heartbeatTimeout 6s on the held lock: beat-a keeps it for more than twice that, on its agent's heartbeats")
		const timeout = 6 * time.Second
		Eventually(func() error {
			l := fetchLock(ns, "beat")
			l.Spec.HeartbeatTimeout = &metav1.Duration{Duration: timeout}
			return env.Client.Update(env.Ctx, l)
		}).Should(Succeed(), "lock %s/beat to take heartbeatTimeout %s", ns, timeout)
		grantID := fetchLock(ns, "beat").Status.GrantID
		Consistently(func(g Gomega) {
			g.Expect(fetchLock(ns, "beat").Status.GrantID).To(Equal(grantID), "lock beat still shows beat-a's grant")
			g.Expect(b.running()).To(BeFalse(), "beat-b's app runs while beat-a holds the lock")
		}, 2*timeout+time.Second, 200*time.Millisecond).Should(Succeed(), "lock %s/beat to stay with beat-a on its heartbeats, beat-b's app not running", ns)
		hb := &v1alpha1.LockHeartbeat{}
		Expect(env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: "beat"}, hb)).To(Succeed())
		Expect(hb.Spec.HolderIdentity).To(Equal(grantID), "the heartbeat names beat-a's grant")

		By("cutting beat-a's agent off from the API server: its heartbeat stops")
		Expect(proxy.Stall()).To(Succeed())
		DeferCleanup(proxy.Resume)
		Eventually(b.running, 60*time.Second).Should(BeTrue(), "beat-b's app started once beat-a was given up")
		Expect(a.running()).To(BeFalse(), "beat-a's app stopped")
		Expect(b.periods()[0].start).To(BeTemporally(">", a.periods()[0].stop), "beat-b started after beat-a stopped")
		Expect(b.periods()[0].token).To(BeNumerically(">", a.periods()[0].token))
		cur := &corev1.Pod{}
		Expect(env.Client.Get(env.Ctx, client.ObjectKeyFromObject(a.pod), cur)).To(Succeed())
		Expect(cur.Annotations).To(HaveKeyWithValue(v1alpha1.UnresponsiveAnnotation, grantID), "beat-a is marked unresponsive")
		fmt.Fprintf(GinkgoWriter, "heartbeat failover: beat-a's app stopped %v before beat-b's started\n", b.periods()[0].start.Sub(a.periods()[0].stop))
	})

	// initHolder creates lock name, its holder pod <name>-a whose agent is
	// its container's first process, and <name>-b standing by: a, b and
	// a's grant ID.
	initHolder := func(name string) (a, b *podAgent, grantID string) {
		if os.Getuid() != 0 {
			Skip("the agent runs as the first process of a PID namespace of its own (unshare), as in a container: root only")
		}
		createLock(name, ms, 10*time.Second)
		a = startInitPod(ns, name+"-a", name, kubeconfig, injected)
		Eventually(a.running).Should(BeTrue(), "%s-a's app started", name)
		b = startPod(ns, name+"-b", name, kubeconfig, injected)
		l := fetchLock(ns, name)
		Expect(l.Status.Holder.Pod.Name).To(Equal(name + "-a"))
		return a, b, l.Status.GrantID
	}
	// expectWord checks that lock name's LockHeartbeat carries the word
	// that the app of grantID stopped.
	expectWord := func(name, grantID string) {
		hb := &v1alpha1.LockHeartbeat{}
		Expect(env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: name}, hb)).To(Succeed())
		Expect(hb.Spec.StoppedGrant).To(Equal(grantID), "%s-a's agent said the app of its grant stopped", name)
	}

	It("hands the lock over on the agent's word when the holder pod is deleted, before the kubelet reports its container stopped", func() {
		a, b, grantID := initHolder("word")

		By("deleting word-a; the kubelet (played by the spec) neither signals its agent nor reports its container stopped")
		Expect(env.Client.Delete(env.Ctx, a.pod)).To(Succeed())
		Eventually(b.running, 20*time.Second).Should(BeTrue(), "word-b's app started")
		Expect(a.running()).To(BeFalse(), "word-a's app stopped")
		Expect(b.periods()[0].start).To(BeTemporally(">", a.periods()[0].stop), "word-b started after word-a stopped")
		Expect(b.periods()[0].token).To(BeNumerically(">", a.periods()[0].token))
		expectWord("word", grantID)
		cur := &corev1.Pod{}
		Expect(env.Client.Get(env.Ctx, client.ObjectKeyFromObject(a.pod), cur)).To(Succeed(), "word-a is still there, terminating")
		Expect(cur.Status.ContainerStatuses[0].State.Running).NotTo(BeNil(), "word-a's container is still reported running")
		Expect(a.exited).NotTo(BeClosed(), "word-a's agent still runs: nothing signalled it")
		fmt.Fprintf(GinkgoWriter, "handover on the agent's word: word-a's app stopped %v before word-b's started\n", b.periods()[0].start.Sub(a.periods()[0].stop))
	})

	It("gives its word when the kubelet's SIGTERM comes before status stops showing the grant", func() {
		a, b, grantID := initHolder("sigword")

		By("sending sigword-a's agent SIGTERM first: the app stops, and the agent waits for its grant to be hidden")
		Expect(syscall.Kill(initPid(a), syscall.SIGTERM)).To(Succeed())
		Eventually(a.running).Should(BeFalse(), "sigword-a's app stopped on the SIGTERM passed on")
		Consistently(a.exited, 500*time.Millisecond).ShouldNot(BeClosed(), "sigword-a's agent waits for its grant to be hidden")

		By("deleting sigword-a: its grant is hidden, and its agent says the app stopped and exits")
		Expect(env.Client.Delete(env.Ctx, a.pod)).To(Succeed())
		Eventually(a.exited, 20*time.Second).Should(BeClosed(), "sigword-a's agent exited")
		Eventually(b.running, 20*time.Second).Should(BeTrue(), "sigword-b's app started")
		expectWord("sigword", grantID)
		Expect(b.periods()[0].start).To(BeTemporally(">", a.periods()[0].stop), "sigword-b started after sigword-a stopped")
	})

	It("on a lock with heartbeatTimeout, passes a deleted holder that never ends (its node gone dark) once its last grant can no longer be acted on", func() {
		createLock("dark", ms, 10*time.Second)
		Eventually(func() error {
			l := fetchLock(ns, "dark")
			l.Spec.HeartbeatTimeout = &metav1.Duration{Duration: time.Minute}
			return env.Client.Update(env.Ctx, l)
		}).Should(Succeed(), "lock %s/dark to take heartbeatTimeout 1m", ns)
		// Its node goes dark: its agent is cut off from the API server
		// (its connection stalled) and the spec never reports its
		// container stopped.
		proxied, proxy := throughProxy(kubeconfig)
		a := startPod(ns, "dark-a", "dark", proxied, injected)
		Eventually(a.running).Should(BeTrue(), "dark-a's app started")
		b := startPod(ns, "dark-b", "dark", kubeconfig, injected)
		grantID := fetchLock(ns, "dark").Status.GrantID

		By("cutting dark-a's agent off, then deleting dark-a: it is marked, its grant hidden; its agent stops the app by its deadline, and dark-b is granted once the grant settled, dark-a still terminating")
		Expect(proxy.Stall()).To(Succeed())
		DeferCleanup(proxy.Resume)
		Expect(env.Client.Delete(env.Ctx, a.pod)).To(Succeed())
		var released time.Time
		Eventually(func(g Gomega) {
			l := fetchLock(ns, "dark")
			g.Expect(l.Status.Holder).To(BeNil(), "lock dark shows no holder")
			g.Expect(l.Status.ReleasedAt).NotTo(BeNil(), "lock dark shows when its grant was hidden")
			released = l.Status.ReleasedAt.Time
		}).Should(Succeed(), "lock %s/dark to hide dark-a's grant once dark-a is deleted", ns)
		Eventually(b.running, 40*time.Second).Should(BeTrue(), "dark-b's app started")
		l := fetchLock(ns, "dark")
		cur := &corev1.Pod{}
		Expect(env.Client.Get(env.Ctx, client.ObjectKeyFromObject(a.pod), cur)).To(Succeed(), "dark-a is still there, terminating")
		Expect(cur.Annotations).To(HaveKeyWithValue(v1alpha1.UnresponsiveAnnotation, grantID), "dark-a is marked as given up")
		Expect(a.running()).To(BeFalse(), "dark-a's app stopped")
		Expect(b.periods()[0].start).To(BeTemporally(">", a.periods()[0].stop), "dark-b started after dark-a stopped")
		Expect(l.Status.AcquiredAt.Time).To(BeTemporally(">=", released.Add(10*time.Second)),
			"dark-b was granted no sooner than a ttl after dark-a's grant was hidden")
	})

	It("without the agent's word, hands over once the kubelet reports the container stopped, before the hidden grant's keys expire", func() {
		createLock("noword", ms, 10*time.Second)
		// Not its container's first process: it gives no word, as an
		// agent from before the word, or one that exited first.
		a := startPod(ns, "noword-a", "noword", kubeconfig, injected)
		Eventually(a.running).Should(BeTrue(), "noword-a's app started")
		b := startPod(ns, "noword-b", "noword", kubeconfig, injected)

		By("deleting noword-a: status stops showing its grant at once, and its agent stops the app")
		Expect(env.Client.Delete(env.Ctx, a.pod)).To(Succeed())
		Eventually(func(g Gomega) {
			l := fetchLock(ns, "noword")
			g.Expect(l.Status.Holder).To(BeNil(), "lock noword shows no holder")
			held := meta.FindStatusCondition(l.Status.Conditions, v1alpha1.ConditionHeld)
			g.Expect(held).NotTo(BeNil(), "lock noword's Held condition")
			g.Expect(held.Reason).To(Equal(v1alpha1.ReasonHolderTerminating), "lock noword's Held reason")
		}).Should(Succeed(), "lock %s/noword to show no holder, its Held reason HolderTerminating", ns)
		Eventually(a.running).Should(BeFalse(), "noword-a's app stopped")
		Consistently(b.running, time.Second).Should(BeFalse(), "noword-b's app runs while noword-a's container may")
		key := fetchLock(ns, "noword").Status.Key
		var expiry time.Time
		for _, srv := range ms.Servers {
			c := srv.Client()
			if d, err := c.PTTL(env.Ctx, key).Result(); err == nil && d > 0 && time.Now().Add(d).After(expiry) {
				expiry = time.Now().Add(d)
			}
			_ = c.Close()
		}
		Expect(expiry).NotTo(BeZero(), "the hidden grant's keys are still on the masters")

		By("stopping noword-a's agent and reporting its container stopped, as the kubelet does")
		Expect(a.cmd.Process.Signal(syscall.SIGTERM)).To(Succeed())
		Eventually(a.exited, 10*time.Second).Should(BeClosed(), "noword-a's agent exited")
		kubeletStops(a.pod)
		Eventually(b.running, 20*time.Second).Should(BeTrue(), "noword-b's app started")
		Expect(fetchLock(ns, "noword").Status.AcquiredAt.Time).To(BeTemporally("<", expiry),
			"noword-b was granted before noword-a's keys would have expired: they were released once its container stopped")
		Expect(b.periods()[0].start).To(BeTemporally(">", a.periods()[0].stop), "noword-b started after noword-a stopped")
	})

	It("passes SIGHUP and the pod's SIGTERM on, and still kills the app and its children by the deadline when the app ignores it", func() {
		createLock("stubborn", ms, 10*time.Second)
		proxied, proxy := throughProxy(kubeconfig)
		a := startPodWith(ns, "stubborn-a", "stubborn", proxied, stubbornScript)
		Eventually(a.running).Should(BeTrue(), "stubborn-a's app started")
		var children []int
		Eventually(func() []int {
			out, _ := exec.Command("pgrep", "-g", strconv.Itoa(pgid(a)), "-f", "sleep 1000").Output()
			children = nil
			for _, f := range strings.Fields(string(out)) {
				pid, _ := strconv.Atoi(f)
				children = append(children, pid)
			}
			return children
		}).ShouldNot(BeEmpty(), "stubborn-a's app to start its child sleep 1000")

		By("sending the agent SIGHUP (a reload): the app gets it, and the agent keeps running")
		Expect(a.cmd.Process.Signal(syscall.SIGHUP)).To(Succeed())
		Eventually(func() string { data, _ := os.ReadFile(a.log); return string(data) }).Should(ContainSubstring("hup "), "stubborn-a's app to log the SIGHUP passed on")
		Expect(a.exited).NotTo(BeClosed(), "the agent outlived a SIGHUP")
		Expect(a.running()).To(BeTrue())

		By("sending the agent SIGTERM (the pod's deletion): the app is told and ignores it")
		Expect(a.cmd.Process.Signal(syscall.SIGTERM)).To(Succeed())
		Eventually(func() string { data, _ := os.ReadFile(a.log); return string(data) }).Should(ContainSubstring("term "), "stubborn-a's app to log the pod's SIGTERM passed on")

		By("cutting the agent off: the grant runs out unrefreshed")
		Expect(proxy.Stall()).To(Succeed())
		DeferCleanup(proxy.Resume)
		seen := fetchLock(ns, "stubborn").Status.ValidUntil.Time
		Eventually(a.exited, 20*time.Second).Should(BeClosed(), "stubborn-a's agent exited once its app was killed")
		Expect(a.exitedAt).To(BeTemporally("<", seen), "the agent exited, its app killed, after the last validity it could have seen")
		Expect(a.running()).To(BeFalse(), "stubborn-a's app shown running after the agent logged its kill")
		Expect(a.periods()[0].stop).To(BeTemporally("<=", a.exitedAt), "stubborn-a's app shown stopped after its agent exited")
		for _, pid := range children {
			Eventually(func() bool { return alive(pid) }).Should(BeFalse(), "the app's child %d outlived it", pid)
		}
	})
})
