package controllers

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// heldLock is a lock this manager holds in Redis and renews.
type heldLock struct {
	uid       types.UID
	name      types.NamespacedName
	masterSet types.NamespacedName
	key       string
	value     string
	holder    string
	token     int64

	mu         sync.Mutex
	ttl        time.Duration
	renew      time.Duration
	acquiredAt time.Time
	renewedAt  time.Time
	validUntil time.Time
	votes      []redlock.Vote
	quorum     int

	cancel context.CancelFunc
	done   chan struct{}
}

// snapshot is a consistent copy of a heldLock's changing fields.
type snapshot struct {
	holder                            string
	token                             int64
	acquiredAt, renewedAt, validUntil time.Time
	votes                             []redlock.Vote
	quorum                            int
}

func (h *heldLock) snapshot() snapshot {
	h.mu.Lock()
	defer h.mu.Unlock()
	return snapshot{h.holder, h.token, h.acquiredAt, h.renewedAt, h.validUntil, h.votes, h.quorum}
}

// setTiming follows spec changes of ttl and renewInterval; the next renewal
// uses them.
func (h *heldLock) setTiming(ttl, renew time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ttl, h.renew = ttl, renew
}

func (h *heldLock) timing() (ttl, renew time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ttl, h.renew
}

func (h *heldLock) renewed(at, validUntil time.Time, votes []redlock.Vote) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.renewedAt, h.validUntil, h.votes = at, validUntil, votes
}

// holdings is the set of locks this manager renews, by UID. Renewers run
// on a context that ends with the manager: stopping the manager stops the
// renewals but releases nothing, so that the next leader can adopt the locks.
type holdings struct {
	base context.Context
	stop context.CancelFunc

	mu sync.Mutex
	m  map[types.UID]*heldLock
	wg sync.WaitGroup
}

func newHoldings() *holdings {
	ctx, cancel := context.WithCancel(context.Background())
	return &holdings{base: ctx, stop: cancel, m: map[types.UID]*heldLock{}}
}

// Start implements manager.Runnable: it blocks until the manager stops, then
// stops every renewer.
func (hs *holdings) Start(ctx context.Context) error {
	<-ctx.Done()
	hs.stop()
	hs.wg.Wait()
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (hs *holdings) NeedLeaderElection() bool { return true }

func (hs *holdings) get(uid types.UID) *heldLock {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.m[uid]
}

func (hs *holdings) count() int {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return len(hs.m)
}

// add registers h and runs renew for it until it returns or h is removed.
func (hs *holdings) add(h *heldLock, renew func(ctx context.Context, h *heldLock)) {
	ctx, cancel := context.WithCancel(hs.base)
	h.cancel, h.done = cancel, make(chan struct{})
	hs.mu.Lock()
	hs.m[h.uid] = h
	hs.mu.Unlock()
	hs.wg.Go(func() {
		defer close(h.done)
		renew(ctx, h)
	})
}

// remove stops h's renewer, waits for it, and forgets h. It returns the
// removed lock, or nil.
func (hs *holdings) remove(uid types.UID) *heldLock {
	hs.mu.Lock()
	h := hs.m[uid]
	delete(hs.m, uid)
	hs.mu.Unlock()
	if h != nil {
		h.cancel()
		<-h.done
	}
	return h
}

// forget drops h without waiting for its renewer (called by the renewer
// itself when the lock is lost).
func (hs *holdings) forget(h *heldLock) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.m[h.uid] == h {
		delete(hs.m, h.uid)
	}
}
