package redlock

import (
	"context"
	"crypto/sha1" //nolint:gosec // Redis names cached scripts by their SHA-1 (EVALSHA); no security rests on it
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// script is a Lua script sent as EVALSHA, and as EVAL when the master does
// not have it cached yet (NOSCRIPT).
type script struct{ src, sha string }

func newScript(src string) *script {
	h := sha1.Sum([]byte(src)) //nolint:gosec // EVALSHA names scripts by SHA-1
	return &script{src: src, sha: hex.EncodeToString(h[:])}
}

// args returns EVALSHA's arguments for keys and argv. An operation builds
// them once and shares them among its masters' requests: go-redis only
// reads a command's arguments.
func (s *script) args(keys []string, argv ...any) []any {
	a := make([]any, 0, 3+len(keys)+len(argv))
	a = append(a, "evalsha", s.sha, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	return append(a, argv...)
}

// eval runs a script with arguments from script.args: EVALSHA, then EVAL
// when the master answers NOSCRIPT (its script cache is empty after a
// restart or SCRIPT FLUSH). The NOSCRIPT answer ran nothing, so the EVAL
// runs the script once.
func (n *node) eval(ctx context.Context, s *script, args []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	n.process(ctx, cmd)
	if err := cmd.Err(); err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
		return cmd
	}
	eargs := append([]any{"eval", s.src}, args[2:]...)
	cmd = redis.NewCmd(ctx, eargs...)
	n.process(ctx, cmd)
	return cmd
}

// The scripts compare the stored value with the lock's before touching the
// key and tell "another value" (0) from "no key" (-1).
var (
	releaseScript = newScript(`local v = redis.call("GET", KEYS[1])
if v == ARGV[1] then return redis.call("DEL", KEYS[1]) end
if v == false then return -1 end
return 0`)
	extendScript = newScript(`local v = redis.call("GET", KEYS[1])
if v == ARGV[1] then
  redis.call("PEXPIRE", KEYS[1], ARGV[2], "GT")
  return 1
end
if v == false then return -1 end
return 0`)

	// lockSetScript is SET key value NX PX ttl for a plain lock taking a
	// fencing token. KEYS: the key, its fencing counter; ARGV: value, ttl.
	// It refuses ({-3}) while the key holds a semaphore's [Declaration]: a
	// semaphore of the key has holders there, and a key is one kind.
	// Otherwise it answers {0} when the key holds a value and {1, token}
	// when granted (see setNXLua). An acquisition without a token is a
	// plain SET (see newSetCall).
	lockSetScript = newScript(fenceCounterLua + takeTokenLua + setNXLua + isDeclarationLua + `local v = redis.call("GET", KEYS[1])
if v then
  if isDeclaration(v) then return {-3} end
  return {0}
end
return setNX(true, function() end)`)

	// raiseFenceScript sets the counter KEYS[1] to max(counter, ARGV[1]).
	raiseFenceScript = newScript(`local t = tonumber(ARGV[1])
local c = redis.call("GET", KEYS[1])
if c then
  c = tonumber(c)
  if c == nil then
    return redis.error_reply("ERR fence counter " .. KEYS[1] .. " is not a number")
  end
  if c >= t then return 1 end
end
redis.call("SET", KEYS[1], ARGV[1])
return 1`)
)

// FenceKey returns the name of the fencing-token counter of the lock key
// on every master: key + ":fence". It is a plain string holding the last
// token taken for key on that master, written without a TTL, so it survives
// as long as the master keeps its data; masters must run with
// maxmemory-policy noeviction (an evicted counter falls back to the
// master's clock, like a restart without persistence). Acquire with
// WithFencing reads and writes it; Release and Extend never touch it. Keys
// that end in ":fence" are refused as lock keys (ErrInvalidArgument).
func FenceKey(key string) string { return key + fenceSuffix }

// fenceSuffix ends every fencing counter's key; lock keys may not end in it
// (the lock "k:fence" would be the counter of the lock "k").
const fenceSuffix = ":fence"

// setCall is the SET NX of an acquisition or a restore: a plain SET for a
// plain lock without a token, lockSetScript with one, slotSetScript for a
// semaphore's slot, with its arguments (shared among the masters'
// requests, like script.args).
type setCall struct {
	s    *script // nil: args is a SET ... NX GET, refused (-3) when it finds a declaration
	args []any
	// refusal is the error of a refusing reply's code (below 0).
	refusal func(code int64, reply []any) error
}

// newSetCall returns the SET NX of value under key, a semaphore's slot
// when slot is non-nil, taking a fencing token when fenced.
func newSetCall(key string, slot *Slot, value string, ttlMillis int64, fenced bool) setCall {
	if slot != nil {
		f := "0"
		if fenced {
			f = "1"
		}
		return slotSetCall(*slot, value, ttlMillis, f)
	}
	refusal := func(code int64, _ []any) error {
		if code != -3 {
			return nil
		}
		return &KindConflictError{Key: key, Held: KindSemaphore}
	}
	if !fenced {
		// A semaphore of the key keeps its declaration under the key, so a
		// plain SET NX finds the key taken; GET tells which kind took it.
		return setCall{args: []any{"set", key, value, "px", ttlMillis, "nx", "get"}, refusal: refusal}
	}
	return setCall{s: lockSetScript, args: lockSetScript.args([]string{key, FenceKey(key)}, value, ttlMillis), refusal: refusal}
}

// setNX runs c: OutcomeGranted with the master's fencing token when one
// was asked for, OutcomeHeld when the key holds another value, and
// OutcomeHeld with the refusal's error when the master refused it.
func (n *node) setNX(ctx context.Context, c setCall) (Outcome, int64, error) {
	if c.s == nil {
		cmd := redis.NewStringCmd(ctx, c.args...)
		n.process(ctx, cmd)
		held, err := cmd.Result()
		switch {
		case errors.Is(err, redis.Nil):
			return OutcomeGranted, 0, nil
		case err != nil:
			return OutcomeError, 0, err
		case isDeclaration(held):
			return OutcomeHeld, 0, c.refusal(-3, nil)
		}
		return OutcomeHeld, 0, nil
	}
	reply, err := n.eval(ctx, c.s, c.args).Slice()
	if err != nil {
		return OutcomeError, 0, err
	}
	var code int64
	if len(reply) > 0 {
		code, _ = reply[0].(int64)
	}
	switch {
	case code == 0 && len(reply) == 1:
		return OutcomeHeld, 0, nil
	case code < 0:
		if e := c.refusal(code, reply); e != nil {
			return OutcomeHeld, 0, e
		}
	case code == 1 && len(reply) == 1:
		return OutcomeGranted, 0, nil
	case code == 1 && len(reply) == 2:
		str, _ := reply[1].(string)
		tok, err := strconv.ParseInt(str, 10, 64)
		if err != nil || tok <= 0 {
			// Granted: a failed acquisition's clean-up, or the lock's
			// release, removes the value like any straggler's.
			return OutcomeError, 0, fmt.Errorf("fencing token reply %q: not a positive integer", str)
		}
		return OutcomeGranted, tok, nil
	}
	return OutcomeError, 0, fmt.Errorf("unexpected SET script reply %v", reply)
}

// raiseFenceArgs returns the arguments of raiseFenceScript for raiseFence.
func raiseFenceArgs(key string, token int64) []any {
	return raiseFenceScript.args([]string{FenceKey(key)}, strconv.FormatInt(token, 10))
}

// raiseFence sets key's fencing counter to at least the token in args (from
// raiseFenceArgs).
func (n *node) raiseFence(ctx context.Context, args []any) (Outcome, error) {
	return scriptOutcome(n.eval(ctx, raiseFenceScript, args).Int64())
}

// scriptCall is one script with its arguments: built once per operation and
// shared among its masters' requests, like script.args.
type scriptCall struct {
	s    *script
	args []any
}

// run sends c to the master and classifies the script's reply: 1 done, 0
// another value, -1 no key.
func (n *node) run(ctx context.Context, c scriptCall) (Outcome, error) {
	return scriptOutcome(n.eval(ctx, c.s, c.args).Int64())
}

// releaseCall deletes key if it holds value; for a semaphore's slot (slot
// non-nil) it also drops the declaration once no slot of it is left on the
// master (see slotReleaseScript).
func releaseCall(key, value string, slot *Slot) scriptCall {
	if slot != nil {
		return slotReleaseCall(*slot, value)
	}
	return scriptCall{releaseScript, releaseScript.args([]string{key}, value)}
}

// extendCall sets key's TTL if it holds value; it never creates the key,
// nor shortens a copy's remaining life: another process may renew the same
// value with a longer TTL (a lock restored by an adopter), and a late
// extension must not cut its copies short (PEXPIRE GT, Redis 7: no command
// beyond ACLRules). For a semaphore's slot it keeps the declaration alive
// as long as the slot (see slotExtendScript).
func extendCall(key, value string, ttlMillis int64, slot *Slot) scriptCall {
	if slot != nil {
		return slotExtendCall(*slot, value, ttlMillis)
	}
	return scriptCall{extendScript, extendScript.args([]string{key}, value, ttlMillis)}
}

func scriptOutcome(r int64, err error) (Outcome, error) {
	if err != nil {
		return OutcomeError, err
	}
	switch r {
	case 1:
		return OutcomeGranted, nil
	case 0:
		return OutcomeHeld, nil
	case -1:
		return OutcomeAbsent, nil
	default:
		return OutcomeError, fmt.Errorf("unexpected script reply %d", r)
	}
}
