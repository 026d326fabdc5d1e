package redlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// MaxSlots is the largest number of slots a semaphore may have.
const MaxSlots = 1000

// MaxSemaphoreKeyLen is the longest key of a semaphore, in bytes: the
// release of a slot reads every slot's key.
const MaxSemaphoreKeyLen = 1024

// Slot names one slot of a semaphore: up to Slots holders of the semaphore
// Semaphore at once, each holding one slot, a lock of its own under
// [SlotKey](Semaphore, Index) with its own fencing counter.
type Slot struct {
	// Semaphore is the semaphore's key, shared by every holder.
	Semaphore string
	// Slots is how many holders the semaphore admits at once, from 1 to
	// MaxSlots. It is stored on the masters under the semaphore's key
	// ([Declaration]): holders that declare another number are refused
	// while a slot is held.
	Slots int
	// Index is this slot, from 0 to Slots-1.
	Index int
}

// Key returns the Redis key of the slot's lock.
func (s Slot) Key() string { return SlotKey(s.Semaphore, s.Index) }

// SlotKey returns the key of slot i of the semaphore key: key + ":slot:" +
// i. Its fencing counter is [FenceKey] of it.
func SlotKey(key string, i int) string { return key + slotInfix + strconv.Itoa(i) }

// Declaration returns what every master stores under a semaphore's key
// while it holds a slot of it: the semaphore's number of slots, marked so
// that no lock value reads as one. Every grant of a slot writes it, with a
// TTL at least that of any slot copy on the master; a grant finding
// another number there is refused ([ErrSlotsConflict]); a plain lock of
// the key finds the key taken ([ErrKindConflict]); the release of the
// master's last slot copy removes it.
func Declaration(slots int) string { return declarationPrefix + strconv.Itoa(slots) }

// declarationPrefix starts every [Declaration]; lock values may not
// (validateValue).
const declarationPrefix = "redlock:semaphore:slots="

// isDeclaration reports whether v, stored under a key, is a semaphore's
// [Declaration] rather than a plain lock's value.
func isDeclaration(v string) bool { return strings.HasPrefix(v, declarationPrefix) }

// declaredSlots reads a [Declaration]'s number of slots: 0 when v holds
// none.
func declaredSlots(v string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(v, declarationPrefix))
	if err != nil || n < 1 || n > MaxSlots || !isDeclaration(v) {
		return 0
	}
	return n
}

// slotInfix separates a semaphore's key from a slot's index.
const slotInfix = ":slot:"

// parseSlotKey splits a slot's key ("<semaphore>:slot:<index>").
func parseSlotKey(key string) (sem string, index int, ok bool) {
	i := strings.LastIndex(key, slotInfix)
	if i < 0 {
		return "", 0, false
	}
	digits := key[i+len(slotInfix):]
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return "", 0, false
	}
	index, err := strconv.Atoi(digits)
	return key[:i], index, err == nil
}

// ErrSlotsConflict reports that masters store another number of slots for
// the semaphore ([Declaration]) than the acquisition declared: holders that
// declare another number hold slots of it. It is read from the votes that
// arrived before the decision, like [ErrLockHeld].
var ErrSlotsConflict = errors.New("semaphore declared with another number of slots")

// SlotsConflictError is the error of a master's vote that refused a slot
// because it stores another number of slots for the semaphore.
type SlotsConflictError struct {
	// Semaphore is the semaphore's key.
	Semaphore string
	// Declared is the number of slots the master stores; 0 when its
	// declaration does not hold a number of slots.
	Declared int
	// Slots is what the refused acquisition declared.
	Slots int
}

// Error describes the conflict.
func (e *SlotsConflictError) Error() string {
	if e.Declared == 0 {
		return fmt.Sprintf("semaphore %q: the master's declaration under the key holds no number of slots", e.Semaphore)
	}
	return fmt.Sprintf("semaphore %q is declared with %d slots on this master, not %d", e.Semaphore, e.Declared, e.Slots)
}

// fenceCounterLua defines counter(): the fencing counter KEYS[2] (0 when
// absent), or nil and an error reply when it is malformed, so that a
// malformed counter grants nothing.
const fenceCounterLua = `local function counter()
  local c = redis.call("GET", KEYS[2])
  if not c then return 0 end
  c = tonumber(c)
  if c == nil or c < 0 or c >= 9007199254740991 or c ~= math.floor(c) then
    return nil, redis.error_reply("ERR fence counter " .. KEYS[2] .. " is not an integer in [0, 2^53-1)")
  end
  return c
end
`

// setNXLua defines setNX(fenced, granted): SET KEYS[1] ARGV[1] NX PX
// ARGV[2], answering {0} when the key holds a value and, when granted,
// after granted() ran, {1} or with fenced {1, token} (see counter and
// take). The counter is checked before the SET so that a malformed
// counter grants nothing (its error reply is returned).
const setNXLua = `local function setNX(fenced, granted)
  local c = 0
  if fenced then
    local e
    c, e = counter()
    if e then return e end
  end
  if not redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2], "NX") then return {0} end
  granted()
  if not fenced then return {1} end
  return {1, take(c)}
end
`

// takeTokenLua defines take(c): a fencing token from the counter c read
// by counter(), max(c + 1, TIME in microseconds), stored back into KEYS[2]
// and returned as a decimal string (Lua numbers are doubles: integers
// below 2^53 are exact, a string keeps them so on the wire). Redis 7
// replicates script effects, so TIME may precede a write.
const takeTokenLua = `local function take(c)
  local t = redis.call("TIME")
  local s = string.format("%.0f", math.max(c + 1, tonumber(t[1]) * 1000000 + tonumber(t[2])))
  redis.call("SET", KEYS[2], s)
  return s
end
`

// isDeclarationLua defines isDeclaration(v): whether a value under a key
// is a semaphore's [Declaration] rather than a plain lock's value.
var isDeclarationLua = fmt.Sprintf(`local function isDeclaration(v)
  return string.sub(v, 1, %d) == %q
end
`, len(declarationPrefix), declarationPrefix)

var (
	// slotSetScript is SET slot value NX PX ttl for a semaphore's slot.
	// KEYS: the slot, its fencing counter, the semaphore's key; ARGV:
	// value, ttl, the declaration, "1" to take a fencing token. It refuses
	// ({-3}) while a plain lock holds the semaphore's key (a key is one
	// kind), and ({-2, declared}) when the key declares another number,
	// and otherwise answers {0} when the slot holds a value, {1} when
	// granted and {1, token} when granted with a token. A grant writes
	// the declaration, never shortening its TTL: it outlives every slot
	// copy on the master, so a holder of any slot keeps other numbers,
	// and plain locks of the key, out.
	slotSetScript = newScript(fenceCounterLua + takeTokenLua + setNXLua + isDeclarationLua + `local d = redis.call("GET", KEYS[3])
if d and d ~= ARGV[3] then
  if not isDeclaration(d) then return {-3} end
  return {-2, d}
end
return setNX(ARGV[4] == "1", function()
  if d then
    redis.call("PEXPIRE", KEYS[3], ARGV[2], "GT")
  else
    redis.call("SET", KEYS[3], ARGV[3], "PX", ARGV[2])
  end
end)`)

	// slotExtendScript is extendScript for a semaphore's slot (KEYS: the
	// slot, the semaphore's key; ARGV: value, ttl, the declaration): it
	// extends the slot and the declaration together, so that the
	// declaration outlives the slot's copy (both only ever lengthened by
	// the same TTLs, the declaration's starting at least as long). A copy
	// whose declaration is gone or another (a master that evicted it:
	// semaphores, like fencing counters, need maxmemory-policy
	// noeviction) is not extended and answers 0, "another value": when in
	// doubt, not held. Like every script here, it calls no command beyond
	// ACLRules.
	slotExtendScript = newScript(`local v = redis.call("GET", KEYS[1])
if v == ARGV[1] then
  if redis.call("GET", KEYS[2]) ~= ARGV[3] then return 0 end
  redis.call("PEXPIRE", KEYS[1], ARGV[2], "GT")
  redis.call("PEXPIRE", KEYS[2], ARGV[2], "GT")
  return 1
end
if v == false then return -1 end
return 0`)

	// slotReleaseScript is releaseScript for a semaphore's slot (KEYS: the
	// slot, the semaphore's key; ARGV: value, slots, the declaration):
	// once the slot is deleted and no slot of the declared number is left
	// on the master, it deletes the declaration too, so that the key is
	// free at once (for a new number, or a plain lock) rather than after
	// its TTL. The slots' keys are built here, only when the value
	// matched, so that a release (and a failed attempt's clean-up, sent to
	// every master) costs no more for a thousand slots than for one; the
	// masters are independent servers, never a Redis Cluster, so keys a
	// script does not declare are theirs to read.
	slotReleaseScript = newScript(`local v = redis.call("GET", KEYS[1])
if v ~= ARGV[1] then
  if v == false then return -1 end
  return 0
end
redis.call("DEL", KEYS[1])
if redis.call("GET", KEYS[2]) ~= ARGV[3] then return 1 end
for i = 0, tonumber(ARGV[2]) - 1 do
  if redis.call("GET", KEYS[2] .. ":slot:" .. i) then return 1 end
end
redis.call("DEL", KEYS[2])
return 1`)
)

// slotSetCall is newSetCall for a semaphore's slot: a master storing
// another number of slots refuses it with a *SlotsConflictError, one
// where a plain lock holds the semaphore's key with a *KindConflictError.
func slotSetCall(s Slot, value string, ttlMillis int64, fenced string) setCall {
	return setCall{
		s:    slotSetScript,
		args: slotSetScript.args([]string{s.Key(), FenceKey(s.Key()), s.Semaphore}, value, ttlMillis, Declaration(s.Slots), fenced),
		refusal: func(code int64, reply []any) error {
			switch {
			case code == -3:
				return &KindConflictError{Key: s.Semaphore, Held: KindLock}
			case code == -2 && len(reply) == 2:
				str, _ := reply[1].(string)
				return &SlotsConflictError{Semaphore: s.Semaphore, Declared: declaredSlots(str), Slots: s.Slots}
			}
			return nil
		},
	}
}

func slotExtendCall(s Slot, value string, ttlMillis int64) scriptCall {
	return scriptCall{slotExtendScript, slotExtendScript.args([]string{s.Key(), s.Semaphore}, value, ttlMillis, Declaration(s.Slots))}
}

func slotReleaseCall(s Slot, value string) scriptCall {
	return scriptCall{slotReleaseScript, slotReleaseScript.args([]string{s.Key(), s.Semaphore}, value, strconv.Itoa(s.Slots), Declaration(s.Slots))}
}

// validateSlot checks a slot's names and numbers; nothing is sent.
func validateSlot(op Op, s Slot) error {
	if s.Slots < 1 || s.Slots > MaxSlots {
		return invalidf(op, "a semaphore has from 1 to %d slots, not %d", MaxSlots, s.Slots)
	}
	if s.Index < 0 || s.Index >= s.Slots {
		return invalidf(op, "slot %d of a semaphore of %d slots: slots are numbered from 0 to %d", s.Index, s.Slots, s.Slots-1)
	}
	if len(s.Semaphore) > MaxSemaphoreKeyLen {
		return invalidf(op, "semaphore key of %d bytes exceeds %d", len(s.Semaphore), MaxSemaphoreKeyLen)
	}
	return validateKey(op, s.Semaphore)
}

// refusedFor reports whether the masters that refused with an error of
// type E (*SlotsConflictError, *KindConflictError) are enough, alone, to
// keep a quorum from granting (in some list): one stale refusal on a
// minority is no reason to stop trying.
func refusedFor[E error](c *Client, votes []Vote) bool {
	refusals := make([]Vote, len(votes))
	for i, v := range votes {
		refusals[i] = Vote{Outcome: OutcomePending}
		if e := *new(E); errors.As(v.Err, &e) && v.Outcome == OutcomeHeld {
			refusals[i].Outcome = OutcomeHeld
		}
	}
	return c.anyList(c.tallies(refusals), func(t Tally, size, quorum int) bool { return size-t.Held < quorum })
}

// AcquireSlot acquires slot s.Index of the semaphore s.Semaphore of s.Slots
// slots: a lock (the returned Lock's Key is s.Key()) that is also refused
// with ErrSlotsConflict while masters store another number of slots for
// the semaphore ([Declaration]), and with ErrKindConflict while a plain
// lock holds the semaphore's key, and that keeps its own number stored
// there while it is held. Use it when the caller assigns slots itself (the
// operator gives each slot a DistributedLock); AcquireSemaphore takes any
// free one. Options, retries and errors are Acquire's; WithFencing takes a
// token strictly increasing per slot: a fenced resource compares (slot,
// token), keeping the last token it accepted for each slot.
func (c *Client) AcquireSlot(ctx context.Context, s Slot, ttl time.Duration, opts ...AcquireOption) (*Lock, error) {
	if err := validateSlot(OpAcquire, s); err != nil {
		return nil, err
	}
	ac, err := c.prepareAcquire(ttl, opts)
	if err != nil {
		return nil, err
	}
	return c.retry(ctx, s.Key(), func(attempt int) (*Lock, error) {
		return c.acquireOnce(ctx, s.Key(), &s, ac, ttl, attempt)
	})
}

// AcquireSemaphore acquires any free slot of the semaphore key of slots
// slots (see AcquireSlot), so that at most slots holders hold it at once,
// across clients and processes that declare the same number. Each attempt
// tries the slots in turn from a random one, one round each, until one is
// granted; a conflicting declaration (ErrSlotsConflict), a plain lock of
// the key (ErrKindConflict) or an unavailable quorum
// (ErrQuorumUnavailable) ends the attempt at once, and ErrLockHeld
// means every slot was held. Lock.Slot tells which slot was taken.
func (c *Client) AcquireSemaphore(ctx context.Context, key string, slots int, ttl time.Duration, opts ...AcquireOption) (*Lock, error) {
	if err := validateSlot(OpAcquire, Slot{Semaphore: key, Slots: slots}); err != nil {
		return nil, err
	}
	ac, err := c.prepareAcquire(ttl, opts)
	if err != nil {
		return nil, err
	}
	return c.retry(ctx, key, func(attempt int) (*Lock, error) {
		first := rand.N(slots)
		var last error
		for k := range slots {
			s := Slot{Semaphore: key, Slots: slots, Index: (first + k) % slots}
			l, err := c.acquireOnce(ctx, s.Key(), &s, ac, ttl, attempt)
			if err == nil || !errors.Is(err, ErrLockHeld) && !errors.Is(err, ErrExpired) {
				return l, err
			}
			last = err
		}
		// Every slot was held (or granted too late to count): the
		// semaphore is full.
		var votes []Vote
		if e := (*Error)(nil); errors.As(last, &e) {
			votes = e.Votes
		}
		e := c.opError(OpAcquire, key, ErrLockHeld, nil, votes)
		e.detail = fmt.Sprintf("all %d slots held (votes of the last slot tried)", slots)
		return nil, e
	})
}

// Slot returns the semaphore slot the lock holds, and false for a plain
// lock.
func (l *Lock) Slot() (Slot, bool) {
	if l.slot == nil {
		return Slot{}, false
	}
	return *l.slot, true
}

// WithSlot restores a semaphore's slot (Lock.Slot): the key given to
// Restore must be s.Key(). Its extensions then keep the semaphore's number
// of slots stored, and its release removes it with the last slot.
func WithSlot(s Slot) RestoreOption {
	return func(l *Lock) { l.slot = &s }
}

// heldSlotsScript answers, for the semaphore key ARGV[1] of ARGV[2]
// slots, 1 for each slot whose key holds a value on the master and 0 for
// each free one. It reads the slots' keys without declaring them, as
// slotReleaseScript does, and calls GET only.
var heldSlotsScript = newScript(`local out = {}
for i = 0, tonumber(ARGV[2]) - 1 do
  if redis.call("GET", ARGV[1] .. ":slot:" .. i) then out[i + 1] = 1 else out[i + 1] = 0 end
end
return out`)

// FreeSlots tells, in one round and deciding nothing, which slots of the
// semaphore key of slots slots are free: slot i is free when its key
// holds no value on a majority of the masters that answered (a quorum at
// least; ErrQuorumUnavailable otherwise). A slot seen free may be taken
// a moment later, and one seen held may be released: only an acquisition
// takes a slot. It lets a caller that assigns slots itself (AcquireSlot:
// the operator's semaphores) give a waiter a slot that no other holder
// (another cluster sharing the masters) holds. The round ends once a
// quorum agrees on every slot, or when every master answered or timed
// out (the node timeout).
func (c *Client) FreeSlots(ctx context.Context, key string, slots int) ([]bool, error) {
	if err := validateSlot(OpAcquire, Slot{Semaphore: key, Slots: slots}); err != nil {
		return nil, err
	}
	args := heldSlotsScript.args(nil, key, slots)
	// held counts, per slot, the answers that hold it.
	held := func(answers [][]int64) []int {
		counts := make([]int, slots)
		for _, a := range answers {
			for s, h := range a {
				counts[s] += int(h)
			}
		}
		return counts
	}
	answers, errs, err := listRound(ctx, c, func(ctx context.Context, n *node) ([]int64, error) {
		res, err := n.eval(ctx, heldSlotsScript, args).Int64Slice()
		if err == nil && len(res) != slots {
			err = fmt.Errorf("free slots: unexpected reply %v", res)
		}
		return res, err
	}, func(answers [][]int64, _ int) bool {
		n := len(answers)
		for _, h := range held(answers) {
			if h < c.quorum && n-h < c.quorum {
				return false // no quorum agrees on this slot yet
			}
		}
		return n >= c.quorum
	})
	if err != nil {
		return nil, fmt.Errorf("free slots of %q: %w", key, err)
	}
	n := len(answers)
	if n < c.quorum {
		return nil, fmt.Errorf("%w: %d of %d masters answered for the slots of %q: %w", ErrQuorumUnavailable, n, c.quorum, key, errors.Join(errs...))
	}
	free := make([]bool, slots)
	for s, h := range held(answers) {
		free[s] = 2*(n-h) > n
	}
	return free, nil
}
