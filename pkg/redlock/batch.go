package redlock

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxInflight is how many requests or batches a client has in flight to one
// master before further requests queue and go out together. Stragglers of
// operations that have already decided do not count (round.detach), so a
// sequential client never queues; more slots spread a loaded client's
// requests over more connections and make the batches smaller
// (BenchmarkAcquireReleaseParallel took about 1.5 times as long per
// operation with 3, twice as long with 4).
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
	detached int     // requests in flight whose slot was given back early
	queue    []*call // waiting for a slot, in arrival order
	led      int     // queues led, for tests
}

// call is a queued request.
type call struct {
	ctx  context.Context
	cmd  redis.Cmder
	wake chan bool // true: lead the queue; false: answered
}

// Slot states of a round's request to one master (round.slots): a request
// sent on its own connection holds one of the master's slots until it ends,
// or until its round has decided without it (round.detach), whichever comes
// first. A straggler of a decided operation then no longer makes the
// client's next operation queue behind it.
const (
	slotNone     int32 = iota // no slot held
	slotHeld                  // the request holds a slot
	slotFreed                 // the request ended and gave its slot back
	slotDetached              // the round decided first and gave the slot back
)

// maxDetached bounds the detached stragglers of a master: beyond it (a
// master that stopped answering), stragglers keep their slots, and further
// requests queue and go out together rather than each opening a
// connection to a master that does not answer. A master thus has at most
// maxInflight + maxDetached requests or batches in flight.
const maxDetached = maxInflight

// roundKey is the context key under which a round's requests carry it.
type roundKey struct{}

// slotOf returns the slot word of ctx's round for master n, marked held,
// or nil when the request is not a round's, or when another request of the
// round to n holds the word (such a request frees its own slot when it
// ends). A round's request may send more than once to its master (EVALSHA,
// then EVAL after NOSCRIPT), one after the other.
func (n *node) slotOf(ctx context.Context) *atomic.Int32 {
	r, _ := ctx.Value(roundKey{}).(*round)
	if r == nil {
		return nil
	}
	i := slices.Index(r.c.nodes, n)
	if i < 0 {
		return nil
	}
	s := &r.slots[i]
	for {
		old := s.Load()
		if old == slotHeld || old == slotDetached {
			return nil
		}
		if s.CompareAndSwap(old, slotHeld) {
			return s
		}
	}
}

// process sends cmd to the master and waits for its answer or ctx's end.
func (n *node) process(ctx context.Context, cmd redis.Cmder) {
	b := &n.batch
	b.mu.Lock()
	if b.inflight < maxInflight && len(b.queue) == 0 {
		b.inflight++
		b.mu.Unlock()
		slot := n.slotOf(ctx)
		_ = n.rdb.Process(ctx, cmd)
		if slot == nil || slot.CompareAndSwap(slotHeld, slotFreed) {
			n.freeSlot()
		} else { // detached: its slot was given back already
			b.mu.Lock()
			b.detached--
			b.mu.Unlock()
		}
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
		// The batch runs on its own goroutine, which owns the slot; c
		// returns as soon as its own request ended, like every other
		// request of the batch, not when the whole batch has.
		go n.lead(c)
		<-c.wake
	}
}

// detach gives back the slot of a request whose round has decided, while
// fewer than maxDetached requests to this master are detached.
func (n *node) detach(slot *atomic.Int32) {
	b := &n.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.detached >= maxDetached || !slot.CompareAndSwap(slotHeld, slotDetached) {
		return
	}
	b.detached++
	b.freeSlotLocked()
}

// freeSlot ends a request or batch: the first queued request, if any,
// takes over its slot and leads the queue.
func (n *node) freeSlot() {
	b := &n.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	b.freeSlotLocked()
}

func (b *batcher) freeSlotLocked() {
	if len(b.queue) == 0 {
		b.inflight--
		return
	}
	first := b.queue[0]
	b.queue = slices.Delete(b.queue, 0, 1)
	first.wake <- true
}

// lead sends c and every request queued by now as one batch, in the slot
// c was given, and tells each request (c included) through its wake
// channel as soon as that request has ended.
func (n *node) lead(c *call) {
	b := &n.batch
	b.mu.Lock()
	batch := append([]*call{c}, b.queue...)
	b.led++
	clear(b.queue)
	b.queue = b.queue[:0]
	b.mu.Unlock()

	// Requests whose context has ended are not sent. A pipeline runs on the
	// earliest deadline of its requests, so a request that waited long
	// would cut the time of the fresh ones: requests with less than half the
	// time left of the freshest go out on their own connections instead,
	// each with its own deadline, as without batching.
	now := time.Now()
	var most time.Duration // the longest time left
	live := batch[:0]
	for _, q := range batch {
		if err := q.ctx.Err(); err != nil {
			q.cmd.SetErr(err)
			q.wake <- false
			continue
		}
		most = max(most, timeLeft(q.ctx, now))
		live = append(live, q)
	}
	var alone sync.WaitGroup // requests sent on their own connections
	var ctx context.Context  // the pipeline's: its earliest deadline
	var left time.Duration
	fresh := live[:0]
	for _, q := range live {
		l := timeLeft(q.ctx, now)
		if l < most/2 {
			alone.Go(func() {
				_ = n.rdb.Process(q.ctx, q.cmd)
				q.wake <- false
			})
			continue
		}
		if ctx == nil || l < left {
			ctx, left = q.ctx, l
		}
		fresh = append(fresh, q)
	}
	switch len(fresh) {
	case 0:
	case 1:
		_ = n.rdb.Process(fresh[0].ctx, fresh[0].cmd)
	default:
		pipe := n.rdb.Pipeline()
		for _, q := range fresh {
			_ = pipe.Process(ctx, q.cmd)
		}
		_, _ = pipe.Exec(ctx)
	}
	for _, q := range fresh {
		q.wake <- false
	}
	alone.Wait() // they count against the slot until they ended
	n.freeSlot()
}

// timeLeft is how long ctx has until its deadline (a day when it has none).
func timeLeft(ctx context.Context, now time.Time) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return d.Sub(now)
	}
	return 24 * time.Hour
}
