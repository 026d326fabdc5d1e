package podgate

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
)

// testScheme has the core kinds and the operator's.
func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

// podNamespace is the namespace of the pods the tests admit.
const podNamespace = "team-a"

// admit asks g to admit the creation of pod in podNamespace.
func admit(t *testing.T, g *Gater, pod *corev1.Pod) admission.Response {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return g.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, Namespace: podNamespace, Object: runtime.RawExtension{Raw: raw},
	}})
}

func TestGaterAddsTheGateALabelAsksFor(t *testing.T) {
	decoder := admission.NewDecoder(testScheme(t))
	labelled := func(labels map[string]string, mutate ...func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
		for _, m := range mutate {
			m(p)
		}
		return p
	}
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		wantOps []string // paths patched
		watch   []string // the operator's namespaces; the pod's is "team-a"
		warns   bool
	}{
		{"a labelled pod without a gate gets the scheduling gate", labelled(map[string]string{v1alpha1.LockLabel: "l"}), []string{"/spec/schedulingGates"}, nil, false},
		{"redlock.dev/gate: readiness asks for the readiness gate", labelled(map[string]string{v1alpha1.LockLabel: "l", v1alpha1.GateModeLabel: "readiness"}), []string{"/spec/readinessGates"}, nil, false},
		{"a pod that carries a gate already is left alone", labelled(map[string]string{v1alpha1.LockLabel: "l"}, func(p *corev1.Pod) {
			p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: v1alpha1.ReadinessGate}}
		}), nil, nil, false},
		{"an unlabelled pod is left alone", labelled(nil), nil, nil, false},
		{"a labelled pod of a watched namespace gets the gate", labelled(map[string]string{v1alpha1.LockLabel: "l"}), []string{"/spec/schedulingGates"}, []string{"team-b", "team-a"}, false},
		{"a labelled pod of a namespace the operator does not watch is left alone, with a warning", labelled(map[string]string{v1alpha1.LockLabel: "l"}), nil, []string{"team-b"}, true},
		{"a pod labelled for a semaphore gets the scheduling gate", labelled(map[string]string{v1alpha1.SemaphoreLabel: "s"}), []string{"/spec/schedulingGates"}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := admit(t, &Gater{Decoder: decoder, Namespaces: tc.watch}, tc.pod)
			if !resp.Allowed {
				t.Fatalf("refused: %+v", resp.Result)
			}
			var paths []string
			for _, op := range resp.Patches {
				paths = append(paths, op.Path)
			}
			if len(paths) != len(tc.wantOps) || (len(paths) > 0 && paths[0] != tc.wantOps[0]) {
				t.Errorf("patched %v, want %v", paths, tc.wantOps)
			}
			if (len(resp.Warnings) > 0) != tc.warns {
				t.Errorf("warnings %q, want some: %v", resp.Warnings, tc.warns)
			}
		})
	}
}

func TestGaterRefusesAnAgentPodInANamespaceItDoesNotWatch(t *testing.T) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{v1alpha1.LockLabel: "l"}, Annotations: map[string]string{v1alpha1.AgentAnnotation: "run"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i", Command: []string{"/c"}}}},
	}
	resp := admit(t, &Gater{Decoder: admission.NewDecoder(testScheme(t)), Namespaces: []string{"team-b"}}, p)
	if resp.Allowed || !strings.Contains(resp.Result.Message, "does not watch namespace") {
		t.Errorf("response %+v: want the pod refused, its app would run without the lock", resp.Result)
	}
}

func TestGaterWarnsWhenTheAgentWouldStopTheAppBeforeEveryRefresh(t *testing.T) {
	scheme := testScheme(t)
	lock := &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "l"},
		Spec:       v1alpha1.DistributedLockSpec{MasterSet: "m", TTL: metav1.Duration{Duration: 10 * time.Second}},
	}
	locks := fake.NewClientBuilder().WithScheme(scheme).WithObjects(lock).Build()
	for _, tc := range []struct {
		grace string
		warns bool
	}{
		{"500ms", false}, // 750ms < a tenth of 10s
		{"2s", true},
		{"", true}, // the default, 5s
	} {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{v1alpha1.LockLabel: "l", v1alpha1.GateModeLabel: v1alpha1.GateModeHolderLabel},
				Annotations: map[string]string{v1alpha1.AgentAnnotation: "run"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i", Command: []string{"/c"}}}},
		}
		if tc.grace != "" {
			p.Annotations[v1alpha1.AgentGraceAnnotation] = tc.grace
		}
		resp := admit(t, &Gater{Decoder: admission.NewDecoder(scheme), Agent: podagent.Options{Image: "op"}, Locks: locks}, p)
		if !resp.Allowed {
			t.Fatalf("grace %q: refused: %+v", tc.grace, resp.Result)
		}
		if warned := len(resp.Warnings) > 0 && strings.Contains(resp.Warnings[0], "before the validity is refreshed"); warned != tc.warns {
			t.Errorf("grace %q: warnings %q, want a warning: %v", tc.grace, resp.Warnings, tc.warns)
		}
	}
}

func TestGaterRefusesASemaphorePodThatWouldStartBeforeItsSlot(t *testing.T) {
	for name, mutate := range map[string]func(*corev1.Pod){
		"readiness mode":    func(p *corev1.Pod) { p.Labels[v1alpha1.GateModeLabel] = v1alpha1.GateModeReadiness },
		"holder-label mode": func(p *corev1.Pod) { p.Labels[v1alpha1.GateModeLabel] = v1alpha1.GateModeHolderLabel },
		"the readiness gate": func(p *corev1.Pod) {
			p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: v1alpha1.ReadinessGate}}
		},
		"the agent": func(p *corev1.Pod) { p.Annotations = map[string]string{v1alpha1.AgentAnnotation: "run"} },
	} {
		t.Run(name, func(t *testing.T) {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{v1alpha1.SemaphoreLabel: "s"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i", Command: []string{"/c"}}}},
			}
			mutate(p)
			resp := admit(t, &Gater{Decoder: admission.NewDecoder(testScheme(t))}, p)
			if resp.Allowed || !strings.Contains(resp.Result.Message, "a semaphore's pods") {
				t.Errorf("response %+v: want the pod refused, it cannot wait for a slot that way", resp.Result)
			}
		})
	}
}

func TestGaterRefusesAnUnusablePriority(t *testing.T) {
	for _, labels := range []map[string]string{{v1alpha1.LockLabel: "l"}, {v1alpha1.SemaphoreLabel: "s"}} {
		for value, allowed := range map[string]bool{"high": false, "2147483648": false, "-5": true, "1000000": true} {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: labels, Annotations: map[string]string{v1alpha1.PriorityAnnotation: value}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i", Command: []string{"/c"}}}},
			}
			resp := admit(t, &Gater{Decoder: admission.NewDecoder(testScheme(t))}, p)
			if resp.Allowed != allowed || (!allowed && !strings.Contains(resp.Result.Message, "is not a 32-bit integer")) {
				t.Errorf("labels %v, %s=%q: allowed %v (%+v), want %v", labels, v1alpha1.PriorityAnnotation, value, resp.Allowed, resp.Result, allowed)
			}
		}
	}
}

func TestGaterRefusesAnUnusableWaitLimit(t *testing.T) {
	for _, tc := range []struct {
		key, value string
		allowed    bool
	}{
		{v1alpha1.WaitTimeoutAnnotation, "10m", true},
		{v1alpha1.WaitTimeoutAnnotation, "soon", false},
		{v1alpha1.WaitTimeoutAnnotation, "1ms", false},
		{v1alpha1.OnWaitTimeoutAnnotation, "Fail", true},
		{v1alpha1.OnWaitTimeoutAnnotation, "Evict", false},
	} {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{v1alpha1.LockLabel: "l"}, Annotations: map[string]string{tc.key: tc.value}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i", Command: []string{"/c"}}}},
		}
		resp := admit(t, &Gater{Decoder: admission.NewDecoder(testScheme(t))}, p)
		if resp.Allowed != tc.allowed || (!tc.allowed && !strings.Contains(resp.Result.Message, tc.key)) {
			t.Errorf("%s=%q: allowed %v (%+v), want %v", tc.key, tc.value, resp.Allowed, resp.Result, tc.allowed)
		}
	}
}
