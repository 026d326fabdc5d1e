package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
	if err := a.LeaveLine(ctx, "line", "waiter-a", 0); err != nil {
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

// TestLineFullAndUnavailable: a waiter refused a place in a full line
// (MaxLine, and for a semaphore MaxLine + slots - 1), and one whose line
// fewer than a quorum of masters answer for, may attempt as if there were
// no line.
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
	// A semaphore's line of 3 slots holds its heads beyond MaxLine.
	slot := redlock.Slot{Semaphore: "full-sem", Slots: 3}
	for i := range redlock.MaxLine + 2 {
		if tr := c.CheckSlotTurn(context.Background(), slot, fmt.Sprintf("w%02d", i), 0, lineLife); !tr.Registered {
			t.Fatalf("semaphore waiter %d: %+v", i, tr)
		}
	}
	if tr := c.CheckSlotTurn(context.Background(), slot, "late", 0, lineLife); tr.Registered || !tr.Go || tr.Ticket != 0 {
		t.Fatalf("a waiter past MaxLine + 2 in a semaphore's line of 3 slots: %+v, want no ticket and its turn", tr)
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
	if err := c.LeaveLine(ctx, "sem", "first", 0); err != nil {
		t.Fatal(err)
	}
	if tr := c.CheckSlotTurn(ctx, slot(0), "third", tickets[2], lineLife); !tr.Go || tr.Ahead != 1 {
		t.Fatalf("third waiter once the first left: %+v", tr)
	}
}

// TestPeekTurn: a peek registers nothing and says whether a client with
// no ticket may attempt: at once with an empty line (the next ticket is
// still the first), not with a waiter in it; in a semaphore's line of 2,
// until two wait.
func TestPeekTurn(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	c := newClient(t, redistest.Addrs(servers))
	ctx := context.Background()
	if tr := c.PeekTurn(ctx, "peek"); !tr.Go || tr.Ahead != 0 || tr.Ticket != 0 || tr.Registered || !tr.Free || tr.Err != nil {
		t.Fatalf("peek at an empty line of a free key: %+v", tr)
	}
	first := turn(t, c, "peek", "first", 0)
	if first.Ticket != 1 {
		t.Fatalf("the first ticket after a peek is %d, want 1: the peek registered", first.Ticket)
	}
	if tr := c.PeekTurn(ctx, "peek"); tr.Go || tr.Ahead != 1 || tr.Err != nil {
		t.Fatalf("peek with one waiter: %+v, want no turn, one ahead", tr)
	}
	slot := redlock.Slot{Semaphore: "psem", Slots: 2, Index: 0}
	for i, w := range []string{"a", "b"} {
		if tr := c.PeekSlotTurn(ctx, slot); !tr.Go || tr.Ahead != i {
			t.Fatalf("peek at a semaphore of 2 with %d waiting: %+v", i, tr)
		}
		if tr := c.CheckSlotTurn(ctx, slot, w, 0, lineLife); tr.Err != nil {
			t.Fatal(tr.Err)
		}
	}
	if tr := c.PeekSlotTurn(ctx, slot); tr.Go || tr.Ahead != 2 {
		t.Fatalf("peek at a semaphore of 2 with 2 waiting: %+v", tr)
	}
	if tr := c.PeekTurn(ctx, "bad:line"); !tr.Go || tr.Err == nil {
		t.Fatalf("peek at a reserved key: %+v, want a turn and the key's error", tr)
	}
}

// TestLineACLRulesSuffice: a user allowed ACLRules and LineACLRules
// peeks, takes a ticket, checks its turn and leaves; one allowed ACLRules
// alone is refused the line (NOPERM), and is let attempt as without one.
func TestLineACLRulesSuffice(t *testing.T) {
	ctx := context.Background()
	servers := aclServers(t, 3, redlock.ACLRules+" "+redlock.LineACLRules)
	c := newClient(t, redistest.Addrs(servers), redlock.WithAuth("locker", "pw"))
	if tr := c.PeekTurn(ctx, "acl-line"); tr.Err != nil || !tr.Go {
		t.Fatalf("peek with the line rules: %+v", tr)
	}
	tr := c.CheckTurn(ctx, "acl-line", "w", 0, lineLife)
	if tr.Err != nil || !tr.Registered || !tr.Go {
		t.Fatalf("check with the line rules: %+v", tr)
	}
	if tr := c.CheckTurn(ctx, "acl-line", "w", tr.Ticket, lineLife); tr.Err != nil || !tr.Registered {
		t.Fatalf("check again with the line rules: %+v", tr)
	}
	if err := c.LeaveLine(ctx, "acl-line", "w", tr.Ticket); err != nil {
		t.Fatalf("leave with the line rules: %v", err)
	}

	bare := aclServers(t, 3, redlock.ACLRules)
	b := newClient(t, redistest.Addrs(bare), redlock.WithAuth("locker", "pw"))
	// A script's refused command: "NOPERM", or "can't run this command"
	// (Redis 7.0).
	tr = b.CheckTurn(ctx, "acl-line", "w", 0, lineLife)
	refused := tr.Err != nil && (strings.Contains(tr.Err.Error(), "NOPERM") || strings.Contains(tr.Err.Error(), "can't run this command"))
	if !tr.Go || !errors.Is(tr.Err, redlock.ErrLineUnavailable) || !refused {
		t.Fatalf("check without the line rules: %+v, want a turn and ErrLineUnavailable (the command refused)", tr)
	}
}

// TestLeaveSparesANewerTicket: a leave for a ticket the waiter no longer
// holds (a late one, after it registered anew) takes nothing out; one
// for its ticket does.
func TestLeaveSparesANewerTicket(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	c := newClient(t, redistest.Addrs(servers))
	ctx := context.Background()
	turn(t, c, "spare", "other", 0)
	if tr := turn(t, c, "spare", "w", 7); tr.Ahead != 1 {
		t.Fatalf("w with ticket 7: %+v", tr)
	}
	if err := c.LeaveLine(ctx, "spare", "w", 3); err != nil {
		t.Fatal(err)
	}
	if tr := c.PeekTurn(ctx, "spare"); tr.Ahead != 2 {
		t.Fatalf("after a leave for a ticket w does not hold: %d waiting, want 2", tr.Ahead)
	}
	if err := c.LeaveLine(ctx, "spare", "w", 7); err != nil {
		t.Fatal(err)
	}
	if tr := c.PeekTurn(ctx, "spare"); tr.Ahead != 1 {
		t.Fatalf("after w left with its ticket: %d waiting, want 1", tr.Ahead)
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

// TestLineResumesATicket: a waiter that asks for a ticket again while its
// registration stands (its client restarted, or another manager took
// over) resumes its place ahead of those who came later; one whose entry
// is gone takes a new ticket behind them.
func TestLineResumesATicket(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	first := newClient(t, redistest.Addrs(servers))
	ctx := context.Background()
	a := turn(t, first, "resume", "a", 0)
	b := turn(t, first, "resume", "b", 0)
	if a.Ticket != 1 || b.Ticket != 2 || !a.Go || b.Go {
		t.Fatalf("a %+v, b %+v", a, b)
	}
	restarted := newClient(t, redistest.Addrs(servers))
	again := turn(t, restarted, "resume", "a", 0)
	if again.Ticket != a.Ticket || !again.Go || !again.Registered {
		t.Fatalf("a again after a restart: %+v, want its ticket %d and its turn", again, a.Ticket)
	}
	if tr := turn(t, restarted, "resume", "b", b.Ticket); tr.Go || tr.Ahead != 1 {
		t.Fatalf("b behind the resumed a: %+v", tr)
	}
	if err := restarted.WithdrawFromLine(ctx, "resume", "a", 0); err != nil {
		t.Fatal(err)
	}
	if tr := turn(t, restarted, "resume", "a", 0); tr.Ticket != 3 || tr.Go || tr.Ahead != 1 {
		t.Fatalf("a after it left: %+v, want a new ticket 3 behind b", tr)
	}
}
