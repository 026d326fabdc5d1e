package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// sendFunc sends one request to master i and classifies its answer.
type sendFunc func(ctx context.Context, i int, n *node) (Outcome, error)

// round is one request sent to every master concurrently. Each master's
// request runs on its own goroutine (a kept one: see workers) under the
// round's deadline, on a context the caller's cancellation does not reach,
// so that every request ends by answering or timing out and clean-up can be
// ordered after it. A request may share a pipeline with other operations'
// requests to the same master (see batcher); it still ends by its deadline.
type round struct {
	c     *Client
	votes []Vote          // votes[i] is written before done[i] is closed
	done  []chan struct{} // closed when master i answered or timed out
	order chan int        // indices in the order the answers arrived
	start time.Time

	ctx      context.Context    // the requests' context: one deadline for all
	cancel   context.CancelFunc // ends the requests' shared deadline
	send     sendFunc
	voting   bool
	allEnded func(*round)
	running  atomic.Int32   // requests not yet ended
	slots    []atomic.Int32 // slots[i]: the batcher slot state of master i's request
	inflight *inflight      // set by Release: its entry in Client.releases
	// answered[i] is master i's own answer, before a quarantine or a
	// duplicate address turned it into no vote; set before done[i] closes.
	answered []Outcome
}

// startVotingRound sends to every master for an operation that counts votes
// towards a quorum (acquire, extend, the fencing write-back): the answer of a
// quarantined master, or of a second address of one server, is no vote. The
// caller must call finish once it has decided, after starting any clean-up.
func (c *Client) startVotingRound(ctx context.Context, timeout time.Duration, send sendFunc) (*round, error) {
	return c.startRound(ctx, timeout, true, send, nil)
}

// startReleaseRound sends a release to every master. Every answer counts:
// deleting this lock's own value is right on any server. allEnded runs once
// every request has ended. The caller must call finish once it has decided.
func (c *Client) startReleaseRound(ctx context.Context, timeout time.Duration, send sendFunc, allEnded func(*round)) (*round, error) {
	return c.startRound(ctx, timeout, false, send, allEnded)
}

// startRound sends to every master; use startVotingRound or
// startReleaseRound.
func (c *Client) startRound(ctx context.Context, timeout time.Duration, voting bool, send sendFunc, allEnded func(*round)) (*round, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return nil, ErrClosed
	}
	n := len(c.nodes)
	r := &round{
		c:        c,
		votes:    make([]Vote, n),
		answered: make([]Outcome, n),
		done:     make([]chan struct{}, n),
		slots:    make([]atomic.Int32, n),
		order:    make(chan int, n),
		start:    time.Now(),
		send:     send,
		voting:   voting,
		allEnded: allEnded,
	}
	// One extra count, held until finish, lets clean-ups join the group
	// while Close may already be waiting.
	c.bg.Add(n + 1)
	// One deadline for all requests of the round (they start together), on
	// a context the caller's cancellation does not reach; the last request
	// to end releases its timer.
	r.ctx, r.cancel = context.WithDeadline(context.WithoutCancel(ctx), r.start.Add(timeout))
	r.ctx = context.WithValue(r.ctx, roundKey{}, r)
	r.running.Store(int32(n)) //nolint:gosec // a handful of masters
	for i := range n {
		r.done[i] = make(chan struct{})
	}
	for i := range n {
		c.workers.run(task{r, i})
	}
	return r, nil
}

// run sends the round's request to master i and delivers its vote.
func (r *round) run(i int) {
	c, n := r.c, r.c.nodes[i]
	defer c.bg.Done()
	t0 := time.Now()
	out, err := r.send(r.ctx, i, n)
	last := r.running.Add(-1) == 0
	if last {
		r.cancel()
	}
	v := Vote{Addr: n.addr, Outcome: out, Err: err, Latency: time.Since(t0)}
	r.answered[i] = out
	if r.voting {
		// Checked after the answer: the answer may have come on a new
		// connection that just found the master restarted.
		if q, until := n.quarantined(); q {
			v.Outcome, v.Err = OutcomeQuarantined, &QuarantinedError{Addr: n.addr, Until: until}
		}
		if other := n.duplicate(); other != "" {
			v.Outcome, v.Err = OutcomeError, fmt.Errorf("master %s is the same server as %s: its vote does not count", n.addr, other)
		}
	}
	r.votes[i] = v
	close(r.done[i])
	r.order <- i
	if last && r.allEnded != nil {
		r.allEnded(r)
	}
}

// errNoQuorum is the outcome of a voting round that did not reach a quorum;
// the caller names the reason from the tally. It never leaves the package.
var errNoQuorum = errors.New("no quorum")

// verdict is the decided outcome of a voting round.
type verdict struct {
	votes     []Vote // snapshot at the decision: OutcomePending for stragglers
	tally     Tally
	lists     []Tally   // the tally of each of the client's lists
	ctxErr    error     // the caller's context ended first
	decidedAt time.Time // when the outcome was known
}

// quorumRound is the path every voting operation takes: send to every master
// at once, return as soon as a quorum granted, a quorum is out of reach, or
// ctx ended. The caller must call finish on the round after starting any
// clean-up.
func (c *Client) quorumRound(ctx context.Context, timeout time.Duration, send sendFunc) (*round, verdict, error) {
	r, err := c.startVotingRound(ctx, timeout, send)
	if err != nil {
		return nil, verdict{}, err
	}
	votes, ctxErr := r.collect(ctx, func(lists []Tally, _ []bool) bool { return c.decidedForQuorum(lists) })
	return r, verdict{votes: votes, tally: Count(votes), lists: c.tallies(votes), ctxErr: ctxErr, decidedAt: time.Now()}, nil
}

// result classifies the verdict against the end of the validity the round
// was for: nil when a quorum (of every list) granted before validUntil,
// ErrCancelled when the context ended first, ErrExpired when the quorum came
// too late, errNoQuorum otherwise.
func (v verdict) result(c *Client, validUntil time.Time) error {
	switch {
	case v.ctxErr != nil:
		return ErrCancelled
	case c.granted(v.lists) && v.decidedAt.Before(validUntil):
		return nil
	case c.granted(v.lists):
		return ErrExpired
	default:
		return errNoQuorum
	}
}

// collect waits until decided, given the tally of each of the client's
// lists and which masters answered, reports a known outcome, every master
// has answered, or ctx ends. It
// returns a snapshot of the votes with OutcomePending for masters that had
// not answered, and ctx's error if ctx ended first.
func (r *round) collect(ctx context.Context, decided func(lists []Tally, answered []bool) bool) ([]Vote, error) {
	answered := make([]bool, len(r.votes))
	ts := make([]Tally, len(r.c.lists))
	var ctxErr error
	for got := 0; got < len(r.votes); got++ {
		if decided(ts, answered) {
			break
		}
		select {
		case i := <-r.order:
			answered[i] = true
			for g := range ts {
				if r.c.nodes[i].inList(g) {
					ts[g] = tallyAdd(ts[g], r.votes[i].Outcome)
				}
			}
			continue
		case <-ctx.Done():
			ctxErr = ctx.Err()
		}
		break
	}
	r.detach()
	snap := make([]Vote, len(r.votes))
	for i := range r.votes {
		if answered[i] {
			snap[i] = r.votes[i]
		} else {
			snap[i] = Vote{Addr: r.c.nodes[i].addr, Outcome: OutcomePending}
		}
	}
	return snap, ctxErr
}

// detach gives back the batcher slots the round's requests still hold: the
// round has decided, and its stragglers must not make the client's next
// requests to their masters queue (up to maxDetached per master). They
// still end by the round's deadline.
func (r *round) detach() {
	for i := range r.slots {
		if r.slots[i].Load() == slotHeld {
			r.c.nodes[i].detach(&r.slots[i])
		}
	}
}

// releaseAll sends rel (a releaseCall) to every master once that master's
// request in this round has answered or timed out, on a context the caller
// cannot cancel. It returns one channel per master, closed when its release
// ended.
func (r *round) releaseAll(rel scriptCall, timeout time.Duration) []chan struct{} {
	released := make([]chan struct{}, len(r.votes))
	r.c.bg.Add(len(r.votes))
	for i, n := range r.c.nodes {
		released[i] = make(chan struct{})
		go func() {
			defer r.c.bg.Done()
			defer close(released[i])
			<-r.done[i]
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			_, _ = n.run(ctx, rel) // best effort: the TTL bounds what is left
		}()
	}
	return released
}

// abandon removes the attempt's value of key from every master (rel, a
// releaseCall), each after its request in this round ended (releaseAll),
// and registers the clean-up so that this client's
// next acquisition of key is ordered after it. With waitAnswered it returns
// once the masters that had answered in votes are clean — they are fast, and
// a retry (this client's or another's) then finds them clean; stragglers are
// cleaned in the background either way.
func (r *round) abandon(key string, rel scriptCall, timeout time.Duration, votes []Vote, waitAnswered bool) {
	released := r.releaseAll(rel, timeout)
	cleanup := r.c.releases.add(key, released)
	r.c.bg.Go(func() {
		for _, d := range released {
			<-d
		}
		r.c.releases.end(key, cleanup)
	})
	if !waitAnswered {
		return
	}
	for i, v := range votes {
		if v.Outcome != OutcomePending {
			<-released[i]
		}
	}
}

// finish drops the round's hold on the client's wait group.
func (r *round) finish() { r.c.bg.Done() }

func tallyAdd(t Tally, o Outcome) Tally {
	switch o {
	case OutcomeGranted:
		t.Granted++
	case OutcomeHeld:
		t.Held++
	case OutcomeAbsent:
		t.Absent++
	case OutcomeError:
		t.Error++
	case OutcomeQuarantined:
		t.Quarantined++
	default:
		t.Pending++
	}
	return t
}

// QuarantinedError is the error of a vote from a master that restarted within
// the quarantine window.
type QuarantinedError struct {
	Addr  string
	Until time.Time
}

// Error describes the quarantine.
func (e *QuarantinedError) Error() string {
	return "master " + e.Addr + " restarted recently: quarantined until " + e.Until.Format(time.RFC3339Nano)
}
