package podgate_test

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// stallLabel marks the pods whose first fencing-token annotation the
// stalling webhook holds back.
const stallLabel = "test.redlock.dev/stall"

// stallTokenAnnotation installs a validating admission webhook, served by
// this test, that holds the first update adding the fencing-token
// annotation to a pod labelled stallLabel until release is called (or 15s
// pass), as a slow API server or a paused manager would. stalled is closed
// once that update waits; release reports whether it still waited.
func stallTokenAnnotation(ns string) (stalled <-chan struct{}, release func() bool) {
	held, freed := make(chan struct{}), make(chan struct{})
	var once, stallOnce sync.Once
	var timedOut atomic.Bool
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(req.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "bad review", http.StatusBadRequest)
			return
		}
		var obj, old corev1.Pod
		_ = json.Unmarshal(review.Request.Object.Raw, &obj)
		_ = json.Unmarshal(review.Request.OldObject.Raw, &old)
		if obj.Annotations[v1alpha1.FencingTokenAnnotation] != "" && old.Annotations[v1alpha1.FencingTokenAnnotation] == "" {
			stallOnce.Do(func() {
				close(held)
				select {
				case <-freed:
				case <-time.After(15 * time.Second):
					timedOut.Store(true)
				}
			})
		}
		review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		review.Request = nil
		_ = json.NewEncoder(w).Encode(review)
	}))
	free := func() bool {
		once.Do(func() { close(freed) })
		return !timedOut.Load()
	}
	DeferCleanup(srv.Close)
	DeferCleanup(free)
	url := srv.URL + "/stall"
	ignore, none, timeout := admissionregv1.Ignore, admissionregv1.SideEffectClassNone, int32(20)
	conf := &admissionregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "stall-token-" + ns},
		Webhooks: []admissionregv1.ValidatingWebhook{{
			Name: "stall.test.redlock.dev",
			ClientConfig: admissionregv1.WebhookClientConfig{URL: &url,
				CABundle: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})},
			FailurePolicy: &ignore, SideEffects: &none, TimeoutSeconds: &timeout,
			AdmissionReviewVersions: []string{"v1"},
			ObjectSelector:          &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: stallLabel, Operator: metav1.LabelSelectorOpExists}}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			Rules: []admissionregv1.RuleWithOperations{{
				Operations: []admissionregv1.OperationType{admissionregv1.Update},
				Rule:       admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
		}},
	}
	Expect(k8s.Create(suiteCtx, conf)).To(Succeed())
	DeferCleanup(func() { _ = k8s.Delete(suiteCtx, conf) })
	return held, free
}

var _ = Describe("A grant that ends while its pod is being annotated", Ordered, func() {
	var mgr *testenv.Manager
	BeforeAll(func() { mgr = env.StartManager() })
	AfterAll(func() { mgr.Stop() })

	It("never leaves two pods ungated: the pod is ungated only while the grant it was annotated for stands", func() {
		ns := env.NewNamespace()
		fragile := env.NewServingMasters(ns, "masters", 3, 2*time.Second)
		createLock(ns, "stalled", fragile.Name, "")
		violations := watchExclusion(ns)
		stalled, release := stallTokenAnnotation(ns)

		By("creating b first (it sorts first), labelled for another lock, then a, the holder, whose token annotation the webhook holds back")
		b := gatedPod(ns, "stall-first", "elsewhere", false)
		Expect(k8s.Create(suiteCtx, b)).To(Succeed())
		a := gatedPod(ns, "stall-second", "stalled", false)
		a.Labels[stallLabel] = "a"
		Expect(k8s.Create(suiteCtx, a)).To(Succeed())
		Eventually(stalled).Should(BeClosed(), "the pod gate to annotate %s/stall-second", ns)
		first := fetchLock(ns, "stalled").Status.FencingToken

		By("queueing b, older than a, for the lock; then losing a's grant and letting the masters serve again")
		relabel(b, "stalled")
		for _, s := range fragile.Servers[:2] {
			Expect(s.Stop()).To(Succeed())
		}
		Eventually(func() *v1alpha1.LockHolder { return fetchLock(ns, "stalled").Status.Holder }).Should(BeNil(), "lock %s/stalled to lose its grant", ns)
		for _, s := range fragile.Servers[:2] {
			Expect(s.Cont()).To(Succeed())
		}
		var regrant *v1alpha1.DistributedLock
		Eventually(func(g Gomega) {
			regrant = fetchLock(ns, "stalled")
			g.Expect(regrant.Status.Holder).NotTo(BeNil(), "lock %s/stalled to be granted again", ns)
		}).Should(Succeed(), "lock %s/stalled to be granted again after losing its grant", ns)
		Expect(regrant.Status.FencingToken).To(BeNumerically(">", first))
		Expect(getPod(a).Annotations).NotTo(HaveKey(v1alpha1.FencingTokenAnnotation), "the stalled annotation got through before the grant was lost and made again")

		By("letting the stale annotation through: a is ungated only with the new grant's token, and b stays gated")
		Expect(release()).To(BeTrue(), "the webhook let the annotation through on its own, before the test released it")
		Consistently(violations, 2*time.Second).Should(BeEmpty(), "two pods of %s may run at once", ns)
		Expect(regrant.Status.Holder.Identity).To(Equal(a.Name), "the pod of the last committed grant, which may still be ungated, stays first in line")
		Eventually(func(g Gomega) {
			cur := getPod(a)
			g.Expect(gated(cur)).To(BeFalse(), "%s/stall-second is still gated", ns)
			g.Expect(cur.Annotations).To(HaveKeyWithValue(v1alpha1.FencingTokenAnnotation, strconv.FormatInt(fetchLock(ns, "stalled").Status.FencingToken, 10)), "fencing token on pod %s", a.Name)
		}).Should(Succeed(), "pod %s/%s to be ungated with the new grant's token of lock stalled", ns, a.Name)
		Consistently(func() bool { return gated(getPod(b)) }, time.Second).Should(BeTrue(), "%s/stall-first was ungated while a may run", ns)
		Expect(violations()).To(BeEmpty())
	})
})
