package distributedlock

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/internal/podlock"
)

// +kubebuilder:rbac:groups=apps,resources=replicasets;deployments;statefulsets,verbs=get

// deploymentRevision is the annotation the Deployment controller keeps on a
// Deployment and its ReplicaSets: the ReplicaSet whose value equals the
// Deployment's is its current revision.
const deploymentRevision = "deployment.kubernetes.io/revision"

// staleRevisions reads, from the API server, the workloads of pods whose
// controller labels their revision, and returns which pods are of an old
// revision: a ReplicaSet that is not its Deployment's newest, a
// StatefulSet's revision other than its updateRevision. A pod whose
// workload cannot be read counts as current (first come, first served
// decides), and the read is logged. It is called only when a grant to a new
// pod is due among pods of mixed revisions: a rollout is under way.
func (a apiReads) staleRevisions(ctx context.Context, pods []*corev1.Pod) func(*corev1.Pod) bool {
	if a.Reader == nil {
		return nil
	}
	stale := map[types.UID]bool{}
	byOwner := map[types.UID]func(*corev1.Pod) bool{}
	for _, p := range pods {
		ref := metav1.GetControllerOf(p)
		if ref == nil || podlock.Revision(p) == "" {
			continue
		}
		isStale, ok := byOwner[ref.UID]
		if !ok {
			isStale = a.revisionCheck(ctx, p.Namespace, ref)
			byOwner[ref.UID] = isStale
		}
		stale[p.UID] = isStale(p)
	}
	return func(p *corev1.Pod) bool { return stale[p.UID] }
}

// revisionCheck reads the workload ref names and returns whether one of its
// pods is of an old revision.
func (a apiReads) revisionCheck(ctx context.Context, ns string, ref *metav1.OwnerReference) func(*corev1.Pod) bool {
	current := func(*corev1.Pod) bool { return false }
	log := logf.FromContext(ctx)
	switch {
	case ref.Kind == "ReplicaSet" && ref.APIVersion == appsv1.SchemeGroupVersion.String():
		var rs appsv1.ReplicaSet
		if err := a.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, &rs); err != nil {
			log.Error(err, "read a waiting pod's ReplicaSet to serve its current revision first", "replicaSet", ref.Name)
			return current
		}
		owner := metav1.GetControllerOf(&rs)
		if owner == nil || owner.Kind != "Deployment" {
			return current
		}
		var d appsv1.Deployment
		if err := a.Get(ctx, client.ObjectKey{Namespace: ns, Name: owner.Name}, &d); err != nil {
			log.Error(err, "read a waiting pod's Deployment to serve its current revision first", "deployment", owner.Name)
			return current
		}
		old := d.Annotations[deploymentRevision] != "" && rs.Annotations[deploymentRevision] != d.Annotations[deploymentRevision]
		return func(*corev1.Pod) bool { return old }
	case ref.Kind == "StatefulSet" && ref.APIVersion == appsv1.SchemeGroupVersion.String():
		var sts appsv1.StatefulSet
		if err := a.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, &sts); err != nil {
			log.Error(err, "read a waiting pod's StatefulSet to serve its current revision first", "statefulSet", ref.Name)
			return current
		}
		update := sts.Status.UpdateRevision
		return func(p *corev1.Pod) bool {
			return update != "" && p.Labels[appsv1.ControllerRevisionHashLabelKey] != update
		}
	default:
		return current
	}
}
