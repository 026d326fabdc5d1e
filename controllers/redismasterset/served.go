package redismasterset

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// servedBy is when this process last saw each member of one set (by
// address) serving, on its own clock.
type servedBy struct {
	uid types.UID
	at  map[string]time.Time
}

// recordServing remembers, for each member now serving, that this process
// saw it serving at now: the lastServingAt it is about to write.
func (r *Reconciler) recordServing(ms *v1alpha1.RedisMasterSet, members []v1alpha1.MemberStatus, now time.Time) {
	rec := servedBy{uid: ms.UID, at: map[string]time.Time{}}
	if v, ok := r.served.Load(client.ObjectKeyFromObject(ms)); ok && v.(servedBy).uid == ms.UID {
		for a, t := range v.(servedBy).at {
			rec.at[a] = t
		}
	}
	for _, m := range members {
		if m.State == v1alpha1.MemberServing {
			rec.at[m.Address] = now
		}
	}
	r.served.Store(client.ObjectKeyFromObject(ms), rec)
}

// ownServing is when this process last saw member m serving, on its own
// clock, if status records that very observation; nil when status holds
// another process's (an earlier leader's, stamped on another node's clock,
// which this process does not compare with its own) or none. Status keeps
// whole seconds, and another process may have written a later observation
// within the same second: the instant returned is a second later than this
// process's own.
func (r *Reconciler) ownServing(ms *v1alpha1.RedisMasterSet, m *v1alpha1.MemberStatus) *time.Time {
	if m == nil || m.LastServingAt == nil {
		return nil
	}
	v, ok := r.served.Load(client.ObjectKeyFromObject(ms))
	if !ok || v.(servedBy).uid != ms.UID {
		return nil
	}
	t, ok := v.(servedBy).at[m.Address]
	if !ok || !m.LastServingAt.Truncate(time.Second).Equal(t.Truncate(time.Second)) {
		return nil
	}
	t = t.Add(time.Second)
	return &t
}
