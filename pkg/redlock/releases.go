package redlock

import (
	"context"
	"sync"
)

// releases tracks this client's releases that may still be running, per
// key, so that a new SET of a key to a master is sent only after every
// earlier release of that key to that master has ended. Without it a SET
// could overtake the client's own release and find its old value.
type releases struct {
	mu sync.Mutex
	m  map[string]*inflight
}

// inflight is one release: done[i] is closed when its request to master i
// has ended. prev is the release of the same key registered before it.
type inflight struct {
	done  []chan struct{}
	prev  *inflight // immutable
	ended bool      // guarded by releases.mu
}

// add registers a release of key whose per-master requests end with done.
func (r *releases) add(key string, done []chan struct{}) *inflight {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]*inflight{}
	}
	e := &inflight{done: done, prev: r.m[key]}
	r.m[key] = e
	return e
}

// end marks e as ended and forgets the ended releases at the head of key's
// chain.
func (r *releases) end(key string, e *inflight) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e.ended = true
	h := r.m[key]
	for h != nil && h.ended {
		h = h.prev
	}
	if h == nil {
		delete(r.m, key)
	} else {
		r.m[key] = h
	}
}

// latest returns the newest release of key that may still be running.
func (r *releases) latest(key string) *inflight {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[key]
}

// wait blocks until every release in the chain has ended on master i, or ctx
// ends. A nil chain returns at once.
func (e *inflight) wait(ctx context.Context, i int) error {
	for ; e != nil; e = e.prev {
		select {
		case <-e.done[i]:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
