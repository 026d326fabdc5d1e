package distributedlock

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
)

// Grants that end on their own. A static holder whose lock sets
// spec.holderLease renews the lock's LockHeartbeat with its grant ID (the
// heartbeats of liveness.go, counted on this manager's clock from when it
// first looked at the grant); unrenewed for the lease, its grant is given
// up like an unresponsive pod's (shedGrant: status stops showing it, its
// keys expire after the validity shown), and its request ends:
// status.endedRequest names it and the lock serves its pods until
// spec.holderIdentity changes. spec.maxHoldDuration ends any grant held
// that long from its acquisition: a static holder's as above, a holder
// pod's whose app the agent runs as an unresponsive one's (marked; the
// agent stops the app by the validity it saw); other holder pods are not
// cut short (nothing would stop their workload), only told by an event.

// Events of grants that end on their own.
const (
	EventLeaseExpired    = v1alpha1.ReasonLeaseExpired
	EventMaxHoldExceeded = v1alpha1.ReasonMaxHoldExceeded
)

// endInputs are what the verdict on a grant's own end rests on.
type endInputs struct {
	Now, AcquiredAt time.Time
	// MaxHold: spec.maxHoldDuration (0: none).
	MaxHold time.Duration
	// Lease: spec.holderLease, for a static holder's grant (0: none);
	// Since, LastBeat: when the count started, and the latest renewal seen.
	Lease           time.Duration
	Since, LastBeat time.Time
	// NoHeartbeat: the lock has no LockHeartbeat the holder could renew.
	NoHeartbeat bool
}

// endVerdict says whether the grant ends now (reason and why; "" when
// not), and when to look again (0: no need).
func endVerdict(in endInputs) (reason, why string, recheck time.Duration) {
	if in.MaxHold > 0 {
		held := in.Now.Sub(in.AcquiredAt)
		if held >= in.MaxHold {
			return v1alpha1.ReasonMaxHoldExceeded, fmt.Sprintf("held for %s (maxHoldDuration %s)", held.Round(time.Millisecond), in.MaxHold), 0
		}
		recheck = in.MaxHold - held
	}
	if in.Lease > 0 {
		why, r := livenessVerdict(livenessInputs{Now: in.Now, Timeout: in.Lease, Since: in.Since, LastBeat: in.LastBeat, Limit: "holderLease"})
		switch {
		case why != "" && in.NoHeartbeat:
			return v1alpha1.ReasonLeaseExpired, fmt.Sprintf("the static holder's lease was not renewed: the lock has no LockHeartbeat to renew it with (the operator makes one unless it runs with --agent-access=false): %s", why), 0
		case why != "":
			return v1alpha1.ReasonLeaseExpired, fmt.Sprintf("the static holder's lease was not renewed: %s", why), 0
		}
		if recheck == 0 || r < recheck {
			recheck = r
		}
	}
	return "", "", recheck
}

// checkEnd judges whether h's grant ends on its own now; it returns the
// reason and why ("" when not, with a look asked for at the next
// deadline), and, for a pod whose app the agent runs, that pod (to be
// marked first).
func (r *Reconciler) checkEnd(ctx context.Context, s *scope, h *grants.Grant) (reason, why string, pod *corev1.Pod, err error) {
	lock := s.lock
	in := endInputs{Now: s.now, AcquiredAt: h.AcquiredAt}
	if m := lock.Spec.MaxHoldDuration; m != nil {
		in.MaxHold = m.Duration
	}
	static := h.Pod == nil && h.Holder == lock.Spec.HolderIdentity
	if l := lock.Spec.HolderLease; l != nil && static {
		key := client.ObjectKeyFromObject(lock)
		// No LockHeartbeat counts as no renewal: when in doubt, the
		// lease runs out (nothing else could end the grant).
		hb, err := r.heartbeat(ctx, s)
		if err != nil {
			return "", "", nil, err
		}
		lv := &h.Liveness
		if lv.Since.IsZero() || lv.Timeout != l.Duration {
			*lv = grants.Liveness{Since: s.now, Timeout: l.Duration}
		}
		in.Lease, in.Since, in.LastBeat, in.NoHeartbeat = l.Duration, lv.Since, r.beats.watch(key, h.ID), hb == nil
	}
	if in.MaxHold == 0 && in.Lease == 0 {
		return "", "", nil, nil
	}
	reason, why, recheck := endVerdict(in)
	if reason == "" {
		if recheck > 0 {
			s.requeueAfter(recheck + time.Millisecond)
		}
		return "", "", nil, nil
	}
	if h.Pod == nil {
		return reason, why, nil, nil
	}
	pod = &corev1.Pod{}
	if r.Pods == nil {
		return "", "", nil, nil
	}
	if err := r.Pods.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: h.Pod.Name}, pod); err != nil {
		return "", "", nil, client.IgnoreNotFound(err)
	}
	if pod.UID != h.Pod.UID || !podagent.RunsApp(pod) {
		// Nothing would stop its workload: it keeps the grant, and is told.
		if r.overheld.First(lock.Namespace+"/"+lock.Name, h.ID) {
			r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, EventMaxHoldExceeded, "Hold",
				"grant %d to pod %s %s; it is not cut short: only a pod whose app the agent runs is stopped when its grant ends", h.Token, h.Pod.Name, why)
		}
		return "", "", nil, nil
	}
	return reason, why, pod, nil
}

// endOnItsOwn gives up h's grant when it ends on its own (checkEnd), and
// reports whether it did. A static holder's request ends with it.
func (r *Reconciler) endOnItsOwn(ctx context.Context, s *scope, h *grants.Grant) (bool, error) {
	reason, why, pod, err := r.checkEnd(ctx, s, h)
	if err != nil || reason == "" {
		return false, err
	}
	if pod != nil {
		// Marked first, as an unresponsive holder: once status stops
		// showing the grant, the pod keeps nobody from the lock.
		if err := r.setMark(ctx, pod, h.ID); err != nil {
			return false, err
		}
	} else {
		s.lock.Status.EndedRequest = &v1alpha1.EndedRequest{
			Identity: h.Holder, Generation: s.lock.Generation, Reason: reason, At: v1alpha1.NewPreciseTime(s.now),
		}
	}
	cause := endLeaseExpired
	if reason == v1alpha1.ReasonMaxHoldExceeded {
		cause = endMaxHold
	}
	r.shedGrant(s, h, cause, why)
	return true, nil
}

// staticRequest is the static holder Choose may grant: spec.holderIdentity,
// but none while the lock's namespace is refused (allowed.go) or once the
// request ended (its lease expired, or it held too long: the pods are
// served). The current holder of that name keeps it: while refused, as
// long as its grant is live (in this manager's memory, or shown valid);
// once ended, while its grant is still being given up.
func (s *scope) staticRequest(current *v1alpha1.LockHolder, in holderInputs) string {
	static := s.lock.Spec.HolderIdentity
	holds := current != nil && current.Pod == nil && current.Identity == static
	live := in.InMemory || in.ValidUntil.After(s.now)
	if (s.refused != "" && (!holds || !live)) || (requestEnded(s.lock) && !holds) {
		return ""
	}
	return static
}

// requestEnded reports whether status shows the static request of spec
// ended (its lease expired, or it held too long), and drops a record of
// an earlier request.
func requestEnded(lock *v1alpha1.DistributedLock) bool {
	er := lock.Status.EndedRequest
	if er == nil {
		return false
	}
	if er.Identity != lock.Spec.HolderIdentity {
		lock.Status.EndedRequest = nil // another request since
		return false
	}
	return true
}
