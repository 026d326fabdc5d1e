// Package history records who held which lock when, and checks a recorded
// history for the two safety properties of a lock service: no two holders of
// one key have overlapping validity windows, and fencing tokens only grow.
package history

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Grant is one holder's tenure of a key: from the moment the holder learned
// it holds the lock until the earlier of its validity deadline and the moment
// it started to release the lock.
type Grant struct {
	Key    string
	Holder string
	Start  time.Time
	End    time.Time
	// Token is the fencing token of the grant; zero means none was issued.
	Token int64
}

// Recorder collects grants from concurrent holders.
type Recorder struct {
	mu     sync.Mutex
	grants []Grant
}

// Record adds a grant.
func (r *Recorder) Record(g Grant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.grants = append(r.grants, g)
}

// Grants returns a copy of the grants recorded so far.
func (r *Recorder) Grants() []Grant {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.grants)
}

// Overlap is the violation of two grants of one key whose windows overlap.
type Overlap struct {
	Key            string
	Earlier, Later Grant
}

// Error describes the overlap.
func (o *Overlap) Error() string {
	return fmt.Sprintf("key %q: %s held it from %s until %s, but %s got it at %s (overlap %v)",
		o.Key, o.Earlier.Holder, o.Earlier.Start.Format(time.RFC3339Nano), o.Earlier.End.Format(time.RFC3339Nano),
		o.Later.Holder, o.Later.Start.Format(time.RFC3339Nano), o.Earlier.End.Sub(o.Later.Start))
}

// Check returns an error describing the first violation in grants: a grant
// whose window ends before it starts, two grants of one key whose windows
// overlap (an *Overlap), or a fencing token that does not exceed the one of
// an earlier grant of the same key. Windows that only touch (one ends when the next
// starts) do not overlap.
func Check(grants []Grant) error {
	byKey := map[string][]Grant{}
	for _, g := range grants {
		if g.End.Before(g.Start) {
			return fmt.Errorf("key %q: grant to %s ends (%s) before it starts (%s)", g.Key, g.Holder, g.End.Format(time.RFC3339Nano), g.Start.Format(time.RFC3339Nano))
		}
		byKey[g.Key] = append(byKey[g.Key], g)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		gs := byKey[k]
		slices.SortStableFunc(gs, func(a, b Grant) int { return a.Start.Compare(b.Start) })
		last := gs[0] // the grant whose window ends last among those seen
		top := gs[0]  // the grant with the largest token among those seen
		for _, g := range gs[1:] {
			if g.Start.Before(last.End) {
				return &Overlap{Key: k, Earlier: last, Later: g}
			}
			if top.Token != 0 && g.Token != 0 && g.Token <= top.Token {
				return fmt.Errorf("key %q: fencing token %d of %s does not exceed token %d of the earlier holder %s",
					k, g.Token, g.Holder, top.Token, top.Holder)
			}
			if g.End.After(last.End) {
				last = g
			}
			if g.Token > top.Token {
				top = g
			}
		}
	}
	return nil
}
