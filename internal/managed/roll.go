package managed

import "sort"

// MemberPod is what the rolling update of a managed set knows of one member
// pod.
type MemberPod struct {
	Name    string
	Ordinal int
	// Outdated: the pod runs an older template than the StatefulSet's.
	Outdated bool
	// Ready: the pod's readiness probe passes (its member votes).
	Ready bool
	// Serving: the operator's last probe counted the member as voting.
	Serving bool
	// Terminating: the pod is being deleted.
	Terminating bool
}

// UpToDate is NextToReplace's reason when no member pod is outdated.
const UpToDate = "every member pod is up to date"

// NextToReplace picks the member pod a rolling update deletes next (its
// StatefulSet, updated OnDelete, recreates it from the new template), or ""
// with the reason nothing may go now. At most one voting member is out at a
// time:
//
//   - nothing goes while a pod is terminating or missing (being replaced);
//   - an outdated pod that neither is Ready nor serves goes first: it casts
//     no vote, so replacing it costs nothing;
//   - otherwise an outdated pod goes only when every member pod is Ready and
//     every member serves, the highest ordinal first.
//
// The StatefulSet controller's own rolling update would instead delete every
// outdated pod that is not Ready at once (Kubernetes 1.35+, Parallel pod
// management) — and a member that just started votes a little before its pod
// reports Ready, so a template change then could take down several voting
// members together.
func NextToReplace(pods []MemberPod, replicas int) (name, wait string) {
	if len(pods) < replicas {
		return "", "a member pod is missing (being created)"
	}
	byOrdinal := append([]MemberPod(nil), pods...)
	sort.Slice(byOrdinal, func(i, j int) bool { return byOrdinal[i].Ordinal > byOrdinal[j].Ordinal })
	for _, p := range byOrdinal {
		if p.Terminating {
			return "", "member pod " + p.Name + " is terminating"
		}
	}
	for _, p := range byOrdinal {
		if p.Outdated && !p.Ready && !p.Serving {
			return p.Name, ""
		}
	}
	var next string
	for _, p := range byOrdinal {
		switch {
		case !p.Ready:
			return "", "member pod " + p.Name + " is not Ready"
		case !p.Serving:
			return "", "member of pod " + p.Name + " does not serve"
		case p.Outdated && next == "":
			next = p.Name
		}
	}
	if next == "" {
		return "", UpToDate
	}
	return next, ""
}
