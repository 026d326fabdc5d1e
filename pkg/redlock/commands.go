package redlock

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// The scripts compare the stored value with the lock's before touching the
// key and tell "another value" (0) from "no key" (-1).
var (
	releaseScript = redis.NewScript(`local v = redis.call("GET", KEYS[1])
if v == ARGV[1] then return redis.call("DEL", KEYS[1]) end
if v == false then return -1 end
return 0`)
	extendScript = redis.NewScript(`local v = redis.call("GET", KEYS[1])
if v == ARGV[1] then return redis.call("PEXPIRE", KEYS[1], ARGV[2]) end
if v == false then return -1 end
return 0`)
)

// set sends SET key value NX PX ttl.
func (n *node) set(ctx context.Context, key, value string, ttlMillis int64) (Outcome, error) {
	err := n.rdb.Do(ctx, "SET", key, value, "PX", ttlMillis, "NX").Err()
	switch {
	case err == nil:
		return OutcomeGranted, nil
	case errors.Is(err, redis.Nil):
		return OutcomeHeld, nil
	default:
		return OutcomeError, err
	}
}

// release deletes key if it holds value.
func (n *node) release(ctx context.Context, key, value string) (Outcome, error) {
	return scriptOutcome(releaseScript.Run(ctx, n.rdb, []string{key}, value).Int64())
}

// extend sets key's TTL if it holds value; it never creates the key.
func (n *node) extend(ctx context.Context, key, value string, ttlMillis int64) (Outcome, error) {
	return scriptOutcome(extendScript.Run(ctx, n.rdb, []string{key}, value, ttlMillis).Int64())
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
