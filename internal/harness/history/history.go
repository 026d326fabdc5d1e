// Package history records who held which lock when, and checks a recorded
// history for the two safety properties of a lock service: no two holders of
// one key have overlapping validity windows, and fencing tokens only grow;
// and for the semaphore's: never more holders of a semaphore at once than
// its number of slots, nor holders that declared different numbers; and a
// key is one kind: never a lock's holder and a semaphore's of one key at
// once. CheckRuns checks the pods a semaphore's slots were given: never
// more of them that may run at once than its number of slots, whatever
// their grants.
package history

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
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
	// Semaphore is the key of the semaphore whose slot Key is, and Slots
	// the number of slots its holder declared; "" and 0 for a lock.
	Semaphore string
	Slots     int
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

// Overlap is the violation of two grants of one key whose windows overlap:
// of the key itself, or one of a lock whose key is a semaphore's and one of
// a slot of that semaphore.
type Overlap struct {
	Key            string
	Earlier, Later Grant
}

// Error describes the overlap.
func (o *Overlap) Error() string {
	if o.Earlier.Key != o.Later.Key {
		return fmt.Sprintf("key %q is one kind: %s held %q from %s until %s, but %s got %q at %s (overlap %v)",
			o.Key, o.Earlier.Holder, o.Earlier.Key, o.Earlier.Start.Format(time.RFC3339Nano), o.Earlier.End.Format(time.RFC3339Nano),
			o.Later.Holder, o.Later.Key, o.Later.Start.Format(time.RFC3339Nano), o.Earlier.End.Sub(o.Later.Start))
	}
	return fmt.Sprintf("key %q: %s held it from %s until %s, but %s got it at %s (overlap %v)",
		o.Key, o.Earlier.Holder, o.Earlier.Start.Format(time.RFC3339Nano), o.Earlier.End.Format(time.RFC3339Nano),
		o.Later.Holder, o.Later.Start.Format(time.RFC3339Nano), o.Earlier.End.Sub(o.Later.Start))
}

// Check returns an error describing the first violation in grants: a grant
// whose window ends before it starts, two grants of one key whose windows
// overlap (an *Overlap), a fencing token that does not exceed the one of
// an earlier grant of the same key (each slot of a semaphore is a key), or
// for a semaphore more grants at one instant than their Slots, or two at
// one instant that declared different Slots, or a lock's grant of a key
// and a grant of a slot of the semaphore of that key whose windows overlap
// (an *Overlap). Windows that only touch (one ends when the next starts)
// do not overlap.
func Check(grants []Grant) error {
	if err := checkKeys(grants); err != nil {
		return err
	}
	if err := checkSemaphores(grants); err != nil {
		return err
	}
	return checkKinds(grants)
}

func checkKeys(grants []Grant) error {
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

// checkSemaphores sweeps each semaphore's grants (sweepSlots).
func checkSemaphores(grants []Grant) error {
	bySem := map[string][]tenure{}
	for _, g := range grants {
		if g.Semaphore != "" {
			bySem[g.Semaphore] = append(bySem[g.Semaphore], tenure{who: g.Holder + " (" + g.Key + ")", slots: g.Slots, start: g.Start, end: g.End})
		}
	}
	for _, sem := range slices.Sorted(maps.Keys(bySem)) {
		if err := sweepSlots(sem, "holders", bySem[sem]); err != nil {
			return err
		}
	}
	return nil
}

// Run is a pod's run on a semaphore's slot: from the moment it may start
// (its scheduling gate lifted: the scheduler may bind it) until it is
// known to have stopped (its containers terminated, or its object gone).
// A pod that held a slot runs on after its grant ended until then.
type Run struct {
	// Semaphore names the semaphore object that gave the slot: its pods
	// are counted per object (a semaphore of another cluster sharing its
	// key knows nothing of them; its grants are checked by Check).
	Semaphore string
	Pod       string
	// Slot is the slot's lock, Slots the number of slots it is one of.
	Slot  string
	Slots int
	Start time.Time
	End   time.Time
}

// CheckRuns returns an error describing the first moment when more pods of
// a semaphore may run than the number of slots of theirs, or pods of
// slots of two numbers may run at once: a slot is idle (given out again,
// or removed) only when no pod that holds or held it may still run, and
// a resized semaphore creates the slots of its new number only once none
// of the previous number is left (controllers/distributedsemaphore). A
// run that ends before it starts is an error too. A violation of the
// number is a *SlotsViolation.
func CheckRuns(runs []Run) error {
	bySem := map[string][]tenure{}
	for _, r := range runs {
		if r.End.Before(r.Start) {
			return fmt.Errorf("semaphore %q: the run of pod %s ends (%s) before it starts (%s)", r.Semaphore, r.Pod, r.End.Format(time.RFC3339Nano), r.Start.Format(time.RFC3339Nano))
		}
		bySem[r.Semaphore] = append(bySem[r.Semaphore], tenure{who: "pod " + r.Pod + " (" + r.Slot + ")", slots: r.Slots, start: r.Start, end: r.End})
	}
	for _, sem := range slices.Sorted(maps.Keys(bySem)) {
		if err := sweepSlots(sem, "pods that may run", bySem[sem]); err != nil {
			return err
		}
	}
	return nil
}

// tenure is a grant of a semaphore's slot, or a pod's run on one, and
// the number of slots of its slot.
type tenure struct {
	who        string
	slots      int
	start, end time.Time
}

// SlotsViolation is the violation of a semaphore's number of slots:
// more holders (or pods that may run) than it, or some of two numbers at
// once.
type SlotsViolation struct {
	Semaphore string
	// At is when the tenure that broke it began.
	At  time.Time
	msg string
}

// Error describes the violation.
func (v *SlotsViolation) Error() string { return v.msg }

// sweepSlots sweeps one semaphore's tenures in order of their start: at
// every start, the tenures that still run, with the new one, must be no
// more than its number of slots and must all be of that number. what
// names them in the error.
func sweepSlots(sem, what string, ts []tenure) error {
	slices.SortStableFunc(ts, func(a, b tenure) int { return a.start.Compare(b.start) })
	var running []tenure
	for _, t := range ts {
		if t.slots < 1 {
			return &SlotsViolation{Semaphore: sem, At: t.start, msg: fmt.Sprintf("semaphore %q: %s declares %d slots", sem, t.who, t.slots)}
		}
		running = slices.DeleteFunc(running, func(r tenure) bool { return !r.end.After(t.start) })
		for _, r := range running {
			if r.slots != t.slots {
				return &SlotsViolation{Semaphore: sem, At: t.start, msg: fmt.Sprintf("semaphore %q: %s of a slot declared with %d slots until %s, but %s of one declared with %d from %s",
					sem, r.who, r.slots, r.end.Format(time.RFC3339Nano), t.who, t.slots, t.start.Format(time.RFC3339Nano))}
			}
		}
		running = append(running, t)
		if len(running) > t.slots {
			who := make([]string, len(running))
			for i, r := range running {
				who[i] = r.who
			}
			return &SlotsViolation{Semaphore: sem, At: t.start, msg: fmt.Sprintf("semaphore %q of %d slots: %d %s at %s: %s",
				sem, t.slots, len(running), what, t.start.Format(time.RFC3339Nano), strings.Join(who, ", "))}
		}
	}
	return nil
}

// checkKinds sweeps, for each key both a lock's and a semaphore's, their
// grants in order of their start: a grant of one kind must not start
// before every grant of the other kind seen so far has ended.
func checkKinds(grants []Grant) error {
	byKey := map[string][]Grant{}
	for _, g := range grants {
		byKey[cmp.Or(g.Semaphore, g.Key)] = append(byKey[cmp.Or(g.Semaphore, g.Key)], g)
	}
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		gs := byKey[k]
		slices.SortStableFunc(gs, func(a, b Grant) int { return a.Start.Compare(b.Start) })
		// last[true] is the semaphore's grant whose window ends last among
		// those seen, last[false] the lock's.
		last := map[bool]*Grant{}
		for i := range gs {
			g := &gs[i]
			sem := g.Semaphore != ""
			if o := last[!sem]; o != nil && g.Start.Before(o.End) {
				return &Overlap{Key: k, Earlier: *o, Later: *g}
			}
			if o := last[sem]; o == nil || g.End.After(o.End) {
				last[sem] = g
			}
		}
	}
	return nil
}
