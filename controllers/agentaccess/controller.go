// Package agentaccess is the controller that lets the in-pod agent
// (cmd/agent, added by the webhook: internal/podagent) read its own lock
// and nothing else. For every DistributedLock that pods with the agent
// request, it keeps a Role allowing get, list and watch on that one lock,
// and get and update on its LockHeartbeat, and a RoleBinding of it to
// those pods' ServiceAccounts. Both are named redlock-agent:<lock> and
// owned by the lock. When no such pod is left, it deletes them. It also
// keeps the lock's LockHeartbeat while the Role exists or the lock sets a
// heartbeat timeout or a holder lease.
//
// It owns those objects and no status field. It reads Roles and
// RoleBindings from the API server, not the cache. One of that name the
// lock does not own is left alone, and the lock gets a warning event
// (AgentAccessConflict). One labelled as the operator's whose owner is
// gone, or is an earlier lock of the same name, is adopted. Which pods run
// the agent is read from their spec (podagent.Injected), not from their
// annotations. The reasoning: docs/design/agent.md#what-it-may-read-and-write.
package agentaccess

import (
	"context"
	"fmt"
	"reflect"
	"slices"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/managed"
	"github.com/redlock-operator/redlock-operator/internal/podagent"
	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

// EventConflict is the warning on a lock whose agent Role or RoleBinding
// name is taken by an object the lock does not own.
const EventConflict = "AgentAccessConflict"

// NamePrefix starts the name of every Role and RoleBinding this controller
// keeps; the lock's name follows.
const NamePrefix = "redlock-agent:"

// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=distributedlocks,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.redlock.dev,resources=lockheartbeats,verbs=get;list;watch;create;update;delete

// Reconciler keeps the agents' Roles and RoleBindings.
type Reconciler struct {
	Client client.Client
	// APIReader reads Roles and RoleBindings uncached.
	APIReader client.Reader
	// Pods is the cache of pods labelled redlock.dev/lock.
	Pods     cache.Cache
	Recorder events.EventRecorder
}

// Reconcile brings the Role and RoleBinding of one lock (the request's
// name) to what its pods with the agent need.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	lock := &v1alpha1.DistributedLock{}
	if err := r.Client.Get(ctx, req.NamespacedName, lock); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err) // the owner references take them away
	}
	if !lock.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	var pods corev1.PodList
	if err := r.Pods.List(ctx, &pods, client.InNamespace(lock.Namespace), client.MatchingLabels{v1alpha1.LockLabel: lock.Name}); err != nil {
		return reconcile.Result{}, fmt.Errorf("list pods of lock %s: %w", req.NamespacedName, err)
	}
	subjects := Subjects(pods.Items)
	keep := len(subjects) > 0
	if _, err := r.apply(ctx, lock, Heartbeat(lock), keep || wantsHeartbeat(lock)); err != nil {
		return reconcile.Result{}, err
	}
	// The Role first: no binding is made or kept to a Role not the lock's.
	owned, err := r.apply(ctx, lock, Role(lock), keep)
	if err != nil || !owned {
		return reconcile.Result{}, err
	}
	_, err = r.apply(ctx, lock, Binding(lock, subjects), keep)
	return reconcile.Result{}, err
}

// apply creates or updates want (keep) or deletes it (!keep), and reports
// whether it is (or was) the lock's; an object of that name that is not
// the lock's (Ours) is left as it is.
func (r *Reconciler) apply(ctx context.Context, lock *v1alpha1.DistributedLock, want client.Object, keep bool) (bool, error) {
	kind := reflect.TypeOf(want).Elem().Name()
	cur, ok := want.DeepCopyObject().(client.Object)
	if !ok {
		return false, fmt.Errorf("copy %s", kind)
	}
	err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(want), cur)
	switch {
	case apierrors.IsNotFound(err):
		if !keep {
			return true, nil
		}
		if err := r.Client.Create(ctx, want); err != nil {
			return false, fmt.Errorf("create %s %s: %w", kind, want.GetName(), err) // AlreadyExists: made meanwhile, looked at again
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("get %s %s: %w", kind, want.GetName(), err)
	case !Ours(cur, lock) || !sameRoleRef(cur, want):
		if keep {
			r.Recorder.Eventf(lock, nil, corev1.EventTypeWarning, EventConflict, "GrantAgentAccess",
				"%s %s exists and is not this lock's: the agents of its pods get no read access to it; rename or delete it", kind, want.GetName())
		}
		return false, nil
	case !keep:
		if err := r.Client.Delete(ctx, cur, client.Preconditions{UID: new(cur.GetUID())}); client.IgnoreNotFound(err) != nil {
			return true, fmt.Errorf("delete %s %s: %w", kind, want.GetName(), err)
		}
		return true, nil
	}
	next, changed := merge(cur, want)
	if !changed {
		return true, nil
	}
	if err := r.Client.Update(ctx, next); err != nil {
		return true, fmt.Errorf("update %s %s: %w", kind, want.GetName(), err)
	}
	return true, nil
}

// Ours reports whether the Role or RoleBinding o is lock's: controlled by
// it, or labelled as the operator's and controlled by nothing or by an
// earlier DistributedLock of the same name (deleted with its dependents
// orphaned, or not yet collected), which is adopted.
func Ours(o client.Object, lock *v1alpha1.DistributedLock) bool {
	if metav1.IsControlledBy(o, lock) {
		return true
	}
	if o.GetLabels()[managed.LabelManagedBy] != managed.ManagedByValue {
		return false
	}
	ref := metav1.GetControllerOf(o)
	return ref == nil || ref.Kind == "DistributedLock" && ref.APIVersion == v1alpha1.GroupVersion.String() && ref.Name == lock.Name
}

// sameRoleRef reports whether cur, a RoleBinding, binds the Role want does
// (the reference cannot be changed): a binding to another Role is not
// made the lock's, whatever its labels.
func sameRoleRef(cur, want client.Object) bool {
	c, ok := cur.(*rbacv1.RoleBinding)
	if !ok {
		return true
	}
	w, ok := want.(*rbacv1.RoleBinding)
	return ok && c.RoleRef == w.RoleRef
}

// merge is cur with want's rules or subjects, label and controller
// reference (other metadata kept), and whether that changes it.
func merge(cur, want client.Object) (client.Object, bool) {
	next, ok := cur.DeepCopyObject().(client.Object)
	if !ok {
		return want, true
	}
	switch w := want.(type) {
	case *rbacv1.Role:
		if n, ok := next.(*rbacv1.Role); ok {
			n.Rules = w.Rules
		}
	case *rbacv1.RoleBinding:
		if n, ok := next.(*rbacv1.RoleBinding); ok {
			n.Subjects = w.Subjects
		}
	}
	refs := slices.DeleteFunc(slices.Clone(next.GetOwnerReferences()), func(r metav1.OwnerReference) bool { return r.Controller != nil && *r.Controller })
	next.SetOwnerReferences(append(refs, want.GetOwnerReferences()...))
	labels := next.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[managed.LabelManagedBy] = managed.ManagedByValue
	next.SetLabels(labels)
	return next, !equality.Semantic.DeepEqual(cur, next)
}

// Name is the name of the Role and RoleBinding of lock.
func Name(lock string) string { return NamePrefix + lock }

// objectMeta is the object metadata of lock's Role and RoleBinding.
func objectMeta(lock *v1alpha1.DistributedLock) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace: lock.Namespace, Name: Name(lock.Name),
		Labels: map[string]string{managed.LabelManagedBy: managed.ManagedByValue},
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(lock,
			v1alpha1.GroupVersion.WithKind("DistributedLock"))},
	}
}

// Role is the Role that reads lock and nothing else, and writes its
// LockHeartbeat (renewals, and the agent's word that an app stopped).
func Role(lock *v1alpha1.DistributedLock) *rbacv1.Role {
	return &rbacv1.Role{
		ObjectMeta: objectMeta(lock),
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"distributedlocks"},
			ResourceNames: []string{lock.Name}, Verbs: []string{"get", "list", "watch"},
		}, {
			APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"lockheartbeats"},
			ResourceNames: []string{lock.Name}, Verbs: []string{"get", "update"},
		}},
	}
}

// Heartbeat is lock's LockHeartbeat as this controller creates it: no
// holder yet.
func Heartbeat(lock *v1alpha1.DistributedLock) *v1alpha1.LockHeartbeat {
	meta := objectMeta(lock)
	meta.Name = lock.Name
	return &v1alpha1.LockHeartbeat{ObjectMeta: meta}
}

// Binding is the RoleBinding of lock's Role to subjects.
func Binding(lock *v1alpha1.DistributedLock, subjects []rbacv1.Subject) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: objectMeta(lock),
		Subjects:   subjects,
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: Name(lock.Name)},
	}
}

// Subjects are the ServiceAccounts of the pods that run the agent and have
// not finished, sorted, each once.
func Subjects(pods []corev1.Pod) []rbacv1.Subject {
	var names []string
	ns := ""
	for i := range pods {
		p := &pods[i]
		if !podagent.Injected(p) || podlock.Finished(p) {
			continue
		}
		sa := p.Spec.ServiceAccountName
		if sa == "" {
			sa = "default"
		}
		names, ns = append(names, sa), p.Namespace
	}
	slices.Sort(names)
	names = slices.Compact(names)
	subjects := make([]rbacv1.Subject, 0, len(names))
	for _, n := range names {
		subjects = append(subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: n})
	}
	return subjects
}

// SetupWithManager registers the controller: it reconciles a lock when it
// is created or its heartbeat timeout is set or unset (not on its other
// updates: status refreshes would wake it every few seconds per lock),
// when a labelled pod that asks for the agent changes, when one of its
// Roles or RoleBindings does, and when the labels or owner of its
// LockHeartbeat do (not its renewals).
func (r *Reconciler) SetupWithManager(mgr manager.Manager) error {
	lockOf := handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, p *corev1.Pod) []reconcile.Request {
		if !podagent.Injected(p) {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Labels[v1alpha1.LockLabel]}}}
	})
	// Of a pod's updates only those that change whom it counts for: its
	// lock, or its end. A status update of every agent pod would otherwise
	// list the lock's pods each time.
	counts := predicate.TypedFuncs[*corev1.Pod]{UpdateFunc: func(e event.TypedUpdateEvent[*corev1.Pod]) bool {
		o, n := e.ObjectOld, e.ObjectNew
		return o.Labels[v1alpha1.LockLabel] != n.Labels[v1alpha1.LockLabel] || podlock.Finished(o) != podlock.Finished(n)
	}}
	return builder.ControllerManagedBy(mgr).
		Named("agentaccess").
		For(&v1alpha1.DistributedLock{}, builder.WithPredicates(predicate.Funcs{UpdateFunc: heartbeatSetOrUnset})).
		Owns(&rbacv1.Role{}).
		// Of a LockHeartbeat's updates only those to what this controller
		// keeps (labels, owner): every renewal is an update of its spec.
		Owns(&v1alpha1.LockHeartbeat{}, builder.WithPredicates(predicate.Funcs{UpdateFunc: metadataChanged})).
		Owns(&rbacv1.RoleBinding{}).
		WatchesRawSource(source.Kind(r.Pods, &corev1.Pod{}, lockOf, counts)).
		Complete(r)
}

// wantsHeartbeat reports whether lock's spec asks its holders for a
// heartbeat: a heartbeat timeout (holder pods), or a holder lease (a
// static holder).
func wantsHeartbeat(lock *v1alpha1.DistributedLock) bool {
	return lock.Spec.HeartbeatTimeout != nil || lock.Spec.HolderLease != nil
}

// heartbeatSetOrUnset passes the updates of a lock that start or stop
// asking for a heartbeat, and no others: status refreshes would wake the
// controller every few seconds per lock.
func heartbeatSetOrUnset(e event.UpdateEvent) bool {
	o, ok1 := e.ObjectOld.(*v1alpha1.DistributedLock)
	n, ok2 := e.ObjectNew.(*v1alpha1.DistributedLock)
	return ok1 && ok2 && wantsHeartbeat(o) != wantsHeartbeat(n)
}

// metadataChanged passes the updates that change an object's labels or
// owner references.
func metadataChanged(e event.UpdateEvent) bool {
	o, n := e.ObjectOld, e.ObjectNew
	return !equality.Semantic.DeepEqual(o.GetLabels(), n.GetLabels()) || !equality.Semantic.DeepEqual(o.GetOwnerReferences(), n.GetOwnerReferences())
}
