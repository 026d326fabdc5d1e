package grants

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/internal/renewal"
)

// sessions is the set of grants this manager renews, by lock UID. Sessions
// run on a context that ends with the manager: stopping the manager stops
// the renewals but releases nothing (the grants are orphaned), so that the
// next leader can adopt them.
type sessions struct {
	base context.Context
	stop context.CancelFunc

	mu        sync.Mutex
	m         map[types.UID]*Grant
	bySession map[*renewal.Session]*Grant
}

func newSessions() *sessions {
	ctx, cancel := context.WithCancel(context.Background())
	return &sessions{base: ctx, stop: cancel, m: map[types.UID]*Grant{}, bySession: map[*renewal.Session]*Grant{}}
}

// orphanAll stops every Session without releasing its grant.
func (ss *sessions) orphanAll() {
	ss.stop()
	for _, h := range ss.all() {
		h.Session.Orphan()
	}
}

func (ss *sessions) get(uid types.UID) *Grant {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.m[uid]
}

// hold registers h with the Session start returns, called under the lock
// ofSession takes: a report the Session posts at once still finds h.
func (ss *sessions) hold(h *Grant, start func() *renewal.Session) {
	ss.mu.Lock()
	old := ss.m[h.UID]
	if old == h {
		old = nil
	}
	h.Session = start()
	ss.m[h.UID] = h
	ss.bySession[h.Session] = h
	if old != nil {
		delete(ss.bySession, old.Session)
	}
	ss.mu.Unlock()
	if old != nil {
		// Not reached: a reconcile acquires or adopts only when this
		// manager renews nothing for the lock, and reconciles of one lock
		// run one at a time. Were it reached, the replaced Session stops
		// rather than renew a grant nobody tracks.
		old.Session.Orphan()
	}
}

// ofSession returns the grant s renews, while it is registered.
func (ss *sessions) ofSession(s *renewal.Session) *Grant {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.bySession[s]
}

// drop forgets h (only if it is still the grant registered for its lock).
func (ss *sessions) drop(h *Grant) {
	ss.mu.Lock()
	if ss.m[h.UID] == h {
		delete(ss.m, h.UID)
	}
	if ss.bySession[h.Session] == h {
		delete(ss.bySession, h.Session)
	}
	ss.mu.Unlock()
}

// others returns the grants of objects named name other than uid: those of
// a deleted object, or of an earlier object of the same name.
func (ss *sessions) others(name types.NamespacedName, uid types.UID) []*Grant {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var out []*Grant
	for u, h := range ss.m {
		if h.Name == name && u != uid {
			out = append(out, h)
		}
	}
	return out
}

func (ss *sessions) all() []*Grant {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make([]*Grant, 0, len(ss.m))
	for _, h := range ss.m {
		out = append(out, h)
	}
	return out
}
