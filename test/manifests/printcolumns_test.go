package manifests_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// tableOf asks the API server for kind's objects in namespace ns as kubectl
// does: the server-side table of the CRD's printer columns.
func tableOf(ns, resource string) *metav1.Table {
	hc, err := rest.HTTPClientFor(env.Cfg)
	Expect(err).NotTo(HaveOccurred())
	url := fmt.Sprintf("%s/apis/%s/%s/namespaces/%s/%s", strings.TrimSuffix(env.Cfg.Host, "/"),
		v1alpha1.GroupVersion.Group, v1alpha1.GroupVersion.Version, ns, resource)
	req, err := http.NewRequestWithContext(env.Ctx, http.MethodGet, url, nil)
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	Expect(resp.StatusCode).To(Equal(http.StatusOK), "table of %s: %s", resource, body)
	t := &metav1.Table{}
	Expect(json.Unmarshal(body, t)).To(Succeed())
	return t
}

// cells are row's cells by column name.
func cells(t *metav1.Table, row int) map[string]any {
	out := map[string]any{}
	for i, c := range t.ColumnDefinitions {
		out[c.Name] = t.Rows[row].Cells[i]
	}
	return out
}

// shownColumns are the names, upper-cased, of the columns kubectl get
// prints without -o wide.
func shownColumns(t *metav1.Table) []string {
	var out []string
	for _, c := range t.ColumnDefinitions {
		if c.Priority == 0 {
			out = append(out, strings.ToUpper(c.Name))
		}
	}
	return out
}

var _ = Describe("kubectl get's columns", Ordered, func() {
	var (
		ns     string
		tables = map[string]*metav1.Table{}
	)
	BeforeAll(func() {
		ns = env.NewNamespace()
		k8s, ctx := env.Client, env.Ctx
		By("creating a held lock, a lock not held, a RedisMasterSet and a LockHeartbeat, with status as the operator writes it")
		validUntil := v1alpha1.NewPreciseTime(time.Now().Add(20 * time.Second))
		held := &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "held"},
			Spec: v1alpha1.DistributedLockSpec{MasterSet: "masters", TTL: metav1.Duration{Duration: 30 * time.Second}}}
		Expect(k8s.Create(ctx, held)).To(Succeed())
		held.Status = v1alpha1.DistributedLockStatus{
			Holder: &v1alpha1.LockHolder{Identity: "migrations-job"}, GrantID: "g1", FencingToken: 1796020759067016,
			ValidUntil: validUntil, Queue: &v1alpha1.LockQueue{Count: 3, Waiting: []v1alpha1.QueuedPod{{Name: "urgent-pod", UID: "u1", Priority: 5000}, {Name: "pod-2", UID: "u2"}}},
		}
		meta.SetStatusCondition(&held.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAcquired, Message: "held"})
		Expect(k8s.Status().Update(ctx, held)).To(Succeed())
		Expect(k8s.Create(ctx, &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "idle"},
			Spec: v1alpha1.DistributedLockSpec{MasterSet: "masters", TTL: metav1.Duration{Duration: 30 * time.Second}}})).To(Succeed())

		set := &v1alpha1.RedisMasterSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "masters"},
			Spec: v1alpha1.RedisMasterSetSpec{MaxLockTTL: metav1.Duration{Duration: time.Minute},
				External: &v1alpha1.ExternalMasters{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}}}}
		Expect(k8s.Create(ctx, set)).To(Succeed())
		set.Status.Serving, set.Status.Total = 3, 3
		meta.SetStatusCondition(&set.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionAvailable, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonQuorumServing, Message: "serving"})
		Expect(k8s.Status().Update(ctx, set)).To(Succeed())

		Expect(k8s.Create(ctx, &v1alpha1.LockHeartbeat{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "held"},
			Spec: v1alpha1.LockHeartbeatSpec{HolderIdentity: "g1", RenewTime: &metav1.MicroTime{Time: time.Now()}, StoppedGrant: "g0"}})).To(Succeed())
		for _, r := range []string{"distributedlocks", "redismastersets", "lockheartbeats"} {
			tables[r] = tableOf(ns, r)
		}
	})

	It("prints every column of a DistributedLock: the validity as the timestamp status shows, never <invalid>", func() {
		t := tables["distributedlocks"]
		Expect(shownColumns(t)).To(Equal([]string{"NAME", "HOLDER", "HELD", "VALID-UNTIL", "TOKEN", "WAITING", "AGE"}))
		Expect(t.Rows).To(HaveLen(2))
		held := cells(t, 0)
		lock := &v1alpha1.DistributedLock{}
		Expect(env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: "held"}, lock)).To(Succeed())
		Expect(held).To(HaveKeyWithValue("Name", "held"))
		Expect(held).To(HaveKeyWithValue("Holder", "migrations-job"))
		Expect(held).To(HaveKeyWithValue("Held", "True"))
		shown, err := json.Marshal(lock.Status.ValidUntil)
		Expect(err).NotTo(HaveOccurred())
		Expect(held["Valid-Until"]).To(Equal(strings.Trim(string(shown), `"`)), "the validity as status shows it, in the future")
		Expect(held).To(HaveKeyWithValue("Token", BeNumerically("==", 1796020759067016)))
		Expect(held).To(HaveKeyWithValue("Waiting", BeNumerically("==", 3)))
		By("showing the next pod in line and its priority with -o wide")
		Expect(held).To(HaveKeyWithValue("Next", "urgent-pod"))
		Expect(held).To(HaveKeyWithValue("Next-Priority", BeNumerically("==", 5000)))
		Expect(held["Age"]).To(MatchRegexp(`^[0-9]+[smhd]`), "the lock's age")
		idle := cells(t, 1)
		Expect(idle).To(HaveKeyWithValue("Name", "idle"))
		for _, row := range []map[string]any{held, idle} {
			for name, v := range row {
				Expect(fmt.Sprint(v)).NotTo(ContainSubstring("invalid"), "column %s of lock %s", name, row["Name"])
			}
		}
	})

	It("prints every column of a RedisMasterSet and of a LockHeartbeat", func() {
		t := tables["redismastersets"]
		Expect(shownColumns(t)).To(Equal([]string{"NAME", "SERVING", "TOTAL", "AVAILABLE", "AGE"}))
		Expect(t.Rows).To(HaveLen(1))
		set := cells(t, 0)
		Expect(set).To(HaveKeyWithValue("Serving", BeNumerically("==", 3)))
		Expect(set).To(HaveKeyWithValue("Total", BeNumerically("==", 3)))
		Expect(set).To(HaveKeyWithValue("Available", "True"))
		Expect(set["Age"]).To(MatchRegexp(`^[0-9]+[smhd]`))

		t = tables["lockheartbeats"]
		Expect(shownColumns(t)).To(Equal([]string{"NAME", "HOLDER", "RENEWED", "AGE"}), "STOPPED only with -o wide")
		Expect(t.Rows).To(HaveLen(1))
		hb := cells(t, 0)
		Expect(hb).To(HaveKeyWithValue("Holder", "g1"))
		Expect(hb["Renewed"]).To(MatchRegexp(`^\d{4}-\d\d-\d\dT`), "the renewal's timestamp")
		Expect(hb).To(HaveKeyWithValue("Stopped", "g0"))
		Expect(hb["Age"]).To(MatchRegexp(`^[0-9]+[smhd]`))
	})

	It("matches the sample outputs of kubectl get in the README and docs: headers, and the validity's form", func() {
		short := map[string]string{"dlock": "distributedlocks", "rms": "redismastersets", "dlockhb": "lockheartbeats"}
		files, err := listDocPages() // README.md and docs/**/*.md
		Expect(err).NotTo(HaveOccurred())
		command := regexp.MustCompile(`^kubectl get (dlock|rms|dlockhb)\b`)
		checked := 0
		for _, f := range files {
			data, err := os.ReadFile(filepath.Join(root, f)) //nolint:gosec // the repository's own docs
			Expect(err).NotTo(HaveOccurred())
			sc := bufio.NewScanner(bytes.NewReader(data))
			resource := ""
			for sc.Scan() {
				line := sc.Text()
				if m := command.FindStringSubmatch(line); m != nil {
					resource = short[m[1]]
					continue
				}
				if resource != "" && strings.HasPrefix(line, "# NAME") {
					Expect(strings.Fields(strings.TrimPrefix(line, "#"))).To(Equal(shownColumns(tables[resource])),
						"%s: the sample output of kubectl get %s", f, resource)
					checked++
				}
				if resource == "distributedlocks" && strings.HasPrefix(line, "# ") && !strings.HasPrefix(line, "# NAME") {
					for _, field := range strings.Fields(line) {
						if strings.Contains(field, "T") && strings.HasSuffix(field, "Z") {
							_, err := time.Parse(time.RFC3339Nano, field)
							Expect(err).NotTo(HaveOccurred(), "%s: a validity in the sample output of kubectl get dlock", f)
						}
					}
				}
				if !strings.HasPrefix(line, "#") {
					resource = ""
				}
			}
		}
		Expect(checked).To(BeNumerically(">=", 2), "the docs' samples of kubectl get dlock and kubectl get rms were found")
	})
})
