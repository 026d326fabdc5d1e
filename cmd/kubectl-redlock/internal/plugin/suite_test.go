package plugin_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/cmd/kubectl-redlock/internal/plugin"
	"github.com/redlock-operator/redlock-operator/internal/harness/syncbuf"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// The suite runs the plugin's commands in-process, as the binary runs them
// (flags parsed by cobra, a kubeconfig file), against a real kube-apiserver
// and etcd. The operator does not run: the specs write the locks' status
// as the operator would, and play its part where a command waits for it.

var (
	env        *testenv.Env
	k8s        client.Client
	ctx        context.Context
	kubeconfig string
)

func TestPlugin(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "kubectl redlock")
}

var _ = BeforeSuite(func() {
	env = testenv.Start()
	k8s, ctx = env.Client, env.Ctx
	kubeconfig = env.Kubeconfig(GinkgoT().TempDir())
})

var _ = AfterSuite(func() { env.Stop() })

// result is what one run of the plugin printed and returned.
type result struct {
	out, errOut string
	err         error
}

// combined is what a terminal shows: stdout, stderr, and the error as the
// binary prints it.
func (r result) combined() string {
	s := r.out + r.errOut
	if r.err != nil {
		s += "error: " + r.err.Error() + "\n"
	}
	return s
}

// session is how a run's stdin looks.
type session struct {
	stdin    io.Reader
	terminal bool
}

// kubectlRedlock runs `kubectl redlock ARGS…` against the test's control
// plane, with no stdin.
func kubectlRedlock(args ...string) result { return session{}.run(args...) }

func (s session) run(args ...string) result {
	_, done := s.start(args...)
	return <-done
}

// start runs `kubectl redlock ARGS…` in the background: stderr can be
// read while it runs, and done receives what it printed and returned.
func (s session) start(args ...string) (stderr *syncbuf.Buffer, done <-chan result) {
	var out bytes.Buffer
	errOut := &syncbuf.Buffer{}
	in := s.stdin
	if in == nil {
		in = strings.NewReader("")
	}
	cmd := plugin.NewCommand(genericiooptions.IOStreams{In: in, Out: &out, ErrOut: errOut},
		plugin.Options{IsTerminal: func(io.Reader) bool { return s.terminal }, PollInterval: 200 * time.Millisecond})
	cmd.SetArgs(append([]string{"--kubeconfig", kubeconfig}, args...))
	ch := make(chan result, 1)
	go func() {
		err := cmd.ExecuteContext(ctx)
		ch <- result{out: out.String(), errOut: errOut.String(), err: err}
	}()
	return errOut, ch
}

// namespace creates a namespace of the given name ("" for a generated one).
func namespace(name string) string {
	if name == "" {
		return env.NewNamespace()
	}
	Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
	return name
}

// newLock creates a DistributedLock; spec may set its key or static holder.
func newLock(ns, name string, spec func(*v1alpha1.DistributedLockSpec)) *v1alpha1.DistributedLock {
	l := &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.DistributedLockSpec{MasterSet: "masters", TTL: metav1.Duration{Duration: 30 * time.Second}}}
	if spec != nil {
		spec(&l.Spec)
	}
	Expect(k8s.Create(ctx, l)).To(Succeed())
	return l
}

// writeStatus writes a lock's status as the operator would: mutate changes
// the freshly read status.
func writeStatus(l *v1alpha1.DistributedLock, mutate func(*v1alpha1.DistributedLockStatus)) {
	fresh := &v1alpha1.DistributedLock{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(l), fresh)).To(Succeed())
	mutate(&fresh.Status)
	fresh.Status.Key = fresh.RedisKey()
	Expect(k8s.Status().Update(ctx, fresh)).To(Succeed(), "status of lock %s/%s", l.Namespace, l.Name)
	fresh.DeepCopyInto(l)
}

// grant shows holder (a pod when pod is set, else a static identity) with
// token and a validity of validFor from now.
func grant(st *v1alpha1.DistributedLockStatus, identity string, pod *corev1.Pod, grantID string, token int64, validFor time.Duration) {
	now := time.Now()
	st.Holder = &v1alpha1.LockHolder{Identity: identity}
	if pod != nil {
		st.Holder.Pod = &v1alpha1.PodReference{Name: pod.Name, UID: pod.UID}
		st.LastHolderPod = &v1alpha1.PodReference{Name: pod.Name, UID: pod.UID}
	}
	st.GrantID, st.FencingToken = grantID, token
	st.AcquiredAt, st.RenewedAt = v1alpha1.NewPreciseTime(now), v1alpha1.NewPreciseTime(now)
	st.ValidUntil, st.ReleasedAt = v1alpha1.NewPreciseTime(now.Add(validFor)), nil
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAcquired,
		Message: fmt.Sprintf("held by %s", identity)})
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid, Message: "the spec is valid and the master set serves"})
}

// queue shows pods waiting, in this order.
func queue(st *v1alpha1.DistributedLockStatus, pods ...*corev1.Pod) {
	st.Queue = &v1alpha1.LockQueue{Count: int32(len(pods))} //nolint:gosec // a few pods
	for _, p := range pods {
		st.Queue.Waiting = append(st.Queue.Waiting, v1alpha1.QueuedPod{Name: p.Name, UID: p.UID})
	}
}

// waitingPod creates a pod labelled for lock, behind its scheduling gate.
func waitingPod(ns, name, lock string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.LockLabel: lock, "app": lock}},
		Spec: corev1.PodSpec{
			SchedulingGates: []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGate}},
			Containers:      []corev1.Container{{Name: "app", Image: "busybox"}},
		},
	}
	Expect(k8s.Create(ctx, p)).To(Succeed())
	return p
}

// holderPod creates a pod labelled for lock that runs on a node, ready, as
// a pod the operator ungated and annotated with token.
func holderPod(ns, name, lock string, token int64) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.LockLabel: lock, "app": lock},
			Annotations: map[string]string{v1alpha1.FencingTokenAnnotation: fmt.Sprint(token), v1alpha1.LockNameAnnotation: lock}},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
	}
	Expect(k8s.Create(ctx, p)).To(Succeed())
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	Expect(k8s.Status().Update(ctx, p)).To(Succeed(), "status of pod %s/%s", ns, name)
	return p
}

// event records an event about obj as the operator's recorder does
// (events.k8s.io/v1).
func event(obj client.Object, kind, typ, reason, action, note string, ago time.Duration) {
	e := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: obj.GetNamespace(), Name: fmt.Sprintf("%s.%x", obj.GetName(), time.Now().UnixNano())},
		EventTime:  metav1.NewMicroTime(time.Now().Add(-ago)), ReportingController: "redlock.dev/operator",
		ReportingInstance: "redlock-operator-7d9f8-x2k4q", Action: action, Reason: reason, Type: typ, Note: note,
		Regarding: corev1.ObjectReference{Kind: kind, Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: obj.GetUID()},
	}
	Expect(k8s.Create(ctx, e)).To(Succeed(), "event %s of %s %s", reason, kind, obj.GetName())
}

// podState reads a pod: whether it exists and whether it is being deleted.
func podState(ns, name string, uid types.UID) func() string {
	return func() string {
		p := &corev1.Pod{}
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, p)
		switch {
		case apierrors.IsNotFound(err):
			return "gone"
		case err != nil:
			return "unknown: " + err.Error()
		case p.UID != uid:
			return "gone"
		case p.DeletionTimestamp != nil:
			return "terminating"
		default:
			return "present"
		}
	}
}
