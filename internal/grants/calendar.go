package grants

import "time"

// The refresh calendar. The load rules keep the held grants' demand, an
// average over a refresh period, within the target; but grants made
// together (a rollout, the bench's thousand locks) fall due together, one
// period after another, and a second that holds more refreshes than the
// API server takes lands the last of them late whatever the average. So a
// refresh is scheduled no later than its due time, in the latest slot
// before it that holds fewer refreshes than the target carries in a slot,
// at most maxAdvance earlier (below one refresh a slot, one a slot): a
// refresh sent earlier only shows more
// validity left, and costs a fraction of a write once, after which its
// period keeps the new phase. The reasoning:
// docs/design/overload.md#grants-made-together.

// slotWidth is the span the calendar counts refreshes in.
const slotWidth = 250 * time.Millisecond

// calendar counts the waiting refreshes by the slot of their due time.
type calendar map[int64]int

// slotOf is the slot of t.
func slotOf(t time.Time) int64 { return t.UnixNano() / int64(slotWidth) }

// add counts a refresh due in slot s.
func (c calendar) add(s int64) { c[s]++ }

// remove stops counting a refresh due in slot s.
func (c calendar) remove(s int64) {
	if c[s] <= 1 {
		delete(c, s)
		return
	}
	c[s]--
}

// spread is the latest time at or before due, and not before earliest,
// whose slot holds fewer than perSlot refreshes; due when none does (the
// demand is over the target there: the load rules see to it).
func (c calendar) spread(due, earliest time.Time, perSlot float64) time.Time {
	for at := due; !at.Before(earliest); at = at.Add(-slotWidth) {
		if float64(c[slotOf(at)]) < perSlot {
			return at
		}
	}
	return due
}

// maxAdvance is how much earlier than due the calendar may schedule a
// refresh of a grant with ttl and lead: a quarter of the ttl less the
// lead, and at most 10 s (a longer lead absorbs a longer burst by itself).
func maxAdvance(ttl, lead time.Duration) time.Duration {
	return min((ttl-lead)/4, 10*time.Second)
}
