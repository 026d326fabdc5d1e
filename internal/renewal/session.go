// Package renewal keeps Redlock grants alive. A Session renews one grant on
// its own schedule, on its own goroutine, until it is released, orphaned or
// lost, in the manner of etcd's concurrency.Session: the keep-alive is owned
// by one type, Done tells when it ended and Err why, Orphan stops renewing
// without touching the keys (for a handover to another process), Release
// gives the grant back.
//
// A Session never talks to the Kubernetes API, and its renewals never wait
// on it: it posts itself to its owner's Reports after each renewal and when
// the grant was lost, and the owner reads them (State, Err) and writes
// status. A Session renews on its own schedule (every interval, sooner
// after a failure, never later than a third of the remaining validity) and
// when its owner asks (RenewSoon): when status is refreshed, and so when a
// renewal is wanted just before, is the owner's to decide. What the Session
// keeps from status is one floor: renewals keep the keys at least until the
// validity readers were shown (Config.Floor), and until its own latest
// validity, which the owner may show while a renewal is on its way.
package renewal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Why a Session ended; Err wraps one of them.
var (
	// ErrReleased: Release was called.
	ErrReleased = errors.New("released")
	// ErrOrphaned: Orphan was called (or the Sessions it belongs to stopped):
	// the keys stay until they expire or another process takes them over.
	ErrOrphaned = errors.New("orphaned")
	// ErrLost: the grant was lost: the masters no longer hold it, or its
	// validity passed without a successful renewal.
	ErrLost = errors.New("lost")
)

// LostError says why a grant was lost.
type LostError struct {
	// Reason is a condition reason (ValidityExpired, Lost, ...).
	Reason string
	// Err is the last renewal error, if any.
	Err error
}

// Error describes the loss.
func (e *LostError) Error() string {
	if e.Err == nil {
		return "lost (" + e.Reason + ")"
	}
	return fmt.Sprintf("lost (%s): %v", e.Reason, e.Err)
}

// Unwrap returns ErrLost and the renewal error.
func (e *LostError) Unwrap() []error { return []error{ErrLost, e.Err} }

// Grant is what a Session renews.
type Grant struct {
	// Lock is the acquired (or restored) lock, on Client; the Session
	// renews and releases through it while the master set's client and the
	// TTL stay the same, so that its requests stay ordered after the
	// acquisition's own. Optional.
	Lock *redlock.Lock
	// Client is the client Lock came from.
	Client *redlock.Client
	// Key and Value identify the grant on the masters.
	Key, Value string
	// Token is the grant's fencing token (0 when unfenced): renewals carry
	// it to the masters they put the value back on (redlock.WithToken).
	Token int64
	// Slot is the semaphore slot Key is (redlock.WithSlot), nil for a plain
	// lock: renewals keep the semaphore's number of slots stored with it.
	Slot *redlock.Slot
	// TTL is the time to live of each renewal.
	TTL time.Duration
	// Every is the renew interval.
	Every time.Duration
	// ValidUntil is the grant's validity when the Session starts.
	ValidUntil time.Time
	// Votes of the acquisition (or the adopting extension).
	Votes []redlock.Vote
	// OthersCopiesUntil is, for an adopted grant, when the copies whoever
	// renewed it before wrote may have expired by (a deposed leader that
	// wakes from a pause may still renew it until its own validity); zero
	// for a grant this process made. State.ExpiresBy is never earlier.
	OthersCopiesUntil time.Time
}

// RestoreOptions are the options by which the grant is restored on a
// client: its token, and its slot for a semaphore's.
func (g Grant) RestoreOptions() []redlock.RestoreOption {
	opts := []redlock.RestoreOption{redlock.WithToken(g.Token)}
	if g.Slot != nil {
		opts = append(opts, redlock.WithSlot(*g.Slot))
	}
	return opts
}

// Config is what a Session needs besides its grant.
type Config struct {
	// Client returns the master set's current client (nil when there is
	// none): renewals follow a client rebuilt for a new auth Secret.
	Client func() *redlock.Client
	// Reports receives the Session after each successful renewal and when
	// it ended by itself (the grant was lost); optional.
	Reports *Reports
	// Metrics receives renewal failures and lateness (optional).
	Metrics *metrics.Metrics
	// Reasons maps a renewal error to a condition reason for LostError.
	Reasons func(error) string
	// Floor returns the latest validity readers were shown (optional):
	// renewals keep the keys at least until then, whatever the TTL (see
	// CoveringTTL).
	Floor func() time.Time
}

// State is a consistent snapshot of a Session.
type State struct {
	RenewedAt  time.Time
	ValidUntil time.Time
	// ExpiresBy is when every copy of the grant this Session wrote has
	// expired (redlock.Lock.ExpiresBy, over every renewal it sent, failed
	// ones included); it stays after the Session ended.
	ExpiresBy time.Time
	Votes     []redlock.Vote
	Renewals  int
}

// Session renews one grant. Its methods are safe for concurrent use.
type Session struct {
	grant Grant
	cfg   Config

	mu    sync.Mutex
	state State
	lk    *redlock.Lock
	lkOn  *redlock.Client // the client lk belongs to
	// poke asks the loop for a renewal now.
	poke  chan struct{}
	ttl   time.Duration
	every time.Duration
	err   error

	cancel  context.CancelFunc
	stopped chan struct{} // the renew loop returned
	done    chan struct{} // closed once err is set
	endOnce sync.Once
}

// Hold starts renewing g. The renewals stop when ctx ends (the grant is
// then orphaned), or on Release, Orphan or loss.
func Hold(ctx context.Context, g Grant, cfg Config) *Session {
	ctx, cancel := context.WithCancel(ctx)
	// Without the Lock that acquired it (an adopted grant), whoever renewed
	// it before may have sent a renewal up to its validity: a TTL on top
	// covers that.
	expiresBy := g.ValidUntil.Add(g.TTL)
	if g.Lock != nil {
		expiresBy = g.Lock.ExpiresBy()
	}
	if g.OthersCopiesUntil.After(expiresBy) {
		expiresBy = g.OthersCopiesUntil
	}
	s := &Session{
		grant: g, cfg: cfg,
		state:   State{RenewedAt: time.Now(), ValidUntil: g.ValidUntil, ExpiresBy: expiresBy, Votes: g.Votes},
		ttl:     g.TTL,
		every:   g.Every,
		lk:      g.Lock,
		lkOn:    g.Client,
		cancel:  cancel,
		poke:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
		done:    make(chan struct{}),
	}
	if s.cfg.Reasons == nil {
		s.cfg.Reasons = func(error) string { return v1alpha1.ReasonLost }
	}
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.LocksHeld.Inc()
	}
	go func() {
		defer close(s.stopped)
		err := s.loop(ctx)
		if err == nil {
			err = ErrOrphaned // ctx ended: nobody asked for anything else
		}
		if s.end(err) && errors.Is(err, ErrLost) {
			s.cfg.Reports.post(s)
		}
	}()
	return s
}

// Key returns the grant's Redis key.
func (s *Session) Key() string { return s.grant.Key }

// Done is closed when the Session has ended.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err returns why the Session ended (nil while it runs): an error matching
// ErrReleased, ErrOrphaned or ErrLost (a *LostError).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// State returns a snapshot. ValidUntil is zero once the grant is known lost
// or released.
func (s *Session) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state
	st.Votes = append([]redlock.Vote(nil), st.Votes...)
	return st
}

// RenewSoon asks for a renewal now rather than on schedule, without
// waiting for it: the Session posts itself to Reports when it is done.
func (s *Session) RenewSoon() {
	select {
	case s.poke <- struct{}{}:
	default: // a renewal is asked for already
	}
}

// SetTiming follows spec changes: the next renewal uses ttl and every.
func (s *Session) SetTiming(ttl, every time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ttl, s.every = ttl, every
}

// Orphan stops renewing and leaves the keys to expire or to be taken over.
func (s *Session) Orphan() {
	s.stop(ErrOrphaned)
}

// Release stops renewing and deletes the grant's value from the masters.
// It returns the release's error (redlock.ErrNotHeld when no master held it
// any more); an incomplete release leaves copies that expire with the TTL.
func (s *Session) Release(ctx context.Context) error {
	s.stop(ErrReleased)
	c := s.cfg.Client()
	if c == nil {
		return redlock.ErrQuorumUnavailable
	}
	s.mu.Lock()
	lk := s.lk
	if s.lkOn != c {
		lk = nil
	}
	s.mu.Unlock()
	if lk == nil {
		// Restored with no validity: a lock that can only be released.
		var err error
		if lk, err = c.Restore(s.grant.Key, s.grant.Value, s.timing().ttl, time.Time{}, s.grant.RestoreOptions()...); err != nil {
			return fmt.Errorf("release %q: %w", s.grant.Key, err)
		}
	}
	return lk.Release(ctx)
}

// stop ends the loop and waits for it; the first reason to end wins.
func (s *Session) stop(why error) {
	s.end(why)
	s.cancel()
	<-s.stopped
}

// end records why the Session ended; it reports whether this call did.
func (s *Session) end(err error) bool {
	first := false
	s.endOnce.Do(func() {
		first = true
		s.mu.Lock()
		s.err = err
		if !errors.Is(err, ErrOrphaned) {
			s.state.ValidUntil = time.Time{}
		}
		s.mu.Unlock()
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.LocksHeld.Dec()
		}
		close(s.done)
	})
	return first
}

type timing struct{ ttl, every time.Duration }

func (s *Session) timing() timing {
	s.mu.Lock()
	defer s.mu.Unlock()
	return timing{s.ttl, s.every}
}

// loop renews until ctx ends (nil) or the grant is lost (a *LostError).
func (s *Session) loop(ctx context.Context) error {
	failures := 0
	var lastErr error
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		st := s.State()
		tm := s.timing()
		now := time.Now()
		next := nextRenewal(st.RenewedAt, tm.every, failures, st.ValidUntil, now)
		wake := next
		if st.ValidUntil.Before(wake) {
			wake = st.ValidUntil
		}
		timer.Reset(max(wake.Sub(now), 0))
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-s.poke:
		}
		select {
		case <-s.poke: // asked before this renewal started: it answers that
		default:
		}
		now = time.Now()
		if !now.Before(st.ValidUntil) {
			return &LostError{Reason: v1alpha1.ReasonValidityExpired, Err: lastErr}
		}
		if late := now.Sub(next); late > 0 && s.cfg.Metrics != nil {
			s.cfg.Metrics.RenewLateness.Observe(late.Seconds())
		}
		err := s.renew(ctx, tm.ttl, st.ValidUntil)
		switch {
		case err == nil:
			failures, lastErr = 0, nil
			s.cfg.Reports.post(s)
			continue
		case ctx.Err() != nil:
			return nil
		}
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.RenewFailures.WithLabelValues(s.cfg.Reasons(err)).Inc()
		}
		if errors.Is(err, redlock.ErrExpired) {
			// The validity passed before a quorum renewed it (or before
			// the attempt could start, on a busy machine).
			return &LostError{Reason: v1alpha1.ReasonValidityExpired, Err: err}
		}
		if errors.Is(err, redlock.ErrNotHeld) || errors.Is(err, redlock.ErrInvalidArgument) {
			return &LostError{Reason: s.cfg.Reasons(err), Err: err}
		}
		failures++
		lastErr = err
	}
}

// renew extends the grant once on the master set's current client; validUntil
// is the latest renewal's validity. The TTL asked for never lets the keys
// expire before a validity readers were or may be shown: after spec.ttl
// shrank, the larger of the two is used until the new TTL covers both the
// floor and validUntil, which the status writer may show while this
// renewal is on its way.
func (s *Session) renew(ctx context.Context, ttl time.Duration, validUntil time.Time) error {
	c := s.cfg.Client()
	if c == nil {
		return fmt.Errorf("renew %q: no client for the master set: %w", s.grant.Key, redlock.ErrQuorumUnavailable)
	}
	floor := validUntil
	if s.cfg.Floor != nil && s.cfg.Floor().After(floor) {
		floor = s.cfg.Floor()
	}
	s.mu.Lock()
	ttl = CoveringTTL(ttl, floor, time.Now())
	lk := s.lk
	if s.lkOn != c || lk == nil || lk.TTL() != ttl {
		lk = nil
	}
	s.mu.Unlock()
	if lk == nil {
		var err error
		if lk, err = c.Restore(s.grant.Key, s.grant.Value, ttl, validUntil, s.grant.RestoreOptions()...); err != nil {
			return fmt.Errorf("renew %q: %w", s.grant.Key, err)
		}
	}
	octx, cancel := context.WithDeadline(ctx, validUntil)
	defer cancel()
	err := lk.Extend(octx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if by := lk.ExpiresBy(); by.After(s.state.ExpiresBy) {
		s.state.ExpiresBy = by // a failed renewal may have reached some masters
	}
	if err != nil {
		return err
	}
	s.lk, s.lkOn = lk, c
	if s.err == nil || errors.Is(s.err, ErrOrphaned) {
		s.state.RenewedAt, s.state.ValidUntil, s.state.Votes = time.Now(), lk.ValidUntil(), lk.Votes()
		s.state.Renewals++
	}
	return nil
}

// CoveringTTL is the TTL a renewal at now asks for: ttl, or more when the
// validity shown to readers lies further ahead than ttl would reach (ttl
// was shortened under a held grant), in whole milliseconds.
func CoveringTTL(ttl time.Duration, shown, now time.Time) time.Duration {
	need := shown.Sub(now)
	if need <= 0 {
		return ttl
	}
	// The renewal's validity is start + t − Drift(t), start ≥ now.
	t := (need + redlock.Drift(need)).Truncate(time.Millisecond) + time.Millisecond
	for t-redlock.Drift(t) < need {
		t += time.Millisecond
	}
	return max(ttl, t)
}

// nextRenewal returns when a held grant is next renewed: every after the
// last renewal, or sooner after a failure, and never later than a third of
// the remaining validity before the deadline.
func nextRenewal(last time.Time, every time.Duration, failures int, validUntil, now time.Time) time.Time {
	next := last.Add(every)
	if failures > 0 {
		retry := min(every/4, time.Second)
		next = now.Add(retry)
	}
	if latest := validUntil.Add(-validUntil.Sub(last) / 3); next.After(latest) && latest.After(now) {
		next = latest
	}
	return next
}
