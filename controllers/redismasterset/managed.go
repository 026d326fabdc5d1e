package redismasterset

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/managed"
)

// annotationSpecHash records the rendered spec an object was last written
// with, so that an unchanged spec causes no write.
const annotationSpecHash = "redlock.dev/spec-hash"

// EventAdmitted is the event of a member pod's admission.
const EventAdmitted = "MemberAdmitted"

// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=services;configmaps,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch

// reconcileManaged writes the objects that run a managed set and admits
// new member pods. It reports recorded=true when it recorded the members
// of a new set in status instead: the StatefulSet is created only once that
// record has been written (by the deferred status patch) and read back.
func (r *Reconciler) reconcileManaged(ctx context.Context, ms *v1alpha1.RedisMasterSet, now time.Time) (recorded bool, err error) {
	if err := r.ensureSecret(ctx, ms); err != nil {
		return false, err
	}
	password, err := r.Masters.Password(ctx, ms)
	if err != nil {
		return false, err
	}
	acl := managed.ACLSecret(ms, managed.ACL(password))
	if err := r.createOnce(ctx, ms, acl); err != nil {
		return false, err
	}
	cm, svc, pdb := managed.ConfigMap(ms), managed.Service(ms), managed.PodDisruptionBudget(ms)
	sts := managed.StatefulSet(ms, managed.Options{GateImage: r.GateImage, ACLSecret: acl.Name})
	if _, err := ensure(ctx, r.Client, ms, cm, func(dst *corev1.ConfigMap) { dst.Data = cm.Data }); err != nil {
		return false, err
	}
	if _, err := ensure(ctx, r.Client, ms, svc, func(dst *corev1.Service) {
		dst.Spec.Ports, dst.Spec.Selector, dst.Spec.PublishNotReadyAddresses = svc.Spec.Ports, svc.Spec.Selector, true
		dst.Spec.ClusterIP = corev1.ClusterIPNone
	}); err != nil {
		return false, err
	}
	if _, err := ensure(ctx, r.Client, ms, pdb, func(dst *policyv1.PodDisruptionBudget) { dst.Spec = pdb.Spec }); err != nil {
		return false, err
	}
	if len(ms.Status.Members) == 0 {
		// A new set: record its members as never served before any of their
		// pods exists, so that their first pods are admitted at once. A set
		// whose StatefulSet exists without records knows nothing of its
		// members: their pods wait a full restart delay.
		err := r.Get(ctx, client.ObjectKeyFromObject(sts), &appsv1.StatefulSet{})
		switch {
		case apierrors.IsNotFound(err):
			for _, a := range managed.Addresses(ms) {
				ms.Status.Members = append(ms.Status.Members, v1alpha1.MemberStatus{Address: a, State: v1alpha1.MemberStarting, NeverServed: true})
			}
			return true, nil
		case err != nil:
			return false, err
		}
	}
	if _, err := ensure(ctx, r.Client, ms, sts, func(dst *appsv1.StatefulSet) {
		// Selector, service name, claims and pod management are immutable:
		// they only take the rendered values on creation.
		if dst.ResourceVersion == "" {
			dst.Spec = sts.Spec
			return
		}
		dst.Spec.Replicas, dst.Spec.Template, dst.Spec.UpdateStrategy = sts.Spec.Replicas, sts.Spec.Template, sts.Spec.UpdateStrategy
	}); err != nil {
		return false, err
	}
	return false, r.admitPods(ctx, ms, now)
}

// admitPods annotates every member pod that has no admission yet with the
// instant from which it may serve.
func (r *Reconciler) admitPods(ctx context.Context, ms *v1alpha1.RedisMasterSet, now time.Time) error {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(ms.Namespace), client.MatchingLabels(managed.Labels(ms))); err != nil {
		return fmt.Errorf("list member pods: %w", err)
	}
	delay := managed.RestartDelay(ms)
	lag := managed.ProbeLag(r.ProbeInterval, r.Masters.ProbeTimeout(ms))
	members := ms.Status.Members
	for i := range pods.Items {
		if _, admitted := pods.Items[i].Annotations[managed.ServeAfter]; !admitted {
			// Admission depends on the members' history: read it fresh, not
			// from a cache that may lag behind the latest status write.
			fresh := &v1alpha1.RedisMasterSet{}
			if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(ms), fresh); err != nil {
				return fmt.Errorf("read master set: %w", err)
			}
			members = fresh.Status.Members
			break
		}
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		ord, ok := ordinal(pod, managed.NamesOf(ms).StatefulSet)
		if !ok || ord >= int(ms.Spec.Managed.Replicas) || !pod.DeletionTimestamp.IsZero() {
			continue
		}
		if _, admitted := pod.Annotations[managed.ServeAfter]; admitted {
			continue
		}
		var member *v1alpha1.MemberStatus
		if ord < len(members) {
			member = &members[ord]
		}
		at := managed.AdmitAt(member, delay, lag, now)
		patch := client.MergeFrom(pod.DeepCopy())
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[managed.ServeAfter] = at.UTC().Format(time.RFC3339Nano)
		if err := r.Patch(ctx, pod, patch); err != nil {
			return fmt.Errorf("admit pod %s: %w", pod.Name, err)
		}
		r.Recorder.Eventf(ms, pod, corev1.EventTypeNormal, EventAdmitted, "Admit", "member %d (pod %s) may serve from %s", ord, pod.Name, at.UTC().Format(time.RFC3339))
	}
	return nil
}

// ordinal is a member pod's index: its pod-index label, or its name suffix.
func ordinal(pod *corev1.Pod, sts string) (int, bool) {
	s, ok := pod.Labels[managed.PodIndexLabel]
	if !ok {
		s, ok = strings.CutPrefix(pod.Name, sts+"-")
	}
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0
}

// ensureSecret creates the generated auth Secret once; it is never changed.
func (r *Reconciler) ensureSecret(ctx context.Context, ms *v1alpha1.RedisMasterSet) error {
	if ms.Spec.AuthSecretRef != nil {
		return nil
	}
	return r.createOnce(ctx, ms, managed.Secret(ms, rand.Text()+rand.Text()))
}

// createOnce creates a Secret owned by the set unless it exists: the
// generated password, and the ACL Secrets, which are named by their
// content (a changed ACL is a new Secret). Old ACL Secrets go with the set.
func (r *Reconciler) createOnce(ctx context.Context, ms *v1alpha1.RedisMasterSet, s *corev1.Secret) error {
	if err := controllerutil.SetControllerReference(ms, s, r.Scheme()); err != nil {
		return err
	}
	if err := r.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create secret %s: %w", s.Name, err)
	}
	return nil
}

// ensure creates desired, or updates the existing object with apply when
// the rendered object changed since it was last written. It reports whether
// the object was created.
func ensure[T client.Object](ctx context.Context, c client.Client, owner *v1alpha1.RedisMasterSet, desired T, apply func(dst T)) (bool, error) {
	raw, err := json.Marshal(desired)
	if err != nil {
		return false, err
	}
	sum := sha256.Sum256(raw)
	hash := hex.EncodeToString(sum[:8])
	obj := desired.DeepCopyObject().(T) //nolint:forcetypeassert // a copy has the same type
	res, err := controllerutil.CreateOrUpdate(ctx, c, obj, func() error {
		if obj.GetAnnotations()[annotationSpecHash] == hash && obj.GetResourceVersion() != "" {
			return nil
		}
		apply(obj)
		labels := obj.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		for k, v := range desired.GetLabels() {
			labels[k] = v
		}
		obj.SetLabels(labels)
		ann := obj.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[annotationSpecHash] = hash
		obj.SetAnnotations(ann)
		return controllerutil.SetControllerReference(owner, obj, c.Scheme())
	})
	if err != nil {
		return false, fmt.Errorf("write %T %s: %w", desired, desired.GetName(), err)
	}
	return res == controllerutil.OperationResultCreated, nil
}

// setsOfPod maps a member pod to its master set.
func setsOfPod(_ context.Context, o client.Object) []reconcile.Request {
	name, ok := o.GetLabels()[managed.LabelSet]
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}
