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
	// Down: the operator's last probe got no usable answer from the member
	// (not merely a restarted member sitting out its quarantine, which is
	// about to vote).
	Down bool
	// Terminating: the pod is being deleted.
	Terminating bool
}

// Replacement is NextToReplace's choice.
type Replacement struct {
	// Name of the pod to delete; empty when nothing may go now.
	Name string
	// Voting: the member may vote, so it goes through an eviction, which
	// the set's PodDisruptionBudget (one member at a time) also checks; a
	// member that casts no vote is deleted outright.
	Voting bool
	// Wait says why nothing goes now.
	Wait string
}

// UpToDate is NextToReplace's Wait when no member pod is outdated.
const UpToDate = "every member pod is up to date"

// Others are the members of a set that this cluster does not run (its
// external addresses): how many, and how many the last probe found voting.
type Others struct {
	Total, Serving int
}

// NextToReplace picks the member pod a rolling update replaces next (its
// StatefulSet, updated OnDelete, recreates it from the new template), so
// that at most one voting member is out at a time:
//
//   - nothing goes while a pod is terminating or missing (being replaced);
//   - an outdated member that is Down (no usable answer: a crash loop, a
//     certificate the clients no longer trust) casts no vote, and goes
//     first — when its pod is not Ready either, or when too few members
//     serve for any lock to be held, or when every member but the Down
//     outdated ones is Ready and serving;
//   - otherwise an outdated member goes only when every member pod is Ready
//     and every member serves, the highest ordinal first — and, in a set
//     with members other clusters run (others), only when the set keeps a
//     quorum serving without it.
//
// The StatefulSet controller's own rolling update would instead delete every
// outdated pod that is not Ready at once (Kubernetes 1.35+, Parallel pod
// management) — and a member that just started votes a little before its pod
// reports Ready, so a template change then could take down several voting
// members together.
func NextToReplace(pods []MemberPod, replicas int, others Others) Replacement {
	if len(pods) < replicas {
		return Replacement{Wait: "a member pod is missing (being created)"}
	}
	byOrdinal := append([]MemberPod(nil), pods...)
	sort.Slice(byOrdinal, func(i, j int) bool { return byOrdinal[i].Ordinal > byOrdinal[j].Ordinal })
	for _, p := range byOrdinal {
		if p.Terminating {
			return Replacement{Wait: "member pod " + p.Name + " is terminating"}
		}
	}
	quorum := (replicas+others.Total)/2 + 1
	if name := nonVoterToReplace(byOrdinal, quorum, others.Serving); name != "" {
		return Replacement{Name: name}
	}
	next := voterToReplace(byOrdinal)
	if next.Name != "" && others.Total > 0 && len(byOrdinal)-1+others.Serving < quorum {
		return Replacement{Wait: "replacing a member would leave fewer than a quorum of the set serving (members run elsewhere are down)"}
	}
	return next
}

// nonVoterToReplace is the outdated Down member that may go first, if any
// (see NextToReplace).
func nonVoterToReplace(byOrdinal []MemberPod, quorum, servingElsewhere int) string {
	serving, othersHealthy := servingElsewhere, true
	for _, p := range byOrdinal {
		if p.Serving {
			serving++
		}
		if (!p.Outdated || !p.Down) && (!p.Ready || !p.Serving) {
			othersHealthy = false
		}
	}
	for _, p := range byOrdinal {
		if p.Outdated && p.Down && (!p.Ready || serving < quorum || othersHealthy) {
			return p.Name
		}
	}
	return ""
}

// voterToReplace is the outdated member that may go while every member is
// Ready and serves, the highest ordinal first.
func voterToReplace(byOrdinal []MemberPod) Replacement {
	var next string
	for _, p := range byOrdinal {
		switch {
		case !p.Ready:
			return Replacement{Wait: "member pod " + p.Name + " is not Ready"}
		case !p.Serving:
			return Replacement{Wait: "the member of pod " + p.Name + " does not serve"}
		case p.Outdated && next == "":
			next = p.Name
		}
	}
	if next == "" {
		return Replacement{Wait: UpToDate}
	}
	return Replacement{Name: next, Voting: true}
}
