package redlock

import (
	"context"
	crand "crypto/rand"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// Lock is a lock acquired (or restored) by a Client. Its methods are safe
// for concurrent use; Extend and Release on one Lock are serialised.
type Lock struct {
	c     *Client
	key   string
	value string
	ttl   time.Duration
	token int64 // fencing token; 0 without WithFencing and when restored
	slot  *Slot // the semaphore slot this lock is; nil for a plain lock

	// acquired[i] is closed once the acquisition's SET to master i has
	// answered or timed out: later requests to master i wait for it, so a
	// straggling SET cannot land after the release (nil for restored locks).
	acquired []chan struct{}

	mu sync.Mutex
	// restoring[i] is closed once the latest restore of the value on master
	// i (see restore) has answered or timed out; nil where none was sent.
	// Later requests to master i wait for it, as for acquired.
	restoring  []chan struct{}
	validUntil time.Time // zero once released or known lost
	// sentAt is when the latest acquisition or extension round this Lock
	// sent started (its restores follow within a node timeout); for a
	// restored lock, when the round that gave its validity started at the
	// latest. Zero: nothing known (see ExpiresBy).
	sentAt     time.Time
	extensions int
	votes      []Vote // of the latest successful acquisition or extension
}

// Votes returns the masters' votes on the latest successful acquisition or
// extension (OutcomePending for masters that had not answered by then).
func (l *Lock) Votes() []Vote {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Vote(nil), l.votes...)
}

// inflight returns, under l.mu, what a round's request to each master waits
// for first (see after).
func (l *Lock) inflight() (acquired, restoring []chan struct{}) {
	return l.acquired, append([]chan struct{}(nil), l.restoring...)
}

// after waits until the acquisition's request to master i, and the latest
// restore sent to it, have ended.
func after(ctx context.Context, i int, acquired, restoring []chan struct{}) error {
	for _, chans := range [][]chan struct{}{acquired, restoring} {
		if i >= len(chans) || chans[i] == nil {
			continue
		}
		select {
		case <-chans[i]:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// restore puts the lock's value back, for its TTL, on the masters that
// answered a successful extension round r with "no key" — restarted without
// their data, quarantined or not — so that restarting every master in turn
// (a rolling update) does not wear the lock away one copy at a time; a
// restored copy counts from the next extension. It runs only once a quorum
// has confirmed the lock held, in the background, for each master once its
// request in r has ended (SET NX: it never overwrites another value); later
// requests to a master wait for it. Called with l.mu held, before r.finish.
func (l *Lock) restore(r *round, ttlMillis int64, timeout time.Duration) {
	put := l.putBack(ttlMillis)
	var fence []any
	if l.token > 0 {
		fence = raiseFenceArgs(l.key, l.token)
	}
	l.restoring = make([]chan struct{}, len(r.done))
	for i, n := range l.c.nodes {
		done := make(chan struct{})
		l.restoring[i] = done
		l.c.bg.Go(func() {
			defer close(done)
			<-r.done[i]
			if r.answered[i] != OutcomeAbsent {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			put(ctx, n) // best effort: the next extension restores again
			if fence != nil {
				// The master lost (or, new to the list, never had) the
				// key's counter too: later grants it votes in must see
				// this lock's token.
				_, _ = n.raiseFence(ctx, fence)
			}
		})
	}
}

// putBack returns what restore sends to a master: the acquisition's SET
// key value NX PX ttl without a token, refused like it while the master
// stores the other kind for the key, or for a semaphore's slot another
// number of slots (see newSetCall, slotSetScript).
func (l *Lock) putBack(ttlMillis int64) func(context.Context, *node) {
	set := newSetCall(l.key, l.slot, l.value, ttlMillis, false)
	return func(ctx context.Context, n *node) { _, _, _ = n.setNX(ctx, set) }
}

// noticeKey is the key whose channel tells of the lock's release: its
// own, or a semaphore's slot's semaphore's, where the withdrawals from the
// semaphore's line are told too, so that a waiter for any of its slots
// hears of each.
func (l *Lock) noticeKey() string {
	if l.slot != nil {
		return l.slot.Semaphore
	}
	return l.key
}

// Key returns the lock's Redis key.
func (l *Lock) Key() string { return l.key }

// Token returns the fencing token of the acquisition: strictly greater than
// the token of every earlier fenced grant of the same key, by any client. It
// is 0 when the lock was acquired without WithFencing, or restored without
// WithToken.
func (l *Lock) Token() int64 { return l.token }

// Value returns the value that identifies this acquisition (random unless
// set with WithValue). Persist it
// with Key, TTL and ValidUntil to extend or release the lock from another
// process (see Client.Restore). Anyone who knows the value can release the
// lock: treat it as a credential.
func (l *Lock) Value() string { return l.value }

// TTL returns the time to live each acquisition or extension asks for.
func (l *Lock) TTL() time.Duration { return l.ttl }

// ValidUntil returns the instant the lock's validity ends (clock drift
// already subtracted). It is the zero time once the lock was released or is
// known lost.
func (l *Lock) ValidUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// ExpiresBy returns an instant by which every copy of the lock that this
// Lock's own requests wrote has expired: the start of the latest
// acquisition or extension it sent (answered or not: an extension that
// failed may still have reached some masters), plus the TTL, two node
// timeouts (a request applied at the end of its timeout, and the restore
// that follows it) and the drift allowance. It assumes what the validity
// assumes too: masters whose clocks run within the drift allowance, and
// requests applied within their node timeout. For a restored lock it
// counts from the round that gave the validity it was restored with (what
// other processes sent is theirs to know). Zero when nothing is known: a
// lock restored without a validity that sent nothing since. It is not
// reset by Release: a release that did not reach a master leaves that
// copy until then.
func (l *Lock) ExpiresBy() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sentAt.IsZero() {
		return time.Time{}
	}
	return l.sentAt.Add(l.ttl + 2*l.c.nodeTimeout(l.ttl) + Drift(l.ttl))
}

// Valid reports whether the lock's validity has not yet passed.
func (l *Lock) Valid() bool {
	return time.Now().Before(l.ValidUntil())
}

// Extensions returns how often the lock has been extended.
func (l *Lock) Extensions() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.extensions
}

// AcquireOption configures one acquisition.
type AcquireOption func(*acquireConfig)

type acquireConfig struct {
	value   string
	fencing bool
}

// WithValue sets the value that identifies this acquisition instead of a
// random one. It must be unique for every acquisition of the key, across all
// clients: a value derived from a secret and a counter (such as a fencing
// token) lets a process that restarts recompute it. Retries of one Acquire
// call reuse it.
func WithValue(v string) AcquireOption {
	return func(c *acquireConfig) { c.value = v }
}

// WithFencing makes the acquisition also take a fencing token (Lock.Token),
// strictly increasing per key across all clients and processes. Every master
// keeps a counter (FenceKey); the SET of a granting master takes
// max(counter + 1, its clock in microseconds) and stores it. The lock's token
// is the largest among the granting masters that answered before the
// decision, and a second round raises the counter on a quorum to it before
// Acquire returns: quorums intersect, so every later grant sees it. When that
// second round fails to reach a quorum within the validity, the acquisition
// fails and is cleaned up like any other failed attempt. Without WithFencing
// an acquisition is one round and leaves the counter alone.
func WithFencing() AcquireOption {
	return func(c *acquireConfig) { c.fencing = true }
}

// Acquire acquires the lock key with the given TTL on a quorum of masters,
// retrying with a random delay up to the configured number of tries. On
// success the lock is valid until Lock.ValidUntil. On failure it returns an
// *Error matching ErrLockHeld, ErrKindConflict (a semaphore of key has
// holders), ErrQuorumUnavailable, ErrExpired or ErrCancelled, and every
// master is cleaned of this attempt's value.
func (c *Client) Acquire(ctx context.Context, key string, ttl time.Duration, opts ...AcquireOption) (*Lock, error) {
	if err := validateKey(OpAcquire, key); err != nil {
		return nil, err
	}
	ac, err := c.prepareAcquire(ttl, opts)
	if err != nil {
		return nil, err
	}
	return c.retry(ctx, key, func(attempt int) (*Lock, error) {
		return c.acquireOnce(ctx, key, nil, ac, ttl, attempt)
	})
}

// prepareAcquire checks an acquisition's TTL and options (its key is
// checked already) and returns its configuration, with a random value
// unless WithValue gave one.
func (c *Client) prepareAcquire(ttl time.Duration, opts []AcquireOption) (acquireConfig, error) {
	var ac acquireConfig
	if err := validateTTL(OpAcquire, ttl); err != nil {
		return ac, err
	}
	if err := c.checkWindow(OpAcquire, ttl); err != nil {
		return ac, err
	}
	for i, o := range opts {
		if o == nil {
			return ac, invalidf(OpAcquire, "acquire option %d is nil", i)
		}
		o(&ac)
	}
	if ac.value == "" {
		ac.value = crand.Text()
	} else if err := validateValue(OpAcquire, ac.value); err != nil {
		return ac, err
	}
	return ac, nil
}

// retry runs attempt (numbered from 1) until it succeeds, fails for good,
// or the configured tries are spent, with a random delay in between; the
// context ending during a delay fails with ErrCancelled and the last
// attempt's votes.
func (c *Client) retry(ctx context.Context, key string, attempt func(int) (*Lock, error)) (*Lock, error) {
	for n := 1; ; n++ {
		l, err := attempt(n)
		if err == nil || n >= c.cfg.tries || !retryable(err) {
			return l, err
		}
		t := time.NewTimer(c.retryDelay())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			var last []Vote // the last attempt's votes
			if e := (*Error)(nil); errors.As(err, &e) {
				last = e.Votes
			}
			return nil, c.opError(OpAcquire, key, ErrCancelled, ctx.Err(), last)
		}
	}
}

func retryable(err error) bool {
	return errors.Is(err, ErrLockHeld) || errors.Is(err, ErrSlotsConflict) || errors.Is(err, ErrKindConflict) ||
		errors.Is(err, ErrQuorumUnavailable) || errors.Is(err, ErrExpired)
}

func (c *Client) retryDelay() time.Duration {
	span := c.cfg.retryMax - c.cfg.retryMin
	if span <= 0 {
		return c.cfg.retryMin
	}
	return c.cfg.retryMin + rand.N(span+1)
}

// decidedForQuorum reports whether a quorum operation's outcome is known:
// a quorum of every list granted, or too many masters of one list refused
// for its quorum to be possible.
func (c *Client) decidedForQuorum(lists []Tally) bool {
	return c.granted(lists) || c.anyList(lists, func(t Tally, size, quorum int) bool {
		return size-(t.Held+t.Absent+t.Error+t.Quarantined) < quorum
	})
}

// failureKind names why a quorum operation failed: unavailability when the
// masters that answered usably could not form a quorum of some list,
// otherwise contention.
func (c *Client) failureKind(lists []Tally, contention error) error {
	if c.unreachable(lists) {
		return ErrQuorumUnavailable
	}
	return contention
}

// acquireOnce makes one attempt at key, a semaphore's slot when slot is
// non-nil.
func (c *Client) acquireOnce(ctx context.Context, key string, slot *Slot, ac acquireConfig, ttl time.Duration, attempt int) (*Lock, error) {
	if err := ctx.Err(); err != nil {
		return nil, c.opError(OpAcquire, key, ErrCancelled, err, nil)
	}
	value := ac.value
	ttlMillis := ttl.Milliseconds()
	timeout := c.nodeTimeout(ttl)
	prior := c.releases.latest(key)
	var tokens []int64 // tokens[i] is written before master i's vote is delivered
	if ac.fencing {
		tokens = make([]int64, len(c.nodes))
	}
	set := newSetCall(key, slot, value, ttlMillis, ac.fencing) // shared by the masters' requests
	r, v, err := c.quorumRound(ctx, timeout, func(ctx context.Context, i int, n *node) (Outcome, error) {
		if err := prior.wait(ctx, i); err != nil {
			return OutcomeError, err
		}
		out, tok, err := n.setNX(ctx, set)
		if tokens != nil {
			tokens[i] = tok
		}
		return out, err
	})
	if err != nil {
		return nil, err
	}
	defer r.finish()
	validUntil := r.start.Add(ttl - Drift(ttl))
	end := v.decidedAt

	var e *Error
	res := v.result(c, validUntil)
	switch {
	case res == nil:
		var token int64
		if tokens != nil {
			// Only votes delivered before the decision are read: their
			// tokens were written before they were delivered.
			for i, vote := range v.votes {
				if vote.Outcome == OutcomeGranted {
					token = max(token, tokens[i])
				}
			}
			if c.cfg.beforeFenceWriteBack != nil {
				c.cfg.beforeFenceWriteBack()
			}
			e = c.raiseFence(ctx, key, token, r.done, timeout, validUntil)
			end = time.Now()
			if e != nil {
				v.ctxErr = e.cause // non-nil only when cancelled
				break
			}
		}
		l := &Lock{c: c, key: key, value: value, ttl: ttl, token: token, slot: slot, validUntil: validUntil, sentAt: r.start, acquired: r.done, votes: v.votes}
		c.cfg.observer.ObserveOp(OpEvent{Op: OpAcquire, Key: key, Attempt: attempt, Latency: end.Sub(r.start), Votes: v.votes})
		return l, nil
	case errors.Is(res, errNoQuorum) && refusedFor[*KindConflictError](c, v.votes):
		e = c.opError(OpAcquire, key, c.failureKind(v.lists, ErrKindConflict), nil, v.votes)
	case errors.Is(res, errNoQuorum) && refusedFor[*SlotsConflictError](c, v.votes):
		e = c.opError(OpAcquire, key, c.failureKind(v.lists, ErrSlotsConflict), nil, v.votes)
	case errors.Is(res, errNoQuorum):
		e = c.opError(OpAcquire, key, c.failureKind(v.lists, ErrLockHeld), nil, v.votes)
	default:
		e = c.opError(OpAcquire, key, res, v.ctxErr, v.votes)
	}

	// Failed: remove our value everywhere, each master after its SET ended.
	r.abandon(key, releaseCall(key, value, slot), timeout, v.votes, v.ctxErr == nil)
	c.cfg.observer.ObserveOp(OpEvent{Op: OpAcquire, Key: key, Attempt: attempt, Latency: end.Sub(r.start), Votes: e.Votes, Err: e})
	return nil, e
}

// raiseFence is the second round of a fenced acquisition: it raises key's
// fencing counter to token on every master, each after the acquisition's
// request to it ended (acquired[i] closed), and succeeds (nil) when a quorum
// did so before validUntil. Masters that grant it later only raise their
// counter further, which is harmless.
func (c *Client) raiseFence(ctx context.Context, key string, token int64, acquired []chan struct{}, timeout time.Duration, validUntil time.Time) *Error {
	const detail = "fencing token write-back"
	args := raiseFenceArgs(key, token)
	r, v, err := c.quorumRound(ctx, timeout, func(ctx context.Context, i int, n *node) (Outcome, error) {
		// Ordered after the SET, so that the counter ends at the larger of
		// the two on every master, stragglers included.
		select {
		case <-acquired[i]:
		case <-ctx.Done():
			return OutcomeError, ctx.Err()
		}
		return n.raiseFence(ctx, args)
	})
	if err != nil {
		// The client was closed between the rounds.
		e := c.opError(OpAcquire, key, err, nil, nil)
		e.detail = detail
		return e
	}
	defer r.finish()
	res := v.result(c, validUntil)
	switch {
	case res == nil:
		return nil
	case errors.Is(res, errNoQuorum):
		res = ErrQuorumUnavailable
	}
	e := c.opError(OpAcquire, key, res, v.ctxErr, v.votes)
	e.detail = detail
	return e
}

// Extend resets the lock's TTL on every master that still holds its value.
// It succeeds only when a quorum extended within the new validity; masters
// that have lost the key do not count, and it refuses a lock whose validity
// has already passed (ErrExpired) or that was released (ErrNotHeld), and a
// TTL that with its drift exceeds the client's quarantine window
// (ErrInvalidArgument). After a successful extension only, the value is put
// back on the masters that answered "no key" (restarted without their
// data), to count from the next extension (see restore): restarting every
// master in turn does not wear the lock away. A failed extension never
// re-creates a key. When a quorum reports the value gone, the lock is
// marked lost. When a quorum extended it only after the new validity had
// passed (ErrExpired), the lock is marked lost too. Either way the copies
// the extension refreshed stay until they expire or the caller calls
// Release: another process may renew the same value (a lock restored
// elsewhere, such as a new operator leader adopting it while this one,
// paused, was extending it), and removing copies under it would free the
// key while its validity stands. An extension never shortens a copy's
// remaining TTL, for the same reason.
func (l *Lock) Extend(ctx context.Context) error {
	return l.observed(l.extend(ctx))
}

// observed reports an operation's event, outside l.mu (the observer may read
// the lock), and returns its error.
func (l *Lock) observed(ev *OpEvent, err error) error {
	if ev != nil {
		l.c.cfg.observer.ObserveOp(*ev)
	}
	return err
}

func (l *Lock) extend(ctx context.Context) (*OpEvent, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.c
	switch {
	case l.validUntil.IsZero():
		return nil, c.opError(OpExtend, l.key, ErrNotHeld, nil, nil)
	case !time.Now().Before(l.validUntil):
		return nil, c.opError(OpExtend, l.key, ErrExpired, nil, nil)
	case c.checkWindow(OpExtend, l.ttl) != nil:
		// Restore checks it too; this guards every path to the masters.
		return nil, c.checkWindow(OpExtend, l.ttl)
	case c.cfg.maxExtensions > 0 && l.extensions >= c.cfg.maxExtensions:
		return nil, c.opError(OpExtend, l.key, ErrExtensionLimit, nil, nil)
	case ctx.Err() != nil:
		return nil, c.opError(OpExtend, l.key, ErrCancelled, ctx.Err(), nil)
	}
	ttlMillis := l.ttl.Milliseconds()
	timeout := c.nodeTimeout(l.ttl)
	ext := extendCall(l.key, l.value, ttlMillis, l.slot)
	acquired, restoring := l.inflight()
	r, v, err := c.quorumRound(ctx, timeout, func(ctx context.Context, i int, n *node) (Outcome, error) {
		if err := after(ctx, i, acquired, restoring); err != nil {
			return OutcomeError, err
		}
		return n.run(ctx, ext)
	})
	if err != nil {
		return nil, err
	}
	defer r.finish()
	// Sent, whatever the answers: a master may apply it and its answer
	// never arrive.
	if r.start.After(l.sentAt) {
		l.sentAt = r.start
	}
	validUntil := r.start.Add(l.ttl - Drift(l.ttl))

	ev := &OpEvent{Op: OpExtend, Key: l.key, Attempt: 1, Latency: v.decidedAt.Sub(r.start), Votes: v.votes}
	var kind error
	switch res := v.result(c, validUntil); {
	case res == nil:
		l.validUntil = validUntil
		l.extensions++
		l.votes = v.votes
		l.restore(r, ttlMillis, timeout)
		return ev, nil
	case errors.Is(res, ErrExpired):
		// Extended, but too late to count: the lock is lost. The copies
		// stay (see Extend): another process may renew the same value.
		kind = ErrExpired
		l.validUntil = time.Time{}
	case errors.Is(res, errNoQuorum) && c.anyList(v.lists, func(t Tally, _, quorum int) bool { return t.Held+t.Absent >= quorum }):
		// A quorum (of some list) says the value is gone: the lock is
		// lost; the minority's copies stay, as above.
		kind = ErrNotHeld
		l.validUntil = time.Time{}
	case errors.Is(res, errNoQuorum):
		// Failures kept the quorum from answering; the old validity stands.
		kind = ErrQuorumUnavailable
	default:
		kind = res
	}
	e := c.opError(OpExtend, l.key, kind, v.ctxErr, v.votes)
	ev.Err = e
	return ev, e
}

// Release deletes the lock's value from every master that holds it, never
// touching another client's value. The lock counts as not held from the
// moment Release is called. Release returns once a quorum has answered;
// requests to slower masters go on in the background (Close waits for them),
// and this client's next acquisition of the same key waits, master by master,
// for them to end, so that it does not find its own released value. It
// returns nil when a quorum confirmed the value gone and at least one of
// them deleted it, an error matching ErrNotHeld when no master held it any
// more, and ErrQuorumUnavailable when too few masters answered (their copies
// expire with the TTL). Cancelling ctx stops the wait, not the requests.
func (l *Lock) Release(ctx context.Context) error {
	return l.observed(l.release(ctx))
}

func (l *Lock) release(ctx context.Context) (*OpEvent, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.validUntil = time.Time{}
	c := l.c
	// The release is registered (r.inflight) once the round has started; the
	// hook that unregisters it when every request has ended waits for that.
	registered := make(chan struct{})
	rel := releaseCall(l.key, l.value, l.slot)
	acquired, restoring := l.inflight()
	r, err := c.startReleaseRound(ctx, c.nodeTimeout(l.ttl), func(ctx context.Context, i int, n *node) (Outcome, error) {
		if err := after(ctx, i, acquired, restoring); err != nil {
			return OutcomeError, err
		}
		out, err := n.run(ctx, rel)
		if out == OutcomeGranted && c.cfg.releaseNotices {
			c.publishRelease(n, l.noticeKey(), releaseID(l.key, l.value), c.nodeTimeout(l.ttl))
		}
		return out, err
	}, func(r *round) {
		<-registered
		c.releases.end(l.key, r.inflight)
	})
	if err != nil {
		return nil, err
	}
	r.inflight = c.releases.add(l.key, r.done)
	close(registered)
	defer r.finish()
	votes, ctxErr := r.collect(ctx, func(lists []Tally, _ []bool) bool {
		return c.unreachable(lists) || c.everyList(lists, func(t Tally, _, quorum int) bool { return t.Granted+t.Held+t.Absent >= quorum })
	})
	t := Count(votes)
	var kind error
	switch {
	case ctxErr != nil:
		kind = ErrCancelled
	case c.unreachable(c.tallies(votes)):
		kind = ErrQuorumUnavailable
	case t.Granted == 0:
		kind = ErrNotHeld
	}
	ev := &OpEvent{Op: OpRelease, Key: l.key, Attempt: 1, Latency: time.Since(r.start), Votes: votes}
	if kind == nil {
		return ev, nil
	}
	e := c.opError(OpRelease, l.key, kind, ctxErr, votes)
	ev.Err = e
	return ev, e
}

// Restore rebuilds a lock from persisted fields (Lock.Key, Lock.Value,
// Lock.TTL, Lock.ValidUntil), so that another process, such as a new
// operator leader, can extend or release it. A validUntil in the past gives a
// lock that can only be released. Like Acquire, it refuses (ErrInvalidArgument)
// a TTL that, with its drift allowance, exceeds the client's quarantine
// window, unless validUntil has passed: releasing is always safe.
// The restored lock's Token is 0 unless given with WithToken: persist the
// token beside the other fields. A semaphore's slot is restored WithSlot
// only (persist its Slot too): its key is refused otherwise. A key ending
// in ":line" (a waiting line's, reserved since) is restored for release
// only.
func (c *Client) Restore(key, value string, ttl time.Duration, validUntil time.Time, opts ...RestoreOption) (*Lock, error) {
	const op = Op("restore")
	l := &Lock{c: c, key: key, value: value, ttl: ttl}
	for i, o := range opts {
		if o == nil {
			return nil, invalidf(op, "restore option %d is nil", i)
		}
		o(l)
	}
	if l.slot == nil {
		// A lock granted before its key's suffix was reserved for waiting
		// lines may still be released: releasing is always safe.
		releasing := !validUntil.After(time.Now())
		if err := validateKey(op, key); err != nil && (!releasing || !strings.HasSuffix(key, lineSuffix) || validateKey(op, strings.TrimSuffix(key, lineSuffix)) != nil) {
			return nil, err
		}
	} else {
		if err := validateSlot(op, *l.slot); err != nil {
			return nil, err
		}
		if l.slot.Key() != key {
			return nil, invalidf(op, "key %q is not slot %d of the semaphore %q (%q)", key, l.slot.Index, l.slot.Semaphore, l.slot.Key())
		}
	}
	if err := validateTTL(op, ttl); err != nil {
		return nil, err
	}
	if err := validateValue(op, value); err != nil {
		return nil, err
	}
	if validUntil.After(time.Now()) {
		if err := c.checkWindow(op, ttl); err != nil {
			return nil, err
		}
	}
	if limit := time.Now().Add(ttl - Drift(ttl)); validUntil.After(limit) {
		validUntil = limit
	}
	l.validUntil = validUntil
	if !validUntil.IsZero() {
		l.sentAt = validUntil.Add(Drift(ttl) - ttl)
	}
	return l, nil
}

// RestoreOption configures a restored lock.
type RestoreOption func(*Lock)

// WithToken gives a restored lock the fencing token of its acquisition
// (Lock.Token). Besides Token, it lets each extension carry the token to
// the masters it puts the value back on (restarted without their data, or
// new to the list during a membership change), so that the key's counter
// there is at least the token and later grants stay above it.
func WithToken(token int64) RestoreOption {
	return func(l *Lock) { l.token = token }
}
