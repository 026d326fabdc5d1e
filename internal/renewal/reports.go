package renewal

import "sync"

// Reports is how Sessions tell their owner what happened, in the manner of
// a lease keep-alive's response channel: a Session posts itself after each
// renewal, and once when it ended by itself (the grant was lost). Ready
// receives a value while posts wait; Take returns them in the order they
// were first posted, each Session once however often it posted since the
// last Take. A Session never blocks on its owner and no post is lost: a
// plain buffered channel would have to do one or the other, and a refresh
// waiting for a renewal, or a loss nobody hears of, must not depend on the
// buffer's size. Its methods are safe for concurrent use; a nil *Reports
// takes no posts.
type Reports struct {
	mu      sync.Mutex
	pending []*Session
	posted  map[*Session]struct{}
	ready   chan struct{}
}

// NewReports returns an empty Reports.
func NewReports() *Reports {
	return &Reports{posted: map[*Session]struct{}{}, ready: make(chan struct{}, 1)}
}

// Ready receives a value when posts wait to be taken.
func (r *Reports) Ready() <-chan struct{} { return r.ready }

// Take returns the Sessions posted since the last Take, each once.
func (r *Reports) Take() []*Session {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.pending
	r.pending = nil
	clear(r.posted)
	return out
}

// post records that s has something to report, without blocking.
func (r *Reports) post(s *Session) {
	if r == nil {
		return
	}
	r.mu.Lock()
	if _, ok := r.posted[s]; !ok {
		r.posted[s] = struct{}{}
		r.pending = append(r.pending, s)
	}
	r.mu.Unlock()
	select {
	case r.ready <- struct{}{}:
	default: // signalled already
	}
}
