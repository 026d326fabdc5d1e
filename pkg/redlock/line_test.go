package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// lineLife is how long a registration stands in these tests.
const lineLife = 10 * time.Second

// turn checks waiter's turn in key's line, failing the test when the line
// could not be used.
func turn(t *testing.T, c *redlock.Client, key, waiter string, ticket int64) redlock.Turn {
	t.Helper()
	tr := c.CheckTurn(context.Background(), key, waiter, ticket, lineLife)
	if tr.Err != nil {
		t.Fatalf("turn of %s: %v", waiter, tr.Err)
	}
	return tr
}

// TestLineOrdersWaiters: the first to register goes first, the next waits
// until it leaves; a key held elsewhere is not free, and the line never
// decides who holds it.
func TestLineOrdersWaiters(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	a := newClient(t, redistest.Addrs(servers))
	b := newClient(t, redistest.Addrs(servers), redlock.WithTries(1))
	ctx := context.Background()
	held, err := a.Acquire(ctx, "line", time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	first := turn(t, a, "line", "waiter-a", 0)
	if !first.Go || !first.Registered || first.Ticket == 0 || first.Free {
		t.Fatalf("first waiter: %+v, want its turn, registered, with a ticket, the key not free", first)
	}
	second := turn(t, b, "line", "waiter-b", 0)
	if second.Go || !second.Registered || second.Ticket <= first.Ticket || second.Ahead != 1 {
		t.Fatalf("second waiter: %+v, want no turn behind one, a ticket above %d", second, first.Ticket)
	}
	if again := turn(t, a, "line", "waiter-a", first.Ticket); !again.Go || again.Ticket != first.Ticket {
		t.Fatalf("first waiter checking again: %+v", again)
	}

	// The line decides nothing: the second waiter's acquisition is refused
	// by the key alone, and would be granted once it is free.
	if _, err := b.Acquire(ctx, "line", time.Minute); !errors.Is(err, redlock.ErrLockHeld) {
		t.Fatalf("acquire while held: %v", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if tr := turn(t, b, "line", "waiter-b", second.Ticket); tr.Go || !tr.Free {
		t.Fatalf("second waiter once the key is free, the first still waiting: %+v", tr)
	}
	if err := a.LeaveLine(ctx, "line", "waiter-a"); err != nil {
		t.Fatal(err)
	}
	if tr := turn(t, b, "line", "waiter-b", second.Ticket); !tr.Go || tr.Ahead != 0 {
		t.Fatalf("second waiter once the first left: %+v", tr)
	}
}

// TestLineTiesAndLapses: waiters that took the same ticket are ordered by
// their ids' bytes on every master (not by a locale's collation: "B" is
// before "a"), and a ticket nobody renews lapses on the masters' clocks.
func TestLineTiesAndLapses(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	c := newClient(t, redistest.Addrs(servers))
	ctx := context.Background()
	if tr := turn(t, c, "tie", "a", 7); !tr.Go {
		t.Fatalf("a alone: %+v", tr)
	}
	if tr := turn(t, c, "tie", "B", 7); !tr.Go || tr.Ahead != 0 {
		t.Fatalf("B, with a's ticket and a lower id: %+v, want its turn", tr)
	}
	if tr := turn(t, c, "tie", "a", 7); tr.Go || tr.Ahead != 1 {
		t.Fatalf("a behind B: %+v", tr)
	}

	// Long enough for the second waiter's two rounds on a loaded machine.
	const short = 3 * time.Second
	if tr := c.CheckTurn(ctx, "lapse", "gone", 0, short); !tr.Registered {
		t.Fatalf("gone: %+v", tr)
	}
	stays := turn(t, c, "lapse", "stays", 0)
	if stays.Go {
		t.Fatalf("stays behind gone: %+v", stays)
	}
	waitFor(t, short+2*time.Second, "the unrenewed ticket to lapse", func() bool {
		return turn(t, c, "lapse", "stays", stays.Ticket).Go
	})
}

// TestLineFullAndUnavailable: a waiter refused a place in a full line, and
// one whose line fewer than a quorum of masters answer for, may attempt as
// if there were no line.
func TestLineFullAndUnavailable(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	c := newClient(t, redistest.Addrs(servers), redlock.WithNodeTimeout(200*time.Millisecond))
	for i := range redlock.MaxLine {
		if tr := turn(t, c, "full", fmt.Sprintf("w%02d", i), 0); !tr.Registered {
			t.Fatalf("waiter %d: %+v", i, tr)
		}
	}
	if tr := turn(t, c, "full", "late", 0); tr.Registered || !tr.Go || tr.Ticket != 0 {
		t.Fatalf("a waiter past MaxLine: %+v, want no ticket and its turn", tr)
	}

	stopped(t, servers[:2]...)
	tr := c.CheckTurn(context.Background(), "full", "w05", 0, lineLife)
	if !tr.Go || !errors.Is(tr.Err, redlock.ErrLineUnavailable) {
		t.Fatalf("with two of three masters stopped: %+v, want its turn and the error", tr)
	}
}

// TestLineKeyReserved: a lock key may not end in the lines' suffix.
func TestLineKeyReserved(t *testing.T) {
	if err := redlock.ValidateKey("jobs:line"); err == nil {
		t.Fatal("a key ending in :line was accepted")
	}
}

// TestSlotLine: a semaphore's waiters share its line, whose first N may
// attempt at once.
func TestSlotLine(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	c := newClient(t, redistest.Addrs(servers))
	ctx := context.Background()
	slot := func(i int) redlock.Slot { return redlock.Slot{Semaphore: "sem", Slots: 2, Index: i} }
	var tickets []int64
	for i, w := range []string{"first", "second", "third"} {
		tr := c.CheckSlotTurn(ctx, slot(i%2), w, 0, lineLife)
		if tr.Err != nil || tr.Go != (i < 2) {
			t.Fatalf("%s waiter of a semaphore of 2: %+v", w, tr)
		}
		tickets = append(tickets, tr.Ticket)
	}
	if err := c.LeaveLine(ctx, "sem", "first"); err != nil {
		t.Fatal(err)
	}
	if tr := c.CheckSlotTurn(ctx, slot(0), "third", tickets[2], lineLife); !tr.Go || tr.Ahead != 1 {
		t.Fatalf("third waiter once the first left: %+v", tr)
	}
}

// TestRestoreLineKeyForRelease: a lock whose key ends in ":line" (granted
// before the suffix was reserved) is restored to be released, not to be
// renewed.
func TestRestoreLineKeyForRelease(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	c := newClient(t, redistest.Addrs(servers))
	if _, err := c.Restore("old:line", "v", time.Second, time.Now().Add(time.Minute)); err == nil {
		t.Error("a lock of a reserved key restored to be renewed")
	}
	l, err := c.Restore("old:line", "v", time.Second, time.Time{})
	if err != nil {
		t.Fatalf("restore to release: %v", err)
	}
	if err := l.Release(context.Background()); err != nil && !errors.Is(err, redlock.ErrNotHeld) {
		t.Fatalf("release: %v", err)
	}
}
