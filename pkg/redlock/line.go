package redlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Waiting lines. A key's line on every master orders the attempts of the
// clients waiting for it (clusters sharing the masters), first come, first
// served. It orders attempts only: acquire, extend and release never read
// it, a ticket's lapse frees nothing, and any error on the line lets the
// waiter attempt as if there were none.
//
// A waiter takes a ticket one above the highest a quorum of masters show
// (quorums intersect: a waiter registered on a quorum before is seen, and
// is ahead), and registers it on every master for a while, renewed by each
// check. Ties break by waiter id, the same on every master. A waiter may
// attempt when no lower live ticket stands on a majority of the masters
// that answered; tickets lapse on the masters' own clocks. Lines order
// cooperating clients: a waiter id must be unique among all clients of
// the masters (a second registration of one id replaces the first), and
// a client that passes another's ticket jumps the line. A joint client
// keeps lines on its new list only: during a membership change, clients
// of the previous list see another line (the order suffers, never
// exclusion).

// lineSuffix ends every line's key: a lock key may not end in it.
const lineSuffix = ":line"

// LineKey is the key of key's waiting line.
func LineKey(key string) string { return key + lineSuffix }

// MaxLineLife bounds how long one registration stands: a waiter that
// stopped renewing holds no line up for longer.
const MaxLineLife = time.Minute

// MaxLine bounds the live tickets of one lock's line: the masters run
// without eviction, and a full line would otherwise grow without end. A
// semaphore's line holds its heads beyond it (MaxLine + slots - 1), so
// that it orders waiters however many slots it has. A waiter refused a
// place waits as if there were no line.
const MaxLine = 32

// LineACLRules are the rules a client needs beyond ACLRules to use
// waiting lines: the line script's sorted-set commands and PTTL.
const LineACLRules = "+zadd +zrem +zrange +pttl"

// lineScript keeps the line KEYS[1] of the key KEYS[2]. ARGV: the waiter's
// id, its ticket (0: none), how long its registration stands in ms (0: it
// registers nothing), MaxLine, and "check" or "leave" (the waiter's entry
// only if it holds that ticket, whatever it holds with 0). It drops lapsed
// tickets, and returns {live tickets ahead of the waiter's, the highest
// other live ticket, 1 registered | 0 not asked | -1 the line is full,
// KEYS[2]'s PTTL (-2: the key is free here), the waiter's own live ticket
// before the call (0: none)}; a leave's third value is 1 when it took the
// entry out. It never touches KEYS[2].
var lineScript = newScript(`local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id, tk, life, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local ahead, top, n, mine, mineEnd, mineTk, last = 0, 0, 0, nil, 0, 0, 0
for i = 1, #all, 2 do
  local m, s = all[i], tonumber(all[i + 1])
  local w, e = string.match(m, '^(.*)|(%d+)$')
  e = tonumber(e)
  if not e or e <= now then
    redis.call('ZREM', KEYS[1], m)
  elseif w == id then
    mine, mineEnd, mineTk = m, e, s
  else
    n = n + 1
    if s > top then top = s end
    if e > last then last = e end
    if tk > 0 and (s < tk or (s == tk and before(w, id))) then ahead = ahead + 1 end
  end
end
local own = mineTk
if ARGV[5] == 'leave' then
  if mine and (tk == 0 or mineTk == tk) then
    redis.call('ZREM', KEYS[1], mine)
    return {0, top, 1, -2, mineTk}
  end
  return {0, top, 0, -2, mineTk}
end
local reg = 0
if tk > 0 and life > 0 then
  if mine then redis.call('ZREM', KEYS[1], mine) end
  mine = nil
  if n >= cap then
    reg = -1
  else
    redis.call('ZADD', KEYS[1], ARGV[2], id .. '|' .. string.format('%.0f', now + life))
    reg = 1
    if now + life > last then last = now + life end
  end
end
if mine and mineEnd > last then last = mineEnd end
if last > now then redis.call('PEXPIRE', KEYS[1], string.format('%.0f', last - now)) end
return {ahead, top, reg, redis.call('PTTL', KEYS[2]), own}`)

// lineAnswer is one master's answer to lineScript.
type lineAnswer struct {
	ahead, top, reg, pttl int64
	// own is the waiter's live ticket on the master (0: none).
	own int64
}

// Turn is a waiter's place in a key's line, from one check.
type Turn struct {
	// Ticket is the waiter's ticket, to pass to the next check; 0 when it
	// has none (the line is full, or could not be read).
	Ticket int64
	// Go: the waiter may attempt now. No lower live ticket stands on a
	// majority of the masters that answered, or the line could not be
	// used (Err): a line never keeps anyone from attempting.
	Go bool
	// Registered: a quorum of masters hold the waiter's ticket.
	Registered bool
	// Ahead is the most waiters ahead of it on one master.
	Ahead int
	// Free: the key is free on a majority of the masters that answered.
	Free bool
	// Err is why the line could not be used, or nil.
	Err error
}

// ErrLineUnavailable is the Turn.Err of a line fewer than a quorum of
// masters answered for (down, refusing the line's commands, or holding
// another type under its key).
var ErrLineUnavailable = errors.New("waiting line unavailable")

// CheckTurn registers waiter (an id of the waiting client, unique among
// all clients of the masters, without "|") in the line of the lock key
// for life (whole milliseconds, at most MaxLineLife), taking a ticket when
// ticket is 0, and tells whether it may attempt: the first waiter of the
// line may. With ticket 0, a waiter whose ticket still stands on a quorum
// (its client restarted) takes that ticket again, and keeps its place. It costs one round, two for a new ticket. A ctx that ends
// first gives no turn and ctx's error.
func (c *Client) CheckTurn(ctx context.Context, key, waiter string, ticket int64, life time.Duration) Turn {
	if err := validateKey(OpAcquire, key); err != nil {
		return Turn{Go: true, Err: err}
	}
	return c.checkTurn(ctx, key, LineKey(key), waiter, ticket, 1, life)
}

// CheckSlotTurn is CheckTurn for a waiter on the slot s of a semaphore:
// the semaphore's line, whose first s.Slots waiters may attempt (waiters,
// not holders: a head whose slot is held fails its attempt as without a
// line). Turn.Free is about s's own key.
func (c *Client) CheckSlotTurn(ctx context.Context, s Slot, waiter string, ticket int64, life time.Duration) Turn {
	if err := validateSlot(OpAcquire, s); err != nil {
		return Turn{Go: true, Err: err}
	}
	return c.checkTurn(ctx, s.Key(), LineKey(s.Semaphore), waiter, ticket, s.Slots, life)
}

func (c *Client) checkTurn(ctx context.Context, key, line, waiter string, ticket int64, heads int, life time.Duration) Turn {
	if err := validateLine(waiter, ticket, life); err != nil {
		return Turn{Go: true, Err: err}
	}
	if ticket == 0 {
		// A ticket above every one a quorum shows: a quorum's answers do.
		answers, err := c.lineRound(ctx, key, line, waiter, 0, 0, heads, "check", func(a []lineAnswer, _ int) bool { return len(a) >= c.quorum })
		if err != nil {
			return Turn{Go: ctx.Err() == nil, Err: err}
		}
		ticket = ticketFrom(answers, c.quorum)
	}
	answers, err := c.lineRound(ctx, key, line, waiter, ticket, life, heads, "check", func(a []lineAnswer, pending int) bool {
		return turnSettled(a, pending, heads, ticket, c.quorum)
	})
	if err != nil {
		return Turn{Go: ctx.Err() == nil, Err: err}
	}
	return turnOf(answers, heads, ticket, c.quorum)
}

// ticketFrom is the ticket a waiter with none takes from a quorum's
// answers: the live ticket a quorum shows it still holds (a client that
// restarted, or a waiter whose manager changed, resumes its place), or
// one above every ticket they show.
func ticketFrom(answers []lineAnswer, quorum int) int64 {
	var top int64
	own := map[int64]int{}
	for _, a := range answers {
		top = max(top, a.top)
		if a.own > 0 {
			own[a.own]++
		}
	}
	for t, n := range own {
		if n >= quorum {
			return t
		}
	}
	return top + 1
}

// lineCounts counts the masters' answers a turn is made of.
type lineCounts struct {
	// open: fewer than heads ahead; free: the key free; registered, full:
	// the registration taken, refused for a full line; ahead: the most
	// waiters ahead on one master.
	open, free, registered, full, ahead int
}

func countLine(answers []lineAnswer, heads int) lineCounts {
	var c lineCounts
	for _, a := range answers {
		c.ahead = max(c.ahead, int(a.ahead))
		if a.ahead < int64(heads) {
			c.open++
		}
		if a.pttl == -2 {
			c.free++
		}
		switch a.reg {
		case 1:
			c.registered++
		case -1:
			c.full++
		}
	}
	return c
}

// turnOf is the turn the masters' answers give a waiter with ticket (or
// none) when heads waiters may attempt at once.
func turnOf(answers []lineAnswer, heads int, ticket int64, quorum int) Turn {
	n := countLine(answers, heads)
	t := Turn{Ticket: ticket, Ahead: n.ahead}
	t.Free = 2*n.free > len(answers)
	t.Go = 2*n.open > len(answers)
	if ticket == 0 {
		return t
	}
	t.Registered = n.registered >= quorum
	if !t.Registered && 2*n.full > len(answers) {
		// No place: wait as if there were no line.
		t.Ticket, t.Go = 0, true
	}
	return t
}

// turnSettled reports whether the answers of a quorum give the waiter its
// turn whatever the pending masters answer, or if they do not answer:
// every count the turn compares with a majority or a quorum comes out the
// same with each pending answer for it and with each against it. A paused
// master then costs a waiter whose turn it is nothing; a waiter that
// waits hears every master (until the node timeout).
func turnSettled(answers []lineAnswer, pending, heads int, ticket int64, quorum int) bool {
	if len(answers) < quorum {
		return false
	}
	c, n := countLine(answers, heads), len(answers)+pending
	majority := func(k int) bool { return (2*k > n) == (2*(k+pending) > n) }
	if !majority(c.open) || !majority(c.free) {
		return false
	}
	if ticket > 0 && c.registered < quorum && (c.registered+pending >= quorum || !majority(c.full)) {
		return false
	}
	// Only a turn: a waiter that waits reads Ahead, which only the
	// pending answers can raise (a smaller count from the first answers
	// would pass for the line moving).
	return turnOf(answers, heads, ticket, quorum).Go
}

// PeekTurn tells, in one round and registering nothing, whether a client
// with no ticket may attempt the lock key at once: Go when no live ticket
// stands on a majority of the masters that answered, or the line could
// not be used (Err). A client that then finds the key held takes a ticket
// with CheckTurn; one that peeks and attempts costs the uncontended path
// one round, not a registration's two and a leave.
func (c *Client) PeekTurn(ctx context.Context, key string) Turn {
	if err := validateKey(OpAcquire, key); err != nil {
		return Turn{Go: true, Err: err}
	}
	return c.peekTurn(ctx, key, LineKey(key), 1)
}

// PeekSlotTurn is PeekTurn for the slot s of a semaphore: Go when fewer
// than s.Slots live tickets stand in the semaphore's line on a majority.
func (c *Client) PeekSlotTurn(ctx context.Context, s Slot) Turn {
	if err := validateSlot(OpAcquire, s); err != nil {
		return Turn{Go: true, Err: err}
	}
	return c.peekTurn(ctx, s.Key(), LineKey(s.Semaphore), s.Slots)
}

// peekTicket is above every ticket a line holds: every live ticket is
// ahead of it. peekWaiter is no waiter's id (ids hold no "|").
const (
	peekTicket = 1 << 53
	peekWaiter = "|peek"
)

func (c *Client) peekTurn(ctx context.Context, key, line string, heads int) Turn {
	answers, err := c.lineRound(ctx, key, line, peekWaiter, peekTicket, 0, heads, "check", func(a []lineAnswer, pending int) bool {
		return turnSettled(a, pending, heads, 0, c.quorum)
	})
	if err != nil {
		return Turn{Go: ctx.Err() == nil, Err: err}
	}
	return turnOf(answers, heads, 0, c.quorum)
}

// LeaveLine takes waiter's ticket out of the line of key (a lock's or a
// semaphore's) on every master that answers: it was granted. Only the
// entry with ticket is taken out (0: whatever ticket it holds), so that a
// late leave spares a newer registration. A ticket left behind lapses by
// itself.
func (c *Client) LeaveLine(ctx context.Context, key, waiter string, ticket int64) error {
	return c.leaveLine(ctx, key, waiter, ticket, "leave")
}

// WithdrawFromLine is LeaveLine for a waiter that stops waiting without
// the key. With WithReleaseNotices, every master it left tells the key's
// channel (NoticeChannel) in the background, so that the waiters behind
// it check their turn at once rather than after their retry delay.
func (c *Client) WithdrawFromLine(ctx context.Context, key, waiter string, ticket int64) error {
	return c.leaveLine(ctx, key, waiter, ticket, "withdraw")
}

func (c *Client) leaveLine(ctx context.Context, key, waiter string, ticket int64, mode string) error {
	if err := validateKey(OpAcquire, key); err != nil {
		return err
	}
	if err := validateLine(waiter, ticket, time.Millisecond); err != nil {
		return err
	}
	_, err := c.lineRound(ctx, key, LineKey(key), waiter, ticket, 0, 1, mode, nil)
	return err
}

// lineRound runs lineScript on every master of the client's list and
// returns the answers of those that answered and may vote (a master
// restarted within the quarantine window holds a line it forgot), or
// errLineUnavailable when fewer than a quorum did. heads is how many
// waiters may attempt at once (a lock's 1, a semaphore's slots), which
// sizes the line. mode is "check", "leave", or "withdraw" (a leave that
// tells the key's channel where it took a ticket out). It returns once every
// master answered, or once settled (nil: never) holds for the answers so
// far and how many masters have yet to answer.
func (c *Client) lineRound(ctx context.Context, key, line, waiter string, ticket int64, life time.Duration, heads int, mode string, settled func(answers []lineAnswer, pending int) bool) ([]lineAnswer, error) {
	scriptMode := mode
	if mode == "withdraw" {
		scriptMode = "leave"
	}
	args := lineScript.args([]string{line, key}, waiter, ticket, life.Milliseconds(), MaxLine+heads-1, scriptMode)
	// A withdrawal's notices carry one payload on every master.
	withdrawal := releaseID(key, "\x00withdraw\x00"+waiter+"|"+strconv.FormatInt(ticket, 10))
	out, errs, err := listRound(ctx, c, func(ctx context.Context, n *node) (lineAnswer, error) {
		res, err := n.eval(ctx, lineScript, args).Int64Slice()
		if err != nil {
			return lineAnswer{}, err
		}
		if len(res) != 5 {
			return lineAnswer{}, fmt.Errorf("waiting line: unexpected reply %v", res)
		}
		if mode == "withdraw" && res[2] == 1 && c.cfg.releaseNotices {
			c.publishRelease(n, key, withdrawal, c.lineTimeout())
		}
		return lineAnswer{ahead: res[0], top: res[1], reg: res[2], pttl: res[3], own: res[4]}, nil
	}, settled)
	if err != nil {
		return nil, fmt.Errorf("waiting line of %q: %w", key, err)
	}
	if len(out) < c.quorum {
		return nil, fmt.Errorf("%w: %d of %d masters answered for key %q: %w", ErrLineUnavailable, len(out), c.quorum, key, errors.Join(errs...))
	}
	return out, nil
}

// listRound sends to every master of the list grants are made on (the
// masters only a joint client's previous list names hold no part of the
// lines or of the slots' view), each bounded by the line timeout, and
// returns the answers of those that answered, with the errors of those
// that did not: once every master answered, or once settled (nil: never)
// holds for the answers so far and how many masters have yet to answer.
// Its error is the start's (a closed client) or ctx's.
func listRound[T any](ctx context.Context, c *Client, send func(context.Context, *node) (T, error), settled func(answers []T, pending int) bool) ([]T, []error, error) {
	got := make([]T, len(c.nodes))
	r, err := c.startVotingRound(ctx, c.lineTimeout(), func(ctx context.Context, i int, n *node) (Outcome, error) {
		if !n.inList(0) {
			return OutcomeError, errNotInList
		}
		a, err := send(ctx, n)
		if err != nil {
			return OutcomeError, err
		}
		got[i] = a
		return OutcomeGranted, nil
	})
	if err != nil {
		return nil, nil, err
	}
	defer r.finish()
	votes, err := r.collect(ctx, func(_ []Tally, answered []bool) bool {
		if settled == nil {
			return false
		}
		var so []T
		pending := 0
		for i, n := range c.nodes {
			switch {
			case !answered[i]:
				if n.inList(0) {
					pending++
				}
			case r.votes[i].Outcome == OutcomeGranted:
				so = append(so, got[i])
			}
		}
		return settled(so, pending)
	})
	if err != nil {
		return nil, nil, err
	}
	var out []T
	var errs []error
	for i, v := range votes {
		if v.Outcome == OutcomeGranted {
			out = append(out, got[i])
		} else if v.Err != nil && !errors.Is(v.Err, errNotInList) {
			errs = append(errs, v.Err)
		}
	}
	return out, errs, nil
}

// lineTimeout bounds each master's answer in a line's round: the node
// timeout, or MaxNodeTimeout without WithNodeTimeout (a line's rounds are
// for no lock's ttl).
func (c *Client) lineTimeout() time.Duration {
	if c.cfg.nodeTimeout > 0 {
		return c.cfg.nodeTimeout
	}
	return MaxNodeTimeout
}

// errNotInList: a master only a joint client's previous list names holds
// no part of the lines.
var errNotInList = errors.New("not in the client's list")

// validateLine checks a waiter's id, ticket and registration life.
func validateLine(waiter string, ticket int64, life time.Duration) error {
	switch {
	case waiter == "" || strings.Contains(waiter, "|") || len(waiter) > maxBulkLen/2:
		return invalidf(OpAcquire, "waiter id %q is empty, too long or holds %q", waiter, "|")
	case ticket < 0:
		return invalidf(OpAcquire, "ticket %d", ticket)
	case life < time.Millisecond || life > MaxLineLife || life%time.Millisecond != 0:
		return invalidf(OpAcquire, "registration life %v: whole milliseconds from 1ms to %v", life, MaxLineLife)
	}
	return nil
}
