// Package podlock holds the pure decisions about pods that take part in a
// DistributedLock: which gate a pod waits with (or that it asked for none
// and is marked when it holds), whether it is a candidate,
// whether its containers are known to be stopped, and who holds the lock
// next (first come, first served).
package podlock

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
)

// Gate is how a pod waits for its lock.
type Gate int

// Gates.
const (
	GateNone Gate = iota
	GateScheduling
	GateReadiness
	GateBoth
	// GateLabel is no gate, asked for (redlock.dev/gate: label): the pod
	// runs and is Ready on its own health; the holder is marked with the
	// label redlock.dev/holds.
	GateLabel
)

// GateOf returns the gate pod waits with.
func GateOf(pod *corev1.Pod) Gate {
	sched := slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == v1alpha1.SchedulingGate })
	ready := slices.ContainsFunc(pod.Spec.ReadinessGates, func(g corev1.PodReadinessGate) bool {
		return g.ConditionType == v1alpha1.ReadinessGate
	})
	switch {
	case sched && ready:
		return GateBoth
	case sched:
		return GateScheduling
	case ready:
		return GateReadiness
	case pod.Labels[v1alpha1.GateModeLabel] == v1alpha1.GateModeHolderLabel:
		return GateLabel
	default:
		return GateNone
	}
}

// Finished reports whether pod's phase is terminal.
func Finished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// Stopped reports whether pod's containers are known not to run, now or
// later: it finished, or it still waits behind its scheduling gate (an
// ungated pod may be scheduled any moment), or it was bound to a node and
// every container there has terminated and none will be restarted (the
// pod is being deleted, or its restart policy does not restart them).
func Stopped(pod *corev1.Pod) bool {
	return GateOf(pod) == GateScheduling || GateOf(pod) == GateBoth || Ended(pod)
}

// Ended reports whether the containers of a pod that was granted the lock
// are known not to run, now or later: it finished, or it was bound to a
// node and every container there has terminated and none will be
// restarted. Unlike Stopped, its scheduling gate does not count: a granted
// pod's gate is being lifted (the pod gate controller may act on the grant
// before this view of the pod shows it), so a granted pod that still looks
// gated may run any moment and keeps its grant, or its place first in line.
func Ended(pod *corev1.Pod) bool {
	if Finished(pod) {
		return true
	}
	if pod.Spec.NodeName == "" {
		return false // ungated: the scheduler may bind it at any moment
	}
	if len(pod.Status.InitContainerStatuses)+len(pod.Status.ContainerStatuses) == 0 {
		// Bound to a node but no status yet: the kubelet may be starting it.
		return false
	}
	sidecars := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sidecars[c.Name] = true
		}
	}
	deleting := !pod.DeletionTimestamp.IsZero()
	for _, s := range pod.Status.InitContainerStatuses {
		if s.State.Terminated == nil || (!deleting && sidecars[s.Name]) {
			return false // running, waiting to (re)start, or a sidecar the kubelet restarts
		}
	}
	for _, s := range pod.Status.ContainerStatuses {
		if s.State.Terminated == nil || (!deleting && restarts(pod.Spec.RestartPolicy, s.State.Terminated.ExitCode)) {
			return false
		}
	}
	return true
}

// restarts reports whether the kubelet restarts a container that exited
// with code under policy.
func restarts(policy corev1.RestartPolicy, code int32) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	default: // Always, and the API's default
		return true
	}
}

// MayHold reports whether pod, as read from the API server just before a
// grant, may still be granted a lock: it exists, its containers may run
// (it has not finished, nor have they all stopped for good) and it is not
// being deleted.
func MayHold(pod *corev1.Pod) bool {
	return pod != nil && !Ended(pod) && pod.DeletionTimestamp.IsZero()
}

// Problem says why a labelled pod cannot take part; "" when it can.
func Problem(pod *corev1.Pod) string {
	name := pod.Labels[v1alpha1.LockLabel]
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Sprintf("label %s=%q does not name a DistributedLock: %s", v1alpha1.LockLabel, name, strings.Join(errs, "; "))
	}
	if problem := AnnotationProblem(pod); problem != "" {
		return problem
	}
	return GateProblem(pod)
}

// AnnotationProblem says why one of the annotations a pod sets for its
// wait (redlock.dev/priority, redlock.dev/wait-timeout,
// redlock.dev/on-wait-timeout) cannot be used; "" when they can.
func AnnotationProblem(pod *corev1.Pod) string {
	if _, problem := Priority(pod); problem != "" {
		return problem
	}
	_, problem := WaitLimitOf(pod, nil, "")
	return problem
}

// WaitLimit is how long a pod may wait for a lock or a slot, and what
// then happens to it.
type WaitLimit struct {
	// Timeout is the longest wait, from the pod's creation; 0: no limit.
	Timeout time.Duration
	// Fail: a scheduling-gated pod is set to phase Failed past it.
	Fail bool
}

// maxWaitTimeout is the longest wait limit (spec.waitTimeout's maximum).
const maxWaitTimeout = 720 * time.Hour

// WaitLimitOf is pod's wait limit: its annotations redlock.dev/wait-timeout
// and redlock.dev/on-wait-timeout, else the lock's (or semaphore's)
// spec.waitTimeout and spec.onWaitTimeout. problem says why an annotation
// cannot be used ("" when it can, or is absent).
func WaitLimitOf(pod *corev1.Pod, timeout *metav1.Duration, policy v1alpha1.WaitTimeoutPolicy) (limit WaitLimit, problem string) {
	if timeout != nil {
		limit.Timeout = timeout.Duration
	}
	if v, ok := pod.Annotations[v1alpha1.WaitTimeoutAnnotation]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second || d > maxWaitTimeout {
			return WaitLimit{}, fmt.Sprintf("annotation %s=%q is not a duration between 1s and 720h", v1alpha1.WaitTimeoutAnnotation, v)
		}
		limit.Timeout = d
	}
	if v, ok := pod.Annotations[v1alpha1.OnWaitTimeoutAnnotation]; ok {
		if v != string(v1alpha1.WaitKeep) && v != string(v1alpha1.WaitFail) {
			return WaitLimit{}, fmt.Sprintf("annotation %s=%q is neither %s nor %s", v1alpha1.OnWaitTimeoutAnnotation, v, v1alpha1.WaitKeep, v1alpha1.WaitFail)
		}
		policy = v1alpha1.WaitTimeoutPolicy(v)
	}
	limit.Fail = policy == v1alpha1.WaitFail
	return limit, ""
}

// WaitDeadline is when pod's wait limit passes; zero without a limit.
func (l WaitLimit) WaitDeadline(pod *corev1.Pod) time.Time {
	if l.Timeout <= 0 {
		return time.Time{}
	}
	return pod.CreationTimestamp.Add(l.Timeout)
}

// Priority is pod's queue priority: its annotation redlock.dev/priority,
// or else its PriorityClass's value (spec.priority, which the API server
// sets from spec.priorityClassName), or else 0. problem says why the
// annotation cannot be used ("" when it can, or is absent).
func Priority(pod *corev1.Pod) (priority int32, problem string) {
	if v, ok := pod.Annotations[v1alpha1.PriorityAnnotation]; ok {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil {
			return 0, fmt.Sprintf("annotation %s=%q is not a 32-bit integer", v1alpha1.PriorityAnnotation, v)
		}
		return int32(n), ""
	}
	if pod.Spec.Priority != nil {
		return *pod.Spec.Priority, ""
	}
	return 0, ""
}

// ServiceAccount is the ServiceAccount pod runs as.
func ServiceAccount(pod *corev1.Pod) string {
	if pod.Spec.ServiceAccountName == "" {
		return "default"
	}
	return pod.Spec.ServiceAccountName
}

// NotAllowed says why allowed (a lock's or a semaphore's
// spec.allowedHolders, named what) does not let pod queue; "" when it does
// (nil allows every pod).
func NotAllowed(allowed *v1alpha1.AllowedHolders, what string, pod *corev1.Pod) string {
	if allowed == nil || len(allowed.ServiceAccounts) == 0 || slices.Contains(allowed.ServiceAccounts, ServiceAccount(pod)) {
		return ""
	}
	return fmt.Sprintf("%s allows the pods of the ServiceAccounts %s only (spec.allowedHolders.serviceAccounts); this pod runs as %q and is never granted it",
		what, strings.Join(allowed.ServiceAccounts, ", "), ServiceAccount(pod))
}

// GateProblem says why a pod's gates keep it from taking part in a lock or
// a semaphore; "" when they do not.
func GateProblem(pod *corev1.Pod) string {
	gate := GateOf(pod)
	switch gate {
	case GateNone:
		return fmt.Sprintf("the pod has neither the scheduling gate %s nor the readiness gate %s (set at creation; the webhook adds one), nor the label %s: %s",
			v1alpha1.SchedulingGate, v1alpha1.ReadinessGate, v1alpha1.GateModeLabel, v1alpha1.GateModeHolderLabel)
	case GateBoth:
		return "the pod has both the scheduling gate and the readiness gate: keep one"
	}
	if gate != GateLabel && pod.Labels[v1alpha1.GateModeLabel] == v1alpha1.GateModeHolderLabel {
		return fmt.Sprintf("the pod asks for no gate (label %s: %s) but waits behind one: drop the gate or the label", v1alpha1.GateModeLabel, v1alpha1.GateModeHolderLabel)
	}
	return ""
}

// Candidate reports whether pod may be granted the lock: labelled for it,
// usable, not finished and not being deleted.
func Candidate(pod *corev1.Pod) bool {
	return Problem(pod) == "" && !Finished(pod) && pod.DeletionTimestamp.IsZero()
}

// SemaphoreCandidate reports whether pod, labelled for a semaphore, may be
// given one of its slots: its gates are usable, and it has not finished
// nor is being deleted.
func SemaphoreCandidate(pod *corev1.Pod) bool {
	return SemaphoreProblem(pod) == "" && GateProblem(pod) == "" && !Finished(pod) && pod.DeletionTimestamp.IsZero()
}

// SemaphoreProblem says why a pod labelled for a semaphore cannot wait for
// one of its slots the way it asks; "" when it can. A semaphore's pods wait
// behind the scheduling gate only: they must not start before they are
// given a slot, whose lock then names them (label redlock.dev/lock), so
// neither the readiness gate, nor holder-label mode, nor the agent (which
// reads the lock's name when its container starts) can serve them.
func SemaphoreProblem(pod *corev1.Pod) string {
	switch {
	case pod.Labels[v1alpha1.GateModeLabel] != "":
		return fmt.Sprintf("a semaphore's pods wait behind the scheduling gate only: drop the label %s", v1alpha1.GateModeLabel)
	case slices.ContainsFunc(pod.Spec.ReadinessGates, func(g corev1.PodReadinessGate) bool { return g.ConditionType == v1alpha1.ReadinessGate }):
		return fmt.Sprintf("a semaphore's pods wait behind the scheduling gate only: drop the readiness gate %s", v1alpha1.ReadinessGate)
	}
	if _, agent := pod.Annotations[v1alpha1.AgentAnnotation]; agent {
		return fmt.Sprintf("a semaphore's pods do not run the agent: drop the annotation %s", v1alpha1.AgentAnnotation)
	}
	return AnnotationProblem(pod)
}

// Order sorts pods in queue order: higher priority (Priority) first, then
// first come, first served: creation time, then name.
func Order(pods []*corev1.Pod) {
	slices.SortStableFunc(pods, func(a, b *corev1.Pod) int {
		pa, _ := Priority(a)
		pb, _ := Priority(b)
		if c := cmp.Compare(pb, pa); c != 0 {
			return c
		}
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// Is reports whether pod is the pod ref names (same name and UID).
func Is(pod *corev1.Pod, ref *v1alpha1.PodReference) bool {
	return ref != nil && pod.UID == ref.UID && pod.Name == ref.Name
}

// Ref is a pod's reference.
func Ref(pod *corev1.Pod) v1alpha1.PodReference {
	return v1alpha1.PodReference{Name: pod.Name, UID: pod.UID}
}

// MaxShownWaiting is how many waiting pods status lists.
const MaxShownWaiting = 10

// Choice is who should hold a lock now, and who waits.
type Choice struct {
	// Static is the static holder requested, or "".
	Static string
	// Pod is the pod that should hold the lock, or nil.
	Pod *corev1.Pod
	// Waiting are the candidates in line behind it, in order.
	Waiting []*corev1.Pod
}

// Rules are what Choose is told about a lock's pods beyond the pods
// themselves. Every field may be nil.
type Rules struct {
	// Stale reports that a pod is of an old revision of its workload
	// (nil: no pod is).
	Stale func(*corev1.Pod) bool
	// Passable reports that a pod marked unresponsive can no longer act
	// on its last grant (nil: no marked pod is passable yet).
	Passable func(*corev1.Pod) bool
	// Allowed reports that a pod may queue for the lock (nil: every pod
	// may): a pod it refuses is never granted, unless it is the current or
	// a former holder, which keeps its place while it may run.
	Allowed func(*corev1.Pod) bool
}

// Choose decides who holds the lock key. In order:
//   - the current holder pod, while its containers may run;
//   - a former holder (HeldBefore, or the pod of the last grant status
//     committed, last) that may still run; while it is being deleted or
//     relabelled, or there are several, nobody is granted;
//   - the static holder, when the spec names one;
//   - the first candidate of the current revision (rules.Stale), then the
//     first in Order.
//
// A pod rules.Allowed refuses is no candidate; the current holder and last
// keep their place, and another refused former holder keeps everyone
// waiting while it may run. A pod marked unresponsive keeps everyone
// waiting until rules.Passable, then waits behind every other candidate.
// pods are the pods labelled for the lock (named name), and the current
// and last holder pods whatever their labels.
// The reasoning: docs/design/pod-choice.md; for users:
// docs/concepts/queue-order.md.
func Choose(static, name, key string, holder *v1alpha1.LockHolder, last *v1alpha1.PodReference, pods []*corev1.Pod, rules Rules) Choice {
	g := sortPods(key, holder, last, pods, rules)
	candidates := g.candidates
	Order(candidates)
	if rules.Stale != nil {
		// Current revision first, in Order within each.
		slices.SortStableFunc(candidates, func(a, b *corev1.Pod) int { return cmpBool(rules.Stale(a), rules.Stale(b)) })
	}
	Order(g.prior)
	Order(g.marked)
	candidates = append(candidates, g.marked...)
	switch {
	case g.current != nil:
		return Choice{Pod: g.current, Waiting: candidates}
	case g.blocked:
		// A pod given up as unresponsive may still act on its grant:
		// nobody yet.
		return Choice{Waiting: candidates}
	case len(g.prior) == 1 && g.prior[0].DeletionTimestamp.IsZero() && g.prior[0].Labels[v1alpha1.LockLabel] == name && (rules.allows(g.prior[0]) || Is(g.prior[0], last)):
		return Choice{Pod: g.prior[0], Waiting: candidates}
	case len(g.prior) > 0:
		// A former holder still runs (terminating, relabelled, or more
		// than one of them): nobody else yet.
		return Choice{Waiting: candidates}
	case static != "":
		return Choice{Static: static, Waiting: candidates}
	case len(candidates) > 0:
		return Choice{Pod: candidates[0], Waiting: candidates[1:]}
	default:
		return Choice{}
	}
}

// sorted are a lock's pods by the part they play in Choose.
type sorted struct {
	current                   *corev1.Pod
	prior, candidates, marked []*corev1.Pod
	// blocked: a pod marked unresponsive may still act on its last grant.
	blocked bool
}

func sortPods(key string, holder *v1alpha1.LockHolder, last *v1alpha1.PodReference, pods []*corev1.Pod, rules Rules) sorted {
	var g sorted
	for _, p := range pods {
		switch {
		case holder != nil && Is(p, holder.Pod) && !Ended(p):
			g.current = p
		case Unresponsive(p) && !Ended(p):
			if rules.Passable == nil || !rules.Passable(p) {
				g.blocked = true
			} else if Candidate(p) && !GrantedElsewhere(p, key) && rules.allows(p) {
				g.marked = append(g.marked, p)
			}
		case (HeldBefore(p, key) || Is(p, last)) && !Ended(p):
			g.prior = append(g.prior, p)
		case Candidate(p) && !GrantedElsewhere(p, key) && rules.allows(p):
			g.candidates = append(g.candidates, p)
		}
	}
	return g
}

func (r Rules) allows(p *corev1.Pod) bool { return r.Allowed == nil || r.Allowed(p) }

// Unresponsive reports whether pod was marked unresponsive by the lock
// controller (annotation redlock.dev/unresponsive) and its app runs under
// the agent (run mode), which stops it by its grant's fencing deadline.
// The mark on any other pod counts for nothing, whoever set it: nothing
// would stop its workload (in watch mode the app stops itself, if it
// can).
func Unresponsive(pod *corev1.Pod) bool {
	return pod.Annotations[v1alpha1.UnresponsiveAnnotation] != "" && podagent.RunsApp(pod)
}

// WillRestart reports whether the kubelet restarts a container of pod
// that exited with code.
func WillRestart(pod *corev1.Pod, code int32) bool { return restarts(pod.Spec.RestartPolicy, code) }

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	default:
		return -1
	}
}

// Revision is the revision of its workload a pod was created from, as its
// controller labels it: a ReplicaSet's pod-template-hash (one per
// Deployment revision) or a StatefulSet's controller-revision-hash; "" for
// other pods.
func Revision(pod *corev1.Pod) string {
	if h := pod.Labels[appsv1.ControllerRevisionHashLabelKey]; h != "" {
		return h
	}
	return pod.Labels[appsv1.DefaultDeploymentUniqueLabelKey]
}

// MixedRevisions reports whether pods were created from more than one
// revision of a workload: only then is it worth asking which is current.
func MixedRevisions(pods []*corev1.Pod) bool {
	first := ""
	for _, p := range pods {
		switch r := Revision(p); {
		case r == "":
		case first == "":
			first = r
		case r != first:
			return true
		}
	}
	return false
}

// GrantedElsewhere reports whether pod carries the grant of a key other
// than key: it was granted another lock and then relabelled. It is no
// candidate for key: its workload may still act under the other grant,
// whose token its downward-API files show.
func GrantedElsewhere(pod *corev1.Pod, key string) bool {
	k := pod.Annotations[v1alpha1.LockKeyAnnotation]
	return pod.Annotations[v1alpha1.FencingTokenAnnotation] != "" && k != "" && k != key
}

// GrantedBy reports whether pod, if it was granted a lock, was granted it
// by the DistributedLock named name (pods granted before the lock-name
// annotation existed count as granted by any).
func GrantedBy(pod *corev1.Pod, name string) bool {
	granter := pod.Annotations[v1alpha1.LockNameAnnotation]
	return granter == "" || granter == name
}

// HeldBefore reports whether pod was granted the lock key before: it
// carries the key and a fencing token.
func HeldBefore(pod *corev1.Pod, key string) bool {
	return key != "" && pod.Annotations[v1alpha1.LockKeyAnnotation] == key && pod.Annotations[v1alpha1.FencingTokenAnnotation] != ""
}

// Queue is status's view of the waiting pods, in line.
func Queue(waiting []*corev1.Pod) *v1alpha1.LockQueue {
	if len(waiting) == 0 {
		return nil
	}
	q := &v1alpha1.LockQueue{Count: int32(len(waiting))} //nolint:gosec // pods in one namespace
	for _, p := range waiting[:min(len(waiting), MaxShownWaiting)] {
		prio, _ := Priority(p)
		q.Waiting = append(q.Waiting, v1alpha1.QueuedPod{Name: p.Name, UID: p.UID, Priority: prio})
	}
	return q
}
