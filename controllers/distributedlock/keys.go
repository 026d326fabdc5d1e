package distributedlock

import (
	"context"
	"errors"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// keys removes the keys of the grants this manager ends, when decideEnd
// says they may go, and records per lock the last such grant: what a
// deletion, a new grant and the release of a stopping pod's grant wait
// for.
type keys struct {
	grants  *grants.Set
	masters MasterClients
	values  ValueDeriver
	clock   clock.PassiveClock
	// wake asks for a reconcile of a lock whose keys went.
	wake func(types.NamespacedName)

	mu sync.Mutex
	m  map[types.UID]endRecord
}

// endRecord is what keys keeps of one lock object.
type endRecord struct {
	name    types.NamespacedName
	grantID string    // the last grant ended here
	keysAt  time.Time // when its keys may go
	// expiry is when every copy of an incomplete release has expired
	// (zero: none).
	expiry time.Time
	// stop is the last grant hidden because its pod is being deleted,
	// until settleStopped released its keys; another grant's end leaves
	// it.
	stop stopRecord
}

// stopRecord is a grant hidden because its pod is being deleted.
type stopRecord struct {
	grantID string
	pod     types.UID
	settled bool // settleStopped released its keys
}

// update changes the record of lock uid (named name); a record of another
// grant than grantID starts afresh, keeping only its expiry.
func (k *keys) update(uid types.UID, name types.NamespacedName, grantID string, f func(*endRecord)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[types.UID]endRecord{}
	}
	rec := k.m[uid]
	if rec.grantID != grantID {
		rec = endRecord{expiry: rec.expiry, stop: rec.stop, grantID: grantID}
	}
	rec.name = name
	f(&rec)
	k.m[uid] = rec
}

// setStop records stop for lock uid (named name).
func (k *keys) setStop(uid types.UID, name types.NamespacedName, stop stopRecord) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[types.UID]endRecord{}
	}
	rec := k.m[uid]
	rec.name, rec.stop = name, stop
	k.m[uid] = rec
}

func (k *keys) record(uid types.UID) (endRecord, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	rec, ok := k.m[uid]
	return rec, ok
}

// stopping records that h's grant was hidden because its pod is being
// deleted: its keys go once the pod can no longer act on it
// (settleStopped).
func (k *keys) stopping(lock *v1alpha1.DistributedLock, h *grants.Grant) {
	if h.Pod != nil {
		k.setStop(lock.UID, client.ObjectKeyFromObject(lock), stopRecord{grantID: h.ID, pod: h.Pod.UID})
	}
}

// forget forgets lock uid, whose finalizer went.
func (k *keys) forget(uid types.UID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.m, uid)
}

// forgetName forgets every object named name: none exists any more.
func (k *keys) forgetName(name types.NamespacedName) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for uid, rec := range k.m {
		if rec.name == name {
			delete(k.m, uid)
		}
	}
}

// left reports until when the end of the grant status last showed leaves
// its keys (decideEnd); false when nothing is known to be left. held is
// this manager's grant of the lock (nil: none). Without a record of this
// manager's (another manager ended it, or this one before a restart),
// status's lastValidUntil says it.
func (k *keys) left(lock *v1alpha1.DistributedLock, held *grants.Grant) (time.Time, bool) {
	st := lock.Status
	id := grants.GrantIDOf(st)
	if id == "" || st.Holder != nil {
		return time.Time{}, false
	}
	if rec, ok := k.record(lock.UID); ok && rec.grantID == id && !rec.keysAt.IsZero() {
		return rec.keysAt, true
	}
	if held != nil && held.ID == id {
		return time.Time{}, false // still renewed here: its end decides
	}
	ttl := lock.Spec.TTL.Duration
	switch {
	case st.LastValidUntil != nil:
		return st.LastValidUntil.Add(redlock.Drift(ttl)), true
	case st.ReleasedAt != nil:
		// Hidden by a version that did not record the validity shown.
		return st.ReleasedAt.Add(ttl + redlock.Drift(ttl)), true
	}
	return time.Time{}, false
}

// settle carries out what decideEnd says of the keys of grant g, which
// status no longer shows: released now, left until the validity shown
// (shown, or its Session's, h) has passed, or left to expire.
func (k *keys) settle(ctx context.Context, lock *v1alpha1.DistributedLock, h *grants.Grant, g grants.Ref, c *redlock.Client, shown time.Time, cause endCause) error {
	name := client.ObjectKeyFromObject(lock)
	ms := masterSetOf(lock)
	switch decideEnd(cause).keys {
	case keysNow:
		if c == nil && h == nil {
			c = k.masters.Lookup(ms)
		}
		err := k.giveBack(ctx, h, g, c)
		now := k.clock.Now()
		k.update(g.UID, name, g.GrantID, func(r *endRecord) { r.keysAt = now })
		return err
	case keysExpire:
		if h != nil {
			k.grants.Drop(h)
			h.Session.Orphan()
		}
		return nil
	default:
		k.leave(name, ms, h, g, shown)
		return nil
	}
}

// leave stops renewing grant g of lock name (h: its Session here, or nil),
// which status no longer shows, and leaves its keys until any validity a
// reader may have seen of it has passed: shown (the validity status
// showed last) or the Session's own, whichever is later, and the drift
// allowance; then they are removed on master set ms, and the lock looks
// again.
func (k *keys) leave(name, ms types.NamespacedName, h *grants.Grant, g grants.Ref, shown time.Time) time.Time {
	until := shown
	if h != nil {
		k.grants.Drop(h)
		h.Session.Orphan()
		if v := h.Session.State().ValidUntil; v.After(until) {
			until = v
		}
	}
	at := until.Add(redlock.Drift(g.TTL))
	k.update(g.UID, name, g.GrantID, func(r *endRecord) { r.keysAt = at })
	time.AfterFunc(time.Until(at), func() {
		octx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		_ = k.release(octx, g, k.masters.Lookup(ms)) // what is left expires with the TTL anyway
		k.wake(name)                                 // the next grant need not wait for a retry
	})
	return until
}

// giveBack releases a grant in Redis: through its Session when this
// manager renews it (h), otherwise from its grant ID on client c. When the
// release does not complete, the instant every copy has expired is
// remembered for a deletion waiting on it.
func (k *keys) giveBack(ctx context.Context, h *grants.Grant, g grants.Ref, c *redlock.Client) error {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if h == nil {
		return k.release(octx, g, c)
	}
	k.grants.Drop(h)
	err := h.Session.Release(octx)
	if err != nil && !errors.Is(err, redlock.ErrNotHeld) {
		// Not the validity: a renewal that failed may still have reached
		// some masters, and its copies outlive the validity. Read once the
		// Session stopped, so that a renewal in flight counts.
		if expiry := h.Session.State().ExpiresBy; !expiry.IsZero() {
			k.expires(g.UID, h.Name, expiry)
		}
	}
	return err
}

// expires records that every copy of an incomplete release of lock uid's
// (named name) grant has expired by t.
func (k *keys) expires(uid types.UID, name types.NamespacedName, t time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[types.UID]endRecord{}
	}
	rec := k.m[uid]
	rec.name = name
	if t.After(rec.expiry) {
		rec.expiry = t
	}
	k.m[uid] = rec
}

// release releases the grant g on client c.
func (k *keys) release(ctx context.Context, g grants.Ref, c *redlock.Client) error {
	switch {
	case g.GrantID == "":
		return redlock.ErrNotHeld
	case c == nil:
		return redlock.ErrQuorumUnavailable
	}
	lk, err := c.Restore(g.Key, k.values.Value(string(g.UID), g.GrantID), g.TTL, time.Time{}, restoreOptions(g.Slot, 0)...)
	if err != nil {
		return err
	}
	return lk.Release(ctx)
}
