// Package handover decides what `kubectl redlock handover` does to a lock,
// how it asks for confirmation, and when the handover is over: pure
// functions over the lock and the answers of the API server. The command
// itself (internal/plugin) does the reads and writes.
//
// A handover never writes status and never touches Redis: for a static
// holder it clears spec.holderIdentity; for a pod holder it evicts the pod
// through the Eviction API (so PodDisruptionBudgets apply), and the
// operator grants the next pod once the holder has stopped.
package handover

import (
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// Action is what a handover does.
type Action int

// Actions.
const (
	// ClearStatic clears spec.holderIdentity.
	ClearStatic Action = iota + 1
	// EvictPod evicts the holder pod.
	EvictPod
)

// Plan is what a handover of one lock does, decided on the lock as read.
type Plan struct {
	Action Action
	// Holder is the holder as the prompt and messages name it: the static
	// identity, or pod/NAME.
	Holder string
	// Pod is the holder pod, for EvictPod.
	Pod *v1alpha1.PodReference
	// GrantID and Token are the grant being handed over (empty and 0 when
	// a static holder is asked for but was not granted yet).
	GrantID string
	Token   int64
	// Waiting is how many pods waited when the plan was made.
	Waiting int32
}

// ErrNotHeld is returned for a lock with nothing to hand over.
var ErrNotHeld = errors.New("nothing to hand over")

// PlanFor decides the handover of lock.
func PlanFor(lock *v1alpha1.DistributedLock) (Plan, error) {
	st := lock.Status
	p := Plan{GrantID: st.GrantID, Token: st.FencingToken}
	if st.Queue != nil {
		p.Waiting = st.Queue.Count
	}
	ref := lock.Namespace + "/" + lock.Name
	static := lock.StaticRequest() // none once its request ended: the pods are served
	switch {
	case static != "" && st.Holder != nil && st.Holder.Identity != static:
		return Plan{}, fmt.Errorf("lock %s: its spec asks for %q while status still shows %s: the operator is switching holders; hand over once it settled: %w",
			ref, static, holderName(st.Holder), ErrNotHeld)
	case static != "":
		// Granted to the static holder, or asked for and not granted yet
		// (no grant to wait past): clearing the spec gives it up either way.
		p.Action, p.Holder = ClearStatic, static
		if st.Holder == nil {
			p.GrantID, p.Token = "", 0
		}
		return p, nil
	case st.Holder != nil && st.Holder.Pod != nil:
		pod := *st.Holder.Pod
		p.Action, p.Holder, p.Pod = EvictPod, "pod/"+pod.Name, &pod
		return p, nil
	case st.Holder != nil:
		return Plan{}, fmt.Errorf("lock %s is held by %q, which its spec no longer asks for: the operator is releasing it already: %w", ref, st.Holder.Identity, ErrNotHeld)
	default:
		return Plan{}, fmt.Errorf("lock %s is not held (status shows no holder): %w", ref, ErrNotHeld)
	}
}

// holderName names a holder as messages do: pod/NAME or the identity.
func holderName(h *v1alpha1.LockHolder) string {
	if h.Pod != nil {
		return "pod/" + h.Pod.Name
	}
	return h.Identity
}

// Same reports whether plans a and b hand over the same grant the same
// way: a plan made again after the confirmation must be the one the user
// confirmed.
func Same(a, b Plan) bool {
	if a.Action != b.Action || a.Holder != b.Holder || a.GrantID != b.GrantID || a.Token != b.Token {
		return false
	}
	return (a.Pod == nil) == (b.Pod == nil) && (a.Pod == nil || a.Pod.UID == b.Pod.UID)
}

// Question is the confirmation a handover asks for.
func Question(lock *v1alpha1.DistributedLock, p Plan) string {
	return fmt.Sprintf("hand over lock %s/%s held by %s? [y/N] ", lock.Namespace, lock.Name, p.Holder)
}

// Confirmed reports whether answer (a line typed at the prompt) says yes.
func Confirmed(answer string) bool {
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return true
	}
	return false
}

// Outcome is where a handover stands, read from the lock's status.
type Outcome int

// Outcomes.
const (
	// Pending: status still shows the grant handed over, or no grant yet
	// while pods wait.
	Pending Outcome = iota
	// NextGrant: status shows another grant, within its validity.
	NextGrant
	// Released: the grant is gone from status and no pod waits for it.
	Released
)

// Progress reads the handover of p from the lock's status st at now.
func Progress(p Plan, st v1alpha1.DistributedLockStatus, now time.Time) Outcome {
	if st.Holder != nil && st.ValidUntil != nil && st.ValidUntil.After(now) && st.GrantID != "" && st.GrantID != p.GrantID {
		return NextGrant
	}
	oldGone := st.Holder == nil || st.GrantID != p.GrantID
	if oldGone && (st.Queue == nil || st.Queue.Count == 0) {
		return Released
	}
	return Pending
}

// Describe says what status st shows, for the handover's last message and
// for a timeout.
func Describe(st v1alpha1.DistributedLockStatus, now time.Time) string {
	if st.Holder == nil {
		s := "held by nobody"
		for _, c := range st.Conditions {
			if c.Type == v1alpha1.ConditionHeld && c.Status == metav1.ConditionFalse {
				s += fmt.Sprintf(" (Held=False, %s: %s)", c.Reason, c.Message)
			}
		}
		return s
	}
	who := st.Holder.Identity
	if st.Holder.Pod != nil {
		who = "pod/" + st.Holder.Pod.Name
	}
	validity := "no validity shown"
	if st.ValidUntil != nil {
		if left := st.ValidUntil.Sub(now); left > 0 {
			validity = "valid for " + left.Round(time.Second).String()
		} else {
			validity = "validity passed"
		}
	}
	return fmt.Sprintf("held by %s with fencing token %d (grant %s, %s)", who, st.FencingToken, st.GrantID, validity)
}

// EvictionError turns the Eviction API's refusal to evict pod into an
// error that says why: a PodDisruptionBudget (429), a pod that is gone
// (404) or one that changed (409), or anything else.
func EvictionError(ns, pod string, err error) error {
	ref := ns + "/" + pod
	causes := ""
	var st apierrors.APIStatus
	if errors.As(err, &st) && st.Status().Details != nil {
		var cs []string
		for _, c := range st.Status().Details.Causes {
			cs = append(cs, c.Message)
		}
		if len(cs) > 0 {
			causes = " (" + strings.Join(cs, "; ") + ")"
		}
	}
	switch {
	case apierrors.IsTooManyRequests(err):
		return fmt.Errorf("eviction of holder pod %s refused by a PodDisruptionBudget: %w%s; the lock stays with the pod: retry later, or relax the budget", ref, err, causes)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("holder pod %s is gone already: the operator hands the lock on once it sees that: %w", ref, err)
	case apierrors.IsConflict(err):
		return fmt.Errorf("holder pod %s changed (another pod under its name?) and was not evicted: look again with `kubectl redlock status`: %w", ref, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("not allowed to evict holder pod %s (RBAC: create pods/eviction): %w", ref, err)
	default:
		return fmt.Errorf("evict holder pod %s: %w", ref, err)
	}
}
