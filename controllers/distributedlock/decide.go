package distributedlock

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// holderAction is what the DistributedLock controller does with the holder.
type holderAction int

const (
	// actNone: nothing to do in Redis (not requested, or held and renewed).
	actNone holderAction = iota
	// actAcquire: acquire for the requested holder with the next token.
	actAcquire
	// actAdopt: the status shows a valid holder that this manager does not
	// renew (it restarted, or leadership moved): restore and extend it.
	actAdopt
	// actRelease: the holder is no longer requested.
	actRelease
	// actHandover: another holder is requested: release, then acquire.
	actHandover
)

func (a holderAction) String() string {
	return [...]string{"none", "acquire", "adopt", "release", "handover"}[a]
}

// holderInputs is what decideHolder needs to know.
type holderInputs struct {
	Requested  string    // spec.holderIdentity; "" = nobody
	Holder     string    // the holder in status (or in memory)
	ValidUntil time.Time // the holder's validity
	InMemory   bool      // this manager holds the lock and renews it
	Now        time.Time
}

// decideHolder returns what to do. A holder whose validity has passed and
// that this manager does not renew counts as no holder: it is never adopted.
func decideHolder(in holderInputs) holderAction {
	held := in.Holder != "" && (in.InMemory || in.Now.Before(in.ValidUntil))
	switch {
	case !held && in.Requested == "":
		return actNone
	case !held:
		return actAcquire
	case in.Requested == "":
		return actRelease
	case in.Requested != in.Holder:
		return actHandover
	case in.InMemory:
		return actNone
	default:
		return actAdopt
	}
}

// heldReason maps an acquisition or renewal error to a Held=False reason.
func heldReason(err error) string {
	switch {
	case errors.Is(err, redlock.ErrLockHeld):
		return v1alpha1.ReasonHeldElsewhere
	case errors.Is(err, redlock.ErrSlotsConflict):
		return v1alpha1.ReasonSlotsConflict
	case errors.Is(err, redlock.ErrKindConflict):
		return v1alpha1.ReasonKeyKindConflict
	case errors.Is(err, redlock.ErrQuorumUnavailable):
		return v1alpha1.ReasonQuorumUnavailable
	case errors.Is(err, redlock.ErrExpired):
		return v1alpha1.ReasonValidityExpired
	case errors.Is(err, redlock.ErrNotHeld):
		return v1alpha1.ReasonLost
	default:
		return v1alpha1.ReasonQuorumUnavailable
	}
}

// heldMessage is the Held=False message of an acquisition error: what
// to do first when the masters hold the key as the other kind.
func heldMessage(lock *v1alpha1.DistributedLock, err error) string {
	if !errors.Is(err, redlock.ErrKindConflict) {
		return err.Error()
	}
	if so := lock.Spec.SlotOf; so != nil {
		return fmt.Sprintf("a plain lock (a DistributedLock, here or in a cluster sharing the masters) holds the semaphore's key %q, and a key is one kind: "+
			"give the semaphore another key, or delete that lock and wait for its holder to go: %v", so.SemaphoreKey, err)
	}
	return fmt.Sprintf("a semaphore (a DistributedSemaphore, here or in a cluster sharing the masters) with the key %q has holders, and a key is one kind: "+
		"give this lock another key, or delete that semaphore and wait for its holders to go: %v", lock.RedisKey(), err)
}

// renewInterval is the spec's renewInterval, or ttl/3.
func renewInterval(spec v1alpha1.DistributedLockSpec) time.Duration {
	if spec.RenewInterval != nil && spec.RenewInterval.Duration > 0 {
		return spec.RenewInterval.Duration
	}
	return spec.TTL.Duration / 3
}

// retryDelay is the jittered delay before another acquisition attempt:
// between a tenth and a quarter of the TTL, at most 5s. The jitter keeps
// contending locks from retrying in step.
func retryDelay(ttl time.Duration, rnd func(time.Duration) time.Duration) time.Duration {
	lo := min(ttl/10, 2*time.Second)
	hi := min(ttl/4, 5*time.Second)
	if hi <= lo {
		return lo
	}
	return lo + rnd(hi-lo)
}

// jitter is the production source of randomness for retryDelay.
func jitter(d time.Duration) time.Duration { return rand.N(d) }
