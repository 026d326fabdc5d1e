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
	tr := c.CheckTurn(context.Background(), key, redlock.LineKey(key), waiter, ticket, 1, lineLife)
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
	if err := a.LeaveLine(ctx, "line", redlock.LineKey("line"), "waiter-a"); err != nil {
		t.Fatal(err)
	}
	if tr := turn(t, b, "line", "waiter-b", second.Ticket); !tr.Go || tr.Ahead != 0 {
		t.Fatalf("second waiter once the first left: %+v", tr)
	}
}

// TestLineTiesAndLapses: waiters that took the same ticket are ordered by
// id on every master, and a ticket nobody renews lapses on the masters'
// clocks.
func TestLineTiesAndLapses(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	c := newClient(t, redistest.Addrs(servers))
	ctx := context.Background()
	if tr := turn(t, c, "tie", "z", 7); !tr.Go {
		t.Fatalf("z alone: %+v", tr)
	}
	if tr := turn(t, c, "tie", "m", 7); !tr.Go || tr.Ahead != 0 {
		t.Fatalf("m, with z's ticket and a lower id: %+v, want its turn", tr)
	}
	if tr := turn(t, c, "tie", "z", 7); tr.Go || tr.Ahead != 1 {
		t.Fatalf("z behind m: %+v", tr)
	}

	const short = 300 * time.Millisecond
	if tr := c.CheckTurn(ctx, "lapse", redlock.LineKey("lapse"), "gone", 0, 1, short); !tr.Registered {
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
	tr := c.CheckTurn(context.Background(), "full", redlock.LineKey("full"), "w05", 0, 1, lineLife)
	if !tr.Go || tr.Err == nil {
		t.Fatalf("with two of three masters stopped: %+v, want its turn and the error", tr)
	}
}

// TestLineKeyReserved: a lock key may not end in the lines' suffix.
func TestLineKeyReserved(t *testing.T) {
	if err := redlock.ValidateKey("jobs:line"); err == nil {
		t.Fatal("a key ending in :line was accepted")
	}
}
