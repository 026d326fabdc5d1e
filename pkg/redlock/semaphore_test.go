package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/internal/harness/history"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// patient keeps a loaded machine's stall from failing a single try: these
// tests are about what the masters store, not about slow masters (a node
// timeout derived from a short TTL is tens of milliseconds). A round
// returns once a quorum answered: a straggler's write lands, or is given
// up, within nodeTimeout.
const nodeTimeout = 2 * time.Second

var patient = redlock.WithNodeTimeout(nodeTimeout)

// TestSemaphoreAdmitsSlotsHolders: a semaphore of 3 grants three holders,
// each its own slot with its own fencing token, refuses a fourth while
// they hold (ErrLockHeld), and grants it the slot a release freed, with a
// token above that slot's last one.
func TestSemaphoreAdmitsSlotsHolders(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), patient)
	held := map[int]*redlock.Lock{}
	for range 3 {
		l, err := c.AcquireSemaphore(ctx, "sem-a", 3, time.Minute, redlock.WithFencing())
		if err != nil {
			t.Fatalf("acquire with %d of 3 slots held: %v", len(held), err)
		}
		s, ok := l.Slot()
		if !ok || s.Semaphore != "sem-a" || s.Slots != 3 || l.Key() != redlock.SlotKey("sem-a", s.Index) {
			t.Fatalf("lock %q: slot %+v (%v)", l.Key(), s, ok)
		}
		if held[s.Index] != nil {
			t.Fatalf("slot %d granted twice", s.Index)
		}
		if l.Token() <= 0 {
			t.Fatalf("slot %d: token %d", s.Index, l.Token())
		}
		held[s.Index] = l
	}
	if _, err := c.AcquireSemaphore(ctx, "sem-a", 3, time.Minute); !errors.Is(err, redlock.ErrLockHeld) {
		t.Fatalf("fourth holder of a semaphore of 3: %v, want ErrLockHeld", err)
	}
	for _, s := range servers {
		waitFor(t, nodeTimeout, s.Addr()+" to store 3 slots for sem-a (a straggler's write lands within the node timeout)", func() bool {
			return value(t, s, "sem-a") == redlock.Declaration(3)
		})
	}
	freed := held[1]
	if err := freed.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := c.AcquireSemaphore(ctx, "sem-a", 3, time.Minute, redlock.WithFencing())
	if err != nil {
		t.Fatalf("acquire after slot 1 was released: %v", err)
	}
	if s, _ := l.Slot(); s.Index != 1 {
		t.Fatalf("granted slot %d, want the freed slot 1", s.Index)
	}
	if l.Token() <= freed.Token() {
		t.Fatalf("slot 1's token %d does not exceed its previous %d", l.Token(), freed.Token())
	}
}

// TestSemaphoreRefusesAnotherNumberOfSlots: while holders of a semaphore of
// 2 hold a slot, an acquisition declaring 3 is refused with
// ErrSlotsConflict (each master's vote says what it stores), whichever
// slot it asks for, even one the first number does not have; releasing the
// last slot removes the declaration, and 3 is then served.
func TestSemaphoreRefusesAnotherNumberOfSlots(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), patient)
	a, err := c.AcquireSlot(ctx, redlock.Slot{Semaphore: "sem-b", Slots: 2, Index: 0}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.AcquireSlot(ctx, redlock.Slot{Semaphore: "sem-b", Slots: 2, Index: 1}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1, 2} {
		_, err := c.AcquireSlot(ctx, redlock.Slot{Semaphore: "sem-b", Slots: 3, Index: i}, time.Minute)
		if !errors.Is(err, redlock.ErrSlotsConflict) || errors.Is(err, redlock.ErrLockHeld) {
			t.Fatalf("slot %d of 3 while a slot of 2 is held: %v, want ErrSlotsConflict", i, err)
		}
		conflicts := 0
		for _, v := range votesOf(t, err) {
			if v.Outcome == redlock.OutcomePending {
				continue // decided without it
			}
			var ce *redlock.SlotsConflictError
			if !errors.As(v.Err, &ce) || ce.Declared != 2 || ce.Slots != 3 || v.Outcome != redlock.OutcomeHeld {
				t.Fatalf("slot %d: vote %+v, want held with a conflict naming 2 slots", i, v)
			}
			conflicts++
		}
		if conflicts < 2 {
			t.Fatalf("slot %d: %d masters said they store another number, want a quorum (2)", i, conflicts)
		}
	}
	if _, err := c.AcquireSemaphore(ctx, "sem-b", 3, time.Minute); !errors.Is(err, redlock.ErrSlotsConflict) {
		t.Fatalf("AcquireSemaphore of 3 while a slot of 2 is held: %v, want ErrSlotsConflict", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Release returns once a quorum has answered: a minority may still
	// hold its copy (the slot's and the number's) until the release
	// reaches it or they expire.
	var still []string
	for _, s := range servers {
		if got := value(t, s, "sem-b"); got != "" {
			still = append(still, s.Addr()+" stores "+got)
		}
	}
	if len(still) > len(servers)-(len(servers)/2+1) {
		t.Fatalf("the number of slots outlives the last slot's release on a quorum: %v", still)
	}
	l, err := c.AcquireSemaphore(ctx, "sem-b", 3, time.Minute)
	if err != nil {
		t.Fatalf("acquire with 3 slots once nothing is held: %v", err)
	}
	if s, _ := l.Slot(); s.Slots != 3 {
		t.Fatalf("slot %+v", s)
	}
}

// TestSemaphoreDeclarationOutlivesItsSlots: on every master the stored
// number of slots lives at least as long as every slot copy, through
// acquisitions of different TTLs and extensions, so that an abandoned
// holder keeps other numbers out until its copies expire, and no longer.
func TestSemaphoreDeclarationOutlivesItsSlots(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), patient)
	long, err := c.AcquireSlot(ctx, redlock.Slot{Semaphore: "sem-c", Slots: 2, Index: 0}, 6*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	short, err := c.AcquireSlot(ctx, redlock.Slot{Semaphore: "sem-c", Slots: 2, Index: 1}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		copies := 0
		for _, s := range servers {
			// Absolute expiry instants (ms), not TTLs read one after the
			// other. A master may not have a slot's copy (an acquisition
			// needs a quorum): the declaration outlives those it has.
			p := max(expireTime(t, s, long.Key()), expireTime(t, s, short.Key()))
			if p == -2 {
				continue
			}
			copies++
			if d := expireTime(t, s, "sem-c"); p > d || d < 0 {
				t.Fatalf("%s, %s: a slot lives until %d, its number only until %d", when, s.Addr(), p, d)
			}
		}
		if copies < 2 {
			t.Fatalf("%s: slot copies on %d masters, fewer than a quorum", when, copies)
		}
	}
	check("after both acquisitions")
	if err := long.Extend(ctx); err != nil {
		t.Fatal(err)
	}
	check("after extending the longer slot")
	// Walk away from both: the declaration expires with the last copy.
	waitFor(t, 20*time.Second, "the abandoned slots and their declaration to expire", func() bool {
		return value(t, servers[0], long.Key()) == "" && value(t, servers[0], "sem-c") == ""
	})
	if _, err := c.AcquireSemaphore(ctx, "sem-c", 5, time.Second); err != nil {
		t.Fatalf("another number once the abandoned slots expired: %v", err)
	}
}

// TestSemaphoreSlotSurvivesRestartedMasters: masters restarted one after
// another without their data get the slot and its declaration back after
// the next extension, so that another number stays refused throughout.
func TestSemaphoreSlotSurvivesRestartedMasters(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), redlock.WithNodeTimeout(2*time.Second))
	slot := redlock.Slot{Semaphore: "sem-d", Slots: 2, Index: 1}
	l, err := c.AcquireSlot(ctx, slot, time.Minute, redlock.WithFencing())
	if err != nil {
		t.Fatal(err)
	}
	for i := len(servers) - 1; i >= 0; i-- {
		if err := servers[i].Restart(false); err != nil {
			t.Fatal(err)
		}
		if err := l.Extend(ctx); err != nil {
			t.Fatalf("extend after restarting master %d: %v", i, err)
		}
		waitFor(t, 5*time.Second, fmt.Sprintf("restarted master %d to get the slot and its declaration back", i), func() bool {
			return value(t, servers[i], slot.Key()) == l.Value() && value(t, servers[i], "sem-d") == redlock.Declaration(2) &&
				value(t, servers[i], redlock.FenceKey(slot.Key())) == strconv.FormatInt(l.Token(), 10)
		})
	}
	if _, err := c.AcquireSemaphore(ctx, "sem-d", 3, time.Minute); !errors.Is(err, redlock.ErrSlotsConflict) {
		t.Fatalf("another number after every master restarted under the held slot: %v, want ErrSlotsConflict", err)
	}
	// A restored lock (another process adopting the slot) releases it with
	// its declaration.
	r, err := c.Restore(slot.Key(), l.Value(), l.TTL(), l.ValidUntil(), redlock.WithSlot(slot), redlock.WithToken(l.Token()))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		waitFor(t, nodeTimeout, s.Addr()+" to drop the declaration after the restored slot's release (a straggler's release lands within the node timeout)", func() bool {
			return value(t, s, "sem-d") == ""
		})
	}
}

// TestSemaphoreStaleNumberOnAMinority: a number of slots left on one master
// of three (a crashed client's, of another number) does not stop the
// semaphore: the other slots are still tried and granted by the quorum
// that stores nothing else.
func TestSemaphoreStaleNumberOnAMinority(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), patient)
	set(t, servers[2], "sem-m", redlock.Declaration(5), time.Minute)
	held, err := c.AcquireSlot(ctx, redlock.Slot{Semaphore: "sem-m", Slots: 3, Index: 0}, time.Minute)
	if err != nil {
		t.Fatalf("slot 0 with 5 stored on one master of three: %v", err)
	}
	for range 10 {
		l, err := c.AcquireSemaphore(ctx, "sem-m", 3, time.Minute)
		if err != nil {
			t.Fatalf("a free slot while slot 0 is held and one master stores 5: %v", err)
		}
		if s, _ := l.Slot(); s.Index == 0 {
			t.Fatalf("slot 0 granted twice")
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = held.Release(ctx)
}

// TestSemaphoreSlotWithoutItsNumberIsNotExtended: a slot's copy whose
// number of slots is gone from the master (evicted) is not extended there,
// nor counted: when a quorum lost it, the slot is lost rather than held
// without the number that keeps other numbers out.
func TestSemaphoreSlotWithoutItsNumberIsNotExtended(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), patient)
	slot := redlock.Slot{Semaphore: "sem-e", Slots: 2, Index: 1}
	acquired, err := c.AcquireSlot(ctx, slot, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Extended with a longer TTL than it was acquired with, so that an
	// extension shows in its copies' TTL.
	l, err := c.Restore(slot.Key(), acquired.Value(), 2*time.Minute, acquired.ValidUntil(), redlock.WithSlot(slot))
	if err != nil {
		t.Fatal(err)
	}
	// The acquisition returns once a quorum answered: wait until the
	// straggler's copy and number have landed too, so that none lands
	// after they are removed below.
	for _, s := range servers {
		waitFor(t, nodeTimeout, s.Addr()+" to store the number of slots of sem-e (a straggler's write lands within the node timeout)", func() bool {
			return pttl(t, s, "sem-e") > 0
		})
	}
	for _, s := range servers[:2] {
		cl := s.Client()
		if err := cl.Del(ctx, "sem-e").Err(); err != nil {
			t.Fatal(err)
		}
		_ = cl.Close()
	}
	if err := l.Extend(ctx); !errors.Is(err, redlock.ErrNotHeld) {
		t.Fatalf("extend with the number gone from two masters of three: %v, want ErrNotHeld", err)
	}
	if got := pttl(t, servers[0], l.Key()); got > 30*time.Second {
		t.Fatalf("the copy without its number was extended: pttl %v", got)
	}
	if got := pttl(t, servers[2], l.Key()); got <= 30*time.Second {
		t.Fatalf("the copy with its number was not extended: pttl %v", got)
	}
}

// TestSemaphoreBadInput: slots and indices out of range, reserved keys and
// a restored slot whose key is not the slot's are refused before anything
// is sent.
func TestSemaphoreBadInput(t *testing.T) {
	c := newClient(t, []string{"127.0.0.1:1"}, redlock.WithTries(1))
	ctx := context.Background()
	for name, s := range map[string]redlock.Slot{
		"no slots":         {Semaphore: "s", Slots: 0},
		"too many slots":   {Semaphore: "s", Slots: redlock.MaxSlots + 1},
		"negative index":   {Semaphore: "s", Slots: 2, Index: -1},
		"index past slots": {Semaphore: "s", Slots: 2, Index: 2},
		"empty key":        {Semaphore: "", Slots: 2},
		"fence key":        {Semaphore: "s:fence", Slots: 2},
		"window key":       {Semaphore: redlock.WindowKey, Slots: 2},
	} {
		if _, err := c.AcquireSlot(ctx, s, time.Second); !errors.Is(err, redlock.ErrInvalidArgument) {
			t.Errorf("AcquireSlot %s: %v, want ErrInvalidArgument", name, err)
		}
		if s.Index == 0 {
			if _, err := c.AcquireSemaphore(ctx, s.Semaphore, s.Slots, time.Second); !errors.Is(err, redlock.ErrInvalidArgument) {
				t.Errorf("AcquireSemaphore %s: %v, want ErrInvalidArgument", name, err)
			}
		}
	}
	if _, err := c.Acquire(ctx, "s", time.Second, redlock.WithValue(redlock.Declaration(2))); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("plain Acquire with a semaphore's declaration as its value: %v, want ErrInvalidArgument", err)
	}
	for _, key := range []string{redlock.SlotKey("s", 0)} {
		if _, err := c.Acquire(ctx, key, time.Second); !errors.Is(err, redlock.ErrInvalidArgument) {
			t.Errorf("plain Acquire of a semaphore's key %q: %v, want ErrInvalidArgument", key, err)
		}
		if _, err := c.Restore(key, "2", time.Second, time.Now()); !errors.Is(err, redlock.ErrInvalidArgument) {
			t.Errorf("Restore of a semaphore's key %q without WithSlot: %v, want ErrInvalidArgument", key, err)
		}
	}
	if _, err := c.AcquireSemaphore(ctx, strings.Repeat("k", redlock.MaxSemaphoreKeyLen+1), 2, time.Second); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("a semaphore key over %d bytes: %v, want ErrInvalidArgument", redlock.MaxSemaphoreKeyLen, err)
	}
	slot := redlock.Slot{Semaphore: "s", Slots: 2, Index: 1}
	if _, err := c.Restore(redlock.SlotKey("s", 0), "v", time.Second, time.Now(), redlock.WithSlot(slot)); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("Restore of another slot's key: %v, want ErrInvalidArgument", err)
	}
	if _, err := c.Restore(slot.Key(), "v", time.Second, time.Now(), redlock.WithSlot(redlock.Slot{Semaphore: "s", Slots: 1, Index: 1})); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("Restore of a slot past the number: %v, want ErrInvalidArgument", err)
	}
}

// TestSemaphoreHistoryUnderContention: many clients contend for one
// semaphore key, some declaring 2 slots and some 3, and for a few slots
// directly; the recorded history never has more valid holders than the
// number they declared, never two numbers at once, and each slot's tokens
// increase.
func TestSemaphoreHistoryUnderContention(t *testing.T) {
	servers := redistest.StartN(t, 5, redistest.Options{})
	grants, errs := contend(t, redistest.Addrs(servers), 12, 12, func(c *redlock.Client, w, r int) (*redlock.Lock, error) {
		slots := 2 + w%2
		if r%3 == 2 {
			return c.AcquireSlot(context.Background(), redlock.Slot{Semaphore: "sem-h", Slots: slots, Index: r % slots}, 200*time.Millisecond, redlock.WithFencing())
		}
		return c.AcquireSemaphore(context.Background(), "sem-h", slots, 200*time.Millisecond, redlock.WithFencing())
	})
	if err := history.Check(grants); err != nil {
		t.Fatalf("semaphore bound violated: %v", err)
	}
	bySlots := map[int]int{}
	for _, g := range grants {
		bySlots[g.Slots]++
	}
	if bySlots[2] == 0 || bySlots[3] == 0 {
		t.Fatalf("both numbers should have been served at some point: %v", bySlots)
	}
	t.Logf("%d grants checked (by declared slots %v); refusals %v", len(grants), bySlots, errs)
}

// contend runs workers clients of addrs, each acquiring rounds times with
// acquire(client, worker, round), and records every grant: held for a
// short critical section and released, or, every fourth round, walked
// away from (it expires before anyone else gets it). Refusals
// (contention, another number or kind, a master too slow on this loaded
// machine: none may break a bound) are counted by sentinel; any other
// error fails the test.
func contend(t *testing.T, addrs []string, workers, rounds int, acquire func(c *redlock.Client, w, r int) (*redlock.Lock, error)) ([]history.Grant, map[string]int) {
	t.Helper()
	var rec history.Recorder
	var wg sync.WaitGroup
	var mu sync.Mutex
	errs := map[string]int{}
	for w := range workers {
		c := newClient(t, addrs, redlock.WithTries(20), redlock.WithRetryDelay(time.Millisecond, 15*time.Millisecond),
			redlock.WithNodeTimeout(100*time.Millisecond))
		wg.Go(func() {
			for r := range rounds {
				l, err := acquire(c, w, r)
				if err != nil {
					if kind := kindOf(err); kind != "other" {
						mu.Lock()
						errs[kind]++
						mu.Unlock()
					} else {
						t.Errorf("worker %d: %v", w, err)
					}
					continue
				}
				start := time.Now()
				s, _ := l.Slot()
				g := history.Grant{Key: l.Key(), Holder: fmt.Sprintf("w%d-r%d", w, r), Start: start, Token: l.Token(), Semaphore: s.Semaphore, Slots: s.Slots}
				if r%4 == 3 {
					g.End = l.ValidUntil()
					rec.Record(g)
					continue
				}
				time.Sleep(time.Duration(r%3) * 5 * time.Millisecond) // the critical section
				g.End = time.Now()
				if vu := l.ValidUntil(); vu.Before(g.End) {
					g.End = vu
				}
				rec.Record(g)
				if err := l.Release(context.Background()); err != nil && !errors.Is(err, redlock.ErrNotHeld) && !errors.Is(err, redlock.ErrQuorumUnavailable) {
					t.Errorf("release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	return rec.Grants(), errs
}

// kindOf names the sentinel err matches.
func kindOf(err error) string {
	for _, k := range []error{redlock.ErrKindConflict, redlock.ErrSlotsConflict, redlock.ErrLockHeld, redlock.ErrQuorumUnavailable, redlock.ErrExpired} {
		if errors.Is(err, k) {
			return k.Error()
		}
	}
	return "other"
}

// expireTime is key's absolute expiry on s in ms, -2 when s has no key.
func expireTime(t *testing.T, s *redistest.Server, key string) int64 {
	t.Helper()
	c := s.Client()
	defer c.Close()
	ms, err := c.Do(context.Background(), "pexpiretime", key).Int64()
	if err != nil || ms == -1 {
		t.Fatalf("PEXPIRETIME %s on %s: %d, %v", key, s.Addr(), ms, err)
	}
	return ms // -2: no such key
}

// TestFreeSlots: a slot is free when its key holds no value on a majority
// of the masters that answered: a slot granted is held, a straggler's
// copy on one master of five is no holder, a paused master does not hold
// the round up once a quorum agrees on every slot, and fewer than a
// quorum answering is ErrQuorumUnavailable. It registers nothing.
func TestFreeSlots(t *testing.T) {
	servers := redistest.StartN(t, 5, redistest.Options{})
	ctx := context.Background()
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), patient)
	if _, err := c.AcquireSlot(ctx, redlock.Slot{Semaphore: "fs", Slots: 3, Index: 1}, time.Minute); err != nil {
		t.Fatalf("acquire slot 1: %v", err)
	}
	set(t, servers[0], redlock.SlotKey("fs", 2), "straggler", time.Minute)
	free, err := c.FreeSlots(ctx, "fs", 3)
	if err != nil {
		t.Fatalf("free slots: %v", err)
	}
	if want := []bool{true, false, true}; !slices.Equal(free, want) {
		t.Fatalf("free slots %v, want %v (slot 1 granted, slot 2 a straggler on one master)", free, want)
	}
	for _, s := range servers {
		rc := s.Client()
		n, err := rc.Exists(ctx, redlock.LineKey("fs")).Result()
		_ = rc.Close()
		if err != nil || n != 0 {
			t.Fatalf("%s: the line of fs exists (%d, %v) after a look at the slots: want nothing registered", s.Addr(), n, err)
		}
	}
	for _, s := range servers {
		waitFor(t, nodeTimeout, s.Addr()+" to hold slot 1 of fs (a straggler's write lands within the node timeout)", func() bool {
			return value(t, s, redlock.SlotKey("fs", 1)) != ""
		})
	}
	// A paused master: a quorum of the others agrees on every slot, and
	// the round ends without waiting for it.
	if err := servers[4].Stop(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	free, err = c.FreeSlots(ctx, "fs", 3)
	took := time.Since(start)
	if err := servers[4].Cont(); err != nil {
		t.Fatal(err)
	}
	if err != nil || !slices.Equal(free, []bool{true, false, true}) {
		t.Fatalf("free slots with a master paused: %v, %v; want [true false true]", free, err)
	}
	if took >= nodeTimeout {
		t.Fatalf("free slots with a master paused took %v: the round waited for it (node timeout %v) though a quorum agreed", took, nodeTimeout)
	}
	for _, s := range servers[:3] {
		if err := s.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.FreeSlots(ctx, "fs", 3); !errors.Is(err, redlock.ErrQuorumUnavailable) {
		t.Fatalf("free slots with 2 of 5 masters up: %v, want ErrQuorumUnavailable", err)
	}
	if _, err := c.FreeSlots(ctx, "fs", 0); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Fatalf("free slots of a semaphore of 0 slots: %v, want ErrInvalidArgument", err)
	}
}
