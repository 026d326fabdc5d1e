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

// setArgs returns the arguments of SET key value PX ttl NX, to be shared
// like script.args.
func setArgs(key, value string, ttlMillis int64) []any {
	return []any{"set", key, value, "px", ttlMillis, "nx"}
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

	// fencedSetScript is SET key value NX PX ttl that, only when the SET
	// succeeded, takes a fencing token from the key's counter (KEYS[2]; see
	// takeTokenLua). The counter is checked before the SET so that a
	// malformed counter grants nothing.
	fencedSetScript = newScript(fenceCounterLua + takeTokenLua + `local c, e = counter()
if e then return e end
if not redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2], "NX") then return false end
return take(c)`)

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

// set sends SET key value PX ttl NX, with args from setArgs.
func (n *node) set(ctx context.Context, args []any) (Outcome, error) {
	cmd := redis.NewStatusCmd(ctx, args...)
	n.process(ctx, cmd)
	switch err := cmd.Err(); {
	case err == nil:
		return OutcomeGranted, nil
	case errors.Is(err, redis.Nil):
		return OutcomeHeld, nil
	default:
		return OutcomeError, err
	}
}

// setFencedArgs returns the arguments of fencedSetScript for setFenced.
func setFencedArgs(key, value string, ttlMillis int64) []any {
	return fencedSetScript.args([]string{key, FenceKey(key)}, value, ttlMillis)
}

// setFenced runs fencedSetScript (args from setFencedArgs): SET key value NX
// PX ttl and, when it was granted, the master's fencing token for key.
func (n *node) setFenced(ctx context.Context, args []any) (Outcome, int64, error) {
	s, err := n.eval(ctx, fencedSetScript, args).Text()
	switch {
	case errors.Is(err, redis.Nil):
		return OutcomeHeld, 0, nil
	case err != nil:
		return OutcomeError, 0, err
	}
	tok, err := strconv.ParseInt(s, 10, 64)
	if err != nil || tok <= 0 {
		// The SET was granted: a failed acquisition's clean-up, or the
		// lock's release, removes the value like any straggler's.
		return OutcomeError, 0, fmt.Errorf("fencing token reply %q: not a positive integer", s)
	}
	return OutcomeGranted, tok, nil
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
