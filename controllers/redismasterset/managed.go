package redismasterset

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/managed"
	"github.com/redlock-operator/redlock-operator/internal/masters"
)

// EventAdmitted is the event of a member pod's admission.
const EventAdmitted = "MemberAdmitted"

// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=services;configmaps,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create

// managedOutcome is what reconcileManaged did besides writing objects.
type managedOutcome struct {
	// recorded: the members of a new set were recorded in status instead;
	// the StatefulSet is created only once that record has been written
	// (by the deferred status patch) and read back.
	recorded bool
	// rolling: a rolling update has outdated members left.
	rolling bool
	// problem: the spec could not be applied in full (a TLS Secret that
	// cannot be used): the members keep what they have.
	problem error
}

// reconcileManaged writes the objects that run a managed set, admits new
// member pods and rolls outdated ones.
func (r *Reconciler) reconcileManaged(ctx context.Context, ms *v1alpha1.RedisMasterSet, now time.Time) (managedOutcome, error) {
	if err := r.ensureSecret(ctx, ms); err != nil {
		return managedOutcome{}, err
	}
	password, err := r.Masters.Password(ctx, ms)
	if err != nil {
		return managedOutcome{}, err
	}
	live := &appsv1.StatefulSet{}
	switch err := r.Get(ctx, types.NamespacedName{Namespace: ms.Namespace, Name: managed.NamesOf(ms).StatefulSet}, live); {
	case apierrors.IsNotFound(err):
		live = nil
	case err != nil:
		return managedOutcome{}, fmt.Errorf("read statefulset: %w", err)
	}
	image := gateImage(ms, r.GateImage)
	newDefaults := managed.NewDefaults(ms, live, password, image)
	acl := managed.ACLSecret(ms, managed.ACL(password, newDefaults))
	if err := r.createOnce(ctx, ms, acl); err != nil {
		return managedOutcome{}, err
	}
	var problem error
	serving, err := r.servingTLS(ctx, ms, live, now)
	if err != nil {
		// A running set keeps serving the certificate it has, and goes on
		// admitting, rolling and being probed; the problem is reported.
		cur := liveServing(ms, live)
		if cur == nil || (!masters.SecretUnusable(err) && !errors.Is(err, errUnsupportedSpec)) {
			return managedOutcome{}, err
		}
		serving, problem = cur, err
	}
	cm, svc, pdb := managed.ConfigMap(ms), managed.Service(ms), managed.PodDisruptionBudget(ms)
	opts := managed.Options{GateImage: image, ACLSecret: acl.Name, OperatorNamespace: r.OperatorNamespace, TLS: serving, NewDefaults: newDefaults}
	ms.Status.GateImage = opts.GateImage // written by the deferred status patch
	sts := managed.StatefulSet(ms, opts)
	for _, obj := range []client.Object{cm, svc, pdb, managed.NetworkPolicy(ms, opts)} {
		if err := r.apply(ctx, ms, obj); err != nil {
			return managedOutcome{}, err
		}
	}
	if recordNewMembers(ms, live) {
		return managedOutcome{recorded: true}, nil
	}
	if live != nil {
		// Selector, service name, claims and pod management are immutable:
		// they keep the values the StatefulSet was created with.
		sts.Spec.Selector, sts.Spec.ServiceName = live.Spec.Selector, live.Spec.ServiceName
		sts.Spec.VolumeClaimTemplates, sts.Spec.PodManagementPolicy = live.Spec.VolumeClaimTemplates, live.Spec.PodManagementPolicy
	}
	if err := r.apply(ctx, ms, sts); err != nil {
		return managedOutcome{}, err
	}
	if err := r.admitPods(ctx, ms, now); err != nil {
		return managedOutcome{}, err
	}
	rolling, err := r.rollMembers(ctx, ms, live)
	return managedOutcome{rolling: rolling, problem: problem}, err
}

// recordNewMembers records members that never served before any of their
// pods exists, so that their first pods are admitted at once, and reports
// whether it did: every member of a new set, and the new members of a set
// that grew (they vote only once the membership change lets them). A set
// whose StatefulSet exists without records knows nothing of its members:
// their pods wait a full restart delay.
func recordNewMembers(ms *v1alpha1.RedisMasterSet, live *appsv1.StatefulSet) bool {
	addrs := managed.Addresses(ms)
	switch {
	case live == nil && len(ms.Status.Members) == 0:
		// A new set: every member.
	case live == nil || len(ms.Status.Members) == 0:
		return false
	default:
		// The ordinals the StatefulSet did not have yet: a member whose
		// address changed (a new port) may have served.
		had := 0
		if live.Spec.Replicas != nil {
			had = int(*live.Spec.Replicas)
		}
		addrs = addrs[min(had, len(addrs)):]
	}
	recorded := false
	for _, a := range addrs {
		if ms.Status.Member(a) == nil {
			ms.Status.Members = append(ms.Status.Members, v1alpha1.MemberStatus{Address: a, State: v1alpha1.MemberStarting, NeverServed: true})
			recorded = true
		}
	}
	return recorded
}

// EventReplaced is the event of a member pod deleted for a rolling update.
const EventReplaced = "MemberReplaced"

// rollMembers replaces the next outdated member pod a rolling update may
// replace (managed.NextToReplace), if any: the StatefulSet, updated OnDelete,
// recreates it from its new template. A member that may vote goes through
// an eviction (the set's PodDisruptionBudget refuses it while another
// member is out, whoever took it out); one that casts no vote is deleted.
// It reports whether outdated members are left. live is the StatefulSet as
// read at the start of the reconcile: until its controller has observed its
// latest generation, its update revision may be stale and nothing goes.
// Nothing goes either before this process has probed the set, nor while
// the pod it replaced last is not yet seen going in the cache.
func (r *Reconciler) rollMembers(ctx context.Context, ms *v1alpha1.RedisMasterSet, live *appsv1.StatefulSet) (bool, error) {
	if live == nil || live.Status.UpdateRevision == "" {
		return false, nil
	}
	key := types.NamespacedName{Namespace: ms.Namespace, Name: ms.Name}
	if _, probed := r.probed.Load(key); !probed || live.Status.ObservedGeneration != live.Generation {
		return true, nil
	}
	pods, byName, behind, err := r.memberPods(ctx, ms, live, key)
	if err != nil || behind {
		return true, err
	}
	replicas := int(ms.Spec.Managed.Replicas)
	others := othersOf(ms)
	next := managed.NextToReplace(pods, replicas, others)
	if next.Voting && others.Total > 0 {
		// On what the masters answer now: status may be a probe old.
		fresh, err := r.freshOthers(ctx, ms)
		if err != nil {
			log.FromContext(ctx).Info("rolling update waits: the masters could not be probed", "error", err.Error())
			return true, nil
		}
		next = managed.NextToReplace(pods, replicas, fresh)
	}
	goes := r.inTurn(ctx, ms, key, next, pods, others)
	switch {
	case next.Name == "" && next.Wait == managed.UpToDate:
		return false, nil
	case next.Name == "":
		log.FromContext(ctx).V(1).Info("rolling update waits", "reason", next.Wait)
		return true, nil
	case !goes:
		return true, nil
	}
	pod := byName[next.Name]
	// Only the pod as seen: not one recreated or changed since.
	pre := &metav1.Preconditions{UID: &pod.UID, ResourceVersion: &pod.ResourceVersion}
	if next.Voting {
		err = r.SubResource("eviction").Create(ctx, pod, &policyv1.Eviction{DeleteOptions: &metav1.DeleteOptions{Preconditions: pre}})
	} else {
		err = r.Delete(ctx, pod, client.Preconditions(*pre))
	}
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err) || apierrors.IsTooManyRequests(err):
		return true, nil // the pod changed, or the budget is spent: decide again
	case err != nil:
		return true, fmt.Errorf("replace member pod %s: %w", pod.Name, err)
	}
	r.replaced.Store(key, pod.UID)
	r.Recorder.Eventf(ms, pod, corev1.EventTypeNormal, EventReplaced, "Roll", "replacing pod %s for the set's new template; the next member goes once it votes again", pod.Name)
	return true, nil
}

// memberPods is what a rolling update knows of the set's member pods
// (those of live, by ordinal), and the pods by name; behind: the cache has
// not caught up with the pod replaced last.
func (r *Reconciler) memberPods(ctx context.Context, ms *v1alpha1.RedisMasterSet, live *appsv1.StatefulSet, key types.NamespacedName) ([]managed.MemberPod, map[string]*corev1.Pod, bool, error) {
	var list corev1.PodList
	if err := r.List(ctx, &list, client.InNamespace(ms.Namespace), client.MatchingLabels(managed.Labels(ms))); err != nil {
		return nil, nil, false, fmt.Errorf("list member pods: %w", err)
	}
	replicas := int(ms.Spec.Managed.Replicas)
	addrs := managed.Addresses(ms)
	last, _ := r.replaced.Load(key)
	var pods []managed.MemberPod
	byName := map[string]*corev1.Pod{}
	for i := range list.Items {
		pod := &list.Items[i]
		ord, ok := ordinal(pod, live.Name)
		if !ok || ord >= replicas || !metav1.IsControlledBy(pod, live) {
			continue
		}
		if pod.UID == last && pod.DeletionTimestamp.IsZero() {
			return nil, nil, true, nil
		}
		byName[pod.Name] = pod
		var state string
		if m := ms.Status.Member(addrs[ord]); m != nil {
			state = m.State
		}
		pods = append(pods, managed.MemberPod{
			Name: pod.Name, Ordinal: ord,
			Serving: state == v1alpha1.MemberServing, Down: state == v1alpha1.MemberDown,
			Outdated:    pod.Labels[appsv1.ControllerRevisionHashLabelKey] != live.Status.UpdateRevision,
			Ready:       podReady(pod),
			Terminating: !pod.DeletionTimestamp.IsZero(),
		})
	}
	return pods, byName, false, nil
}

// podReady reports whether a pod's Ready condition is True.
func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// gateImage is the image the set's members copy the gate from: the spec's,
// else the one recorded when the set was first run, else the operator's own
// (which is then recorded): an operator upgrade does not roll every set.
func gateImage(ms *v1alpha1.RedisMasterSet, operator string) string {
	switch {
	case ms.Spec.Managed.GateImage != "":
		return ms.Spec.Managed.GateImage
	case ms.Status.GateImage != "":
		return ms.Status.GateImage
	default:
		return operator
	}
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
	addrs := managed.Addresses(ms)
	status := &ms.Status
	for i := range pods.Items {
		if _, admitted := pods.Items[i].Annotations[managed.ServeAfter]; !admitted {
			// Admission depends on the members' history: read it fresh, not
			// from a cache that may lag behind the latest status write.
			fresh := &v1alpha1.RedisMasterSet{}
			if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(ms), fresh); err != nil {
				return fmt.Errorf("read master set: %w", err)
			}
			status = &fresh.Status
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
		member := status.Member(addrs[ord])
		at := managed.AdmitAt(member, r.ownServing(ms, member), delay, lag, now)
		patch := client.MergeFrom(pod.DeepCopy())
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		// The gate counts the delay on its own clock; the instant is for
		// people (and gates older than the delay annotation).
		pod.Annotations[managed.ServeDelay] = managed.AdmissionDelay(at, now)
		pod.Annotations[managed.ServeAfter] = at.UTC().Format(time.RFC3339Nano)
		if err := r.Patch(ctx, pod, patch); err != nil {
			return fmt.Errorf("admit pod %s: %w", pod.Name, err)
		}
		r.Recorder.Eventf(ms, pod, corev1.EventTypeNormal, EventAdmitted, "Admit", "member %d (pod %s) may serve in %s (at %s)", ord, pod.Name, pod.Annotations[managed.ServeDelay], at.UTC().Format(time.RFC3339))
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

// FieldOwner is the field manager of the operator's server-side applies.
const FieldOwner = "redlock-operator"

// applied is what the last apply of an object sent and got back.
type applied struct{ hash, resourceVersion string }

// apply writes desired, owned by the set, with server-side apply: the
// fields the operator sets are kept as rendered, so a hand edit of them is
// reverted (fields it does not set are left alone). An object whose
// rendering is unchanged and that nobody wrote since the last apply is not
// sent again.
func (r *Reconciler) apply(ctx context.Context, owner *v1alpha1.RedisMasterSet, desired client.Object) error {
	gvk, err := apiutil.GVKForObject(desired, r.Scheme())
	if err != nil {
		return err
	}
	if err := controllerutil.SetControllerReference(owner, desired, r.Scheme()); err != nil {
		return err
	}
	raw, err := json.Marshal(desired)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(raw)
	hash := hex.EncodeToString(sum[:8])
	key := gvk.Kind + "/" + desired.GetNamespace() + "/" + desired.GetName()
	live := desired.DeepCopyObject().(client.Object) //nolint:forcetypeassert // a copy has the same type
	switch err := r.Get(ctx, client.ObjectKeyFromObject(desired), live); {
	case err == nil:
		if last, ok := r.applied.Load(key); ok && last.(applied) == (applied{hash, live.GetResourceVersion()}) { //nolint:forcetypeassert // only applied is stored
			return nil
		}
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("read %s %s: %w", gvk.Kind, desired.GetName(), err)
	}
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: content}
	u.SetGroupVersionKind(gvk)
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	if err := r.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply %s %s: %w", gvk.Kind, desired.GetName(), err)
	}
	r.applied.Store(key, applied{hash, u.GetResourceVersion()})
	return nil
}

// setsOfPod maps a member pod to its master set.
func setsOfPod(_ context.Context, o client.Object) []reconcile.Request {
	name, ok := o.GetLabels()[managed.LabelSet]
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}
