package redismasterset

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/managed"
)

// memberZones returns the zone of each managed member, by ordinal, from
// its pod's node: "" where not known (no pod, not scheduled, a node
// without the label, or Nodes not read).
func (r *Reconciler) memberZones(ctx context.Context, ms *v1alpha1.RedisMasterSet) ([]string, error) {
	zones := make([]string, ms.Spec.Managed.Replicas)
	if !r.ReadNodes {
		return zones, nil
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(ms.Namespace), client.MatchingLabels(managed.Labels(ms))); err != nil {
		return nil, fmt.Errorf("list member pods: %w", err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		ord, ok := ordinal(pod, managed.NamesOf(ms).StatefulSet)
		if !ok || ord >= len(zones) || pod.Spec.NodeName == "" || !pod.DeletionTimestamp.IsZero() {
			continue
		}
		node := &corev1.Node{}
		switch err := r.Get(ctx, client.ObjectKey{Name: pod.Spec.NodeName}, node); {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("read node %s of member %d: %w", pod.Spec.NodeName, ord, err)
		}
		zones[ord] = node.Labels[corev1.LabelTopologyZone]
	}
	return zones, nil
}

// setZones writes each member's zone and the SurvivesZoneLoss condition.
func setZones(ms *v1alpha1.RedisMasterSet, zones []string, readNodes bool) {
	for i := range ms.Status.Members {
		if i < len(zones) {
			ms.Status.Members[i].Zone = zones[i]
		}
	}
	status, reason, msg := zoneCondition(zones, readNodes)
	setSetCondition(ms, v1alpha1.ConditionSurvivesZoneLoss, status, reason, msg)
}

// zoneCondition tells whether losing any one zone leaves a quorum of the
// members, given each member's zone ("" unknown).
func zoneCondition(zones []string, readNodes bool) (metav1.ConditionStatus, string, string) {
	if !readNodes {
		return metav1.ConditionUnknown, v1alpha1.ReasonZonesUnknown,
			"the operator does not read Nodes (--watch-nodes=false), so the members' zones are not known"
	}
	quorum := len(zones)/2 + 1
	in := map[string][]int{}
	unknown := 0
	for i, z := range zones {
		if z == "" {
			unknown++
			continue
		}
		in[z] = append(in[z], i)
	}
	most, mostZone := 0, ""
	for _, z := range slices.Sorted(maps.Keys(in)) {
		if len(in[z]) > most {
			most, mostZone = len(in[z]), z
		}
	}
	switch {
	case most >= quorum:
		return metav1.ConditionFalse, v1alpha1.ReasonQuorumInOneZone,
			fmt.Sprintf("members %s of %d run in zone %s, a quorum (%d): losing that zone stops every lock of the set", ordinals(in[mostZone]), len(zones), mostZone, quorum)
	case most+unknown >= quorum:
		return metav1.ConditionUnknown, v1alpha1.ReasonZonesUnknown,
			fmt.Sprintf("%d of %d members' zones are not known (not scheduled, or on nodes without the label %s)", unknown, len(zones), corev1.LabelTopologyZone)
	default:
		return metav1.ConditionTrue, v1alpha1.ReasonNoZoneHoldsQuorum,
			fmt.Sprintf("%d members in %d zones, at most %d in one; a lock needs %d", len(zones), len(in), most, quorum)
	}
}

// ordinals prints member ordinals as "0, 1 and 2".
func ordinals(ords []int) string {
	s := make([]string, len(ords))
	for i, o := range ords {
		s[i] = fmt.Sprint(o)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
