//go:build e2e

// Package e2e proves delayed restart on a real single-node cluster
// (hack/local-cluster): the operator runs in-cluster, installed from a
// release (RELEASE_DIR: its image imported from the OCI layout, its chart
// from the .tgz, with the config/local-cluster component as Helm's
// post-renderer); a managed RedisMasterSet of five host-network members
// holds a lock while its members crash.
//
//	make e2e   # cluster up, this suite, cluster down
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/managed"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

const (
	ns       = "e2e"
	basePort = 17000
	ttl      = 4 * time.Second
)

var (
	k8s   client.Client
	ctx   = context.Background()
	state = envOr("CLUSTER_STATE", "/var/tmp/redlock-cluster")
	root  = func() string { wd, _ := os.Getwd(); return filepath.Join(wd, "..", "..") }()
	set   *v1alpha1.RedisMasterSet
	// restartDelay of the set: maxLockTTL + 1% + 2ms + 1s.
	restartDelay = ttl + 40*time.Millisecond + 2*time.Millisecond + time.Second
)

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "e2e on a real local cluster")
}

// releaseDir is the release the suite installs (make e2e-release: this
// tree's, for this host's architecture); hack/local-cluster imported its
// image.
var releaseDir = os.Getenv("RELEASE_DIR")

// releaseChart is the release's packaged chart.
func releaseChart() string {
	charts, err := filepath.Glob(filepath.Join(releaseDir, "redlock-operator-*.tgz"))
	Expect(err).NotTo(HaveOccurred())
	Expect(charts).To(HaveLen(1), "one chart in the release %s", releaseDir)
	return charts[0]
}

// releaseFile reads name from the release.
func releaseFile(name string) []byte {
	data, err := os.ReadFile(filepath.Join(releaseDir, name)) //nolint:gosec // the release the suite installs
	Expect(err).NotTo(HaveOccurred(), "%s of the release %s", name, releaseDir)
	return data
}

// releaseImage is the operator's image as the release names it:
// REPO@DIGEST, the digest of its OCI layout's index.
func releaseImage() string {
	digest := strings.TrimSpace(string(releaseFile("image.digest")))
	m := regexp.MustCompile(`(?m)^\s*image: (\S+@` + regexp.QuoteMeta(digest) + `)$`).FindSubmatch(releaseFile("install.yaml"))
	Expect(m).NotTo(BeNil(), "the release's install.yaml names its image.digest")
	return string(m[1])
}

func run(name string, args ...string) string {
	cmd := exec.Command(name, args...)
	cmd.Dir = root
	// Only stdout is returned: stderr (e.g. "go: downloading ..." on a cold
	// module cache) must never mix into manifests the caller applies.
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	Expect(cmd.Run()).To(Succeed(), "%s %v: %s%s", name, args, out.String(), errOut.String())
	return out.String()
}

var _ = BeforeSuite(func() {
	redis.SetLogger(quiet{})
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	Expect(err).NotTo(HaveOccurred())
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	Expect(releaseDir).NotTo(BeEmpty(), "RELEASE_DIR names the release to install: run the suite with make e2e, which builds it")
	By("installing the release's chart " + releaseChart() + " with the local cluster's changes (hack/local-cluster/post-render)")
	Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "redlock-system",
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}}})).To(Succeed(), "namespace redlock-system, privileged for the host-network manager")
	run("go", "tool", "-modfile=hack/tools/helm/go.mod", "helm", "install", "redlock-operator", releaseChart(),
		"--namespace", "redlock-system", "--post-renderer", filepath.Join(root, "hack", "local-cluster", "post-render"))
	Eventually(func(g Gomega) {
		var pods corev1.PodList
		g.Expect(k8s.List(ctx, &pods, client.InNamespace("redlock-system"))).To(Succeed(), "pods of namespace redlock-system")
		g.Expect(pods.Items).NotTo(BeEmpty(), "pods of namespace redlock-system")
		g.Expect(pods.Items[0].Status.Phase).To(Equal(corev1.PodRunning), "phase of pod %s/%s", "redlock-system", pods.Items[0].Name)
	}, 2*time.Minute, time.Second).Should(Succeed(), "the operator's pod in redlock-system to run")

	Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	set = &v1alpha1.RedisMasterSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "masters"},
		Spec: v1alpha1.RedisMasterSetSpec{
			MaxLockTTL: metav1.Duration{Duration: ttl},
			Managed: &v1alpha1.ManagedMasters{
				Replicas: 5, Image: "redis:7-local", Port: basePort, HostNetwork: true,
			},
		},
	}
	Expect(k8s.Create(ctx, set)).To(Succeed())
	Eventually(available, 3*time.Minute, time.Second).Should(BeTrue(), "master set %s/%s to be available with 5 members serving", ns, set.Name)
})

// On a failure, show what the cluster looked like: the pods and locks of
// the suite's namespaces, their events, and the manager's log (read from
// the node: there is no route to the kubelet's log endpoint here).
var _ = AfterEach(func() {
	if !CurrentSpecReport().Failed() {
		return
	}
	for _, namespace := range []string{ns, "demo", "e2e-upgrade"} {
		out, _ := exec.Command(os.Getenv("KUBECTL"), "get", "pods,dlock,rms,jobs", "-n", namespace, "-o", "yaml").CombinedOutput()
		GinkgoWriter.Printf("--- objects in %s:\n%s\n", namespace, out)
		out, _ = exec.Command(os.Getenv("KUBECTL"), "get", "events", "-n", namespace, "--sort-by=.lastTimestamp").CombinedOutput()
		GinkgoWriter.Printf("--- events in %s:\n%s\n", namespace, out)
	}
	logs, _ := filepath.Glob("/var/log/pods/redlock-system_*/manager/*.log")
	for _, f := range logs {
		out, _ := exec.Command("tail", "-n", "400", f).CombinedOutput()
		GinkgoWriter.Printf("--- manager log %s:\n%s\n", f, out)
	}
})

// removeAfterSpec deletes obj (a set's members, with their exec probes, or
// a whole namespace) once the spec ends, so that later specs do not run on
// a node busy with earlier specs' pods.
func removeAfterSpec(obj client.Object) {
	DeferCleanup(func() {
		if err := k8s.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			Expect(err).NotTo(HaveOccurred())
		}
	})
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func available() bool {
	cur := &v1alpha1.RedisMasterSet{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(set), cur); err != nil {
		return false
	}
	return meta.IsStatusConditionTrue(cur.Status.Conditions, v1alpha1.ConditionAvailable) && cur.Status.Serving == 5
}

// memberState is member i's state in the set's status.
func memberState(i int) string {
	cur := &v1alpha1.RedisMasterSet{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(set), cur); err != nil || i >= len(cur.Status.Members) {
		return ""
	}
	return cur.Status.Members[i].State
}

func lock(name, holder string) *v1alpha1.DistributedLock {
	return &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.DistributedLockSpec{
			MasterSet: "masters", Key: "e2e/key", TTL: metav1.Duration{Duration: ttl}, HolderIdentity: holder,
		},
	}
}

func get(l *v1alpha1.DistributedLock) *v1alpha1.DistributedLock {
	cur := &v1alpha1.DistributedLock{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(l), cur)).To(Succeed())
	return cur
}

func held(l *v1alpha1.DistributedLock) bool {
	return meta.IsStatusConditionTrue(l.Status.Conditions, v1alpha1.ConditionHeld) && l.Status.Holder != nil
}

func serves(port int) bool { return demo.Serves(ctx, fmt.Sprintf("127.0.0.1:%d", port)) }

// killMember SIGKILLs the main process (the gate) of member i's Redis
// container, as a crash would; the kubelet restarts the container. It
// returns the instant just before the kill.
func killMember(i int) time.Time {
	pod := &corev1.Pod{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("masters-%d", i)}, pod)).To(Succeed())
	at, err := demo.KillContainer(ctx, state, pod)
	Expect(err).NotTo(HaveOccurred())
	return at
}

var _ = Describe("delayed restart", Ordered, func() {
	var holder, rival *v1alpha1.DistributedLock
	var token int64
	BeforeAll(func() {
		holder, rival = lock("holder", "first"), lock("rival", "second")
		Expect(k8s.Create(ctx, holder)).To(Succeed())
		Eventually(func() bool { return held(get(holder)) }, time.Minute, 100*time.Millisecond).Should(BeTrue(), "lock %s/%s to be held", ns, holder.Name)
		Expect(k8s.Create(ctx, rival)).To(Succeed())
		token = get(holder).Status.FencingToken
	})

	It("keeps a crashed member out of service for the restart delay while the lock stays held", func() {
		crashed := killMember(0)
		down, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		Expect(demo.AwaitDown(down, fmt.Sprintf("127.0.0.1:%d", basePort), 10*time.Millisecond)).To(Succeed(), "member 0 of master set %s/%s to stop answering once killed", ns, set.Name)
		// Throughout, the holder keeps the lock and the rival never gets it.
		var served time.Time
		for served.IsZero() {
			Expect(time.Since(crashed)).To(BeNumerically("<", restartDelay+time.Minute), "the member never came back")
			h, r := get(holder), get(rival)
			Expect(held(h) && h.Status.Holder.Identity == "first" && h.Status.FencingToken == token).To(BeTrue(), "the holder lost the lock")
			Expect(held(r)).To(BeFalse(), "a second holder got the lock")
			if serves(basePort) {
				served = time.Now()
			}
			time.Sleep(50 * time.Millisecond)
		}
		gap := served.Sub(crashed)
		GinkgoWriter.Printf("crash → first accepted connection: %v (restart delay %v)\n", gap, restartDelay)
		Expect(gap).To(BeNumerically(">=", restartDelay))
		// Back, it is quarantined (its keys are gone) and does not vote ...
		Eventually(func() string { return memberState(0) }, 10*time.Second, 50*time.Millisecond).Should(Equal(v1alpha1.MemberQuarantined), "member 0 of master set %s/%s to be quarantined once back", ns, set.Name)
		// ... until its quarantine has passed; then it is counted again.
		Eventually(func() string { return memberState(0) }, time.Minute, 100*time.Millisecond).Should(Equal(v1alpha1.MemberServing), "member 0 of master set %s/%s to serve once its quarantine passed", ns, set.Name)
		Expect(available()).To(BeTrue())
		GinkgoWriter.Printf("crash → member serving and counted again: %v\n", time.Since(crashed))
		Expect(held(get(holder))).To(BeTrue())
		Expect(held(get(rival))).To(BeFalse())
	})

	It("makes a replacement pod wait for its admission", func() {
		pod := &corev1.Pod{}
		key := client.ObjectKey{Namespace: ns, Name: "masters-1"}
		Expect(k8s.Get(ctx, key, pod)).To(Succeed())
		oldUID := pod.UID
		Expect(k8s.Delete(ctx, pod)).To(Succeed())
		deleted := time.Now()
		var admitAt time.Time
		Eventually(func(g Gomega) {
			cur := &corev1.Pod{}
			g.Expect(k8s.Get(ctx, key, cur)).To(Succeed(), "pod %s", key)
			g.Expect(cur.UID).NotTo(Equal(oldUID), "UID of pod %s", key)
			at, err := time.Parse(time.RFC3339Nano, cur.Annotations[managed.ServeAfter])
			g.Expect(err).NotTo(HaveOccurred(), "admission time of pod %s", key)
			admitAt = at
		}, time.Minute, 100*time.Millisecond).Should(Succeed(), "replacement pod %s to be created with its admission time", key)
		Expect(admitAt).To(BeTemporally(">", deleted.Add(-restartDelay)))
		Eventually(func() bool { return serves(basePort + 1) }, time.Minute, 50*time.Millisecond).Should(BeTrue(), "replacement member 1 of master set %s/%s to serve on port %d", ns, set.Name, basePort+1)
		Expect(time.Now()).To(BeTemporally(">=", admitAt))
		Eventually(available, time.Minute, 200*time.Millisecond).Should(BeTrue(), "master set %s/%s to be available again with 5 members serving", ns, set.Name)
	})

	It("loses the lock cleanly with a majority down and regains it after the delay", func() {
		for i := 2; i <= 4; i++ {
			killMember(i)
		}
		Eventually(func() bool { return !held(get(holder)) }, 2*ttl, 50*time.Millisecond).Should(BeTrue(), "lock %s/%s to be lost with three of five members down", ns, holder.Name)
		h := get(holder)
		Expect(h.Status.Holder).To(BeNil(), "no holder is shown once the grant is lost")
		Eventually(func() bool { return held(get(holder)) || held(get(rival)) }, 2*time.Minute, 200*time.Millisecond).Should(BeTrue(), "lock %s/%s or %s/%s to be held again after the delay", ns, holder.Name, ns, rival.Name)
		Expect(held(get(holder)) && held(get(rival))).To(BeFalse(), "both locks of one key held")
	})
})

// The manager never restarted during the suite: a restart (a panic, a
// failed probe, an OOM kill) hands the locks to a new leader and would
// explain other specs' failures, so it is a failure of its own, with the
// end of the log of the container that stopped.
var _ = AfterSuite(func() {
	var pods corev1.PodList
	Expect(k8s.List(ctx, &pods, client.InNamespace("redlock-system"))).To(Succeed())
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount == 0 {
				continue
			}
			var reason string
			if t := cs.LastTerminationState.Terminated; t != nil {
				reason = fmt.Sprintf("%s, exit code %d", t.Reason, t.ExitCode)
			}
			logs, _ := filepath.Glob(filepath.Join("/var/log/pods", "redlock-system_"+p.Name+"_*", cs.Name, "*.log"))
			var tail []byte
			if len(logs) > 0 {
				slices.Sort(logs)
				tail, _ = exec.Command("tail", "-n", "15", logs[0]).CombinedOutput()
			}
			Fail(fmt.Sprintf("container %s of %s restarted %d times (%s); the end of its first log:\n%s", cs.Name, p.Name, cs.RestartCount, reason, tail))
		}
	}
})
