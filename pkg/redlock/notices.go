package redlock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Release notices. A client built WithReleaseNotices publishes, on every
// master whose copy its Release deleted, a message on NoticeChannel(key),
// after the deletion and apart from it: a master that refuses the PUBLISH
// (an ACL without the channel) fails nothing. Another client's Notices
// listens on every master and calls back once a quorum of them told of a
// release of a watched key: the key is then free on a quorum, and an
// attempt made at once can win it. Notices are hints. A lost one (a master
// down, a connection broken, a release whose quorum overlaps the
// subscribed masters on fewer than a quorum, a grant that expired rather
// than being released) costs the listener only its own retry delay, and
// exclusion still rests on SET NX alone.

// NoticePrefix begins every release notice's channel.
const NoticePrefix = "redlock:released:"

// NoticeACLRules are the rules a client needs beyond ACLRules to publish
// and listen to release notices: the notice channels, PUBLISH and
// (UN)SUBSCRIBE. PING, which keeps a listening connection alive, is in
// ACLRules already.
const NoticeACLRules = "&" + NoticePrefix + "* +publish +subscribe +unsubscribe"

// NoticeChannel is the channel a release of key is told on.
func NoticeChannel(key string) string { return NoticePrefix + key }

// noticeWindow is how long a release's notices are counted: each release
// has its own id, so the window only forgets releases whose quorum never
// came.
const noticeWindow = time.Minute

// noticePing is how long a listening connection may be silent before it
// is pinged; one silent for as long again after the ping is dead (a
// half-open connection answers nothing, though the ping's write succeeds)
// and is made anew.
const noticePing = 30 * time.Second

// noticeTimeout bounds one SUBSCRIBE, UNSUBSCRIBE or PUBLISH.
const noticeTimeout = time.Second

// noticeRetryMin and noticeRetryMax bound the wait before a listening
// connection that failed is tried again.
const (
	noticeRetryMin = 100 * time.Millisecond
	noticeRetryMax = 5 * time.Second
)

// WithReleaseNotices makes Release publish a notice on NoticeChannel(key)
// on every master whose copy it deleted (see Notices); a semaphore's
// slot's on the semaphore key's channel, which tells of every slot. The
// PUBLISH goes after that master's answer, in the background: it adds no
// wait to Release, and its failure fails nothing.
func WithReleaseNotices() Option {
	return func(c *config) error {
		c.releaseNotices = true
		return nil
	}
}

// publishRelease tells of key's release on n, in the background; id tells
// this release's notices from another's (releaseID). It goes through the
// master's batcher, as lock requests do. Callers run within a round (whose
// count keeps Close waiting).
func (c *Client) publishRelease(n *node, key, id string, timeout time.Duration) {
	c.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		cmd := redis.NewIntCmd(ctx, "publish", NoticeChannel(key), id)
		n.process(ctx, cmd)
		if err := cmd.Err(); err != nil {
			c.observeNotice(NoticeEvent{Addr: n.addr, Op: NoticePublish, Err: fmt.Errorf("publish release notice of %q: %w", key, err)})
		}
	})
}

// releaseID is the payload of a release's notices: the same on every
// master, another for each grant, and no clue to the lock's value.
func releaseID(key, value string) string {
	sum := sha256.Sum256([]byte(key + "\x00" + value))
	return hex.EncodeToString(sum[:8])
}

// NoticeEvent reports a release notice that could not be published or
// listened for: the master and why. Notices are hints, so these are for
// metrics and logs only.
type NoticeEvent struct {
	Addr string
	// Op is what failed: NoticePublish or NoticeListen.
	Op  NoticeOp
	Err error
}

// NoticeOp is what a NoticeEvent reports failed.
type NoticeOp string

const (
	// NoticePublish is a release's PUBLISH, refused or unanswered.
	NoticePublish NoticeOp = "publish"
	// NoticeListen is a listening connection broken or found dead, or a
	// SUBSCRIBE refused.
	NoticeListen NoticeOp = "listen"
)

// NoticeObserver is told of NoticeEvents when the client's Observer
// implements it too.
type NoticeObserver interface {
	ObserveNotice(NoticeEvent)
}

// isClosed reports whether Close was called.
func (c *Client) isClosed() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.closed
}

func (c *Client) observeNotice(ev NoticeEvent) {
	if o, ok := c.cfg.observer.(NoticeObserver); ok {
		o.ObserveNotice(ev)
	}
}

// Notices listens on every master of a client's list for release notices
// of the keys it watches. It holds one connection to each master, pinged
// when silent, made again after a break (go-redis then subscribes it to
// every watched key once more). The callback may run on several masters'
// listeners at once, and must not block.
type Notices struct {
	c         *Client
	onRelease func(key string)
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	ears      []*ear
	closeOnce sync.Once
	closeErr  error
	// ping is noticePing, but in tests.
	ping atomic.Int64

	// subMu orders Watch's and Unwatch's (UN)SUBSCRIBEs, so that a
	// master sees them in the order the counts changed.
	subMu sync.Mutex

	mu      sync.Mutex
	watched map[string]int // channel → watchers
	// changed is closed, and replaced, whenever a master confirms a
	// subscription.
	changed chan struct{}
	heard   map[heardKey]*heard
	pruned  time.Time // when heard was last rid of releases past noticeWindow
}

// ear is the listening connection to one master.
type ear struct {
	i int // the master's index, for counting
	n *node
	// psMu guards ps, which is replaced when the connection is dead.
	psMu sync.Mutex
	ps   *redis.PubSub
	// confirmed is the channels the master confirmed on the current
	// connection (guarded by Notices.mu).
	confirmed map[string]bool
}

func (e *ear) pubsub() *redis.PubSub {
	e.psMu.Lock()
	defer e.psMu.Unlock()
	return e.ps
}

// heardKey is one release: its key and its id (the payload of its
// notices).
type heardKey struct{ key, id string }

// heard is which masters told of one release, from when.
type heard struct {
	since time.Time
	from  map[int]bool
	told  bool // the quorum was reached and the callback made
}

// Notices starts listening for release notices on every master of the
// client's list (a joint client's previous list aside). onRelease(key) is
// called once per release of a watched key, when a quorum of masters told
// of it. Close stops it; it fails with ErrClosed on a closed client.
func (c *Client) Notices(onRelease func(key string)) (*Notices, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return nil, ErrClosed
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &Notices{
		c: c, onRelease: onRelease, ctx: ctx, cancel: cancel,
		watched: map[string]int{}, changed: make(chan struct{}), heard: map[heardKey]*heard{},
	}
	w.ping.Store(int64(noticePing))
	for i, n := range c.nodes {
		if !n.inList(0) {
			continue
		}
		e := &ear{i: i, n: n, ps: n.rdb.Subscribe(ctx), confirmed: map[string]bool{}}
		w.ears = append(w.ears, e)
		w.wg.Go(func() { w.listen(e) })
	}
	return w, nil
}

// Watch asks for notices of key's releases on every master, and returns
// once a quorum of masters confirmed it. A release that deletes the key on
// a quorum of those masters is then told; with every master subscribed
// (when all answer), every release is. It returns ctx's error, with how
// many masters confirmed, if ctx ends first, and ErrClosed once Close was
// called; the subscription stays either way (Unwatch ends it), and masters
// that were down subscribe when they are back.
func (w *Notices) Watch(ctx context.Context, key string) error {
	if w.ctx.Err() != nil {
		return ErrClosed
	}
	ch := NoticeChannel(key)
	w.subMu.Lock()
	w.mu.Lock()
	w.watched[ch]++
	var ask []*ear
	for _, e := range w.ears {
		if !e.confirmed[ch] {
			ask = append(ask, e)
		}
	}
	w.mu.Unlock()
	// SUBSCRIBE again where it is not confirmed: it is idempotent, and a
	// subscription refused or lost gets another chance.
	w.each(ask, func(ctx context.Context, ps *redis.PubSub) error { return ps.Subscribe(ctx, ch) })
	w.subMu.Unlock()
	for {
		w.mu.Lock()
		n, changed := 0, w.changed
		for _, e := range w.ears {
			if e.confirmed[ch] {
				n++
			}
		}
		w.mu.Unlock()
		if n >= w.c.quorum {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("watch release notices of %q: %d of %d masters subscribed: %w", key, n, len(w.ears), ctx.Err())
		case <-w.ctx.Done():
			return ErrClosed
		case <-changed:
		}
	}
}

// Unwatch ends one Watch of key; the last one unsubscribes.
func (w *Notices) Unwatch(key string) {
	ch := NoticeChannel(key)
	w.subMu.Lock()
	defer w.subMu.Unlock()
	w.mu.Lock()
	if w.watched[ch] == 0 {
		w.mu.Unlock()
		return
	}
	w.watched[ch]--
	last := w.watched[ch] == 0
	if last {
		delete(w.watched, ch)
		for _, e := range w.ears {
			delete(e.confirmed, ch)
		}
	}
	w.mu.Unlock()
	if last {
		w.each(w.ears, func(ctx context.Context, ps *redis.PubSub) error { return ps.Unsubscribe(ctx, ch) })
	}
}

// each runs f on the ears' connections at once, each within
// noticeTimeout of Notices' own context (a caller's deadline that passed
// would make go-redis take the connection for broken), and once more
// where it failed: go-redis may have made the connection again inside
// the first call, without the new channel. An error left means no
// connection; the next one subscribes to every watched channel.
func (w *Notices) each(ears []*ear, f func(context.Context, *redis.PubSub) error) {
	var wg sync.WaitGroup
	for _, e := range ears {
		wg.Go(func() {
			for range 2 {
				ctx, cancel := context.WithTimeout(w.ctx, noticeTimeout)
				err := f(ctx, e.pubsub())
				cancel()
				if err == nil || w.ctx.Err() != nil {
					return
				}
			}
		})
	}
	wg.Wait()
}

// Close stops listening and closes the connections.
func (w *Notices) Close() error {
	w.closeOnce.Do(func() {
		w.cancel()
		// Under subMu, so that no renew replaces a connection after it
		// is closed (renew does nothing once cancelled); not across the
		// wait, which may be for a listener in renew.
		w.subMu.Lock()
		var errs []error
		for _, e := range w.ears {
			if err := e.pubsub().Close(); err != nil {
				errs = append(errs, err)
			}
		}
		w.subMu.Unlock()
		w.wg.Wait()
		w.closeErr = errors.Join(errs...)
	})
	return w.closeErr
}

// listen receives e's messages until Close, or until the client's
// connections are closed. A connection silent for noticePing is pinged;
// silent for as long again, it is dead and made anew. A failed connection
// is tried again after a growing wait.
func (w *Notices) listen(e *ear) {
	delay := noticeRetryMin
	connected, pinged := false, false
	for {
		ps := e.pubsub()
		msg, err := ps.ReceiveTimeout(w.ctx, time.Duration(w.ping.Load()))
		if w.ctx.Err() != nil {
			return
		}
		if errors.Is(err, redis.ErrClosed) && w.c.isClosed() {
			w.cancel() // the client's connections are gone: so is Notices
			return
		}
		var ne net.Error
		if connected && errors.As(err, &ne) && ne.Timeout() {
			if !pinged {
				pinged = ps.Ping(w.ctx) == nil
				if pinged {
					continue
				}
			} else {
				w.renew(e)
				pinged, connected = false, false
				continue
			}
		}
		var reply redis.Error
		switch {
		case err != nil && errors.As(err, &reply):
			// A refusal (NOPERM for a channel): the connection stands.
			w.c.observeNotice(NoticeEvent{Addr: e.n.addr, Op: NoticeListen, Err: fmt.Errorf("listen for release notices: %w", err)})
			continue
		case err != nil:
			w.c.observeNotice(NoticeEvent{Addr: e.n.addr, Op: NoticeListen, Err: fmt.Errorf("listen for release notices: %w", err)})
			w.mu.Lock()
			clear(e.confirmed)
			w.mu.Unlock()
			connected, pinged = false, false
			select {
			case <-w.ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, noticeRetryMax)
			continue
		}
		delay, connected, pinged = noticeRetryMin, true, false
		switch m := msg.(type) {
		case *redis.Subscription:
			w.subscribed(e, m)
		case *redis.Message:
			if e.n.duplicate() == "" { // one server under two addresses tells once
				w.told(e.i, strings.TrimPrefix(m.Channel, NoticePrefix), m.Payload, time.Now())
			}
		}
	}
}

// renew replaces e's connection, found dead, with a new one subscribed to
// every watched channel.
func (w *Notices) renew(e *ear) {
	w.c.observeNotice(NoticeEvent{Addr: e.n.addr, Op: NoticeListen, Err: fmt.Errorf("listen for release notices: no answer to a ping within %v: connecting again", time.Duration(w.ping.Load()))})
	w.subMu.Lock()
	defer w.subMu.Unlock()
	if w.ctx.Err() != nil {
		return // closed: Close closes the connection there is
	}
	w.mu.Lock()
	clear(e.confirmed)
	channels := make([]string, 0, len(w.watched))
	for ch := range w.watched {
		channels = append(channels, ch)
	}
	w.mu.Unlock()
	ps := e.n.rdb.Subscribe(w.ctx)
	e.psMu.Lock()
	old := e.ps
	e.ps = ps
	e.psMu.Unlock()
	_ = old.Close()
	if len(channels) > 0 {
		w.each([]*ear{e}, func(ctx context.Context, ps *redis.PubSub) error { return ps.Subscribe(ctx, channels...) })
	}
}

// subscribed records master e's confirmation of a (un)subscription.
func (w *Notices) subscribed(e *ear, m *redis.Subscription) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if m.Kind != "subscribe" {
		delete(e.confirmed, m.Channel)
		return
	}
	if w.watched[m.Channel] == 0 {
		return // unwatched meanwhile
	}
	e.confirmed[m.Channel] = true
	close(w.changed)
	w.changed = make(chan struct{})
}

// told counts master i's notice of a release of key (id: the notice's
// payload), and calls back when it completes a quorum.
func (w *Notices) told(i int, key, id string, now time.Time) {
	w.mu.Lock()
	if w.watched[NoticeChannel(key)] == 0 {
		w.mu.Unlock()
		return
	}
	if now.Sub(w.pruned) > noticeWindow/10 {
		for k, h := range w.heard {
			if now.Sub(h.since) > noticeWindow {
				delete(w.heard, k)
			}
		}
		w.pruned = now
	}
	hk := heardKey{key, id}
	h := w.heard[hk]
	if h == nil {
		h = &heard{since: now, from: map[int]bool{}}
		w.heard[hk] = h
	}
	h.from[i] = true
	call := !h.told && len(h.from) >= w.c.quorum
	h.told = h.told || call
	if h.told && len(h.from) >= len(w.ears) {
		delete(w.heard, hk) // every master told: nothing more to absorb
	}
	w.mu.Unlock()
	if call {
		w.onRelease(key)
	}
}
