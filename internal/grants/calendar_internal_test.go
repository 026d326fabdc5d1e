package grants

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/internal/metrics"
)

func TestCalendarSpread(t *testing.T) {
	due := time.Unix(1000, 0).Add(100 * time.Millisecond)
	full := func(slots ...time.Duration) calendar {
		c := calendar{}
		for _, back := range slots {
			for range 4 {
				c.add(slotOf(due.Add(-back)))
			}
		}
		return c
	}
	for _, tc := range []struct {
		name     string
		cal      calendar
		earliest time.Time
		perSlot  float64
		want     time.Time
	}{
		{"an empty calendar keeps the due time", full(), due.Add(-time.Second), 4, due},
		{"a full slot moves it one slot earlier", full(0), due.Add(-time.Second), 4, due.Add(-slotWidth)},
		{"past full slots to the latest with room", full(0, slotWidth, 2*slotWidth), due.Add(-time.Second), 4, due.Add(-3 * slotWidth)},
		{"room is a fraction of a write: a slot with 4 has room below 4.5", full(0), due.Add(-time.Second), 4.5, due},
		{"no earlier than earliest: full back to it keeps the due time", full(0, slotWidth), due.Add(-slotWidth), 4, due},
		{"earliest after due keeps the due time", full(0), due.Add(time.Second), 4, due},
		{"no room anywhere (a target of 0) keeps the due time", full(), due.Add(-time.Second), 0, due},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.cal.spread(due, tc.earliest, tc.perSlot); !got.Equal(tc.want) {
				t.Errorf("spread = due %v, want due %v", got.Sub(due), tc.want.Sub(due))
			}
		})
	}
}

// TestGrantsMadeTogetherAreSpread: 60 grants made in one instant, at ttl
// 10s behind a budget of 40 writes/s (a target of 32, 8 refreshes in a
// slot), fall due together; the writer schedules them no later than due,
// at most maxAdvance earlier, and no slot holds more than 8. Forgotten,
// they leave the calendar empty.
func TestGrantsMadeTogetherAreSpread(t *testing.T) {
	const ttl = 10 * time.Second
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 40, 0)
	shown := time.Now().Add(5 * time.Second)
	nominal := w.sched.due(shown, ttl)
	perSlot := w.load.target() * slotWidth.Seconds()
	var all []*refresh
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range 60 {
		h := &Grant{UID: types.UID(fmt.Sprint(i)), shown: shown}
		e := &refresh{h: h, ttl: ttl, index: -1, keepIndex: -1}
		w.entries[h.UID] = e
		w.schedule(e, nominal)
		all = append(all, e)
	}
	bySlot := map[int64]int{}
	for _, e := range all {
		if e.due.After(nominal) || e.due.Before(nominal.Add(-maxAdvance(ttl, e.lead))) {
			t.Errorf("grant %s due %v from its due time, want within [-%v, 0]", e.h.UID, e.due.Sub(nominal), maxAdvance(ttl, e.lead))
		}
		if e.lead != shown.Sub(nominal) {
			t.Errorf("grant %s has lead %v, want the lead of its due time %v", e.h.UID, e.lead, shown.Sub(nominal))
		}
		bySlot[slotOf(e.due)]++
	}
	for s, n := range bySlot {
		if float64(n) > perSlot {
			t.Errorf("slot %d holds %d refreshes, want at most %.0f", s, n, perSlot)
		}
		if w.cal[s] != n {
			t.Errorf("the calendar counts %d in slot %d, want %d", w.cal[s], s, n)
		}
	}
	if len(bySlot) < 8 {
		t.Errorf("60 refreshes in %d slots, want at least 8", len(bySlot))
	}
	for _, e := range all {
		w.remove(e)
	}
	if len(w.cal) != 0 {
		t.Errorf("forgotten refreshes left %v in the calendar", w.cal)
	}
}
