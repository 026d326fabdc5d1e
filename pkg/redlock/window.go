package redlock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// WindowKey is the key on every master where clients register their
// quarantine windows. Clients of sets with different maxLockTTLs sharing a
// server (in one cluster or several, naming it by any address) thereby all
// quarantine it by the longest: a server that restarted empty does not vote
// for any of them while a lock granted with the longest ttl may be valid.
// Lock keys may not be WindowKey. It lies under the prefix of the operator's
// default lock keys ("redlock:<namespace>/<name>"), so an ACL narrowed to
// ~redlock:* covers it.
const WindowKey = "redlock:quarantine-window"

// MaxWindow bounds a window read from a master: a longer one (a value no
// client of this package registers) is ignored.
const MaxWindow = 48 * time.Hour

// windowLife is how long a registration stands after it was made: twice its
// window. The client that made it registers again on every connection and
// probe; once it stops (its set deleted, its maxLockTTL lowered), every lock
// it granted has expired well before its registration does.
func windowLife(w time.Duration) time.Duration { return 2 * w }

// windowScript keeps on KEYS[1] the registered windows and when each lapses,
// on the master's clock, as "window=expiry,…" in ms; it registers ARGV[1]
// for ARGV[2] ms and ARGV[3] for ARGV[4] ms (0: none), drops lapsed entries
// and those over ARGV[5], and returns the longest window standing and how
// long it stands. A value of another type or form is replaced.
const windowScript = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap = tonumber(ARGV[5])
local entries = {}
local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'string' then
  for w, e in string.gmatch(raw, '(%d+)=(%d+)') do
    w = tonumber(w)
    e = tonumber(e)
    if w > 0 and w <= cap and e > now and (entries[w] == nil or entries[w] < e) then entries[w] = e end
  end
end
for i = 1, 3, 2 do
  local w = tonumber(ARGV[i])
  local e = now + tonumber(ARGV[i + 1])
  if w > 0 and w <= cap and (entries[w] == nil or entries[w] < e) then entries[w] = e end
end
local best, life, last, parts = 0, 0, now, {}
for w, e in pairs(entries) do
  if w > best then best, life = w, e - now end
  if e > last then last = e end
  parts[#parts + 1] = string.format('%.0f=%.0f', w, e)
end
if #parts > 0 then
  redis.call('SET', KEYS[1], table.concat(parts, ','), 'PX', string.format('%.0f', last - now))
end
return {string.format('%.0f', best), string.format('%.0f', life)}`

// registerWindow registers on the master, over s (the connection being set
// up, or the client's pool), this client's own window and the longest it
// carries for the server (one another client registered, which a master
// without persistence forgot on restarting), and learns the longest
// standing there. A master that refuses
// the script for want of permission still votes, quarantined by this
// client's own window only: the error is kept for the set's status (an ACL
// narrowed before WindowKey existed must not take every master out on an
// upgrade).
func (n *node) registerWindow(ctx context.Context, s redis.Scripter) error {
	now := n.cfg.now()
	// No lock outlives MaxWindow (the API caps maxLockTTL at 24h): a
	// longer own window protects no other set's locks more.
	own := min(n.cfg.quarantine, MaxWindow)
	var carried, life time.Duration
	n.mu.Lock()
	if w := n.windowLocked(now); w > n.cfg.quarantine {
		carried, life = w, n.carriedUntil.Sub(now)
	}
	n.mu.Unlock()
	keys := []string{WindowKey}
	args := []any{own.Milliseconds(), windowLife(own).Milliseconds(), carried.Milliseconds(), life.Milliseconds(), MaxWindow.Milliseconds()}
	res, err := s.Eval(ctx, windowScript, keys, args...).StringSlice()
	if err != nil {
		if redis.HasErrorPrefix(err, "NOPERM") {
			n.mu.Lock()
			n.windowErr = fmt.Errorf("register the quarantine window in key %s: %w (allow EVAL and that key to the ACL user)", WindowKey, err)
			n.mu.Unlock()
			return nil
		}
		return fmt.Errorf("register the quarantine window in key %s: %w", WindowKey, err)
	}
	var best, stands int64
	if len(res) != 2 {
		return fmt.Errorf("register the quarantine window: unexpected reply %q", res)
	}
	if _, err := fmt.Sscan(res[0]+" "+res[1], &best, &stands); err != nil {
		return fmt.Errorf("register the quarantine window: unexpected reply %q: %w", res, err)
	}
	n.learn(time.Duration(best)*time.Millisecond, time.Duration(stands)*time.Millisecond, now)
	return nil
}

// learn records the longest window standing on the master and how long it
// stands (both from registerWindow). A longer window than the one the
// master was judged by keeps it out until that window has passed since it
// may have begun to lose keys, as if known at the connection.
func (n *node) learn(w, stands time.Duration, now time.Time) {
	n.mu.Lock()
	n.windowErr = nil
	if w <= n.cfg.quarantine || w > MaxWindow {
		n.mu.Unlock()
		return
	}
	until := now.Add(stands)
	var event *QuarantineEvent
	if cur := n.windowLocked(now); w > cur || (w == cur && until.After(n.carriedUntil)) {
		n.carried, n.carriedUntil = w, until
		if w > cur && !n.since.IsZero() {
			event = n.quarantineLocked(now, w, false)
		}
	}
	n.mu.Unlock()
	if event != nil {
		n.cfg.observer.ObserveQuarantine(*event)
	}
}

// windowLocked is the window the master is quarantined by now: the client's
// own, or a longer one carried while it stands. n.mu must be held.
func (n *node) windowLocked(now time.Time) time.Duration {
	if n.carried > n.cfg.quarantine && now.Before(n.carriedUntil) {
		return n.carried
	}
	return n.cfg.quarantine
}
