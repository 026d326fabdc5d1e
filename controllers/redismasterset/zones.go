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
	"github.com/redlock-operator/redlock-operator/internal/masters"
)

// placement is where a member runs: nowhere (no pod, not scheduled, or
// terminating; an external member probed Down or not yet), in a zone, on a
// node whose zone is not known (zone ""), or outside this cluster (an
// external member, which no zone's loss here takes).
type placement struct {
	running bool
	zone    string
	outside bool
}

// memberPlacements returns where each member of the spec's list runs
// (masters.Addresses: the managed members by ordinal, then the external
// ones). Without Nodes to read, every running managed member's zone is
// unknown.
func (r *Reconciler) memberPlacements(ctx context.Context, ms *v1alpha1.RedisMasterSet) ([]placement, error) {
	out := make([]placement, ms.Spec.Managed.Replicas)
	if ext := ms.Spec.External; ext != nil {
		for _, a := range ext.Addresses {
			out = append(out, placement{running: probedUp(ms, a), outside: true})
		}
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(ms.Namespace), client.MatchingLabels(managed.Labels(ms))); err != nil {
		return nil, fmt.Errorf("list member pods: %w", err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		ord, ok := ordinal(pod, managed.NamesOf(ms).StatefulSet)
		if !ok || ord >= int(ms.Spec.Managed.Replicas) || pod.Spec.NodeName == "" || !pod.DeletionTimestamp.IsZero() {
			continue
		}
		out[ord].running = true
		if !r.ReadNodes {
			continue
		}
		node := &corev1.Node{}
		switch err := r.Get(ctx, client.ObjectKey{Name: pod.Spec.NodeName}, node); {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("read node %s of member %d: %w", pod.Spec.NodeName, ord, err)
		}
		out[ord].zone = node.Labels[corev1.LabelTopologyZone]
	}
	return out, nil
}

// probedUp reports whether the probe recorded the master at addr and did
// not find it Down: how the zones count a master no pod of this cluster
// runs.
func probedUp(ms *v1alpha1.RedisMasterSet, addr string) bool {
	m := ms.Status.Member(addr)
	return m != nil && m.State != v1alpha1.MemberDown
}

// setZones writes each member's zone and the SurvivesZoneLoss condition,
// computed for every list of masters grants need: the set's, and during a
// membership change the previous one too.
func setZones(ms *v1alpha1.RedisMasterSet, placements []placement, readNodes bool) {
	spec, _ := masters.Addresses(ms)
	ordinals := map[string]int{}
	for i, a := range spec {
		ordinals[a] = i
	}
	for i, m := range ms.Status.Members {
		if j, ok := ordinals[m.Address]; ok && j < len(placements) {
			ms.Status.Members[i].Zone = placements[j].zone
		}
	}
	if !readNodes {
		setSetCondition(ms, v1alpha1.ConditionSurvivesZoneLoss, metav1.ConditionUnknown, v1alpha1.ReasonZonesUnknown,
			"the operator does not read Nodes (--watch-nodes=false), so the members' zones are not known")
		return
	}
	listOf := func(addrs []string) []int {
		var out []int
		for _, a := range addrs {
			i, ok := ordinals[a]
			if !ok {
				// A master of another list (the previous one, or one the
				// spec no longer names): counted, in a zone not known
				// unless probed Down.
				placements = append(placements, placement{running: probedUp(ms, a)})
				i = len(placements) - 1
				ordinals[a] = i
			}
			out = append(out, i)
		}
		return out
	}
	current := listOf(ms.Status.Addresses)
	if len(ms.Status.Addresses) == 0 {
		current = listOf(spec)
	}
	status, reason, msg := zoneCondition(placements, current)
	if ch := ms.Status.MembershipChange; ch != nil && status != metav1.ConditionFalse {
		if s, r, m := zoneCondition(placements, listOf(ch.Previous)); s != metav1.ConditionTrue {
			status, reason, msg = s, r, "of the previous list, which grants need until the membership change ends: "+m
		}
	}
	setSetCondition(ms, v1alpha1.ConditionSurvivesZoneLoss, status, reason, msg)
}

// zoneCondition tells whether losing any one zone leaves a quorum of the
// list's members (ordinals) running. A member that runs nowhere counts as
// lost; one whose zone is not known may be in any zone.
func zoneCondition(placements []placement, list []int) (metav1.ConditionStatus, string, string) {
	quorum := len(list)/2 + 1
	in := map[string][]int{}
	var nowhere, unknown []int
	known := 0
	for _, i := range list {
		switch p := placements[i]; {
		case !p.running:
			nowhere = append(nowhere, i)
		case p.outside:
			known++
		case p.zone == "":
			unknown = append(unknown, i)
		default:
			in[p.zone] = append(in[p.zone], i)
			known++
		}
	}
	if known+len(unknown) == 0 {
		return metav1.ConditionUnknown, v1alpha1.ReasonZonesUnknown, fmt.Sprintf("none of the %d members runs yet", len(list))
	}
	// Losing zone z leaves at least the members known elsewhere, and at
	// most those and the members of unknown zones.
	worst, worstZone := known+len(unknown), ""
	for _, z := range slices.Sorted(maps.Keys(in)) {
		if left := known - len(in[z]); left < worst {
			worst, worstZone = left, z
		}
	}
	if len(unknown) > 0 && known < worst {
		worst, worstZone = known, "" // the unknown members may share a zone of their own
	}
	switch {
	case worstZone != "" && worst+len(unknown) < quorum:
		msg := fmt.Sprintf("losing zone %s (%s) leaves %d of %d members running, fewer than a quorum (%d)", worstZone, ordinalList(in[worstZone]), worst+len(unknown), len(list), quorum)
		if len(nowhere) > 0 {
			msg += fmt.Sprintf("; not running: %s", ordinalList(nowhere))
		}
		return metav1.ConditionFalse, v1alpha1.ReasonQuorumInOneZone, msg
	case worst < quorum:
		return metav1.ConditionUnknown, v1alpha1.ReasonZonesUnknown,
			fmt.Sprintf("the zones of %s are not known (nodes without the label %s, or gone); with them a zone may hold what the set cannot lose", ordinalList(unknown), corev1.LabelTopologyZone)
	default:
		return metav1.ConditionTrue, v1alpha1.ReasonNoZoneHoldsQuorum,
			fmt.Sprintf("losing any one zone leaves at least %d of %d members running; a lock needs %d", worst, len(list), quorum)
	}
}

// ordinalList names members: "member 0", "members 0, 1 and 2".
func ordinalList(ords []int) string {
	s := make([]string, len(ords))
	for i, o := range ords {
		s[i] = fmt.Sprint(o)
	}
	if len(s) < 2 {
		return "member " + strings.Join(s, "")
	}
	return "members " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
