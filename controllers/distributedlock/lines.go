package distributedlock

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// lines (nil: off) keeps this manager's waiting locks in the waiting lines
// of their keys on the masters (redlock.CheckTurn), so that locks in every
// cluster sharing the masters attempt first come, first served. Before an
// attempt a lock peeks at its key's line, and attempts at once when nobody
// waits; a lock that finds its key held joins the line then (its arrival),
// and from then on attempts only in its turn. A line orders attempts only:
// exclusion is SET NX on a quorum, a ticket never frees or shortens a key,
// and any error on the line lets the lock attempt as before (and its
// master set's locks attempt without the line for lineRetry). A lock that
// does not attempt in a reconcile (held back by this cluster's rules, no
// longer requested, gone) leaves its line, and never holds another
// cluster's waiters up. A semaphore's slot lock waits in the semaphore's
// line, whose first N waiters may attempt (redlock.CheckSlotTurn), for
// the pod it attempts for: the waiter is that pod, so that the slots of
// every cluster sharing the key serve waiting pods first come, first
// served, N at a time. The reasoning: docs/design/waiting-lines.md.
type lines struct {
	now func() time.Time
	// checks counts the checks before attempts, by result.
	checks *prometheus.CounterVec

	mu     sync.Mutex
	places map[types.NamespacedName]linePlace
	// unusable is when a client's line last could not be used (a refused
	// command, masters not answering): its locks attempt without the line
	// for lineRetry, each attempt costing no failing round.
	unusable map[*redlock.Client]time.Time
}

// linePlace is one lock's place in its key's line.
type linePlace struct {
	uid types.UID
	// waiter is its id in the line: the lock's UID, or the pod a slot's
	// lock attempts for (lineWaiter).
	waiter string
	ticket int64 // 0: none taken
	ahead  int   // waiters ahead at the last check
	// freeSince is when the key was seen free at a check with as many
	// waiters ahead as now (zero: held at the last check).
	freeSince time.Time
	client    *redlock.Client
	// key is the line's lock key: the lock's, or its semaphore's.
	key string
	// semaphore: the line is a semaphore's, whose N heads are waiters:
	// one leaving with a slot makes room for the next.
	semaphore bool
}

// lineBound is how long a lock with waiters ahead waits while its key is
// free on a majority of the masters, with no waiter ahead leaving, before
// it attempts anyway: the longest retry delay (5 s) and a second, by which
// a live waiter ahead would have attempted. Registrations that raced, a
// master that restarted and forgot the line, or a waiter that stopped
// without leaving never leave nobody attempting.
const lineBound = 6 * time.Second

// lineRetry is how long a master set's locks attempt without their line
// after it could not be used.
const lineRetry = time.Minute

// lineLeaveTimeout bounds a LeaveLine, made in the background.
const lineLeaveTimeout = 2 * time.Second

// lineWaitMessage is the Held message (reason HeldElsewhere) of a lock
// waiting for its turn, and slotLineWaitMessage a semaphore's slot
// lock's: one text each, so that checks write no status.
const (
	lineWaitMessage     = "waiting in the key's line on the masters: a lock that came first (in this cluster or another sharing the masters) attempts first; this one attempts in its turn, or once the key has been free for 6s"
	slotLineWaitMessage = "waiting in the semaphore's line on the masters: the first pods to come (in this cluster or another sharing the masters), as many as the semaphore has slots, attempt; this one attempts in its turn, or once its slot has been free for 6s"
)

// waitMessage is lock's Held message while it waits for its turn.
func waitMessage(lock *v1alpha1.DistributedLock) string {
	if slotOf(lock) != nil {
		return slotLineWaitMessage
	}
	return lineWaitMessage
}

// Results of a check before an attempt (redlock_lock_line_checks_total).
const (
	lineClear       = "clear"       // nobody waits: attempt
	lineTurn        = "turn"        // its turn came: attempt
	lineWait        = "wait"        // waiters ahead: wait
	lineBounded     = "bound"       // waiters ahead, the key free for lineBound: attempt
	lineUnavailable = "unavailable" // the line could not be used, or is full: attempt
)

func newLines(now func() time.Time, checks *prometheus.CounterVec) *lines {
	return &lines{now: now, checks: checks, places: map[types.NamespacedName]linePlace{}, unusable: map[*redlock.Client]time.Time{}}
}

// lineLife is how long one registration of a lock that retries after
// retry stands: its wait for a notice (waitLease), and at least 30 s, so
// that a reconcile delayed on a loaded manager keeps its place; a waiter
// that stops without leaving holds a free key up for lineBound only.
func lineLife(retry time.Duration) time.Duration {
	return min(redlock.MaxLineLife, max(waitLease(retry), 30*time.Second).Truncate(time.Millisecond))
}

// lineWaiter is lock's id in its line when it attempts for holder: the
// lock's UID, or for a semaphore's slot the pod it attempts for (none: the
// lock's), whose place follows it to whichever slot it is given.
func lineWaiter(lock *v1alpha1.DistributedLock, holder *v1alpha1.LockHolder) string {
	if slotOf(lock) != nil && holder != nil && holder.Pod != nil {
		return string(holder.Pod.UID)
	}
	return string(lock.UID)
}

// lineKey is the lock key whose line lock waits in, and whose release
// notices wake it: its own, or its semaphore's (whose channel tells of
// every slot's release and every withdrawal from the semaphore's line).
func lineKey(lock *v1alpha1.DistributedLock) string {
	if slot := slotOf(lock); slot != nil {
		return slot.Semaphore
	}
	return lock.RedisKey()
}

// peek and check are redlock's PeekTurn and CheckTurn for lock's line.
func peek(ctx context.Context, c *redlock.Client, lock *v1alpha1.DistributedLock) redlock.Turn {
	if slot := slotOf(lock); slot != nil {
		return c.PeekSlotTurn(ctx, *slot)
	}
	return c.PeekTurn(ctx, lock.RedisKey())
}

func check(ctx context.Context, c *redlock.Client, lock *v1alpha1.DistributedLock, waiter string, ticket int64, life time.Duration) redlock.Turn {
	if slot := slotOf(lock); slot != nil {
		return c.CheckSlotTurn(ctx, *slot, waiter, ticket, life)
	}
	return c.CheckTurn(ctx, lock.RedisKey(), waiter, ticket, life)
}

// mayAttempt reports whether lock, whose name is name, may attempt on c
// now as waiter (lineWaiter), checking its line (and keeping its place
// there): yes when nobody waits (for a slot, fewer than the semaphore's
// number), when its turn came, when the line cannot be used, or when the
// key has been free for lineBound with waiters still ahead. When not,
// recheck is when to look again for the bound (0: at the retry delay).
func (l *lines) mayAttempt(ctx context.Context, name types.NamespacedName, lock *v1alpha1.DistributedLock, waiter string, c *redlock.Client, retry time.Duration) (ok bool, recheck time.Duration) {
	if l == nil {
		return true, 0
	}
	now := l.now()
	p, usable := l.placeOf(name, lock, waiter, c, now)
	if !usable {
		return true, 0
	}
	lctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if p.ticket == 0 {
		t := peek(lctx, c, lock)
		if t.Err != nil {
			return l.unavailable(c, now, true), 0
		}
		if t.Go {
			l.checks.WithLabelValues(lineClear).Inc()
			return true, 0
		}
	}
	t := check(lctx, c, lock, waiter, p.ticket, lineLife(retry))
	if t.Err != nil || t.Ticket == 0 {
		// Its place, if any, stands: the next check keeps it.
		return l.unavailable(c, now, t.Err != nil), 0
	}
	progress := t.Ahead < p.ahead // a new place has none ahead yet
	p.ticket, p.ahead, p.client, p.key, p.semaphore = t.Ticket, t.Ahead, c, lineKey(lock), slotOf(lock) != nil
	result := lineWait
	switch {
	case t.Go:
		result, p.freeSince = lineTurn, time.Time{}
	case !t.Free:
		p.freeSince = time.Time{}
	case p.freeSince.IsZero() || progress:
		// The bound counts from here: a waiter ahead that left, or
		// attempted, shows the line moving.
		p.freeSince, recheck = now, lineBound
	case now.Sub(p.freeSince) >= lineBound:
		result = lineBounded
	default:
		recheck = lineBound - now.Sub(p.freeSince)
	}
	l.mu.Lock()
	l.places[name] = p
	l.mu.Unlock()
	l.checks.WithLabelValues(result).Inc()
	return result != lineWait, recheck
}

// placeOf is lock's place in its line as waiter (a new one, with no
// ticket, when it has none, or name's place was another lock's or
// waiter's: a slot's lock that attempts for another pod withdraws the
// last one's), and whether c's line is in use at now (unavailable).
func (l *lines) placeOf(name types.NamespacedName, lock *v1alpha1.DistributedLock, waiter string, c *redlock.Client, now time.Time) (linePlace, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.places[name]
	if ok && (p.uid != lock.UID || p.waiter != waiter) {
		delete(l.places, name)
		p.leave(name, true)
		ok = false
	}
	if !ok {
		p = linePlace{uid: lock.UID, waiter: waiter}
	}
	at, bad := l.unusable[c]
	return p, !bad || now.Sub(at) >= lineRetry
}

// unavailable counts a check whose line could not be used (failed) or
// was full, and when it failed lets c's locks attempt without their line
// for lineRetry (a full line is one key's: the others still serve); it
// reports that the lock may attempt.
func (l *lines) unavailable(c *redlock.Client, now time.Time, failed bool) bool {
	l.checks.WithLabelValues(lineUnavailable).Inc()
	if !failed {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unusable[c] = now
	for cl, at := range l.unusable {
		if now.Sub(at) >= lineRetry {
			delete(l.unusable, cl)
		}
	}
	return true
}

// join takes lock a place in its line as waiter once an attempt found
// the key held, unless it holds one or its line is not in use: its
// arrival.
func (l *lines) join(ctx context.Context, name types.NamespacedName, lock *v1alpha1.DistributedLock, waiter string, c *redlock.Client, retry time.Duration) {
	if l == nil {
		return
	}
	now := l.now()
	if p, usable := l.placeOf(name, lock, waiter, c, now); p.ticket != 0 || !usable {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	t := check(lctx, c, lock, waiter, 0, lineLife(retry))
	if t.Err != nil || t.Ticket == 0 {
		l.unavailable(c, now, t.Err != nil)
		return // no place: attempts as without one
	}
	l.mu.Lock()
	l.places[name] = linePlace{uid: lock.UID, waiter: waiter, ticket: t.Ticket, ahead: t.Ahead, client: c, key: lineKey(lock), semaphore: slotOf(lock) != nil}
	l.mu.Unlock()
}

// granted takes name's lock out of its line: it holds the key.
func (l *lines) granted(name types.NamespacedName) { l.leave(name, false) }

// withdraw takes name's lock out of its line without the key: it stopped
// attempting, or is gone. The masters tell the waiters behind it (a
// release notice), so that the next checks its turn at once.
func (l *lines) withdraw(name types.NamespacedName) { l.leave(name, true) }

// leave takes name's lock out of its line, in the background. Only its
// ticket is taken out, so that a leave landing after a newer registration
// spares it; a ticket a leave misses lapses on the masters' clocks.
func (l *lines) leave(name types.NamespacedName, withdrawn bool) {
	if l == nil {
		return
	}
	l.mu.Lock()
	p, ok := l.places[name]
	delete(l.places, name)
	l.mu.Unlock()
	if ok {
		p.leave(name, withdrawn)
	}
}

// leave takes the place's ticket out of its line, in the background. A
// waiter that withdraws tells the waiters behind it (a release notice),
// and so does one that leaves a semaphore's line with its slot: the next
// waiter is a head now.
func (p linePlace) leave(name types.NamespacedName, withdrawn bool) {
	if p.ticket == 0 {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), lineLeaveTimeout)
		defer cancel()
		out := p.client.LeaveLine
		if withdrawn || p.semaphore {
			out = p.client.WithdrawFromLine
		}
		if err := out(ctx, p.key, p.waiter, p.ticket); err != nil {
			logf.Log.WithName("lines").V(1).Info("waiting line not left: the ticket lapses", "lock", name, "error", err.Error())
		}
	}()
}
