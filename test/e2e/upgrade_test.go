//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/release"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

// decodeObjects are the objects of a YAML stream (documents without
// apiVersion and kind left out).
func decodeObjects(data []byte) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return out
		}
		Expect(err).NotTo(HaveOccurred(), "decode a YAML document")
		if u.GetAPIVersion() != "" && u.GetKind() != "" {
			out = append(out, u)
		}
	}
}

// buildOperatorImage builds the binaries the final stage of dir's
// Dockerfile copies (its COPY --from=builder lines, USER, WORKDIR,
// ENTRYPOINT), stamped with version, as the Dockerfile builds them, and
// imports them into the node's containerd as image tag, as
// hack/local-cluster does for the working tree.
func buildOperatorImage(dir, tag, version string) {
	data, err := os.ReadFile(filepath.Join(dir, "Dockerfile")) //nolint:gosec // the spec's own checkout
	Expect(err).NotTo(HaveOccurred())
	final := string(data)[strings.LastIndex(string(data), "\nFROM "):]
	field := func(re string) string {
		m := regexp.MustCompile(`(?m)^` + re + `$`).FindStringSubmatch(final)
		Expect(m).NotTo(BeNil(), "the Dockerfile's final stage has %s", re)
		return m[1]
	}
	rootfs := filepath.Join(GinkgoT().TempDir(), "rootfs")
	for _, m := range regexp.MustCompile(`(?m)^COPY --from=builder (\S+) (\S+)$`).FindAllStringSubmatch(final, -1) {
		bin := path.Base(m[1])
		build := exec.Command("go", "build", "-trimpath", "-ldflags",
			"-s -w -X github.com/redlock-operator/redlock-operator/internal/version.Version="+version,
			"-o", filepath.Join(rootfs, m[2]), "./cmd/"+bin)
		build.Dir = dir
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "build %s of %s: %s", bin, version, out)
	}
	tar := filepath.Join(GinkgoT().TempDir(), "operator.tar")
	out, err := exec.Command(filepath.Join(state, "bin", "mkimage"), "-rootfs", rootfs, "-tag", tag,
		"-entrypoint", field(`ENTRYPOINT \["([^"]*)"\]`), "-user", field(`USER (\S+)`), "-workdir", field(`WORKDIR (\S+)`), "-o", tar).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "mkimage %s: %s", tag, out)
	out, err = exec.Command("ctr", "-a", filepath.Join(state, "containerd", "containerd.sock"), "-n", "k8s.io", "images", "import", tar).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "import %s: %s", tag, out)
}

// previousManifests is kustomize build config/e2e of dir, a previous
// release's tree, running image.
func previousManifests(dir, image string) []byte {
	build := exec.Command("go", "tool", "-modfile=hack/tools/go.mod", "kustomize", "build", "config/e2e")
	build.Dir = dir
	out, err := build.Output()
	Expect(err).NotTo(HaveOccurred(), "kustomize build config/e2e in %s", dir)
	return bytes.ReplaceAll(out, []byte("redlock-operator:e2e"), []byte(image))
}

// recreating is manifests with the manager's Deployment rolled out by
// recreating its one pod: host-network manager pods cannot bind the same
// ports side by side, as a surge pod would (in a real cluster two pods of
// the Deployment run at once and the standby takes over).
func recreating(manifests []byte) string {
	var docs []string
	for _, u := range decodeObjects(manifests) {
		if u.GetKind() == "Deployment" {
			Expect(unstructured.SetNestedMap(u.Object, map[string]any{"type": "Recreate"}, "spec", "strategy")).To(Succeed())
		}
		data, err := yaml.Marshal(u.Object)
		Expect(err).NotTo(HaveOccurred())
		docs = append(docs, string(data))
	}
	return strings.Join(docs, "---\n")
}

// deployOperator applies manifests and waits until the manager pod running
// image leads (it took the Lease after it started) and is the only manager
// pod, ready and never restarted. It returns when that pod took the Lease.
func deployOperator(manifests, image string) time.Time {
	// The Deployment applied before rolled with the default strategy,
	// whose rollingUpdate the API server filled in: gone first, or
	// Recreate is refused next to it.
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "redlock-system", Name: "redlock-operator-controller-manager"}}
	err := k8s.Patch(ctx, dep, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"strategy":{"type":"Recreate","rollingUpdate":null}}}`)))
	Expect(client.IgnoreNotFound(err)).To(Succeed(), "the manager's Deployment recreating its pod")
	apply := exec.Command(os.Getenv("KUBECTL"), "apply", "--server-side", "--force-conflicts", "-f", "-") //nolint:gosec // the suite's kubectl
	apply.Stdin = strings.NewReader(manifests)
	out, err := apply.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "apply the operator running %s: %s", image, out)
	var acquired time.Time
	Eventually(func(g Gomega) {
		var list corev1.PodList
		g.Expect(k8s.List(ctx, &list, client.InNamespace("redlock-system"), client.MatchingLabels{"control-plane": "controller-manager"})).To(Succeed())
		var pods []corev1.Pod // evicted or finished pods left over do not count
		for _, p := range list.Items {
			if p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
				pods = append(pods, p)
			}
		}
		g.Expect(pods).To(HaveLen(1), "one manager pod")
		p := pods[0]
		g.Expect(p.DeletionTimestamp).To(BeNil(), "manager pod %s not being deleted", p.Name)
		g.Expect(p.Spec.Containers[0].Image).To(Equal(image), "manager pod %s runs %s", p.Name, image)
		g.Expect(p.Status.ContainerStatuses).NotTo(BeEmpty(), "manager pod %s reports its container", p.Name)
		running := p.Status.ContainerStatuses[0].State.Running
		g.Expect(running).NotTo(BeNil(), "manager pod %s runs", p.Name)
		g.Expect(p.Status.ContainerStatuses[0].Ready).To(BeTrue(), "manager pod %s ready", p.Name)
		g.Expect(p.Status.ContainerStatuses[0].RestartCount).To(BeZero(), "manager pod %s never restarted", p.Name)
		var lease coordinationv1.Lease
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "redlock-system", Name: "redlock-operator.redlock.dev"}, &lease)).To(Succeed())
		// Host-network pods share the node's hostname, which leader
		// election names its holder by: the pod leads when it took the
		// Lease after it started (StartedAt is in whole seconds).
		g.Expect(lease.Spec.HolderIdentity).NotTo(BeNil(), "the Lease has a holder")
		g.Expect(*lease.Spec.HolderIdentity).NotTo(BeEmpty(), "the Lease has a holder")
		g.Expect(lease.Spec.AcquireTime).NotTo(BeNil(), "the Lease was acquired")
		g.Expect(lease.Spec.AcquireTime.Time.Before(running.StartedAt.Time)).To(BeFalse(), "manager pod %s (started %v) took the Lease (at %v)", p.Name, running.StartedAt.Time, lease.Spec.AcquireTime.Time)
		acquired = lease.Spec.AcquireTime.Time
	}, 3*time.Minute, 200*time.Millisecond).Should(Succeed(), "the manager running %s to lead, alone", image)
	return acquired
}

// grantSeen is what a lock's status showed at the start.
type grantSeen struct {
	holder, grantID string
	token           int64
}

// upgradeWatch polls the spec's locks and pods until stopped and records
// every moment at which a lock's status showed another grant or holder
// than at the start, a passed validity, or at which a pod other than the
// holder could run.
type upgradeWatch struct {
	mu         sync.Mutex
	violations []string
	count      int           // violations, all of them
	leastAhead time.Duration // least validity status showed ahead
	reads      int           // reads of the locks and pods that answered
	longestGap time.Duration // longest time between two of them
	stop, done chan struct{}
	once       sync.Once
}

func watchUpgrade(namespace string, start map[string]grantSeen) *upgradeWatch {
	w := &upgradeWatch{leastAhead: time.Hour, stop: make(chan struct{}), done: make(chan struct{})}
	note := func(format string, args ...any) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.count++
		if len(w.violations) < 50 {
			w.violations = append(w.violations, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
		}
	}
	go func() {
		defer GinkgoRecover()
		defer close(w.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		shown := map[string]time.Time{} // validity each lock showed last
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			var locks v1alpha1.DistributedLockList
			var pods corev1.PodList
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := k8s.List(rctx, &locks, client.InNamespace(namespace))
			if err == nil {
				err = k8s.List(rctx, &pods, client.InNamespace(namespace))
			}
			cancel()
			if err != nil {
				continue // the API server is busy: the next tick reads again (the gap is counted)
			}
			now := time.Now()
			w.mu.Lock()
			w.reads++
			w.longestGap = max(w.longestGap, now.Sub(last))
			w.mu.Unlock()
			last = now
			if len(locks.Items) != len(start) {
				note("%d locks listed, not %d", len(locks.Items), len(start))
			}
			holders := map[string]string{}
			for _, l := range locks.Items {
				st, want := l.Status, start[l.Name]
				switch {
				case st.Holder == nil || st.ValidUntil == nil:
					note("lock %s shows no holder (Held %v)", l.Name, meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHeld))
					continue
				case st.Holder.Identity != want.holder || st.GrantID != want.grantID:
					note("lock %s shows grant %s to %s, not grant %s to %s", l.Name, st.GrantID, st.Holder.Identity, want.grantID, want.holder)
				case st.FencingToken != want.token:
					note("lock %s shows token %d, not %d", l.Name, st.FencingToken, want.token)
				}
				ahead := st.ValidUntil.Sub(now)
				if ahead <= 0 {
					note("lock %s shows a validity that passed %v ago", l.Name, -ahead)
				}
				// A lapse between two reads: renewed after the validity
				// shown before had passed.
				if before, ok := shown[l.Name]; ok && st.RenewedAt != nil && st.RenewedAt.After(before) {
					note("lock %s renewed at %v, after the validity it showed before (%v) had passed", l.Name, st.RenewedAt.Time, before)
				}
				shown[l.Name] = st.ValidUntil.Time
				w.mu.Lock()
				w.leastAhead = min(w.leastAhead, ahead)
				w.mu.Unlock()
				holders[l.Name] = st.Holder.Identity
			}
			for _, p := range pods.Items {
				if demo.MayRun(&p) && holders[p.Labels[v1alpha1.LockLabel]] != p.Name {
					note("pod %s may run, but lock %s shows holder %q", p.Name, p.Labels[v1alpha1.LockLabel], holders[p.Labels[v1alpha1.LockLabel]])
				}
			}
		}
	}()
	return w
}

// finish stops the watch (once; a spec that failed first stops it in its
// cleanup).
func (w *upgradeWatch) finish() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

var _ = Describe("upgrade from the previous release, and rollback to it", Ordered, func() {
	const (
		upNS = "e2e-upgrade"
		// One manager pod, recreated (host network): the new one leads a
		// pod start after the old one stopped, which 2/3 of the ttl the
		// stopping leader refreshed ahead must cover, on a loaded machine
		// too (with a standby running, 6.3s suffice: docs/design/failover.md).
		lockTTL = 30 * time.Second
		locks   = 3
	)
	var (
		version, prevImage, image string
		prevManifests, manifests  string
	)

	BeforeAll(func() {
		var commit string
		version, commit = previous()
		prevImage = "redlock-operator:" + version + "-e2e"
		By("building the operator of " + version + " (commit " + commit + ") and importing it as " + prevImage)
		prev := GinkgoT().TempDir()
		archive := exec.Command("sh", "-c", "git archive "+commit+" | tar -x -C "+prev)
		archive.Dir = root
		out, err := archive.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "git archive %s (a clone with history is needed): %s", commit, out)
		buildOperatorImage(prev, prevImage, version)
		prevManifests = recreating(previousManifests(prev, prevImage))
		// This tree's: the release's chart as the suite installed it.
		image = releaseImage()
		manifests = recreating([]byte(run("go", "tool", "-modfile=hack/tools/helm/go.mod", "helm", "get", "manifest", "redlock-operator", "--namespace", "redlock-system")))
		// Whatever happens, the suite's other specs get this tree's
		// operator back.
		DeferCleanup(func() {
			deployOperator(manifests, image)
			Eventually(available, 3*time.Minute, time.Second).Should(BeTrue(), "master set %s/%s to be available again under this tree's operator", ns, set.Name)
		})

		By("running " + version + "'s operator")
		deployOperator(prevManifests, prevImage)

		By("three masters on the host, an external RedisMasterSet naming them (maxLockTTL 30s), locks of ttl 30s, two gated pods each")
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: upNS}})).To(Succeed())
		removeAfterSpec(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: upNS}})
		servers := redistest.StartN(GinkgoTB(), 3, redistest.Options{})
		Expect(k8s.Create(ctx, &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: upNS, Name: "masters"},
			Spec: v1alpha1.RedisMasterSetSpec{
				External:   &v1alpha1.ExternalMasters{Addresses: redistest.Addrs(servers)},
				MaxLockTTL: metav1.Duration{Duration: lockTTL},
			},
		})).To(Succeed())
		for i := range locks {
			name := fmt.Sprintf("upgrade-%d", i)
			Expect(k8s.Create(ctx, &v1alpha1.DistributedLock{
				ObjectMeta: metav1.ObjectMeta{Namespace: upNS, Name: name},
				Spec:       v1alpha1.DistributedLockSpec{MasterSet: "masters", TTL: metav1.Duration{Duration: lockTTL}},
			})).To(Succeed())
			for _, suffix := range []string{"a", "b"} {
				pod := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Namespace: upNS, Name: name + "-" + suffix, Labels: map[string]string{v1alpha1.LockLabel: name}},
					Spec: corev1.PodSpec{
						TerminationGracePeriodSeconds: new(int64(1)),
						Containers: []corev1.Container{{Name: "work", Image: "busybox:local", ImagePullPolicy: corev1.PullNever,
							Command: []string{"/bin/sh", "-c", "sleep 3600"}}},
					},
				}
				// Retried while the new manager's webhook, which gates the
				// pod, starts serving.
				Eventually(func() error { return client.IgnoreAlreadyExists(k8s.Create(ctx, pod.DeepCopy())) }, time.Minute, 200*time.Millisecond).
					Should(Succeed(), "pod %s/%s to be created through the webhook", upNS, pod.Name)
			}
		}
	})

	It("keeps every grant, its token and its validity through the upgrade and the rollback, and never lets a second pod run", func() {
		start := map[string]grantSeen{}
		By("every lock held by one of its pods, which runs; the other waits at the gate")
		Eventually(func(g Gomega) {
			var list v1alpha1.DistributedLockList
			g.Expect(k8s.List(ctx, &list, client.InNamespace(upNS))).To(Succeed())
			g.Expect(list.Items).To(HaveLen(locks))
			for _, l := range list.Items {
				g.Expect(l.Status.Holder).NotTo(BeNil(), "lock %s held", l.Name)
				g.Expect(l.Status.Holder.Pod).NotTo(BeNil(), "lock %s held by a pod", l.Name)
				holder := &corev1.Pod{}
				g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: upNS, Name: l.Status.Holder.Identity}, holder)).To(Succeed())
				g.Expect(holder.Status.Phase).To(Equal(corev1.PodRunning), "holder %s of lock %s runs", holder.Name, l.Name)
				start[l.Name] = grantSeen{holder: l.Status.Holder.Identity, grantID: l.Status.GrantID, token: l.Status.FencingToken}
			}
		}, 3*time.Minute, 200*time.Millisecond).Should(Succeed(), "the locks of namespace %s to be held by running pods under %s", upNS, version)
		watch := watchUpgrade(upNS, start)
		DeferCleanup(watch.finish)

		// refreshedBy waits until every lock was renewed after since: by
		// the manager that took the Lease then.
		refreshedBy := func(since time.Time, who string) {
			Eventually(func(g Gomega) {
				var list v1alpha1.DistributedLockList
				g.Expect(k8s.List(ctx, &list, client.InNamespace(upNS))).To(Succeed())
				for _, l := range list.Items {
					g.Expect(l.Status.RenewedAt).NotTo(BeNil(), "lock %s renewed", l.Name)
					g.Expect(l.Status.RenewedAt.After(since)).To(BeTrue(), "lock %s renewed at %v, after %s started at %v", l.Name, l.Status.RenewedAt.Time, who, since)
				}
			}, 2*lockTTL, 100*time.Millisecond).Should(Succeed(), "every lock of namespace %s to be renewed by %s", upNS, who)
		}

		By("upgrading to this tree's operator")
		upgradeAt := time.Now()
		leads := deployOperator(manifests, image)
		refreshedBy(leads, "this tree's manager")
		upgraded := time.Since(upgradeAt)

		By("rolling back to " + version)
		rollbackAt := time.Now()
		leads = deployOperator(prevManifests, prevImage)
		refreshedBy(leads, version+"'s manager")
		rolledBack := time.Since(rollbackAt)

		By("watching " + version + "'s manager renew every lock once more")
		refreshedBy(time.Now(), version+"'s manager, again")
		watch.finish()

		By("granting a new lock to a pod gated through " + version + "'s webhook")
		Expect(k8s.Create(ctx, &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: upNS, Name: "after-rollback"},
			Spec:       v1alpha1.DistributedLockSpec{MasterSet: "masters", TTL: metav1.Duration{Duration: lockTTL}},
		})).To(Succeed())
		after := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: upNS, Name: "after-rollback", Labels: map[string]string{v1alpha1.LockLabel: "after-rollback"}},
			Spec: corev1.PodSpec{TerminationGracePeriodSeconds: new(int64(1)), Containers: []corev1.Container{{Name: "work", Image: "busybox:local",
				ImagePullPolicy: corev1.PullNever, Command: []string{"/bin/sh", "-c", "sleep 3600"}}}},
		}
		created := after.DeepCopy()
		Eventually(func() error { created = after.DeepCopy(); return k8s.Create(ctx, created) }, time.Minute, 200*time.Millisecond).
			Should(Succeed(), "pod %s/%s to be created through the webhook", upNS, after.Name)
		Expect(demo.Gated(created)).To(BeTrue(), "pod %s/%s created with the scheduling gate %s's webhook adds", upNS, after.Name, version)
		Eventually(func(g Gomega) {
			cur := &corev1.Pod{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(after), cur)).To(Succeed())
			g.Expect(demo.MayRun(cur)).To(BeTrue(), "pod %s ungated", cur.Name)
			l := &v1alpha1.DistributedLock{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: upNS, Name: "after-rollback"}, l)).To(Succeed())
			g.Expect(l.Status.Holder).NotTo(BeNil(), "lock after-rollback held")
			g.Expect(l.Status.Holder.Identity).To(Equal(cur.Name), "lock after-rollback held by pod %s", cur.Name)
		}, time.Minute, 200*time.Millisecond).Should(Succeed(), "lock %s/after-rollback to be granted to pod after-rollback by %s's manager", upNS, version)

		watch.mu.Lock()
		violations, count, leastAhead, reads, gap := watch.violations, watch.count, watch.leastAhead, watch.reads, watch.longestGap
		watch.mu.Unlock()
		GinkgoWriter.Printf("upgrade and rollback of %d locks (ttl %v) held by pods:\n", locks, lockTTL)
		GinkgoWriter.Printf("  %-44s %v\n", "apply "+version+" → this tree, every lock renewed:", upgraded.Round(100*time.Millisecond))
		GinkgoWriter.Printf("  %-44s %v\n", "apply this tree → "+version+", every lock renewed:", rolledBack.Round(100*time.Millisecond))
		GinkgoWriter.Printf("  %-44s %v\n", "least validity status showed ahead:", leastAhead.Round(100*time.Millisecond))
		GinkgoWriter.Printf("  %-44s %d (longest gap %v)\n", "reads of the locks and pods:", reads, gap.Round(100*time.Millisecond))
		GinkgoWriter.Printf("  %-44s %d\n", "violations (lapse, other grant, 2nd pod):", count)
		Expect(violations).To(BeEmpty(), "the same grants, tokens and holders, never a passed validity, never a second pod of a lock able to run")
		Expect(reads).To(BeNumerically(">=", 10), "the watch read the locks and pods throughout")
		Expect(gap).To(BeNumerically("<", 5*time.Second), "the watch never went 5s without a read")
	})
})

// previous is the release hack/previous-release names.
func previous() (version, commit string) {
	version, commit, err := release.Previous(root)
	Expect(err).NotTo(HaveOccurred())
	return version, commit
}
