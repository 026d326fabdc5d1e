// Package lockclient holds a DistributedLock for a critical section of a
// running process, through the Kubernetes API server only: it never talks
// to Redis, so a process needs no master credentials, only RBAC on one
// lock.
//
// Acquire asks for the lock as its static holder (spec.holderIdentity, a
// name of its own per call), on the version of the lock it read, once no
// other static request is open; the operator acquires the lock across the
// masters and shows the grant in status. The grant carries its fencing
// token, the validity status showed and the deadline by this host's clock
// (package holding): pass the token to every fenced resource, and stop
// acting on the grant when Done is closed, or Err says so before each
// action.
//
// The lock must set spec.holderLease. While the grant lasts, the client
// renews that lease through the lock's LockHeartbeat (a third of the lease
// apart, at once when the lease changes), so the lock of a process that
// crashed, hangs or is cut off passes on once the lease runs out. A grant
// ends (Done, Err) at the earliest of: status no longer shows it; the
// validity status showed passes (less the skew allowance) with no refresh
// seen; the lease runs out, counted from when the latest renewal that
// succeeded was sent (once one did, a moment after the grant, no later
// than the operator's own count); Release.
// The validity is what keeps two holders apart (the operator leaves the
// keys of a grant it gives up until then); the lease only ends a grant
// sooner. A process paused past its deadline learns from Err that the
// grant ended before it acts again, whatever its goroutines did meanwhile;
// the fencing token is what protects a resource from an action already
// under way. A grant that ends on its own withdraws its request in the
// background, so the lock passes on without waiting for the lease.
//
// It needs get, list, watch and patch on the DistributedLock (list and
// watch with a field selector on its name, so a Role may name it in
// resourceNames) and get and update on its LockHeartbeat;
// docs/tasks/go-client.md has a Role.
package lockclient

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/pkg/holding"
)

// Errors. A grant's Err wraps one of ErrLost, ErrExpired, ErrReleased.
var (
	// ErrNoLease: the lock sets no spec.holderLease, so a process that
	// crashed would keep it for ever; the client refuses it.
	ErrNoLease = errors.New("lockclient: the lock sets no spec.holderLease")
	// ErrLockNotFound: no such DistributedLock.
	ErrLockNotFound = errors.New("lockclient: no such DistributedLock")
	// ErrRequestEnded: the request ended before its grant was seen (the
	// lease ran out, or maxHoldDuration passed).
	ErrRequestEnded = errors.New("lockclient: the request ended")
	// ErrLost: status no longer shows the grant (given up, lost, handed
	// over, the lock deleted).
	ErrLost = errors.New("lockclient: the grant ended")
	// ErrExpired: the grant's deadline passed: no validity refresh seen,
	// or the lease not renewed, in time.
	ErrExpired = errors.New("lockclient: the grant's deadline passed")
	// ErrReleased: Release was called.
	ErrReleased = errors.New("lockclient: released")
)

// DefaultSkewAllowance is how far this host's clock may run behind the
// operator's by default (as the in-pod agent's --skew-allowance).
const DefaultSkewAllowance = 250 * time.Millisecond

// Client acquires DistributedLocks for this process.
type Client struct {
	c        client.WithWatch
	identity string
	skew     time.Duration
	clock    clock.Clock
}

// Option configures a Client.
type Option func(*Client)

// WithIdentity sets the prefix of the static holder names the client asks
// for (default: the host name); each Acquire adds a random suffix.
func WithIdentity(prefix string) Option { return func(c *Client) { c.identity = prefix } }

// WithSkewAllowance sets how far this host's clock may run behind the
// operator's (default DefaultSkewAllowance): it is taken off every
// validity. Keep it below a tenth of the lock's ttl.
func WithSkewAllowance(d time.Duration) Option { return func(c *Client) { c.skew = d } }

// WithClock sets the local clock (default: the real one).
func WithClock(clk clock.Clock) Option { return func(c *Client) { c.clock = clk } }

// New returns a client acting through c, whose scheme must know the
// coordination.redlock.dev types (v1alpha1.AddToScheme).
func New(c client.WithWatch, opts ...Option) *Client {
	cl := &Client{c: c, skew: DefaultSkewAllowance, clock: clock.RealClock{}}
	for _, o := range opts {
		o(cl)
	}
	if cl.identity == "" {
		cl.identity, _ = os.Hostname()
	}
	if cl.identity == "" {
		cl.identity = "lockclient"
	}
	return cl
}

// Acquire asks for lock and waits until it is granted, or ctx ends (then
// the request is withdrawn). ctx bounds the wait only: the grant lasts
// until it ends on its own or Release, and renews its lease until then,
// so Release every grant (defer g.Release(ctx)).
//
// Waiters are not queued: when the lock is free of static requests, every
// waiting client asks at once on the version it read, and one wins; the
// others wait for the next turn.
func (c *Client) Acquire(ctx context.Context, lock types.NamespacedName) (*Grant, error) {
	suffix := make([]byte, 8)
	if _, err := rand.Read(suffix); err != nil {
		return nil, fmt.Errorf("lockclient: a holder name: %w", err)
	}
	id := c.identity + "-" + hex.EncodeToString(suffix)
	wctx, stop := context.WithCancel(context.Background())
	w := holding.Watch(wctx, c.c, lock, holding.Holder{Identity: id}, holding.Options{SkewAllowance: c.skew, Clock: c.clock})
	var asked request
	fail := func(err error) (*Grant, error) {
		if werr := w.Err(); werr != nil {
			err = fmt.Errorf("%w (watching the lock: %w)", err, werr)
		}
		stop()
		if asked.sent {
			if werr := c.giveBack(lock, id, asked.unsure); werr != nil {
				err = errors.Join(err, werr)
			}
		}
		return nil, err
	}
	for {
		l, seen, next := w.Latest()
		if g := w.Current(); g != nil {
			return c.start(w, stop, lock, id, g), nil
		}
		if seen {
			done, err := c.step(ctx, l, lock, id, &asked)
			if done {
				return fail(err)
			}
		}
		select {
		case <-ctx.Done():
			return fail(fmt.Errorf("lockclient: acquire %s: %w", lock, ctx.Err()))
		case <-next:
		}
	}
}

// request is what Acquire knows of its request: sent (it may have been
// applied) and unsure (its answer never came: it may be applied later
// than a first look shows).
type request struct{ sent, unsure bool }

// askTimeout bounds the request, whatever the caller's context: its
// answer says whether it was applied.
const askTimeout = 10 * time.Second

// step acts on version l of the lock while Acquire waits: it asks for the
// lock once no other static request is open. done: Acquire fails with err.
func (c *Client) step(ctx context.Context, l *v1alpha1.DistributedLock, lock types.NamespacedName, id string, asked *request) (done bool, err error) {
	switch {
	case l == nil:
		return true, fmt.Errorf("%w: %s", ErrLockNotFound, lock)
	case l.Spec.HolderLease == nil:
		return true, fmt.Errorf("%w: %s", ErrNoLease, lock)
	case l.Spec.HolderIdentity == id && l.StaticRequest() == "":
		er := l.Status.EndedRequest
		return true, fmt.Errorf("%w: %s: %s", ErrRequestEnded, lock, er.Reason)
	case l.Spec.HolderIdentity == id, l.StaticRequest() != "":
		return false, nil // asked, or another request is open: wait
	}
	next := l.DeepCopy()
	next.Spec.HolderIdentity = id
	// Not cancelled with ctx, so that its answer comes; counted as sent
	// before it is: one applied whose answer is lost is withdrawn too.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), askTimeout)
	defer cancel()
	asked.sent = true
	switch err := c.c.Patch(actx, next, client.MergeFromWithOptions(l, client.MergeFromWithOptimisticLock{})); {
	case err == nil, apierrors.IsConflict(err):
		return false, nil // a later version comes
	case apierrors.IsNotFound(err):
		return true, fmt.Errorf("%w: %s", ErrLockNotFound, lock)
	default:
		asked.unsure = asked.unsure || !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err)
		return true, fmt.Errorf("lockclient: ask for %s: %w", lock, err)
	}
}

// Withdrawing a request: giveBack tries once for giveBackNow, then goes on
// in the background a second apart for giveBackFor (the lease ends a
// request nobody renews anyway); a request whose answer never came is
// looked for again at each of recheckAfter, in case it is applied later.
const (
	giveBackNow = 2 * time.Second
	giveBackFor = 5 * time.Minute
)

var recheckAfter = []time.Duration{time.Second, 5 * time.Second, 15 * time.Second}

// giveBack withdraws the request of id (withdraw), on contexts of its own:
// the caller's may be what ended. It returns the first attempt's failure.
func (c *Client) giveBack(lock types.NamespacedName, id string, unsure bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), giveBackNow)
	err := c.withdraw(ctx, lock, id)
	cancel()
	if err == nil && !unsure {
		return nil
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), giveBackFor)
		defer cancel()
		for ctx.Err() == nil && c.withdraw(ctx, lock, id) != nil {
			select {
			case <-ctx.Done():
			case <-c.clock.After(time.Second):
			}
		}
		if !unsure {
			return
		}
		for _, d := range recheckAfter {
			select {
			case <-ctx.Done():
				return
			case <-c.clock.After(d):
			}
			_ = c.withdraw(ctx, lock, id)
		}
	}()
	return err
}

// withdraw clears spec.holderIdentity if it still names id.
func (c *Client) withdraw(ctx context.Context, lock types.NamespacedName, id string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l := &v1alpha1.DistributedLock{}
		if err := c.c.Get(ctx, lock, l); err != nil {
			return client.IgnoreNotFound(err)
		}
		if l.Spec.HolderIdentity != id {
			return nil
		}
		next := l.DeepCopy()
		next.Spec.HolderIdentity = ""
		return c.c.Patch(ctx, next, client.MergeFromWithOptions(l, client.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		return fmt.Errorf("lockclient: give back %s: %w", lock, err)
	}
	return nil
}

// start begins the grant's lease renewals and its watch for an end.
func (c *Client) start(w *holding.Watcher, stop context.CancelFunc, lock types.NamespacedName, id string, g *holding.Grant) *Grant {
	gr := &Grant{
		Token: g.Token, GrantID: g.GrantID, Key: g.Key, ValidUntil: g.ValidUntil, Holder: id,
		c: c, w: w, stop: stop, lock: lock, done: make(chan struct{}), moved: make(chan struct{}, 1),
	}
	ctx, cancel := context.WithCancel(context.Background())
	gr.cancel = cancel
	go gr.renew(ctx)
	go gr.watch(ctx, w.Done(ctx, g))
	return gr
}

// Grant is one grant of a lock to this process.
type Grant struct {
	// Token is the grant's fencing token: pass it to every fenced
	// resource, which refuses a token lower than the highest it has seen.
	// The token, not Err, is what protects the resource: a process can
	// pause between asking Err and its write landing.
	Token int64
	// GrantID identifies the grant.
	GrantID string
	// Key is the lock's Redis key.
	Key string
	// ValidUntil is the validity status showed when the grant was seen,
	// on the operator's clock (refreshed while it lasts: Deadline).
	ValidUntil time.Time
	// Holder is the static holder name the client asked for.
	Holder string

	c      *Client
	w      *holding.Watcher
	stop   context.CancelFunc // the watch
	cancel context.CancelFunc // renew and watch
	lock   types.NamespacedName
	done   chan struct{}
	moved  chan struct{} // a renewal succeeded or failed

	mu  sync.Mutex
	err error
	// renewed is when the latest renewal that succeeded was sent (zero:
	// none yet), under the lease renewedFor; renewErr the latest renewal's
	// error (nil: it succeeded).
	renewed    time.Time
	renewedFor time.Duration
	renewErr   error
}

// Done is closed once the grant has ended: stop acting on it. Err says
// why.
func (g *Grant) Done() <-chan struct{} { return g.done }

// Err is nil while the grant lasts, and why it ended after: ErrLost,
// ErrExpired or ErrReleased, wrapped (with the latest renewal's error, if
// it failed). It reads the clock itself, so a process that was paused
// past the deadline learns it here, before anything else; ask it before
// each action on the grant.
func (g *Grant) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		if why := g.overLocked(); why != nil {
			g.endLocked(why)
		}
	}
	return g.err
}

// Deadline is when the grant ends at the latest, by this host's clock
// (monotonic): the validity last seen less the skew allowance, or the
// lease counted from when the latest renewal that succeeded was sent,
// whichever is earlier. Zero once the grant ended. Bound each action on
// the grant by it (context.WithDeadline).
func (g *Grant) Deadline() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		if why := g.overLocked(); why != nil {
			g.endLocked(why)
		}
	}
	if g.err != nil {
		return time.Time{}
	}
	return g.deadlineLocked()
}

func (g *Grant) deadlineLocked() time.Time {
	d := g.w.Deadline(g.GrantID)
	if l := g.leaseUntilLocked(); !d.IsZero() && !l.IsZero() && l.Before(d) {
		return l
	}
	return d
}

// leaseUntilLocked is when the lease runs out by this process's count: the
// latest renewal that succeeded, from when it was sent, plus the lease it
// was made under (a changed lease is renewed at once). The operator counts
// from when it sees a renewal, and afresh from when it sees a new lease,
// so once a renewal succeeded this is no later than its verdict; zero
// until then (a moment after the grant: the operator's count started at
// its first look at the grant, which this process cannot place). It is
// not what keeps two holders apart: the validity is (the operator leaves
// the keys of a grant it gives up until then).
func (g *Grant) leaseUntilLocked() time.Time {
	if g.renewed.IsZero() {
		return time.Time{}
	}
	return g.renewed.Add(g.renewedFor)
}

// overLocked says why the grant is over by the clock and the latest
// status seen (nil: it is not).
func (g *Grant) overLocked() error {
	now := g.c.clock.Now()
	var why error
	switch d, l := g.w.Deadline(g.GrantID), g.leaseUntilLocked(); {
	case d.IsZero():
		why = fmt.Errorf("%w: %s no longer shows grant %s", ErrLost, g.lock, g.GrantID)
	case !l.IsZero() && !now.Before(l):
		why = fmt.Errorf("%w: lease of %s not renewed in time", ErrExpired, g.lock)
	case !now.Before(d):
		why = fmt.Errorf("%w: validity of %s not refreshed in time", ErrExpired, g.lock)
	default:
		return nil
	}
	if g.renewErr != nil {
		why = fmt.Errorf("%w (the latest renewal failed: %w)", why, g.renewErr)
	}
	return why
}

// endLocked ends the grant with err (once). Unless it was released, the
// request is withdrawn in the background: the lock passes on without
// waiting for the lease.
func (g *Grant) endLocked(err error) {
	if g.err != nil {
		return
	}
	g.err = err
	close(g.done)
	g.cancel()
	g.stop()
	if !errors.Is(err, ErrReleased) {
		go func() { _ = g.c.giveBack(g.lock, g.Holder, false) }()
	}
}

func (g *Grant) end(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.endLocked(err)
}

// Release ends the grant and gives the lock back: call it only once
// nothing acts on the grant any more (its word says so). Done is closed
// first;
// then it writes its word for the grant (the LockHeartbeat's
// releasedGrant), on which the operator releases the keys at once and
// grants the next holder, and withdraws the request (clears
// spec.holderIdentity if it still names this grant's holder). A change
// of the request by anyone else is not a release: the operator then keeps
// the keys until the validity status showed has passed. After the grant
// ended on its own, the word still tells that nothing acts on it.
func (g *Grant) Release(ctx context.Context) error {
	g.end(fmt.Errorf("%w: %s", ErrReleased, g.lock))
	word := holding.SayReleased(ctx, g.c.c, g.lock, g.GrantID)
	if apierrors.IsNotFound(word) {
		word = nil // no LockHeartbeat: the withdrawal is all the operator reads
	}
	return errors.Join(word, g.c.withdraw(ctx, g.lock, g.Holder))
}

// watch ends the grant when status stops showing it, or by the deadline.
func (g *Grant) watch(ctx context.Context, shown <-chan struct{}) {
	for {
		changed := g.w.Changed()
		g.mu.Lock()
		if g.err == nil {
			if why := g.overLocked(); why != nil {
				g.endLocked(why)
			}
		}
		ended, left := g.err != nil, time.Duration(0)
		if !ended {
			left = g.deadlineLocked().Sub(g.c.clock.Now())
		}
		g.mu.Unlock()
		if ended {
			return
		}
		t := g.c.clock.NewTimer(left)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-shown:
			t.Stop()
			g.end(g.lostOrExpired())
			return
		case <-g.moved:
			t.Stop()
		case <-changed:
			t.Stop()
		case <-t.C():
		}
	}
}

// lostOrExpired says why the watcher reported the grant's end.
func (g *Grant) lostOrExpired() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if why := g.overLocked(); why != nil {
		return why
	}
	return fmt.Errorf("%w: %s", ErrLost, g.lock)
}

// renew renews the lease a third of it apart (a tenth after a failure),
// and at once when the lock's lease changes, as long as the grant lasts.
func (g *Grant) renew(ctx context.Context) {
	var (
		tried time.Time     // the latest attempt
		lease time.Duration // the lease it was made under
		wait  time.Duration // from it to the next
	)
	for {
		changed := g.w.Changed()
		if g.Err() != nil {
			return // never a renewal past the deadline, e.g. after a pause
		}
		cur := g.w.Current()
		if cur == nil || cur.GrantID != g.GrantID || cur.HolderLease <= 0 {
			return // the watch ends the grant
		}
		now := g.c.clock.Now()
		if tried.IsZero() || cur.HolderLease != lease || now.Sub(tried) >= wait {
			tried, lease = now, cur.HolderLease
			wait = lease / 3
			if g.beat(ctx, now, lease) != nil {
				wait = lease / 10
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-g.c.clock.After(tried.Add(wait).Sub(now)):
		}
	}
}

// beat renews the lease once, sent at sent, and records the outcome.
func (g *Grant) beat(ctx context.Context, sent time.Time, lease time.Duration) error {
	// Bounded by the deadline only: a renewal begun before a pause is
	// given up when the process resumes after it, and a slow one still
	// counts while the grant lasts.
	limit := lease
	if dl := g.Deadline(); !dl.IsZero() {
		limit = dl.Sub(sent)
	}
	bctx, cancel := context.WithTimeout(ctx, limit)
	err := holding.Beat(bctx, g.c.c, g.lock, g.GrantID, sent)
	cancel()
	g.mu.Lock()
	if err == nil && g.err == nil && sent.After(g.renewed) {
		g.renewed, g.renewedFor = sent, lease
	}
	g.renewErr = err
	g.mu.Unlock()
	select {
	case g.moved <- struct{}{}:
	default:
	}
	return err
}
