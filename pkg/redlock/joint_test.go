package redlock_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Replacing one dead master of five with locks held: through the joint
// client the holder keeps its grant (no lapse) and the new master gets its
// copy, a rival is refused throughout, the new master votes only after its
// window, and once the change is over the lock is held on the new list
// alone — a quorum of it survives losing two of the masters the lists share
// — with fencing tokens still rising.
func TestJointQuorumReplacesADeadMasterWithALockHeld(t *testing.T) {
	const window, ttl = 3 * time.Second, 2 * time.Second
	servers := redistest.StartN(t, 6, redistest.Options{})
	addrs := redistest.Addrs(servers)
	previous, current := addrs[:5], append(slices.Clone(addrs[:4]), addrs[5])
	waitUp(t, servers, window)
	ctx := context.Background()
	// Rivals try once; the holder's own acquisition retries, as the
	// operator's would, on a loaded machine.
	opts := []redlock.Option{redlock.WithTries(1), redlock.WithQuarantine(window), redlock.WithNodeTimeout(500 * time.Millisecond)}
	before := newClient(t, previous, redlock.WithQuarantine(window), redlock.WithNodeTimeout(500*time.Millisecond))
	held, err := before.Acquire(ctx, "job", ttl, redlock.WithFencing())
	if err != nil {
		t.Fatal(err)
	}
	if err := servers[4].Kill(); err != nil {
		t.Fatal(err)
	}

	newVotes := time.Now().Add(window)
	joint := newClient(t, current, append(opts, redlock.WithJoint(previous, newVotes))...)
	if !joint.Joint() {
		t.Fatal("a client with another previous list is not joint")
	}
	lock, err := joint.Restore(held.Key(), held.Value(), ttl, held.ValidUntil(), redlock.WithToken(held.Token()))
	if err != nil {
		t.Fatal(err)
	}
	var extensions int
	for time.Now().Before(newVotes.Add(ttl / 4)) {
		if err := lock.Extend(ctx); err != nil {
			t.Fatalf("extension %d through the joint client, the new master not voting yet: %v", extensions+1, err)
		}
		extensions++
		if _, err := joint.Acquire(ctx, "job", ttl); !errors.Is(err, redlock.ErrLockHeld) {
			t.Fatalf("a rival through the joint client while the lock is held: %v, want ErrLockHeld", err)
		}
		if q := joint.Masters()[4]; time.Now().Before(newVotes) && !q.QuarantinedUntil.After(time.Now()) {
			t.Fatalf("the new master %s votes before its window ended (quarantined until %v)", q.Addr, q.QuarantinedUntil)
		}
		waitFor(t, ttl, "the next extension's turn", func() bool { return time.Until(lock.ValidUntil()) < ttl/2 })
	}
	t.Logf("%d extensions through the joint client", extensions)
	spare := servers[5].Client()
	defer spare.Close()
	waitFor(t, ttl, "the new master to hold the lock's value, and its fencing counter at least the lock's token", func() bool {
		v, err := spare.Get(ctx, "job").Result()
		counter, cerr := spare.Get(ctx, redlock.FenceKey("job")).Int64()
		return err == nil && v == held.Value() && cerr == nil && counter >= held.Token()
	})

	// The change is over: the new list alone, two of the shared masters gone.
	after := newClient(t, current, opts...)
	moved, err := after.Restore(lock.Key(), lock.Value(), ttl, lock.ValidUntil())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range servers[:2] {
		if err := s.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	if err := moved.Extend(ctx); err != nil {
		t.Fatalf("extending on the new list with two shared masters down (the new master's copy counting): %v", err)
	}
	if err := moved.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := after.Acquire(ctx, "job", ttl, redlock.WithFencing())
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= held.Token() {
		t.Fatalf("token %d on the new list after the change, want above the token %d granted before it", next.Token(), held.Token())
	}
}

// Swapping every master while a lock is held: a client of the new list
// alone grants the key at once (two valid holders, which is why the list
// cannot simply be replaced), while the joint client refuses it for as long
// as the previous list's grant stands.
func TestJointQuorumRefusesARivalOfAGrantOnThePreviousList(t *testing.T) {
	const ttl = 2 * time.Second
	servers := redistest.StartN(t, 6, redistest.Options{})
	addrs := redistest.Addrs(servers)
	previous, current := addrs[:3], addrs[3:]
	ctx := context.Background()
	opts := []redlock.Option{redlock.WithTries(1), redlock.WithNodeTimeout(500 * time.Millisecond)}
	holder := newClient(t, previous, redlock.WithNodeTimeout(500*time.Millisecond))
	held, err := holder.Acquire(ctx, "swap", ttl)
	if err != nil {
		t.Fatal(err)
	}
	// New masters voting at once isolates the previous list's part.
	joint := newClient(t, current, append(opts, redlock.WithJoint(previous, time.Time{}))...)
	if _, err := joint.Acquire(ctx, "swap", ttl); !errors.Is(err, redlock.ErrLockHeld) {
		t.Fatalf("the joint client while a grant on the previous list stands: %v, want ErrLockHeld", err)
	}
	swapped := newClient(t, current, opts...)
	rival, err := swapped.Acquire(ctx, "swap", ttl)
	if err != nil {
		t.Fatalf("a client of the new list alone: %v (expected to grant, showing why a swap needs joint quorums)", err)
	}
	if !held.Valid() {
		t.Fatal("the first grant lapsed before the rival's was made: the test shows nothing")
	}
	if err := rival.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := joint.Acquire(ctx, "swap", ttl); err != nil {
		t.Fatalf("the joint client once the key is free on both lists: %v", err)
	}
}

// A master the change only renames (another address string of the same
// server) is one master of each list: its extensions count in both, not as
// a server listed twice. (An acquisition's SET NX reaches it twice, and
// only the first is granted: a renamed master counts once there.)
func TestJointQuorumCountsARenamedMasterInBothLists(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	previous := redistest.Addrs(servers)
	current := append(slices.Clone(previous[:2]), redistest.Aliases(servers)[2])
	const window = 1500 * time.Millisecond // duplicates are found by the quarantine check
	waitUp(t, servers, window)
	ctx := context.Background()
	joint := newClient(t, current, redlock.WithNodeTimeout(500*time.Millisecond), redlock.WithQuarantine(window), redlock.WithJoint(previous, time.Time{}))
	if _, err := joint.Probe(ctx); err != nil { // connects to every address
		t.Fatal(err)
	}
	lock, err := joint.Acquire(ctx, "renamed", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := servers[0].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := lock.Extend(ctx); err != nil {
		t.Fatalf("with one shared master down, the renamed master and the other shared one must make a quorum of each list: %v", err)
	}
}
