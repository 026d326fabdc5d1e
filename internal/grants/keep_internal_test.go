package grants

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/internal/metrics"
)

// TestADropOfCapacityKeepsTheOldestGrants plays one refresh period after
// the API server's capacity drops from what 1,000 grants at ttl 10s need
// (111 writes/s) to 50: each grant's refresh is ready a lead before its
// shown validity, and one is sent every 1/50 s, landing 20 ms later. The
// writer cannot land them all; it must land those of the oldest grants the
// 50 writes/s carry (360: the 80 % the load rules keep). Nearest validity
// first, as the writer sent before, lands them late in turn.
func TestADropOfCapacityKeepsTheOldestGrants(t *testing.T) {
	const (
		locks    = 1000
		ttl      = 10 * time.Second
		capacity = 50
		kept     = 360 // shedTarget × capacity × (ttl − lead)
		rtt      = 20 * time.Millisecond
	)
	lead := StatusLead(ttl)
	period := ttl - lead
	play := func(order func(w *statusWriter, now time.Time) *refresh) (late []int) {
		w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 1000, 0)
		t0 := time.Now()
		var pending []*refresh
		for i := range locks {
			// Validities spread evenly over the period; grant i is the
			// i-th oldest, in no relation to its validity.
			shown := t0.Add(lead + time.Duration((i*7919)%locks)*period/locks)
			h := &Grant{UID: types.UID(fmt.Sprint(i)), ID: fmt.Sprint(i), AcquiredAt: t0.Add(-time.Hour + time.Duration(i)*time.Millisecond), shown: shown}
			pending = append(pending, &refresh{h: h, ttl: ttl, index: -1, keepIndex: -1})
		}
		for now := t0; now.Before(t0.Add(period)); now = now.Add(time.Second / capacity) {
			rest := pending[:0]
			for _, e := range pending {
				if e.h.shown.Add(-lead).After(now) {
					rest = append(rest, e)
					continue
				}
				w.place(e, ready)
			}
			pending = rest
			if w.ready.Len() == 0 {
				continue
			}
			e := order(w, now)
			w.place(e, inFlight)
			if now.Add(rtt).After(e.h.shown) {
				var i int
				_, _ = fmt.Sscan(e.h.ID, &i)
				late = append(late, i)
			}
		}
		// Those still ready at the end of the period are late too.
		for _, e := range w.ready.items {
			var i int
			_, _ = fmt.Sscan(e.h.ID, &i)
			late = append(late, i)
		}
		return late
	}
	oldest := func(late []int) (n int) {
		for _, i := range late {
			if i < kept {
				n++
			}
		}
		return n
	}
	keep := play(func(w *statusWriter, now time.Time) *refresh { return w.next(now) })
	if n := oldest(keep); n != 0 {
		t.Errorf("keep order: %d of the %d oldest grants refreshed late, want 0 (%d late in all)", n, kept, len(keep))
	}
	if len(keep) < locks-capacity*int(period.Seconds())-capacity {
		t.Errorf("keep order: %d late in all: more refreshes landed than 50 writes/s allow", len(keep))
	}
	edf := play(func(w *statusWriter, _ time.Time) *refresh { return w.ready.items[0] })
	if n := oldest(edf); n < kept/2 {
		t.Errorf("nearest validity first: %d of the %d oldest grants refreshed late; the test expects most, or it shows nothing", n, kept)
	}
	t.Logf("late in one period: keep order %d (of the oldest %d: %d); nearest validity first %d (of the oldest: %d)", len(keep), kept, oldest(keep), len(edf), oldest(edf))
}
