package redlock

import (
	"errors"
	"fmt"
)

// Kind is what a key holds on the masters: a plain lock (Acquire) or a
// semaphore's slots (AcquireSlot, AcquireSemaphore). A key is one kind at
// a time: while one kind has holders, the other is refused.
type Kind string

// The kinds of a key.
const (
	// KindLock: a plain lock holds the key itself.
	KindLock Kind = "lock"
	// KindSemaphore: a semaphore's slots hold the key's [SlotKey]s, and
	// the key stores their number ([Declaration]).
	KindSemaphore Kind = "semaphore"
)

// ErrKindConflict reports that the other kind holds the key: a plain
// lock's key is a semaphore's with holders, or a semaphore's key is a
// plain lock's with a holder. Each master refuses the second kind while
// it stores the first (a plain lock's value, a semaphore's number of
// slots), so that at most one kind holds a quorum. It is read from the
// votes that arrived before the decision, like [ErrLockHeld].
var ErrKindConflict = errors.New("key held by the other kind (lock or semaphore)")

// KindConflictError is the error of a master's vote that refused a key
// because the other kind holds it there.
type KindConflictError struct {
	// Key is the key both kinds name: the plain lock's, the semaphore's.
	Key string
	// Held is the kind the master holds the key as.
	Held Kind
}

// Error describes the conflict.
func (e *KindConflictError) Error() string {
	if e.Held == KindSemaphore {
		return fmt.Sprintf("key %q is a semaphore's on this master (it stores the semaphore's number of slots): a plain lock of it is refused while the semaphore has holders", e.Key)
	}
	return fmt.Sprintf("key %q is a plain lock's on this master: a semaphore of it is refused while the lock has a holder", e.Key)
}
