package distributedlock

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"

	"github.com/redlock-operator/redlock-operator/internal/renewal"
)

// held is a grant this manager renews: what status shows of it, and the
// session that keeps it alive.
type held struct {
	uid       types.UID
	name      types.NamespacedName
	ref       grantRef // the grant in Redis
	masterSet string
	grantID   string
	holder    string
	pod       *v1alpha1.PodReference // the holder pod, when a pod holds it
	// leased: a static holder's grant made or adopted while the lock set
	// spec.holderLease: it ends by the holder's word, not by a change of
	// its request, even if the lease is unset since.
	leased     bool
	token      int64
	acquiredAt time.Time
	quorum     int
	session    *renewal.Session
	// othersCopiesUntil: for an adopted grant, when the copies whoever
	// renewed it before wrote have expired (othersCopiesUntil); zero
	// otherwise.
	othersCopiesUntil time.Time
	// liveness is what this manager saw of the holder pod (liveness.go);
	// only the lock's reconciles touch it.
	liveness liveness

	mu        sync.Mutex
	committed time.Time // the latest validity of this grant that this manager's own write committed
}

// wrote records that a write of this manager committed validity v of h's
// grant (as status shows it, to the microsecond).
func (h *held) wrote(v time.Time) {
	v = v.Truncate(time.Microsecond)
	h.mu.Lock()
	defer h.mu.Unlock()
	if v.After(h.committed) {
		h.committed = v
	}
}

// ownValidity reports whether status's validity v of h's grant is one
// this manager's writes showed, or earlier: not another manager's.
func (h *held) ownValidity(v time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !v.After(h.committed)
}

// sessions is the set of grants this manager renews, by lock UID. Sessions
// run on a context that ends with the manager: stopping the manager stops
// the renewals but releases nothing (the grants are orphaned), so that the
// next leader can adopt them.
type sessions struct {
	base context.Context
	stop context.CancelFunc

	// dropped is called with each grant dropped (optional).
	dropped func(*held)
	// last, when set, is closed once the stopping manager's last status
	// writes are done (the writer's handover): the Sessions renew until
	// then, for those writes to show fresh renewals.
	last <-chan struct{}

	mu        sync.Mutex
	m         map[types.UID]*held
	bySession map[*renewal.Session]*held
}

func newSessions() *sessions {
	ctx, cancel := context.WithCancel(context.Background())
	return &sessions{base: ctx, stop: cancel, m: map[types.UID]*held{}, bySession: map[*renewal.Session]*held{}}
}

// Start implements manager.Runnable: it blocks until the manager stops
// (and its last status writes are done), then orphans every session and
// waits for them.
func (ss *sessions) Start(ctx context.Context) error {
	<-ctx.Done()
	if ss.last != nil {
		<-ss.last
	}
	ss.stop()
	for _, h := range ss.all() {
		h.session.Orphan()
	}
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (ss *sessions) NeedLeaderElection() bool { return true }

func (ss *sessions) get(uid types.UID) *held {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.m[uid]
}

// hold registers h with the Session start returns, called under the lock
// ofSession takes: a report the Session posts at once still finds h.
func (ss *sessions) hold(h *held, start func() *renewal.Session) {
	ss.mu.Lock()
	old := ss.m[h.uid]
	if old == h {
		old = nil
	}
	h.session = start()
	ss.m[h.uid] = h
	ss.bySession[h.session] = h
	if old != nil {
		delete(ss.bySession, old.session)
	}
	ss.mu.Unlock()
	if old != nil {
		// Not reached: a reconcile acquires or adopts only when this
		// manager renews nothing for the lock, and reconciles of one lock
		// run one at a time. Were it reached, the replaced Session stops
		// rather than renew a grant nobody tracks.
		old.session.Orphan()
	}
}

// ofSession returns the grant s renews, while it is registered.
func (ss *sessions) ofSession(s *renewal.Session) *held {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.bySession[s]
}

// drop forgets h (only if it is still the grant registered for its lock).
func (ss *sessions) drop(h *held) {
	ss.mu.Lock()
	if ss.m[h.uid] == h {
		delete(ss.m, h.uid)
	}
	if ss.bySession[h.session] == h {
		delete(ss.bySession, h.session)
	}
	ss.mu.Unlock()
	if ss.dropped != nil {
		ss.dropped(h)
	}
}

// others returns the grants of objects named name other than uid: those of
// a deleted object, or of an earlier object of the same name.
func (ss *sessions) others(name types.NamespacedName, uid types.UID) []*held {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var out []*held
	for u, h := range ss.m {
		if h.name == name && u != uid {
			out = append(out, h)
		}
	}
	return out
}

func (ss *sessions) all() []*held {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make([]*held, 0, len(ss.m))
	for _, h := range ss.m {
		out = append(out, h)
	}
	return out
}
