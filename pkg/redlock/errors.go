package redlock

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Errors returned by this package match them with errors.Is.
var (
	// ErrInvalidArgument reports bad input; nothing was sent to any master.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrLockHeld reports that the lock is held elsewhere: masters hold
	// another value, and the masters that failed (down, timed out, error
	// replies, quarantined) were too few to explain the missing quorum on
	// their own. It is read from the votes that arrived before the decision.
	ErrLockHeld = errors.New("lock held elsewhere")
	// ErrQuorumUnavailable reports that the masters that failed (down, timed
	// out, error replies, quarantined) leave fewer than a quorum.
	ErrQuorumUnavailable = errors.New("quorum unavailable")
	// ErrExpired reports that the lock's validity ran out, either before the
	// operation started or while it was in flight.
	ErrExpired = errors.New("validity expired")
	// ErrNotHeld reports that the lock's value is gone: Extend found a
	// quorum without it (the lock is then marked lost), or Release found no
	// master holding it.
	ErrNotHeld = errors.New("lock not held")
	// ErrCancelled reports that the caller's context ended first. The error
	// also matches the context's own error (context.Canceled or
	// context.DeadlineExceeded).
	ErrCancelled = errors.New("cancelled")
	// ErrExtensionLimit reports that the lock was extended as often as
	// [WithMaxExtensions] allows.
	ErrExtensionLimit = errors.New("extension limit reached")
	// ErrClosed reports use of a closed [Client].
	ErrClosed = errors.New("client closed")
)

// Op names an operation on a lock.
type Op string

// Operations reported in errors and to the [Observer].
const (
	OpAcquire Op = "acquire"
	OpExtend  Op = "extend"
	OpRelease Op = "release"
)

// Outcome is one master's answer to one operation.
type Outcome int

// Outcomes of a single master's vote.
const (
	// OutcomePending: the master had not answered when the outcome was
	// decided.
	OutcomePending Outcome = iota
	// OutcomeGranted: SET succeeded, the key was extended, or it was deleted.
	OutcomeGranted
	// OutcomeHeld: the key holds another client's value.
	OutcomeHeld
	// OutcomeAbsent: the key does not exist (extend and release only; a
	// successful extension then restores it, see Lock.Extend).
	OutcomeAbsent
	// OutcomeError: a Redis error reply, a timeout or a connection error.
	OutcomeError
	// OutcomeQuarantined: the master restarted within the quarantine window
	// and does not vote.
	OutcomeQuarantined
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case OutcomePending:
		return "pending"
	case OutcomeGranted:
		return "granted"
	case OutcomeHeld:
		return "held"
	case OutcomeAbsent:
		return "absent"
	case OutcomeError:
		return "error"
	case OutcomeQuarantined:
		return "quarantined"
	default:
		return fmt.Sprintf("outcome(%d)", int(o))
	}
}

// Vote is one master's answer to one operation.
type Vote struct {
	// Addr is the master's address.
	Addr string
	// Outcome is what the master answered.
	Outcome Outcome
	// Err is the error behind OutcomeError or OutcomeQuarantined.
	Err error
	// Latency is how long the master took to answer (zero when pending).
	Latency time.Duration
}

// Tally counts votes by outcome.
type Tally struct {
	Granted, Held, Absent, Error, Quarantined, Pending int
}

// Count tallies votes.
func Count(votes []Vote) Tally {
	var t Tally
	for _, v := range votes {
		t = tallyAdd(t, v.Outcome)
	}
	return t
}

// unavailable is the number of masters known to have given no usable answer.
// Pending masters do not count: they may still answer.
func (t Tally) unavailable() int { return t.Error + t.Quarantined }

// Error describes a failed operation on a lock: which operation, which key,
// why, and every master's vote.
type Error struct {
	// Op is the operation that failed.
	Op Op
	// Key is the lock's key.
	Key string
	// Quorum is the number of granted votes the operation needed.
	Quorum int
	// Votes holds one vote per master, in the order the masters were given.
	Votes []Vote

	kind   error  // one of the sentinels
	cause  error  // the context's error for ErrCancelled, otherwise nil
	detail string // which step failed, when the sentinel alone does not say
}

// Error returns a one-line description with the votes and per-node errors.
func (e *Error) Error() string {
	t := Count(e.Votes)
	var b strings.Builder
	fmt.Fprintf(&b, "redlock: %s %q: %v", e.Op, e.Key, e.kind)
	if e.detail != "" {
		fmt.Fprintf(&b, ": %s", e.detail)
	}
	if e.cause != nil {
		fmt.Fprintf(&b, " (%v)", e.cause)
	}
	fmt.Fprintf(&b, " [quorum %d of %d: %d granted, %d held elsewhere, %d absent, %d errors, %d quarantined, %d pending]",
		e.Quorum, len(e.Votes), t.Granted, t.Held, t.Absent, t.Error, t.Quarantined, t.Pending)
	for _, v := range e.Votes {
		if v.Err != nil {
			fmt.Fprintf(&b, "; %s: %v", v.Addr, v.Err)
		}
	}
	return b.String()
}

// Unwrap returns the sentinel and, for cancellations, the context's error.
func (e *Error) Unwrap() []error {
	if e.cause != nil {
		return []error{e.kind, e.cause}
	}
	return []error{e.kind}
}

// opError returns the error of a failed operation on key: kind is one of
// the sentinels, cause the context's error for ErrCancelled (otherwise nil).
func (c *Client) opError(op Op, key string, kind, cause error, votes []Vote) *Error {
	return &Error{Op: op, Key: key, Quorum: c.quorum, Votes: votes, kind: kind, cause: cause}
}

// invalidf returns an ErrInvalidArgument error for op.
func invalidf(op Op, format string, args ...any) error {
	return fmt.Errorf("redlock: %s: %w: %s", op, ErrInvalidArgument, fmt.Sprintf(format, args...))
}
