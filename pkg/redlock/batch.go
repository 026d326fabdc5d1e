package redlock

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxInflight is how many requests or batches a client has in flight to one
// master before further requests queue and go out together. Two leave one
// for a straggler of a client's previous operation and one for its next;
// more spread a loaded client's requests over more connections and make the
// batches smaller (BenchmarkAcquireReleaseParallel took about twice as long
// per operation with 4).
const maxInflight = 2

// batcher sends a master's requests: each at once on its own connection
// while fewer than maxInflight are in flight, as go-redis does; beyond that
// they queue, and when a slot frees, every request queued by then goes out
// in one pipeline (one write, one read, on the client and on the master).
// Under load this saves most system calls; a client with a few requests in
// flight never waits for a slot.
//
// A queued request whose context ends before it is sent is dropped unsent;
// a pipeline's deadline is the earliest of its requests', so no request
// ends later than its own deadline would have ended it. Redis runs a
// pipeline's commands in order, and no request is sent before the request
// that queued it ended, so whatever a request waited for before it was
// handed to process still happens before it.
type batcher struct {
	mu       sync.Mutex
	inflight int     // requests and batches in flight
	queue    []*call // waiting for a slot, in arrival order
	led      int     // queues led, for tests
}

// call is a queued request.
type call struct {
	ctx  context.Context
	cmd  redis.Cmder
	wake chan bool // true: lead the queue; false: answered
}

// process sends cmd to the master and waits for its answer or ctx's end.
func (n *node) process(ctx context.Context, cmd redis.Cmder) {
	b := &n.batch
	b.mu.Lock()
	if b.inflight < maxInflight && len(b.queue) == 0 {
		b.inflight++
		b.mu.Unlock()
		_ = n.rdb.Process(ctx, cmd)
		n.freeSlot()
		return
	}
	c := &call{ctx: ctx, cmd: cmd, wake: make(chan bool, 1)}
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	var lead bool
	select {
	case lead = <-c.wake:
	case <-ctx.Done():
		b.mu.Lock()
		if i := slices.Index(b.queue, c); i >= 0 {
			// Not sent, and now never will be.
			b.queue = slices.Delete(b.queue, i, i+1)
			b.mu.Unlock()
			cmd.SetErr(ctx.Err())
			return
		}
		b.mu.Unlock()
		lead = <-c.wake // taken by a batch, or made its leader
	}
	if lead {
		n.lead(c)
	}
}

// freeSlot ends a request or batch: the first queued request, if any,
// takes over its slot and leads the queue.
func (n *node) freeSlot() {
	b := &n.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.inflight--
		return
	}
	first := b.queue[0]
	b.queue = slices.Delete(b.queue, 0, 1)
	first.wake <- true
}

// lead sends c and every request queued by now as one batch, in the slot
// c was given.
func (n *node) lead(c *call) {
	b := &n.batch
	b.mu.Lock()
	batch := append([]*call{c}, b.queue...)
	b.led++
	clear(b.queue)
	b.queue = b.queue[:0]
	b.mu.Unlock()

	// Requests whose context has ended are not sent; the batch runs on the
	// context with the earliest deadline.
	var ctx context.Context
	var deadline time.Time // zero: none yet
	live := batch[:0]
	for _, q := range batch {
		if err := q.ctx.Err(); err != nil {
			q.cmd.SetErr(err)
			if q != c {
				q.wake <- false
			}
			continue
		}
		if d, ok := q.ctx.Deadline(); ctx == nil || ok && (deadline.IsZero() || d.Before(deadline)) {
			ctx = q.ctx
			if ok {
				deadline = d
			}
		}
		live = append(live, q)
	}
	switch len(live) {
	case 0:
	case 1:
		_ = n.rdb.Process(live[0].ctx, live[0].cmd)
	default:
		pipe := n.rdb.Pipeline()
		for _, q := range live {
			_ = pipe.Process(ctx, q.cmd)
		}
		_, _ = pipe.Exec(ctx)
	}
	for _, q := range live {
		if q != c {
			q.wake <- false
		}
	}
	n.freeSlot()
}
