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
// down, a connection broken) costs the listener only its own retry delay,
// and exclusion still rests on SET NX alone.

// NoticePrefix begins every release notice's channel.
const NoticePrefix = "redlock:released:"

// NoticeACLRules are the rules a client needs beyond ACLRules to publish
// and listen to release notices: the notice channels, PUBLISH and
// (UN)SUBSCRIBE. PING, which keeps a listening connection alive, is in
// ACLRules already.
const NoticeACLRules = "&" + NoticePrefix + "* +publish +subscribe +unsubscribe"

// NoticeChannel is the channel a release of key is told on.
func NoticeChannel(key string) string { return NoticePrefix + key }

// noticeWindow bounds the time over which one release's notices are
// counted towards a quorum: a release's requests answer within its node
// timeout (at most MaxNodeTimeout unless set), and notices older than
// that belong to another release.
const noticeWindow = time.Second

// noticePing is how long a listening connection may be silent before it
// is pinged.
const noticePing = 30 * time.Second

// noticeRetryMin and noticeRetryMax bound the wait before a listening
// connection that failed is tried again.
const (
	noticeRetryMin = 100 * time.Millisecond
	noticeRetryMax = 5 * time.Second
)

// WithReleaseNotices makes Release publish a notice on NoticeChannel(key)
// on every master whose copy it deleted (see Notices). The PUBLISH goes
// after that master's answer, in the background: it adds no wait to
// Release, and its failure fails nothing.
func WithReleaseNotices() Option {
	return func(c *config) error {
		c.releaseNotices = true
		return nil
	}
}

// publishRelease tells of key's release on n, in the background; id tells
// this release's notices from another's (releaseID). Callers run within a
// round (whose count keeps Close waiting).
func (c *Client) publishRelease(n *node, key, id string, timeout time.Duration) {
	c.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := n.rdb.Publish(ctx, NoticeChannel(key), id).Err(); err != nil {
			c.observeNotice(NoticeEvent{Addr: n.addr, Err: fmt.Errorf("publish release notice of %q: %w", key, err)})
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
	Err  error
}

// NoticeObserver is told of NoticeEvents when the client's Observer
// implements it too.
type NoticeObserver interface {
	ObserveNotice(NoticeEvent)
}

func (c *Client) observeNotice(ev NoticeEvent) {
	if o, ok := c.cfg.observer.(NoticeObserver); ok {
		o.ObserveNotice(ev)
	}
}

// Notices listens on every master of a client for release notices of the
// keys it watches. It holds one connection to each master, kept open and
// subscribed again after a break. The callback runs on the listener of the
// master whose notice completed a quorum, and must not block.
type Notices struct {
	c         *Client
	onRelease func(key string)
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	subs      []*redis.PubSub

	mu      sync.Mutex
	watched map[string]int // channel → watchers
	// confirmed is, per master, the channels its connection confirmed
	// (cleared when the connection breaks); changed is closed, and
	// replaced, whenever it grows.
	confirmed []map[string]bool
	changed   chan struct{}
	heard     map[heardKey]*heard
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
// client. onRelease(key) is called once per release of a watched key, when
// a quorum of masters told of it. Close stops it.
func (c *Client) Notices(onRelease func(key string)) *Notices {
	ctx, cancel := context.WithCancel(context.Background())
	w := &Notices{
		c: c, onRelease: onRelease, ctx: ctx, cancel: cancel,
		watched: map[string]int{}, changed: make(chan struct{}), heard: map[heardKey]*heard{},
	}
	for i, n := range c.nodes {
		ps := n.rdb.Subscribe(ctx)
		w.subs = append(w.subs, ps)
		w.confirmed = append(w.confirmed, map[string]bool{})
		w.wg.Go(func() { w.listen(i, n, ps) })
	}
	return w
}

// Watch asks for notices of key's releases, on every master, and returns
// once a quorum of masters confirmed it: any release that frees the key on
// a quorum from then on is told. It returns ctx's error, with how many
// masters confirmed, if ctx ends first; the subscription stays (Unwatch
// ends it), and masters that were down subscribe when they are back.
func (w *Notices) Watch(ctx context.Context, key string) error {
	ch := NoticeChannel(key)
	w.mu.Lock()
	w.watched[ch]++
	first := w.watched[ch] == 1
	w.mu.Unlock()
	if first {
		for _, ps := range w.subs {
			// An error is a broken connection: listen makes it again,
			// and go-redis subscribes it to every channel then.
			_ = ps.Subscribe(ctx, ch)
		}
	}
	for {
		w.mu.Lock()
		n, changed := 0, w.changed
		for _, c := range w.confirmed {
			if c[ch] {
				n++
			}
		}
		w.mu.Unlock()
		if n >= w.c.quorum {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("watch release notices of %q: %d of %d masters subscribed: %w", key, n, len(w.subs), ctx.Err())
		case <-changed:
		}
	}
}

// Unwatch ends one Watch of key; the last one unsubscribes.
func (w *Notices) Unwatch(ctx context.Context, key string) {
	ch := NoticeChannel(key)
	w.mu.Lock()
	if w.watched[ch] == 0 {
		w.mu.Unlock()
		return
	}
	w.watched[ch]--
	last := w.watched[ch] == 0
	if last {
		delete(w.watched, ch)
		for _, c := range w.confirmed {
			delete(c, ch)
		}
	}
	w.mu.Unlock()
	if last {
		for _, ps := range w.subs {
			_ = ps.Unsubscribe(ctx, ch) // a broken connection subscribes again without it
		}
	}
}

// Close stops listening and closes the connections.
func (w *Notices) Close() error {
	w.cancel()
	var errs []error
	for _, ps := range w.subs {
		if err := ps.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	w.wg.Wait()
	return errors.Join(errs...)
}

// listen receives master i's messages until Close. A connection silent
// for noticePing is pinged, so that a dead one is found and made again;
// go-redis then subscribes to every channel once more. A failed
// connection is tried again after a growing wait.
func (w *Notices) listen(i int, n *node, ps *redis.PubSub) {
	delay := noticeRetryMin
	for {
		msg, err := ps.ReceiveTimeout(w.ctx, noticePing)
		if w.ctx.Err() != nil {
			return
		}
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			err = ps.Ping(w.ctx)
			if err == nil {
				continue
			}
		}
		if err != nil {
			w.c.observeNotice(NoticeEvent{Addr: n.addr, Err: fmt.Errorf("listen for release notices: %w", err)})
			w.mu.Lock()
			clear(w.confirmed[i])
			w.mu.Unlock()
			select {
			case <-w.ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, noticeRetryMax)
			continue
		}
		delay = noticeRetryMin
		switch m := msg.(type) {
		case *redis.Subscription:
			w.subscribed(i, m)
		case *redis.Message:
			w.told(i, strings.TrimPrefix(m.Channel, NoticePrefix), m.Payload, time.Now())
		}
	}
}

// subscribed records master i's confirmation of a (un)subscription.
func (w *Notices) subscribed(i int, m *redis.Subscription) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if m.Kind != "subscribe" {
		delete(w.confirmed[i], m.Channel)
		return
	}
	if w.watched[m.Channel] == 0 {
		return // unwatched meanwhile
	}
	w.confirmed[i][m.Channel] = true
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
	for k, h := range w.heard {
		if now.Sub(h.since) > noticeWindow {
			delete(w.heard, k)
		}
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
	w.mu.Unlock()
	if call {
		w.onRelease(key)
	}
}
