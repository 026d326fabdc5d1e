// Package holding tells a process whether its pod (or it, as a static
// holder: pkg/lockclient) holds a DistributedLock,
// from a watch of that one lock, and until when it may act on the grant by
// its own clock: the fencing deadline.
//
// A grant is what the lock's status shows for the pod: holder (the pod's
// name and UID), fencing token, grant ID, and Held=True with a validity
// still ahead. The validity is an instant on the operator's clock. Each
// observation turns it into a local deadline,
//
//	deadline = observed + (validUntil − observed − skew allowance)
//
// where observed is the local time the version arrived. The deadline
// carries the monotonic reading of observed, so a step of the local wall
// clock after the observation does not move it; the skew allowance covers
// the difference between the operator's clock and this one. A refresh of
// the validity is a new observation and moves the deadline on. When the
// process can no longer reach the API server nothing moves it: the grant
// ends at its deadline.
//
// A grant ends (Done) when status shows anything else for it — another
// grant, another holder, Held no longer True — or when its deadline passes,
// whichever comes first. The watch needs get, list and watch on that one
// DistributedLock (a Role with resourceNames: list and watch are asked
// with a field selector on its name), and nothing on pods.
package holding

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// Grant is one grant of the lock to this pod, as last observed.
type Grant struct {
	// Token is the grant's fencing token.
	Token int64
	// GrantID identifies the grant (a new grant, even to the same pod,
	// has a new one).
	GrantID string
	// Key is the Redis key of the lock.
	Key string
	// ValidUntil is the validity status showed, on the operator's clock.
	ValidUntil time.Time
	// Deadline is when this process must have stopped acting on the grant,
	// by its own clock (monotonic from the observation).
	Deadline time.Time
	// HeartbeatTimeout is the lock's spec.heartbeatTimeout (0: unset): the
	// holder must renew the lock's heartbeat Lease well within it
	// (Heartbeat), or the operator gives the grant up.
	HeartbeatTimeout time.Duration
	// HolderLease is the lock's spec.holderLease (0: unset): a static
	// holder must renew the lock's heartbeat within it, or the operator
	// ends the grant.
	HolderLease time.Duration
}

// Holder is who the watcher looks for in the lock's status: a pod (Name
// and UID), or a static holder (Identity: spec.holderIdentity, shown in
// status with no pod).
type Holder struct {
	Name     string
	UID      types.UID
	Identity string
}

// shows reports whether status holder h is this holder.
func (holder Holder) shows(h *v1alpha1.LockHolder) bool {
	switch {
	case h == nil:
		return false
	case holder.Identity != "":
		return h.Pod == nil && h.Identity == holder.Identity
	default:
		return h.Pod != nil && h.Pod.UID == holder.UID && h.Pod.Name == holder.Name
	}
}

// Options tune a Watcher.
type Options struct {
	// SkewAllowance is subtracted from every validity: how far this
	// host's clock may run behind the operator's. It must stay below the
	// lead with which the operator refreshes the validity (a tenth of the
	// ttl), or every grant ends just before each refresh.
	SkewAllowance time.Duration
	// Clock is the local clock (default: the real one).
	Clock clock.Clock
	// RetryDelay is how long a failed watch waits before it starts again
	// (default 500ms).
	RetryDelay time.Duration
}

// Watcher follows one DistributedLock for one holder.
type Watcher struct {
	c      client.WithWatch
	lock   types.NamespacedName
	holder Holder
	opts   Options

	mu      sync.Mutex
	current *Grant // nil: not held (as last observed, or its deadline passed)
	// shown is the grant ID the latest observed status shows to this
	// holder, valid or not ("": none); observed is set at the first
	// observation.
	shown    string
	observed bool
	changed  chan struct{} // closed and replaced whenever current changes
	latest   *v1alpha1.DistributedLock
	version  chan struct{} // closed and replaced at every version observed
	err      error         // the latest error of the watch, nil once it works again
	stopped  chan struct{}
}

// Watch starts following lock for holder until ctx ends.
func Watch(ctx context.Context, c client.WithWatch, lock types.NamespacedName, holder Holder, opts Options) *Watcher {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.RetryDelay <= 0 {
		opts.RetryDelay = 500 * time.Millisecond
	}
	w := &Watcher{c: c, lock: lock, holder: holder, opts: opts, changed: make(chan struct{}), version: make(chan struct{}), stopped: make(chan struct{})}
	go w.run(ctx)
	return w
}

// Stopped is closed once the watcher's context ended and it stopped.
func (w *Watcher) Stopped() <-chan struct{} { return w.stopped }

// Current returns the grant this pod holds now: nil when status does not
// show one, or when its deadline has passed.
func (w *Watcher) Current() *Grant {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.currentLocked()
}

func (w *Watcher) currentLocked() *Grant {
	if w.current == nil || !w.opts.Clock.Now().Before(w.current.Deadline) {
		return nil
	}
	g := *w.current
	return &g
}

// Err is the latest error of the watch (nil while it works).
func (w *Watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Next waits until this pod holds a grant, and returns it.
func (w *Watcher) Next(ctx context.Context) (*Grant, error) {
	for {
		w.mu.Lock()
		g, changed := w.currentLocked(), w.changed
		w.mu.Unlock()
		if g != nil {
			return g, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-w.stopped:
			return nil, errors.New("the watcher stopped")
		case <-changed:
		}
	}
}

// Done returns a channel closed once g has ended: status shows something
// else for it, or its deadline (as moved on by later observations of the
// same grant) has passed. Deadline, called after it, gives that deadline.
func (w *Watcher) Done(ctx context.Context, g *Grant) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			w.mu.Lock()
			cur, changed := w.current, w.changed
			w.mu.Unlock()
			if cur == nil || cur.GrantID != g.GrantID {
				return
			}
			left := cur.Deadline.Sub(w.opts.Clock.Now())
			if left <= 0 {
				return
			}
			// Fired or not, the loop looks again: a refresh observed as
			// the timer fires has moved the deadline on.
			timer := w.opts.Clock.NewTimer(left)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-w.stopped:
				timer.Stop()
				return
			case <-changed:
				timer.Stop()
			case <-timer.C():
			}
		}
	}()
	return done
}

// Deadline returns the latest deadline observed for grant id (zero when
// status no longer shows it).
func (w *Watcher) Deadline(id string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.current == nil || w.current.GrantID != id {
		return time.Time{}
	}
	return w.current.Deadline
}

// Latest returns the latest version of the lock observed (nil: it does
// not exist, or, with seen false, nothing was observed yet) and a channel
// closed once a later one is observed. The lock is shared: do not modify
// it.
func (w *Watcher) Latest() (l *v1alpha1.DistributedLock, seen bool, next <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latest, w.observed, w.version
}

// Changed returns a channel closed at the next change of what this pod
// holds.
func (w *Watcher) Changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

// run lists and watches the lock, observing each version, until ctx ends.
func (w *Watcher) run(ctx context.Context) {
	defer close(w.stopped)
	for ctx.Err() == nil {
		err := w.watchOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-w.opts.Clock.After(w.opts.RetryDelay):
		}
	}
}

// watchOnce lists the lock, then watches it from that version until the
// watch ends.
func (w *Watcher) watchOnce(ctx context.Context) error {
	byName := client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", w.lock.Name)}
	var list v1alpha1.DistributedLockList
	if err := w.c.List(ctx, &list, client.InNamespace(w.lock.Namespace), byName); err != nil {
		return fmt.Errorf("list DistributedLock %s: %w", w.lock, err)
	}
	if len(list.Items) == 0 {
		w.observe(nil)
	} else {
		w.observe(&list.Items[0])
	}
	from := &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}}
	wi, err := w.c.Watch(ctx, &v1alpha1.DistributedLockList{}, from, client.InNamespace(w.lock.Namespace), byName)
	if err != nil {
		return fmt.Errorf("watch DistributedLock %s: %w", w.lock, err)
	}
	defer wi.Stop()
	w.mu.Lock()
	w.err = nil
	w.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return errors.New("the watch ended")
			}
			switch ev.Type {
			case watch.Error:
				return fmt.Errorf("watch DistributedLock %s: error event", w.lock)
			case watch.Deleted:
				w.observe(nil)
			case watch.Added, watch.Modified:
				if l, ok := ev.Object.(*v1alpha1.DistributedLock); ok {
					w.observe(l)
				}
			}
		}
	}
}

// observe records what one version of the lock shows for this pod.
func (w *Watcher) observe(l *v1alpha1.DistributedLock) {
	now := w.opts.Clock.Now()
	next := GrantOf(l, w.holder, now, w.opts.SkewAllowance)
	shown := shownTo(l, w.holder)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.latest = l
	close(w.version)
	w.version = make(chan struct{})
	if sameGrant(w.current, next) && w.observed && shown == w.shown {
		return
	}
	w.current, w.shown, w.observed = next, shown, true
	close(w.changed)
	w.changed = make(chan struct{})
}

// shownTo is the ID of the grant l's status shows to holder, valid or
// not ("": none).
func shownTo(l *v1alpha1.DistributedLock, holder Holder) string {
	if l == nil || !holder.shows(l.Status.Holder) {
		return ""
	}
	return l.Status.GrantID
}

// Hidden reports whether the latest status observed no longer shows grant
// id to this holder at all, whatever its validity: the operator stopped
// showing it (released it, handed it over, gave it up), and never shows
// it again. A grant whose deadline passed while status still shows it is
// not hidden.
func (w *Watcher) Hidden(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.observed && w.shown != id
}

// sameGrant reports whether a and b are the same observation.
func sameGrant(a, b *Grant) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// GrantOf is what lock l's status, observed at now (this host's clock),
// shows for holder: the grant and its deadline, or nil when it shows none
// for it (or the validity, less the skew allowance, has passed).
func GrantOf(l *v1alpha1.DistributedLock, holder Holder, now time.Time, skew time.Duration) *Grant {
	if l == nil {
		return nil
	}
	st := l.Status
	if !holder.shows(st.Holder) || st.ValidUntil == nil || !meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionHeld) {
		return nil
	}
	left := st.ValidUntil.Sub(now) - skew // wall clocks: the operator's instant against this host's
	if left <= 0 {
		return nil
	}
	g := &Grant{
		Token: st.FencingToken, GrantID: st.GrantID, Key: st.Key,
		ValidUntil: st.ValidUntil.Time, Deadline: now.Add(left), // now's monotonic reading carries on
	}
	if t := l.Spec.HeartbeatTimeout; t != nil {
		g.HeartbeatTimeout = t.Duration
	}
	if t := l.Spec.HolderLease; t != nil {
		g.HolderLease = t.Duration
	}
	return g
}
