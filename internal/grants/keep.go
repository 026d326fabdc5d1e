package grants

import "time"

// Keeping through a drop of capacity. Refreshes go nearest shown validity
// first: when all of them can land in time, that order lands them all.
// When they cannot (the API server takes fewer writes than the grants
// held need, and the load rules have not shed the difference yet: a drop
// is measured a window or more after it began), that order makes every
// grant late in turn. So while the nearest validity has waited more than
// keepBehind of its lead past its due time, refreshes go oldest grant
// first, the order in which grants are kept (chooseShed sheds the
// youngest). The grants the API server's writes can carry are refreshed
// in time, and the youngest, which the load rules shed next, are the ones
// that wait.
// The reasoning: docs/design/overload.md#a-drop-of-capacity.

// keepBehind of its lead waited by the nearest validity's refresh sends
// refreshes in keep order. Half (when it would land tight) is too late:
// the old grants' refreshes queued by then, sent oldest first rather than
// nearest first, land late themselves (TestADropOfCapacityKeepsTheOldestGrants).
const keepBehind = 0.25

// keptFirst is the keep order: the oldest grant first.
func keptFirst(a, b *refresh) bool {
	if !a.h.AcquiredAt.Equal(b.h.AcquiredAt) {
		return a.h.AcquiredAt.Before(b.h.AcquiredAt)
	}
	return byShown(a, b)
}

// next is the ready refresh to send at now: nearest shown validity first,
// or in keep order while that one has waited more than keepBehind of its
// lead. Callers hold w.mu; a refresh is ready.
func (w *statusWriter) next(now time.Time) *refresh {
	head := w.ready.items[0]
	lead := w.sched.lead(head.ttl)
	if head.h.shown.Sub(now) < lead-time.Duration(keepBehind*float64(lead)) {
		return w.readyKeep.items[0]
	}
	return head
}
