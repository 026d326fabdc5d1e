package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/internal/harness/history"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// expectKindConflict checks that err is ErrKindConflict (not another
// refusal) and that a quorum of the answered votes refused because the
// masters hold key as the kind held.
func expectKindConflict(t *testing.T, err error, what, key string, held redlock.Kind, quorum int) {
	t.Helper()
	if !errors.Is(err, redlock.ErrKindConflict) || errors.Is(err, redlock.ErrLockHeld) || errors.Is(err, redlock.ErrSlotsConflict) {
		t.Fatalf("%s: %v, want ErrKindConflict", what, err)
	}
	refused := 0
	for _, v := range votesOf(t, err) {
		var ke *redlock.KindConflictError
		if errors.As(v.Err, &ke) {
			if v.Outcome != redlock.OutcomeHeld || ke.Key != key || ke.Held != held {
				t.Fatalf("%s: vote %+v, want held with a conflict naming %q held as a %s", what, v, key, held)
			}
			refused++
		}
	}
	if refused < quorum {
		t.Fatalf("%s: %d masters refused for the other kind, want a quorum (%d)", what, refused, quorum)
	}
}

// TestKeyIsOneKind: with 3 and 5 masters, a semaphore of a plain lock's
// key is refused with ErrKindConflict while the lock is held (through its
// extensions), and a plain lock of a semaphore's key while any slot is
// held; a refusal by every master writes nothing, and refusals end once
// the first kind's holders have released.
func TestKeyIsOneKind(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d masters", n), func(t *testing.T) {
			servers := redistest.StartN(t, n, redistest.Options{})
			ctx := context.Background()
			quorum := n/2 + 1
			c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), patient)

			// A lock, then a semaphore of its key.
			l, err := c.Acquire(ctx, "kind-a", time.Minute, redlock.WithFencing())
			if err != nil {
				t.Fatal(err)
			}
			// Acquire returns on a quorum: once the stragglers' copies
			// landed too, every master refuses, and nothing is written.
			waitHeldEverywhere(t, servers, "kind-a", l.Value(), nodeTimeout)
			for round := range 2 {
				_, err = c.AcquireSlot(ctx, redlock.Slot{Semaphore: "kind-a", Slots: 1, Index: 0}, time.Minute, redlock.WithFencing())
				expectKindConflict(t, err, "a slot of the held lock's key", "kind-a", redlock.KindLock, quorum)
				_, err = c.AcquireSemaphore(ctx, "kind-a", 3, time.Minute)
				expectKindConflict(t, err, "a semaphore of the held lock's key", "kind-a", redlock.KindLock, quorum)
				if round == 0 {
					if err := l.Extend(ctx); err != nil {
						t.Fatalf("extend the lock beside refused semaphores: %v", err)
					}
				}
			}
			for _, s := range servers {
				if v := value(t, s, "kind-a"); v != l.Value() {
					t.Fatalf("%s stores %q under kind-a after the semaphore was refused, want the lock's value", s.Addr(), v)
				}
				for _, k := range []string{redlock.SlotKey("kind-a", 0), redlock.FenceKey(redlock.SlotKey("kind-a", 0))} {
					if v := value(t, s, k); v != "" {
						t.Fatalf("%s stores %q under %s after the semaphore was refused", s.Addr(), v, k)
					}
				}
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			sem, err := c.AcquireSemaphore(ctx, "kind-a", 1, time.Minute)
			if err != nil {
				t.Fatalf("a semaphore of the key once the lock was released: %v", err)
			}
			if err := sem.Release(ctx); err != nil {
				t.Fatal(err)
			}

			// A semaphore, then a lock of its key.
			a, err := c.AcquireSemaphore(ctx, "kind-b", 2, time.Minute, redlock.WithFencing())
			if err != nil {
				t.Fatal(err)
			}
			b, err := c.AcquireSemaphore(ctx, "kind-b", 2, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			waitHeldEverywhere(t, servers, "kind-b", redlock.Declaration(2), nodeTimeout)
			_, err = c.Acquire(ctx, "kind-b", time.Minute)
			expectKindConflict(t, err, "a lock of the held semaphore's key", "kind-b", redlock.KindSemaphore, quorum)
			_, err = c.Acquire(ctx, "kind-b", time.Minute, redlock.WithFencing())
			expectKindConflict(t, err, "a fenced lock of the held semaphore's key", "kind-b", redlock.KindSemaphore, quorum)
			for _, s := range servers {
				if v := value(t, s, "kind-b"); v != redlock.Declaration(2) {
					t.Fatalf("%s stores %q under kind-b after the lock was refused, want the semaphore's declaration", s.Addr(), v)
				}
				if v := value(t, s, redlock.FenceKey("kind-b")); v != "" {
					t.Fatalf("%s stores %q under %s after the lock was refused", s.Addr(), v, redlock.FenceKey("kind-b"))
				}
			}
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			_, err = c.Acquire(ctx, "kind-b", time.Minute)
			expectKindConflict(t, err, "a lock of the semaphore's key while one of two slots is held", "kind-b", redlock.KindSemaphore, quorum)
			if err := b.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Acquire(ctx, "kind-b", time.Minute); err != nil {
				t.Fatalf("a lock of the key once the semaphore's holders released: %v", err)
			}
		})
	}
}

// TestKindsRaceForOneKey: with 3 and 5 masters, clients race plain locks
// and a semaphore of 2 slots for one key, their requests interleaving on
// every master, some holders walking away: the history never has a
// lock's holder and a slot's at once (the check counts the two kinds of
// one key as conflicting), and both kinds are served in turn.
func TestKindsRaceForOneKey(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d masters", n), func(t *testing.T) {
			servers := redistest.StartN(t, n, redistest.Options{})
			grants, refusals := contend(t, redistest.Addrs(servers), 8, 12, func(c *redlock.Client, w, _ int) (*redlock.Lock, error) {
				if w%2 == 0 {
					return c.Acquire(context.Background(), "kind-race", 300*time.Millisecond, redlock.WithFencing())
				}
				return c.AcquireSemaphore(context.Background(), "kind-race", 2, 300*time.Millisecond, redlock.WithFencing())
			})
			if err := history.Check(grants); err != nil {
				t.Fatalf("a key held as both kinds at once: %v", err)
			}
			locks, slots := 0, 0
			for _, g := range grants {
				if g.Semaphore == "" {
					locks++
				} else {
					slots++
				}
			}
			if locks == 0 || slots == 0 {
				t.Fatalf("both kinds should have been served in turn: %d lock grants, %d slot grants", locks, slots)
			}
			t.Logf("%d lock grants and %d slot grants checked; refusals %v", locks, slots, refusals)
		})
	}
}

// TestKindLeftByAnotherClientEndsExtension: a slot's copy whose
// semaphore's key holds a plain lock's value on a master (written by a
// client that does not check kinds, such as an older version) is not
// extended: when a quorum has both kinds, the slot is lost rather than
// held beside the other kind. (A plain lock and a declaration share the
// key: they cannot sit side by side.)
func TestKindLeftByAnotherClientEndsExtension(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	c := newClient(t, redistest.Addrs(servers), redlock.WithTries(1), patient)

	sl, err := c.AcquireSlot(ctx, redlock.Slot{Semaphore: "kind-f", Slots: 1, Index: 0}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	waitHeldEverywhere(t, servers, sl.Key(), sl.Value(), nodeTimeout)
	for _, s := range servers[:2] {
		set(t, s, "kind-f", "another client's lock", time.Minute)
	}
	if err := sl.Extend(ctx); !errors.Is(err, redlock.ErrNotHeld) {
		t.Fatalf("extend a slot beside a plain lock of its semaphore's key on two masters of three: %v, want ErrNotHeld", err)
	}
}

// TestPutBackRefusesTheOtherKind: an extension puts a lost copy back only
// where the master does not hold the key as the other kind (another
// client's attempt that reached a minority), and does once that is gone.
func TestPutBackRefusesTheOtherKind(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	addrs := redistest.Addrs(servers)
	ctx := context.Background()
	lost := servers[2]
	for _, tc := range []struct {
		name  string
		slot  *redlock.Slot
		key   string
		other map[string]string // the other kind's keys on the lost copy's master
	}{
		{"a lock beside a semaphore's slot", nil, "kind-p",
			map[string]string{"kind-p": redlock.Declaration(1), redlock.SlotKey("kind-p", 0): "another"}},
		{"a slot beside a plain lock", &redlock.Slot{Semaphore: "kind-q", Slots: 1, Index: 0}, redlock.SlotKey("kind-q", 0),
			map[string]string{"kind-q": "another"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, addrs, redlock.WithTries(1), patient)
			var l *redlock.Lock
			var err error
			if tc.slot != nil {
				l, err = c.AcquireSlot(ctx, *tc.slot, time.Minute)
			} else {
				l, err = c.Acquire(ctx, tc.key, time.Minute)
			}
			if err != nil {
				t.Fatal(err)
			}
			waitHeldEverywhere(t, servers, l.Key(), l.Value(), nodeTimeout)
			cl := lost.Client()
			defer cl.Close()
			if err := cl.Del(ctx, l.Key()).Err(); err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.other {
				set(t, lost, k, v, time.Minute)
			}
			if err := l.Extend(ctx); err != nil {
				t.Fatalf("extend with two copies of three: %v", err)
			}
			_ = c.Close() // waits for the put back
			if v := value(t, lost, l.Key()); v != tc.other[l.Key()] {
				t.Fatalf("the copy was put back beside the other kind: %s stores %q, want %q", l.Key(), v, tc.other[l.Key()])
			}
			for k := range tc.other {
				if err := cl.Del(ctx, k).Err(); err != nil {
					t.Fatal(err)
				}
			}
			opts := []redlock.RestoreOption{}
			if tc.slot != nil {
				opts = append(opts, redlock.WithSlot(*tc.slot))
			}
			c2 := newClient(t, addrs, redlock.WithTries(1), patient)
			r, err := c2.Restore(l.Key(), l.Value(), l.TTL(), l.ValidUntil(), opts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Extend(ctx); err != nil {
				t.Fatalf("extend once the other kind is gone: %v", err)
			}
			_ = c2.Close()
			if v := value(t, lost, l.Key()); v != l.Value() {
				t.Fatalf("the copy was not put back once the other kind was gone: %s stores %q", l.Key(), v)
			}
		})
	}
}
