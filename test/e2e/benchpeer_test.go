//go:build e2e

package e2e

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// The Kubernetes-native peer of the benchmark and the API writes per held
// lock (make bench-failover-pods).

const (
	leasePeerImage   = "leasepeer:local"
	leasePeerAccount = "bench-lease"
)

// importLeasePeer builds test/e2e/leasepeer statically and imports it into
// the local cluster as leasePeerImage, as hack/local-cluster/cluster.sh
// imports its images (mkimage, then ctr images import).
func importLeasePeer() {
	rootfs := GinkgoT().TempDir()
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(rootfs, "leasepeer"), "./test/e2e/leasepeer")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "go build ./test/e2e/leasepeer: %s", out)
	tarball := filepath.Join(state, "images", "leasepeer.tar")
	Expect(os.MkdirAll(filepath.Dir(tarball), 0o750)).To(Succeed())
	run(filepath.Join(state, "bin", "mkimage"), "-rootfs", rootfs, "-tag", leasePeerImage, "-entrypoint", "/leasepeer", "-o", tarball)
	run("ctr", "-a", filepath.Join(state, "containerd", "containerd.sock"), "-n", "k8s.io", "images", "import", tarball)
}

// leasePeerAccess lets the peer's ServiceAccount take Leases in the
// suite's namespace, until the benchmark ends.
func leasePeerAccess() {
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leasePeerAccount}},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leasePeerAccount},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{coordinationv1.GroupName}, Resources: []string{"leases"},
				Verbs: []string{"get", "create", "update"}}},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leasePeerAccount},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: leasePeerAccount},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: leasePeerAccount}},
		},
	}
	for _, o := range objs {
		Expect(k8s.Create(ctx, o)).To(Succeed())
		removeAfterSpec(o)
	}
}

// leasePeerTemplate is a pod template of app running the Lease peer on
// lease, as user uid, on the host network like the agent's pods, reporting
// to the same host directory.
func leasePeerTemplate(app, lease string, uid int64) corev1.PodTemplateSpec {
	hostDir := corev1.HostPathDirectory
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{
			ServiceAccountName:            leasePeerAccount,
			HostNetwork:                   true,
			DNSPolicy:                     corev1.DNSClusterFirstWithHostNet,
			TerminationGracePeriodSeconds: new(int64(5)),
			SecurityContext:               &corev1.PodSecurityContext{RunAsUser: new(uid), RunAsGroup: new(uid)},
			Containers: []corev1.Container{{
				Name: "app", Image: leasePeerImage, ImagePullPolicy: corev1.PullNever,
				Env: []corev1.EnvVar{{Name: "LEASE", Value: lease}, {Name: "REPORT", Value: "/active/" + app + ".log"},
					{Name: "POD_NAME", ValueFrom: field("metadata.name")}, {Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
					{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"}, {Name: "KUBERNETES_SERVICE_PORT", Value: apiPort()}},
				VolumeMounts: []corev1.VolumeMount{{Name: "active", MountPath: "/active"}},
			}},
			Volumes: []corev1.Volume{{Name: "active", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: activeDir, Type: &hostDir}}}},
		},
	}
}

// changes counts, per key, the changes a watch sees from the moment it is
// started: every committed write to the objects it watches.
type changes struct {
	mu    sync.Mutex
	count map[string]int
	stops []func()
}

// watchChanges adds a watch of list (from its current version on) whose
// changes are counted under key(object).
func (c *changes) watchChanges(wc client.WithWatch, list client.ObjectList, key func(client.Object) string, opts ...client.ListOption) {
	Expect(k8s.List(ctx, list, opts...)).To(Succeed())
	w, err := wc.Watch(ctx, list, append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}})...)
	Expect(err).NotTo(HaveOccurred())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			o, ok := ev.Object.(client.Object)
			if !ok || ev.Type == watch.Bookmark || ev.Type == watch.Error {
				continue
			}
			c.mu.Lock()
			c.count[key(o)]++
			c.mu.Unlock()
		}
	}()
	c.stops = append(c.stops, func() { w.Stop(); <-done })
}

// stop ends the watches and returns the counts.
func (c *changes) stop() map[string]int {
	for _, s := range c.stops {
		s()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.count)
}

var requestLabel = regexp.MustCompile(`(\w+)="([^"]*)"`)

// apiWrites is the API server's count of write requests so far
// (apiserver_request_total, verbs POST, PUT, PATCH, APPLY and DELETE) by
// resource and subresource, and whether they were refused (code ≥ 400).
func apiWrites() map[writeKind]float64 {
	out, err := exec.Command(os.Getenv("KUBECTL"), "get", "--raw", "/metrics").Output() //nolint:gosec // the suite's kubectl
	Expect(err).NotTo(HaveOccurred())
	writes := map[writeKind]float64{}
	for line := range strings.Lines(string(out)) {
		rest, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		l := map[string]string{}
		for _, m := range requestLabel.FindAllStringSubmatch(labels, -1) {
			l[m[1]] = m[2]
		}
		switch l["verb"] {
		case "POST", "PUT", "PATCH", "APPLY", "DELETE":
		default:
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		r := l["resource"]
		if l["subresource"] != "" {
			r += "/" + l["subresource"]
		}
		writes[writeKind{r, l["code"] >= "400"}] += v
	}
	return writes
}

type writeKind struct {
	resource string
	refused  bool
}

// measureWrites holds three locks at once — agent-run DistributedLocks at
// ttl 4s (the suite's) and 15s (on the long set), and a client-go Lease
// (15s lease duration: the same failover bound as the 15s lock) — and
// counts the API writes each causes over a quiet minute: changes to the
// lock object and to its pods, through watches, and the API server's own
// count of writes by resource in the same minute.
func measureWrites() {
	const window = 60 * time.Second
	type held struct {
		app, what, kind string
		bound           time.Duration
		d               *appsv1.Deployment
	}
	var locks []held
	for i, l := range []struct {
		set     string
		lockTTL time.Duration
	}{{"masters", ttl}, {longSetName, 15 * time.Second}} {
		app := "bench-writes-" + l.lockTTL.String()
		resetActive(app)
		lk := lockOn(app, l.set, l.lockTTL)
		Expect(k8s.Create(ctx, lk)).To(Succeed())
		removeAfterSpec(lk)
		locks = append(locks, held{app, "DistributedLock, agent-run, ttl " + l.lockTTL.String(), "distributedlocks", l.lockTTL,
			agentDeployment(app, agentTemplate(app, app, int64(23472+i)))})
	}
	const peer = "bench-writes-lease"
	resetActive(peer)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: peer},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": peer}},
			Template: leasePeerTemplate(peer, peer, 23481),
		},
	}
	Expect(k8s.Create(ctx, d)).To(Succeed())
	removeAfterSpec(d)
	locks = append(locks, held{peer, "Lease, client-go leaderelection 15s/10s/2s", "leases", 15 * time.Second, d})
	for _, l := range locks {
		Eventually(func() error { _, err := running(l.app, l.d); return err }, 3*time.Minute, 200*time.Millisecond).Should(Succeed(), "app %s to run", l.app)
	}
	// The grants' own writes (holder marks, first refreshes) are done.
	time.Sleep(10 * time.Second)

	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	Expect(err).NotTo(HaveOccurred())
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: k8s.Scheme()})
	Expect(err).NotTo(HaveOccurred())
	c := &changes{count: map[string]int{}}
	byName := func(o client.Object) string { return o.GetNamespace() + "/" + o.GetName() }
	c.watchChanges(wc, &v1alpha1.DistributedLockList{}, func(o client.Object) string { return "distributedlocks " + byName(o) }, client.InNamespace(ns))
	c.watchChanges(wc, &coordinationv1.LeaseList{}, func(o client.Object) string { return "leases " + byName(o) })
	c.watchChanges(wc, &corev1.PodList{}, func(o client.Object) string { return "pods of " + o.GetLabels()["app"] }, client.InNamespace(ns))
	before, start := apiWrites(), time.Now()
	time.Sleep(window)
	after, elapsed := apiWrites(), time.Since(start)
	counts := c.stop()
	for _, l := range locks {
		if _, err := running(l.app, l.d); err != nil {
			GinkgoWriter.Printf("writes: the app of %s is not running at the end of the window: %v\n", l.app, err)
		}
	}

	GinkgoWriter.Printf("\nAPI writes per held lock over a quiet %v (watches of each object; 2 pods each, the holder's app running throughout):\n\n", elapsed.Round(time.Second))
	GinkgoWriter.Printf("| held lock | failover bound | writes to the lock object | writes to its pods | writes/s per held lock |\n|---|---:|---:|---:|---:|\n")
	perSecond := map[string]float64{}
	for _, l := range locks {
		object, pods := counts[l.kind+" "+ns+"/"+l.app], counts["pods of "+l.app]
		perSecond[l.app] = float64(object+pods) / elapsed.Seconds()
		GinkgoWriter.Printf("| %s | %v | %d | %d | %.3f |\n", l.what, l.bound, object, pods, perSecond[l.app])
	}
	if lock := perSecond[locks[1].app]; lock > 0 {
		GinkgoWriter.Printf("\nLease / agent-run lock at the same 15s failover bound: %.1f× the writes\n", perSecond[peer]/lock)
	}
	GinkgoWriter.Printf("\nevery change the watches saw: %v\n", counts)
	GinkgoWriter.Printf("\nthe API server's write requests in the same window (apiserver_request_total, POST/PUT/PATCH/APPLY/DELETE; the whole cluster):\n\n| resource | writes | writes/s | refused (code ≥ 400) |\n|---|---:|---:|---:|\n")
	resources := map[string]bool{}
	for k := range after {
		resources[k.resource] = true
	}
	for _, r := range slices.Sorted(maps.Keys(resources)) {
		done := after[writeKind{r, false}] - before[writeKind{r, false}]
		refused := after[writeKind{r, true}] - before[writeKind{r, true}]
		if done > 0 || refused > 0 {
			GinkgoWriter.Printf("| %s | %.0f | %.3f | %.0f |\n", r, done, done/elapsed.Seconds(), refused)
		}
	}
	GinkgoWriter.Println()
}
