package distributedlock

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// slotOf returns the semaphore slot lock is (spec.slotOf), or nil for a
// plain lock.
func slotOf(lock *v1alpha1.DistributedLock) *redlock.Slot {
	so := lock.Spec.SlotOf
	if so == nil {
		return nil
	}
	return &redlock.Slot{Semaphore: so.SemaphoreKey, Slots: int(so.Slots), Index: int(so.Index)}
}

// keyProblem is why pkg/redlock would refuse lock's key (or slot), or nil:
// a condition, not an acquisition retried for ever.
func keyProblem(lock *v1alpha1.DistributedLock) error {
	if slot := slotOf(lock); slot != nil {
		return redlock.ValidateSlot(*slot)
	}
	return redlock.ValidateKey(lock.RedisKey())
}

// acquire acquires lock on c for ttl: its key, or, for a semaphore's
// slot, the slot with the semaphore's number declared on the masters.
func acquire(ctx context.Context, c *redlock.Client, lock *v1alpha1.DistributedLock, ttl time.Duration, opts ...redlock.AcquireOption) (*redlock.Lock, error) {
	if slot := slotOf(lock); slot != nil {
		return c.AcquireSlot(ctx, *slot, ttl, opts...)
	}
	return c.Acquire(ctx, lock.RedisKey(), ttl, opts...)
}

// masterSetOf is the name of lock's RedisMasterSet.
func masterSetOf(lock *v1alpha1.DistributedLock) types.NamespacedName {
	return types.NamespacedName{Namespace: lock.Namespace, Name: lock.Spec.MasterSet}
}

// restoreOptions are the options that restore a grant of token (0: none
// known) of a lock that is slot (nil: a plain lock).
func restoreOptions(slot *redlock.Slot, token int64) []redlock.RestoreOption {
	return renewal.Grant{Slot: slot, Token: token}.RestoreOptions()
}
