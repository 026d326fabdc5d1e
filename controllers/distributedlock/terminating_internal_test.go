package distributedlock

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
)

// TestSaidStopped: the agent's word counts as the end of exactly the pod
// of the last grant, only once status no longer shows that grant, only
// for a pod being deleted whose app the agent runs.
func TestSaidStopped(t *testing.T) {
	now := metav1.NewTime(time.Unix(1000, 0))
	runMode := func(name string, token string, deleting bool) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Command: []string{podagent.Agent, "run", "--", "/app"}}}},
		}
		if token != "" {
			p.Annotations = map[string]string{v1alpha1.FencingTokenAnnotation: token, v1alpha1.LockKeyAnnotation: "key"}
		}
		if deleting {
			p.DeletionTimestamp = &now
		}
		return p
	}
	hidden := v1alpha1.DistributedLockStatus{GrantID: "g", FencingToken: 7, LastHolderPod: &v1alpha1.PodReference{Name: "p", UID: "uid-p"}}
	shown := *hidden.DeepCopy()
	shown.Holder = &v1alpha1.LockHolder{Identity: "p", Pod: &v1alpha1.PodReference{Name: "p", UID: "uid-p"}}
	noAgent := runMode("p", "", true)
	noAgent.Spec.Containers[0].Command = []string{"/app"}
	withSidecar := runMode("p", "", true)
	withSidecar.Spec.InitContainers = []corev1.Container{{Name: "proxy", RestartPolicy: new(corev1.ContainerRestartPolicyAlways)}}
	twoContainers := runMode("p", "", true)
	twoContainers.Spec.Containers = append(twoContainers.Spec.Containers, corev1.Container{Name: "other"})
	sharedPIDs := runMode("p", "", true)
	sharedPIDs.Spec.ShareProcessNamespace = new(true)
	debugged := runMode("p", "", true)
	debugged.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug"}}}
	for _, tc := range []struct {
		name string
		st   v1alpha1.DistributedLockStatus
		word string
		pod  *corev1.Pod
		want bool
	}{
		{"the last holder pod, being deleted, its grant hidden and named", hidden, "g", runMode("p", "", true), true},
		{"a pod annotated with the last grant's token (lastHolderPod moved on)", hidden, "g", runMode("q", "7", true), true},
		{"no word", hidden, "", runMode("p", "", true), false},
		{"a word for another grant (a former one)", hidden, "g0", runMode("p", "", true), false},
		{"status still shows the grant", shown, "g", runMode("p", "", true), false},
		{"the pod is not being deleted (its containers may restart)", hidden, "g", runMode("p", "", false), false},
		{"the pod's app does not run through the agent", hidden, "g", noAgent, false},
		{"another pod, granted an earlier token", hidden, "g", runMode("q", "6", true), false},
		{"a pod with a sidecar, which could act on the grant", hidden, "g", withSidecar, false},
		{"a pod with another container", hidden, "g", twoContainers, false},
		{"a pod sharing one PID namespace (the agent is not its first process)", hidden, "g", sharedPIDs, false},
		{"a pod with an ephemeral container", hidden, "g", debugged, false},
	} {
		if got := saidStopped(tc.st, tc.word, "key", tc.pod); got != tc.want {
			t.Errorf("%s: saidStopped = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestHeartbeatsTellOfAWord: a LockHeartbeat whose stoppedGrant changed
// to a grant wakes its lock, once per word; renewals and resyncs do not.
func TestHeartbeatsTellOfAWord(t *testing.T) {
	b := newHeartbeats(clocktesting.NewFakePassiveClock(time.Unix(1000, 0)))
	var woken []types.NamespacedName
	b.stopped = func(n types.NamespacedName) { woken = append(woken, n) }
	hb := func(rv, holder, stopped string) *v1alpha1.LockHeartbeat {
		return &v1alpha1.LockHeartbeat{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "l", ResourceVersion: rv},
			Spec:       v1alpha1.LockHeartbeatSpec{HolderIdentity: holder, StoppedGrant: stopped},
		}
	}
	b.observe(nil, hb("1", "", ""))
	b.observe(hb("1", "", ""), hb("2", "g1", ""))       // a renewal
	b.observe(hb("2", "g1", ""), hb("3", "g1", "g1"))   // the word
	b.observe(hb("3", "g1", "g1"), hb("3", "g1", "g1")) // a resync
	b.observe(hb("3", "g1", "g1"), hb("4", "g2", "g1")) // the next holder's renewal
	b.observe(hb("4", "g2", "g1"), hb("5", "g2", "g2")) // its word
	want := []types.NamespacedName{{Namespace: "ns", Name: "l"}, {Namespace: "ns", Name: "l"}}
	if len(woken) != len(want) {
		t.Errorf("woken %v, want %v (once per word)", woken, want)
	}
}
