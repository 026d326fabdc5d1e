package redlock

import "time"

// Observer receives events from a Client so that callers can export metrics
// or logs without this package depending on a metrics library. Methods are
// called synchronously from the operation's goroutine and must be fast and
// safe for concurrent use.
type Observer interface {
	// ObserveOp is called once per attempt of Acquire, Extend or Release.
	ObserveOp(OpEvent)
	// ObserveQuarantine is called when a new connection finds a master that
	// restarted within the quarantine window.
	ObserveQuarantine(QuarantineEvent)
}

// OpEvent describes one attempt of one operation.
type OpEvent struct {
	Op      Op
	Key     string
	Attempt int           // 1-based attempt number (Acquire retries)
	Latency time.Duration // until the outcome was decided
	Votes   []Vote        // one per master; OutcomePending for stragglers
	Err     error         // nil on success
}

// QuarantineEvent describes a master found restarted within the window.
type QuarantineEvent struct {
	Addr   string
	RunID  string
	Uptime time.Duration // as reported by the master (whole seconds)
	Until  time.Time     // the master votes again after this instant
}

type nopObserver struct{}

func (nopObserver) ObserveOp(OpEvent)                 {}
func (nopObserver) ObserveQuarantine(QuarantineEvent) {}
