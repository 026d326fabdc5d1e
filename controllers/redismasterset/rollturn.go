package redismasterset

import (
	"context"
	"errors"
	"fmt"

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

// inTurn reports whether the rolling update's next replacement may go now
// as far as the other clusters running members of the set are concerned: a
// voting member goes only in this cluster's turn, taken here; while
// nothing goes, a turn taken stays (a member replaced last may not vote
// yet), and a finished roll gives it back.
func (r *Reconciler) inTurn(ctx context.Context, ms *v1alpha1.RedisMasterSet, key types.NamespacedName, next managed.Replacement, others managed.Others) (bool, error) {
	switch {
	case next.Name == "" && next.Wait == managed.UpToDate:
		r.endRollTurn(ctx, key)
		return false, nil
	case next.Name == "":
		_, err := r.rollTurn(ctx, ms, false)
		return false, err
	case !next.Voting || others.Total == 0:
		return true, nil
	}
	turn, err := r.rollTurn(ctx, ms, true)
	if err == nil && !turn {
		log.FromContext(ctx).V(1).Info("rolling update waits", "reason", "another cluster replaces a member of a set on these masters ("+RollKey+" is held)")
	}
	return turn, err
}

// rollTurn (sets with external members) keeps this cluster's turn to
// replace a voting member, renewing it for maxLockTTL, or with take, takes
// it when it has none; it reports whether it holds it. Held elsewhere:
// another cluster replaces one of the set's members; wait. A turn ends
// when the roll does (endRollTurn) or, should this process stop, when its
// TTL passes.
func (r *Reconciler) rollTurn(ctx context.Context, ms *v1alpha1.RedisMasterSet, take bool) (bool, error) {
	key := types.NamespacedName{Namespace: ms.Namespace, Name: ms.Name}
	if v, ok := r.rollTurns.Load(key); ok {
		lk := v.(*redlock.Lock)
		if err := lk.Extend(ctx); err == nil {
			return true, nil
		}
		r.rollTurns.Delete(key) // lapsed: take it again below, or wait
	}
	if !take {
		return false, nil
	}
	c, err := r.Masters.Refresh(ctx, ms)
	if err != nil {
		return false, err
	}
	lk, err := c.Acquire(ctx, RollKey, ms.Spec.MaxLockTTL.Duration)
	switch {
	case errors.Is(err, redlock.ErrLockHeld):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("take the turn to replace a member: %w", err)
	}
	r.rollTurns.Store(key, lk)
	return true, nil
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
