package redismasterset

import (
	"context"
	"errors"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/managed"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// RollKey is the key on a set's masters that the clusters running members
// of one set take in turn while they replace a voting member: a
// PodDisruptionBudget across clusters, each of whose members sees only its
// own. Sets sharing the servers take turns too.
const RollKey = "redlock:member-roll"

// rollEvery is how often a set with a rolling update under way is
// reconciled: rollInterval, and a third of maxLockTTL at most, so that a
// turn held for maxLockTTL is renewed in time.
func rollEvery(ms *v1alpha1.RedisMasterSet) time.Duration {
	return min(rollInterval, ms.Spec.MaxLockTTL.Duration/3)
}

// inTurn reports whether the rolling update's next replacement (next, from
// pods) may go now as far as the other clusters running members of the
// set are concerned: a voting member goes only in this cluster's turn,
// taken here. While nothing goes and a roll is under way (a pod outdated,
// or one replaced that does not vote yet), the turn stays, and is taken
// again if it lapsed (a manager restart, a rebuilt client); a finished
// roll gives it back.
func (r *Reconciler) inTurn(ctx context.Context, ms *v1alpha1.RedisMasterSet, key types.NamespacedName, next managed.Replacement, pods []managed.MemberPod, others managed.Others) bool {
	_, replaced := r.replaced.Load(key)
	switch {
	case next.Name == "" && next.Wait == managed.UpToDate:
		r.endRollTurn(ctx, key)
		r.replaced.Delete(key)
		return false
	case others.Total == 0:
		return next.Name != ""
	case next.Name == "":
		underWay := replaced || slices.ContainsFunc(pods, func(p managed.MemberPod) bool { return p.Outdated })
		r.rollTurn(ctx, ms, underWay)
		return false
	case !next.Voting:
		return true // a member that casts no vote takes nothing from the set
	}
	return r.rollTurn(ctx, ms, true)
}

// rollTurn keeps this cluster's turn to replace a voting member, renewing
// it for maxLockTTL, or with take, takes it when it has none; it reports
// whether it holds it. A failed renewal keeps the turn until its validity
// passes (its key stands on the masters until then). Any failure to take
// it (held elsewhere, too few masters answering, a key refused) means not
// in turn: logged, never a reconcile error, so that the set is still
// probed. A turn ends when the roll does (endRollTurn) or, should this
// process stop, when its validity passes.
func (r *Reconciler) rollTurn(ctx context.Context, ms *v1alpha1.RedisMasterSet, take bool) bool {
	key := types.NamespacedName{Namespace: ms.Namespace, Name: ms.Name}
	logger := log.FromContext(ctx)
	if v, ok := r.rollTurns.Load(key); ok {
		lk := v.(*redlock.Lock)
		err := lk.Extend(ctx)
		if err == nil {
			return true
		}
		if lk.Valid() {
			logger.V(1).Info("turn to replace a member not renewed: held until its validity passes", "error", err.Error())
			return true
		}
		r.rollTurns.Delete(key)
	}
	if !take {
		return false
	}
	c, err := r.Masters.Refresh(ctx, ms)
	if err != nil {
		logger.Info("rolling update waits: the turn to replace a member cannot be taken", "error", err.Error())
		return false
	}
	lk, err := c.Acquire(ctx, RollKey, ms.Spec.MaxLockTTL.Duration)
	switch {
	case errors.Is(err, redlock.ErrLockHeld):
		logger.V(1).Info("rolling update waits", "reason", "another cluster replaces a member of a set on these masters ("+RollKey+" is held)")
		return false
	case err != nil:
		logger.Info("rolling update waits: the turn to replace a member cannot be taken", "error", err.Error())
		return false
	}
	r.rollTurns.Store(key, lk)
	return true
}

// endRollTurn gives this cluster's turn back, if it holds one.
func (r *Reconciler) endRollTurn(ctx context.Context, key types.NamespacedName) {
	v, ok := r.rollTurns.LoadAndDelete(key)
	if !ok {
		return
	}
	if err := v.(*redlock.Lock).Release(ctx); err != nil {
		log.FromContext(ctx).V(1).Info("turn to replace a member not given back: it lapses", "error", err.Error())
	}
}

// freshOthers probes the set's masters now and counts the members of its
// list this cluster does not run, and those of them voting: a voting
// member goes on what the masters answer at the moment, not on the last
// probe's status (up to a probe interval old).
func (r *Reconciler) freshOthers(ctx context.Context, ms *v1alpha1.RedisMasterSet) (managed.Others, error) {
	c, err := r.Masters.Refresh(ctx, ms)
	if err != nil {
		return managed.Others{}, err
	}
	results, err := c.Probe(ctx)
	if err != nil {
		return managed.Others{}, err
	}
	now := r.Clock.Now()
	members := make([]v1alpha1.MemberStatus, len(results))
	for i, res := range results {
		members[i] = memberState(res, now)
	}
	return countOthers(ms, members), nil
}

// othersOf counts, from status, the members of the set's list that this
// cluster does not run, and those of them the last probe found voting.
func othersOf(ms *v1alpha1.RedisMasterSet) managed.Others {
	return countOthers(ms, ms.Status.Members)
}

// countOthers counts the external members of the list grants are made on
// among members, and those of them serving.
func countOthers(ms *v1alpha1.RedisMasterSet, members []v1alpha1.MemberStatus) managed.Others {
	var o managed.Others
	for _, m := range members {
		if isOther(ms, m.Address) {
			o.Total++
			if m.State == v1alpha1.MemberServing {
				o.Serving++
			}
		}
	}
	return o
}

// isOther reports whether addr is an external member of the list grants
// are made on.
func isOther(ms *v1alpha1.RedisMasterSet, addr string) bool {
	return ms.Spec.External != nil && slices.Contains(ms.Spec.External.Addresses, addr) && slices.Contains(ms.Status.Addresses, addr)
}
