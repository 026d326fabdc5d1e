package distributedlock

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/conditions"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

// Who may take a key (spec.allowedHolders.namespaces). The list of one
// object governs a key in this cluster: the oldest object of the key that
// names namespaces (creation time, then namespace and name), among the
// DistributedLocks of a lock's key, or the DistributedSemaphores of a
// semaphore's key (a slot's lock follows its semaphore's). A later object
// naming other namespaces cannot take the key from the first, only refuse
// itself; and an object that names no namespaces never refuses anyone.

const (
	// indexPolicyKey indexes every DistributedLock by the key its
	// namespaces rule is about (policyKey).
	indexPolicyKey = "redlock.dev/policy-key"
	// indexNamespaceRule indexes the DistributedLocks (not slots) and the
	// DistributedSemaphores that name namespaces, by their key.
	indexNamespaceRule = "redlock.dev/namespace-rule"
)

// EventNamespaceNotAllowed is the event on a lock refused by the
// namespaces rule of its key.
const EventNamespaceNotAllowed = v1alpha1.ReasonNamespaceNotAllowed

// policyKey is the key a lock's namespaces rule is about: its Redis key,
// or, for a semaphore's slot, the semaphore's key.
func policyKey(l *v1alpha1.DistributedLock) string {
	if l.Spec.SlotOf != nil {
		return semaphorePolicyKey(l.Spec.SlotOf.SemaphoreKey)
	}
	return "lock:" + l.RedisKey()
}

func semaphorePolicyKey(key string) string { return "semaphore:" + key }

// rule is an object that names the namespaces that may take its key.
type rule struct {
	kind, namespace, name string
	created               time.Time
	namespaces            []string
}

// ruleOf is o's rule, or ok false when o names no namespaces (or is being
// deleted).
func ruleOf(o client.Object) (r rule, key string, ok bool) {
	if !o.GetDeletionTimestamp().IsZero() {
		return rule{}, "", false
	}
	r = rule{namespace: o.GetNamespace(), name: o.GetName(), created: o.GetCreationTimestamp().Time}
	var a *v1alpha1.AllowedHolders
	switch x := o.(type) {
	case *v1alpha1.DistributedLock:
		if x.Spec.SlotOf != nil {
			return rule{}, "", false // its semaphore's rule counts
		}
		r.kind, key, a = "DistributedLock", policyKey(x), x.Spec.AllowedHolders
	case *v1alpha1.DistributedSemaphore:
		r.kind, key, a = "DistributedSemaphore", semaphorePolicyKey(x.RedisKey()), x.Spec.AllowedHolders
	}
	if a == nil || len(a.Namespaces) == 0 {
		return rule{}, "", false
	}
	r.namespaces = a.Namespaces
	return r, key, true
}

// governing is the rule that governs a key: the oldest of rules.
func governing(rules []rule) (rule, bool) {
	if len(rules) == 0 {
		return rule{}, false
	}
	return slices.MinFunc(rules, func(a, b rule) int {
		if c := a.created.Compare(b.created); c != 0 {
			return c
		}
		if c := strings.Compare(a.namespace, b.namespace); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	}), true
}

// namespaceRefusal says why the rule of its key refuses a lock in
// namespace ns ("" when nothing does); what names the key.
func namespaceRefusal(ns, what string, rules []rule) string {
	g, ok := governing(rules)
	if !ok || slices.Contains(g.namespaces, ns) {
		return ""
	}
	return fmt.Sprintf("namespace %q may not take %s: %s %s/%s, the first to name who may, allows %s (spec.allowedHolders.namespaces); nobody new is granted this lock",
		ns, what, g.kind, g.namespace, g.name, strings.Join(g.namespaces, ", "))
}

// rulesOf lists the rules of lock's key.
func (r *Reconciler) rulesOf(ctx context.Context, lock *v1alpha1.DistributedLock) ([]rule, error) {
	var objs []client.Object
	key := policyKey(lock)
	if lock.Spec.SlotOf != nil {
		var list v1alpha1.DistributedSemaphoreList
		if err := r.List(ctx, &list, client.MatchingFields{indexNamespaceRule: key}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("list the semaphores of key %s: %w", lock.Spec.SlotOf.SemaphoreKey, err)
		}
		for i := range list.Items {
			objs = append(objs, &list.Items[i])
		}
	} else {
		var list v1alpha1.DistributedLockList
		if err := r.List(ctx, &list, client.MatchingFields{indexNamespaceRule: key}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("list the locks of key %s: %w", lock.RedisKey(), err)
		}
		for i := range list.Items {
			objs = append(objs, &list.Items[i])
		}
	}
	var rules []rule
	for _, o := range objs {
		if ru, _, ok := ruleOf(o); ok {
			rules = append(rules, ru)
		}
	}
	return rules, nil
}

// checkNamespace sets s.refused when the rule of s.lock's key refuses its
// namespace, and tells so (Ready False, an event when it starts). The lock
// still reconciles: a holder keeps its grant until it ends, nobody new is
// granted.
func (r *Reconciler) checkNamespace(ctx context.Context, s *scope) error {
	rules, err := r.rulesOf(ctx, s.lock)
	if err != nil {
		return err
	}
	what := "key " + s.lock.RedisKey()
	if so := s.lock.Spec.SlotOf; so != nil {
		what = "semaphore key " + so.SemaphoreKey
	}
	s.refused = namespaceRefusal(s.lock.Namespace, what, rules)
	if s.refused == "" {
		return nil
	}
	if c := meta.FindStatusCondition(s.orig.Conditions, v1alpha1.ConditionReady); c == nil || c.Reason != v1alpha1.ReasonNamespaceNotAllowed {
		r.Recorder.Eventf(s.lock, nil, corev1.EventTypeWarning, EventNamespaceNotAllowed, "Acquire", "%s", conditions.Message(s.refused))
	}
	s.setReady(metav1.ConditionFalse, v1alpha1.ReasonNamespaceNotAllowed, s.refused)
	return nil
}

// allows reports whether pod may queue for the lock: its namespace is not
// refused, spec.allowedHolders allows the pod, and its semaphore is not
// moving it to another slot (MovingPodAnnotation) (podlock.Rules.Allowed).
func (s *scope) allows(p *corev1.Pod) bool {
	return s.refused == "" && podlock.NotAllowed(s.lock.Spec.AllowedHolders, "", p) == "" && !moving(s.lock, p)
}

// moving reports whether the semaphore of the slot lock is moving pod to
// another slot: the lock grants it nothing.
func moving(lock *v1alpha1.DistributedLock, pod *corev1.Pod) bool {
	return lock.MovingPod() == string(pod.UID)
}

// namespaceRuleChanged passes the creation and deletion of an object that
// names namespaces, and updates that change its list or start its
// deletion: the other locks of its key look again.
func namespaceRuleChanged() predicate.Predicate {
	names := func(o client.Object) bool { _, _, ok := ruleOf(o); return ok }
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return names(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return names(e.Object) },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, _, okOld := ruleOf(e.ObjectOld)
			n, _, okNew := ruleOf(e.ObjectNew)
			return okOld != okNew || okOld && !slices.Equal(o.namespaces, n.namespaces)
		},
	}
}

// locksOfRule enqueues the locks whose key a changed rule is about.
func locksOfRule(c client.Reader) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		var key string
		switch x := o.(type) {
		case *v1alpha1.DistributedLock:
			key = policyKey(x)
		case *v1alpha1.DistributedSemaphore:
			key = semaphorePolicyKey(x.RedisKey())
		default:
			return nil
		}
		return listLocks(ctx, c, "list the locks of a key", o, client.MatchingFields{indexPolicyKey: key})
	}
}

// indexRules registers the indexes of this file.
func indexRules(ctx context.Context, indexer client.FieldIndexer) error {
	if err := indexer.IndexField(ctx, &v1alpha1.DistributedLock{}, indexPolicyKey, func(o client.Object) []string {
		return []string{policyKey(o.(*v1alpha1.DistributedLock))}
	}); err != nil {
		return err
	}
	byRule := func(o client.Object) []string {
		if _, key, ok := ruleOf(o); ok {
			return []string{key}
		}
		return nil
	}
	if err := indexer.IndexField(ctx, &v1alpha1.DistributedLock{}, indexNamespaceRule, byRule); err != nil {
		return err
	}
	return indexer.IndexField(ctx, &v1alpha1.DistributedSemaphore{}, indexNamespaceRule, byRule)
}
