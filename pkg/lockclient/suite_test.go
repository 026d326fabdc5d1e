package lockclient_test

import (
	"bufio"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// The suite runs a real kube-apiserver and etcd, the operator's manager and
// three real redis-server masters. The in-process specs use the client
// directly; the others run examples/critical-section as separate processes
// that contend for one lock and write to a fenced resource the test
// serves.

var (
	env *testenv.Env
	mgr *testenv.Manager
	ns  string
	ms  *testenv.MasterSet
	// example is the built examples/critical-section; kubeconfig an
	// administrator's for it.
	example, kubeconfig string
)

func TestLockClient(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "A Go client holding a lock for a critical section")
}

var _ = BeforeSuite(func() {
	env = testenv.Start()
	dir := GinkgoT().TempDir()
	example = filepath.Join(dir, "critical-section")
	build := exec.Command("go", "build", "-o", example, "../../examples/critical-section")
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "go build examples/critical-section: %s", out)
	kubeconfig = env.Kubeconfig(dir)
	mgr = env.StartManager()
	ns = env.NewNamespace()
	ms = env.NewServingMasters(ns, "masters", 3, 10*time.Second)
})

var _ = AfterSuite(func() {
	if mgr != nil {
		mgr.Stop()
	}
	env.Stop()
})

// newLock creates a lock on the suite's masters with a ttl of 10s (its
// validity lasts well past a lease of 3s, and a tenth of it, the lead of a
// validity refresh, is well above the skew allowance) and, when lease is
// non-zero, that holderLease.
func newLock(name string, lease time.Duration) types.NamespacedName {
	return newLockOn(name, ms.Name, lease)
}

func newLockOn(name, masterSet string, lease time.Duration) types.NamespacedName {
	l := &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.DistributedLockSpec{MasterSet: masterSet, TTL: metav1.Duration{Duration: 10 * time.Second}},
	}
	if lease > 0 {
		l.Spec.HolderLease = &metav1.Duration{Duration: lease}
	}
	Expect(env.Client.Create(env.Ctx, l)).To(Succeed())
	return client.ObjectKeyFromObject(l)
}

func getLock(key types.NamespacedName) *v1alpha1.DistributedLock {
	l := &v1alpha1.DistributedLock{}
	Expect(env.Client.Get(env.Ctx, key, l)).To(Succeed())
	return l
}

// fenced is the fenced resource of the test: it accepts a write whose token
// is no lower than the highest it accepted, and records every write.
type fenced struct {
	srv *http.Server
	url string

	mu      sync.Mutex
	highest int64
	writes  []write
}

type write struct {
	token    int64
	writer   string
	accepted bool
}

func newFenced() *fenced {
	f := &fenced{}
	mux := http.NewServeMux()
	mux.HandleFunc("/write", func(w http.ResponseWriter, r *http.Request) {
		token, err := strconv.ParseInt(r.URL.Query().Get("token"), 10, 64)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if !f.offer(token, r.URL.Query().Get("writer")) {
			w.WriteHeader(http.StatusConflict)
		}
	})
	f.srv = &http.Server{Addr: "127.0.0.1:0", Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	f.url = "http://" + ln.Addr().String() + "/write"
	go func() { _ = f.srv.Serve(ln) }()
	DeferCleanup(func() { _ = f.srv.Close() })
	return f
}

// offer is one write: accepted unless its token is lower than the highest.
func (f *fenced) offer(token int64, writer string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	ok := token >= f.highest
	if ok {
		f.highest = token
	}
	f.writes = append(f.writes, write{token: token, writer: writer, accepted: ok})
	return ok
}

func (f *fenced) log() []write {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]write(nil), f.writes...)
}

// proc is a running examples/critical-section and the event lines it
// printed.
type proc struct {
	name string
	cmd  *exec.Cmd

	mu     sync.Mutex
	events []event
	exited chan struct{}
	err    error
}

// event is one line the example printed: its name and fields.
type event struct {
	name   string
	fields map[string]string
	at     time.Time
}

// start runs the example on lock as name, with kubeconfig kc.
func start(name, kc string, lock types.NamespacedName, f *fenced, hold time.Duration) *proc {
	cmd := exec.Command(example, "--kubeconfig", kc, "-n", lock.Namespace, "--lock", lock.Name,
		"--fenced", f.url, "--identity", name, "--hold", hold.String(), "--every", "50ms")
	cmd.Stderr = GinkgoWriter
	out, err := cmd.StdoutPipe()
	Expect(err).NotTo(HaveOccurred())
	Expect(cmd.Start()).To(Succeed(), "start %s", name)
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.add(sc.Text())
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	DeferCleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-p.exited
	})
	return p
}

func (p *proc) add(line string) {
	fields := map[string]string{}
	var name string
	for _, kv := range splitFields(line) {
		k, v, _ := strings.Cut(kv, "=")
		if k == "event" {
			name = v
			continue
		}
		fields[k] = v
	}
	at, _ := strconv.ParseInt(fields["at"], 10, 64)
	GinkgoWriter.Printf("%s: %s\n", p.name, line)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, event{name: name, fields: fields, at: time.Unix(0, at)})
}

// splitFields splits a line at spaces outside double quotes.
func splitFields(line string) []string {
	var out []string
	var cur strings.Builder
	quoted := false
	for _, r := range line {
		switch {
		case r == '"':
			quoted = !quoted
			cur.WriteRune(r)
		case r == ' ' && !quoted:
			out = append(out, cur.String())
			cur.Reset()
		default:
			cur.WriteRune(r)
		}
	}
	return append(out, cur.String())
}

// Events returns the events printed so far.
func (p *proc) Events() []event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]event(nil), p.events...)
}

// first returns the first event named name (ok false: none yet).
func (p *proc) first(name string) (event, bool) {
	for _, e := range p.Events() {
		if e.name == name {
			return e, true
		}
	}
	return event{}, false
}

// eventually waits for the first event named name and returns it.
func (p *proc) eventually(name string, timeout time.Duration) event {
	var e event
	Eventually(func(g Gomega) {
		var ok bool
		e, ok = p.first(name)
		g.Expect(ok).To(BeTrue())
	}).WithTimeout(timeout).Should(Succeed(), "process %s to print event=%s", p.name, name)
	return e
}

// proxiedKubeconfig writes a kubeconfig like kubeconfig whose server is
// reached through a proxy the test controls.
func proxiedKubeconfig() (string, *redistest.Proxy) {
	u, err := url.Parse(env.Cfg.Host)
	Expect(err).NotTo(HaveOccurred())
	proxy := redistest.NewProxy(GinkgoT(), u.Host)
	kc, err := os.ReadFile(kubeconfig) //nolint:gosec // the suite's own kubeconfig
	Expect(err).NotTo(HaveOccurred())
	Expect(string(kc)).To(ContainSubstring(u.Host), "the kubeconfig names the API server")
	path := filepath.Join(GinkgoT().TempDir(), "kubeconfig")
	Expect(os.WriteFile(path, []byte(strings.ReplaceAll(string(kc), u.Host, proxy.Addr())), 0o600)).To(Succeed()) //nolint:gosec // a temporary directory of the test
	return path, proxy
}
