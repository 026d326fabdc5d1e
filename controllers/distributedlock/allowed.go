package distributedlock

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

// indexPolicyKey indexes DistributedLocks by the key that
// spec.allowedHolders.namespaces governs (policyKey).
const indexPolicyKey = "redlock.dev/policy-key"

// EventNamespaceNotAllowed is the event on a lock refused by another
// lock's (or semaphore's) spec.allowedHolders.namespaces.
const EventNamespaceNotAllowed = v1alpha1.ReasonNamespaceNotAllowed

// policyKey is the key whose holders a lock's namespaces list governs: a
// lock's Redis key, or, for a semaphore's slot, the semaphore's key (the
// semaphore copies its allowedHolders into every slot).
func policyKey(l *v1alpha1.DistributedLock) string {
	if l.Spec.SlotOf != nil {
		return "semaphore:" + l.Spec.SlotOf.SemaphoreKey
	}
	return "lock:" + l.RedisKey()
}

// namespaceRefusal says why the locks of the same policy key refuse lock
// (one of them names the namespaces that may take the key, and lock's is
// not among them); "" when none does. A lock may refuse itself.
func namespaceRefusal(lock *v1alpha1.DistributedLock, same []v1alpha1.DistributedLock) string {
	var by []string
	for i := range same {
		l := &same[i]
		if a := l.Spec.AllowedHolders; a != nil && len(a.Namespaces) > 0 && !slices.Contains(a.Namespaces, lock.Namespace) && l.DeletionTimestamp.IsZero() {
			by = append(by, fmt.Sprintf("%s/%s (allows %s)", l.Namespace, l.Name, strings.Join(a.Namespaces, ", ")))
		}
	}
	if len(by) == 0 {
		return ""
	}
	slices.Sort(by)
	what := "key " + lock.RedisKey()
	if lock.Spec.SlotOf != nil {
		what = "semaphore key " + lock.Spec.SlotOf.SemaphoreKey
	}
	return fmt.Sprintf("namespace %q may not take %s: spec.allowedHolders.namespaces of %s; no pod is granted this lock", lock.Namespace, what, strings.Join(by, "; "))
}

// checkNamespace sets s.refused when the locks sharing s.lock's policy key
// refuse its namespace, and tells so (Ready False, an event when it
// starts). The lock still reconciles: its current holder keeps the grant
// until it ends, and nobody else is granted.
func (r *Reconciler) checkNamespace(ctx context.Context, s *scope) error {
	var same v1alpha1.DistributedLockList
	if err := r.List(ctx, &same, client.MatchingFields{indexPolicyKey: policyKey(s.lock)}); err != nil {
		return fmt.Errorf("list the locks of key %s: %w", s.lock.RedisKey(), err)
	}
	s.refused = namespaceRefusal(s.lock, same.Items)
	if s.refused == "" {
		return nil
	}
	if c := meta.FindStatusCondition(s.orig.Conditions, v1alpha1.ConditionReady); c == nil || c.Reason != v1alpha1.ReasonNamespaceNotAllowed {
		r.Recorder.Eventf(s.lock, nil, corev1.EventTypeWarning, EventNamespaceNotAllowed, "Acquire", "%s", s.refused)
	}
	s.setReady(metav1.ConditionFalse, v1alpha1.ReasonNamespaceNotAllowed, s.refused)
	return nil
}

// allows reports whether pod may queue for the lock: its namespace is not
// refused and spec.allowedHolders allows the pod (podlock.Rules.Allowed).
func (s *scope) allows(p *corev1.Pod) bool {
	return s.refused == "" && podlock.NotAllowed(s.lock.Spec.AllowedHolders, "", p) == ""
}

// static is the static holder Choose may grant: none while the lock's
// namespace is refused, but for the current holder, which keeps its grant.
func (s *scope) static(current *v1alpha1.LockHolder) string {
	static := s.lock.Spec.HolderIdentity
	if s.refused != "" && (current == nil || current.Pod != nil || current.Identity != static) {
		return ""
	}
	return static
}

// locksOfPolicyKey enqueues the locks that share a changed lock's policy
// key: its namespaces list may now refuse them, or no longer.
func (r *Reconciler) locksOfPolicyKey(ctx context.Context, o client.Object) []reconcile.Request {
	lock, ok := o.(*v1alpha1.DistributedLock)
	if !ok {
		return nil
	}
	var same v1alpha1.DistributedLockList
	if err := r.List(ctx, &same, client.MatchingFields{indexPolicyKey: policyKey(lock)}); err != nil {
		logf.FromContext(ctx).Error(err, "list the locks of a key", "lock", client.ObjectKeyFromObject(lock))
		return nil
	}
	var reqs []reconcile.Request
	for i := range same.Items {
		if same.Items[i].UID != lock.UID {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&same.Items[i])})
		}
	}
	return reqs
}
