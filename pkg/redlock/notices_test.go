package redlock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// noticeWait bounds the wait for a notice in these tests: a release's
// requests and their PUBLISH answer within the node timeout (patient).
const noticeWait = 2 * nodeTimeout

// listener collects the keys a Notices called back with.
type listener struct {
	mu   sync.Mutex
	keys []string
	got  chan string
}

func newListener() *listener { return &listener{got: make(chan string, 100)} }

func (l *listener) onRelease(key string) {
	l.mu.Lock()
	l.keys = append(l.keys, key)
	l.mu.Unlock()
	l.got <- key
}

// next waits for the next key called back.
func (l *listener) next(t *testing.T, what string) string {
	t.Helper()
	select {
	case k := <-l.got:
		return k
	case <-time.After(noticeWait):
		t.Fatalf("no release notice within %v: %s", noticeWait, what)
		return ""
	}
}

// noticeRig is a holder that publishes release notices and a waiter
// whose Notices (l hears them) listens, on the same masters.
type noticeRig struct {
	holder, waiter *redlock.Client
	notices        *redlock.Notices
	l              *listener
}

func newNoticeRig(t *testing.T, servers []*redistest.Server, opts ...redlock.Option) *noticeRig {
	t.Helper()
	opts = append(opts, redlock.WithTries(1), patient)
	r := &noticeRig{l: newListener()}
	r.holder = newClient(t, redistest.Addrs(servers), append(opts, redlock.WithReleaseNotices())...)
	r.waiter = newClient(t, redistest.Addrs(servers), opts...)
	notices, err := r.waiter.Notices(r.l.onRelease)
	if err != nil {
		t.Fatal(err)
	}
	r.notices = notices
	t.Cleanup(func() { _ = r.notices.Close() })
	return r
}

// releaseAndClose acquires key with c, releases it and closes c (which
// waits for the PUBLISHes).
func releaseAndClose(t *testing.T, c *redlock.Client, key string) {
	t.Helper()
	ctx := context.Background()
	lock, err := c.Acquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatalf("release of %q: %v", key, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// watching is a rig whose waiter watches key.
func watching(t *testing.T, servers []*redistest.Server, key string, opts ...redlock.Option) *noticeRig {
	t.Helper()
	r := newNoticeRig(t, servers, opts...)
	if err := r.notices.Watch(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	return r
}

// releaseAndHear acquires key with the holder, releases it, and waits for
// the waiter to hear of it.
func (r *noticeRig) releaseAndHear(t *testing.T, key, what string) {
	t.Helper()
	ctx := context.Background()
	lock, err := r.holder.Acquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if k := r.l.next(t, what); k != key {
		t.Fatalf("notice of %q, want %q: %s", k, key, what)
	}
}

// stopped stops servers (SIGSTOP: connections stay up, nothing answers)
// and continues them when the test ends.
func stopped(t *testing.T, servers ...*redistest.Server) {
	t.Helper()
	for _, s := range servers {
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Cont() })
	}
}

// subscribers is how many connections listen on channel, per master.
func subscribers(t *testing.T, servers []*redistest.Server, channel string) []int64 {
	t.Helper()
	out, err := redistest.Subscribers(context.Background(), servers, channel)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// waitSubscribers waits until every master has want listeners on key's
// notice channel (Watch returns once a quorum confirmed).
func waitSubscribers(t *testing.T, servers []*redistest.Server, key string, want int64) {
	t.Helper()
	waitFor(t, noticeWait, "every master to count the watcher's subscription", func() bool {
		for _, n := range subscribers(t, servers, redlock.NoticeChannel(key)) {
			if n != want {
				return false
			}
		}
		return true
	})
}

// TestReleaseNoticeWakesAWatcher: a client built WithReleaseNotices tells
// another client's Notices of each release of a watched key, once per
// release (at a quorum of masters), and of no key not watched; after
// Unwatch no master keeps the subscription.
func TestReleaseNoticeWakesAWatcher(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	r := newNoticeRig(t, servers)
	holder, waiter, l, notices := r.holder, r.waiter, r.l, r.notices

	if err := notices.Watch(ctx, "wake"); err != nil {
		t.Fatal(err)
	}
	waitSubscribers(t, servers, "wake", 1)
	for round := range 2 {
		lock, err := holder.Acquire(ctx, "wake", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		// On every master, so that its release deletes (and tells) on
		// every master.
		waitHeldEverywhere(t, servers, "wake", lock.Value(), nodeTimeout)
		if _, err := waiter.Acquire(ctx, "wake", time.Minute); !errors.Is(err, redlock.ErrLockHeld) {
			t.Fatalf("round %d: the waiter's attempt while held: %v, want ErrLockHeld", round, err)
		}
		if err := lock.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if k := l.next(t, "the holder released"); k != "wake" {
			t.Fatalf("round %d: notice of %q, want wake", round, k)
		}
		// Told at a quorum: the key is free on a quorum, and the
		// waiter's attempt at once wins it.
		won, err := waiter.Acquire(ctx, "wake", time.Minute)
		if err != nil {
			t.Fatalf("round %d: the waiter's attempt once told: %v", round, err)
		}
		if err := won.Release(ctx); err != nil {
			t.Fatal(err)
		}
		expectCopiesRemoved(t, servers, "wake", nodeTimeout)
	}
	// A key nobody watches: released with a notice nobody hears.
	other, err := holder.Acquire(ctx, "unwatched", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	waitHeldEverywhere(t, servers, "unwatched", other.Value(), nodeTimeout)
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	notices.Unwatch("wake")
	waitSubscribers(t, servers, "wake", 0)
	// Close waits for the holder's PUBLISHes: every master told of every
	// release whose copy it deleted (two rounds and the unwatched key).
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	for i, s := range servers {
		if n := commandCalls(t, s)["publish"]; n != 3 {
			t.Errorf("master %d: %d PUBLISH, want 3 (one per release)", i, n)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.keys) != 2 {
		t.Errorf("notices called back %v, want one per release of the watched key (2)", l.keys)
	}
}

// TestSlotReleaseTellsTheSemaphore: the release of a semaphore's slot is
// told on the semaphore key's channel, which a waiter for any slot
// watches, and not on the slot's own.
func TestSlotReleaseTellsTheSemaphore(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	r := newNoticeRig(t, servers)
	if err := r.notices.Watch(ctx, "sem-wake"); err != nil {
		t.Fatal(err)
	}
	slot := redlock.Slot{Semaphore: "sem-wake", Slots: 2, Index: 1}
	if err := r.notices.Watch(ctx, slot.Key()); err != nil {
		t.Fatal(err)
	}
	lock, err := r.holder.AcquireSlot(ctx, slot, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	waitHeldEverywhere(t, servers, slot.Key(), lock.Value(), nodeTimeout)
	if err := lock.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if k := r.l.next(t, "the slot's holder released"); k != "sem-wake" {
		t.Fatalf("notice of %q, want the semaphore's key sem-wake", k)
	}
	if err := r.holder.Close(); err != nil { // waits for its PUBLISHes
		t.Fatal(err)
	}
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if len(r.l.keys) != 1 {
		t.Errorf("notices called back %v, want one, of the semaphore's key", r.l.keys)
	}
}

// TestReleaseWithoutNoticesPublishesNothing: notices are opt-in; a client
// without WithReleaseNotices sends no PUBLISH.
func TestReleaseWithoutNoticesPublishesNothing(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	c, err := redlock.New(redistest.Addrs(servers), redlock.WithTries(1), patient)
	if err != nil {
		t.Fatal(err)
	}
	releaseAndClose(t, c, "quiet")
	for i, s := range servers {
		if n := commandCalls(t, s)["publish"]; n != 0 {
			t.Errorf("master %d: %d PUBLISH without WithReleaseNotices", i, n)
		}
	}
}

// noticeErrors records the NoticeEvents a client reports.
type noticeErrors struct {
	mu   sync.Mutex
	errs []error
}

func (*noticeErrors) ObserveOp(redlock.OpEvent)                 {}
func (*noticeErrors) ObserveQuarantine(redlock.QuarantineEvent) {}

func (o *noticeErrors) ObserveNotice(ev redlock.NoticeEvent) {
	o.mu.Lock()
	o.errs = append(o.errs, ev.Err)
	o.mu.Unlock()
}

// TestRefusedNoticeFailsNothing: a master whose ACL refuses the notice
// channel (ACLRules alone) still releases; the refused PUBLISH is only
// reported (NoticeObserver); a watcher there is not subscribed (Watch
// returns its context's error) and the refusal is reported too.
func TestRefusedNoticeFailsNothing(t *testing.T) {
	servers := aclServers(t, 3, redlock.ACLRules)
	ctx := context.Background()
	obs := &noticeErrors{}
	c, err := redlock.New(redistest.Addrs(servers), redlock.WithAuth("locker", "pw"), redlock.WithTries(1), patient,
		redlock.WithReleaseNotices(), redlock.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	releaseAndClose(t, c, "refused") // PUBLISH refused

	obs.mu.Lock()
	if len(obs.errs) != len(servers) {
		t.Fatalf("reported %v, want one refused PUBLISH per master", obs.errs)
	}
	for _, err := range obs.errs {
		if !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("reported %v, want NOPERM", err)
		}
	}
	obs.errs = nil
	obs.mu.Unlock()

	waiter, err := redlock.New(redistest.Addrs(servers), redlock.WithAuth("locker", "pw"), redlock.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = waiter.Close() })
	notices, err := waiter.Notices(func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = notices.Close() })
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := notices.Watch(short, "refused"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Watch where SUBSCRIBE is refused: %v, want its context's deadline", err)
	}
	waitFor(t, noticeWait, "the refused SUBSCRIBE (NOPERM) to be reported", func() bool {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return len(obs.errs) > 0 && strings.Contains(errors.Join(obs.errs...).Error(), "NOPERM")
	})
}

// TestNoticeACLRulesSuffice: a user allowed ACLRules and NoticeACLRules
// publishes and hears release notices.
func TestNoticeACLRulesSuffice(t *testing.T) {
	servers := aclServers(t, 3, redlock.ACLRules+" "+redlock.NoticeACLRules)
	r := watching(t, servers, "acl-notice", redlock.WithAuth("locker", "pw"))
	r.releaseAndHear(t, "acl-notice", "released with the notice ACL")
}

// TestExternalACLDocumented: the ACL user that docs/tasks/external-masters.md
// and the package doc give is exactly ACLRules, NoticeACLRules and
// LineACLRules, which the tests above and TestLineACLRulesSuffice prove
// suffice.
func TestExternalACLDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "tasks", "external-masters.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := "user redlock-operator on >PASSWORD ~* resetchannels " + redlock.ACLRules + " " + redlock.NoticeACLRules + " " + redlock.LineACLRules + "\n"
	if !strings.Contains(string(doc), want) {
		t.Errorf("docs/tasks/external-masters.md does not give the ACL user\n%s", want)
	}
}

// TestNoticesListenAgainAfterARestart: a master restarted comes back
// without the watcher's subscription; the watcher connects again and
// subscribes once more, and is told of the next release.
func TestNoticesListenAgainAfterARestart(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	r := watching(t, servers, "again")
	waitSubscribers(t, servers, "again", 1)
	for _, s := range servers[:2] {
		if err := s.Restart(false); err != nil {
			t.Fatal(err)
		}
	}
	// The listener finds its connection broken at once (EOF), and
	// connects again within its retry delay (at most 5s).
	waitFor(t, 10*time.Second, "the watcher to subscribe again on the restarted masters", func() bool {
		n := subscribers(t, servers, redlock.NoticeChannel("again"))
		return n[0] == 1 && n[1] == 1
	})
	r.releaseAndHear(t, "again", "released after the restarts")
}

// TestWatchWaitsForAQuorum: Watch returns once a quorum of masters
// confirmed the subscription; with a quorum stopped it returns its
// context's error, and the subscription is made when they answer again.
func TestWatchWaitsForAQuorum(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	r := newNoticeRig(t, servers)
	notices := r.notices
	// The listening connections are made before the masters stop.
	if err := notices.Watch(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	stopped(t, servers[1:]...)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err := notices.Watch(short, "quorum")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "of 3 masters subscribed") {
		t.Fatalf("Watch with two of three masters stopped: %v, want its deadline, saying how many subscribed", err)
	}
	for _, s := range servers[1:] {
		if err := s.Cont(); err != nil {
			t.Fatal(err)
		}
	}
	// A second Watch of the key waits for the first's subscription.
	if err := notices.Watch(ctx, "quorum"); err != nil {
		t.Fatal(err)
	}
	r.releaseAndHear(t, "quorum", "released once the masters answered")
}

// TestNoticesCloseEndsAWatch: a Watch waiting for a quorum returns
// ErrClosed once Notices is closed, and so does one called after; closing
// twice is fine.
func TestNoticesCloseEndsAWatch(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	r := newNoticeRig(t, servers)
	stopped(t, servers[1:]...)
	done := make(chan error, 1)
	go func() { done <- r.notices.Watch(context.Background(), "closing") }()
	if err := r.notices.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, redlock.ErrClosed) {
			t.Fatalf("Watch when closed: %v, want ErrClosed", err)
		}
	case <-time.After(noticeWait):
		t.Fatal("Watch still waits after Close")
	}
	if err := r.notices.Watch(context.Background(), "after"); !errors.Is(err, redlock.ErrClosed) {
		t.Fatalf("Watch after Close: %v, want ErrClosed", err)
	}
	if err := r.notices.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestAWatchWhoseDeadlinePassedBreaksNothing: a Watch called with a
// context already ended returns its error, and the connections it shares
// with the other watched keys stand: their releases are still told.
func TestAWatchWhoseDeadlinePassedBreaksNothing(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	obs := &noticeErrors{}
	r := newNoticeRig(t, servers, redlock.WithObserver(obs))
	ctx := context.Background()
	if err := r.notices.Watch(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := r.notices.Watch(ended, "late"); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch with an ended context: %v", err)
	}
	r.notices.Unwatch("late")
	r.releaseAndHear(t, "kept", "released after a Watch with an ended context")
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.errs) > 0 {
		t.Fatalf("listening connections broke: %v", obs.errs)
	}
}

// TestWatchAndUnwatchAtOnce: Watches and Unwatches of one key from many
// goroutines leave it subscribed on every master exactly when a Watch is
// left, whatever order their SUBSCRIBEs and UNSUBSCRIBEs took.
func TestWatchAndUnwatchAtOnce(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	r := newNoticeRig(t, servers)
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			for range 5 {
				if err := r.notices.Watch(ctx, "busy"); err != nil {
					t.Error(err)
					return
				}
				r.notices.Unwatch("busy")
			}
		})
	}
	wg.Wait()
	waitSubscribers(t, servers, "busy", 0)
	if err := r.notices.Watch(ctx, "busy"); err != nil {
		t.Fatal(err)
	}
	waitSubscribers(t, servers, "busy", 1)
	r.releaseAndHear(t, "busy", "released after the Watches and Unwatches")
}

// TestNoticesEndWithTheClient: once the client is closed, its Notices
// stops listening, and a Watch returns ErrClosed.
func TestNoticesEndWithTheClient(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	c, err := redlock.New(redistest.Addrs(servers), patient)
	if err != nil {
		t.Fatal(err)
	}
	notices, err := c.Notices(func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer notices.Close()
	if err := notices.Watch(context.Background(), "ends"); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Notices(func(string) {}); !errors.Is(err, redlock.ErrClosed) {
		t.Fatalf("Notices of a closed client: %v, want ErrClosed", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), noticeWait)
	defer cancel()
	waitFor(t, noticeWait, "a Watch to fail with ErrClosed once the client closed", func() bool {
		return errors.Is(notices.Watch(ctx, "after"), redlock.ErrClosed)
	})
}

// TestASilentConnectionIsMadeAnew: a master that stops answering (its
// process stopped: the connection stays up, the ping's write succeeds)
// is found by the unanswered ping and connected to anew; once it answers
// again, the watcher is subscribed there and told of releases through it.
func TestASilentConnectionIsMadeAnew(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	obs := &noticeErrors{}
	r := newNoticeRig(t, servers, redlock.WithObserver(obs))
	redlock.SetNoticePing(r.notices, 200*time.Millisecond)
	ctx := context.Background()
	// The confirmations end the listeners' first reads, of noticePing
	// (30s): the next ones are of the shortened ping.
	if err := r.notices.Watch(ctx, "silent"); err != nil {
		t.Fatal(err)
	}
	// Master 0's too, which Watch's quorum need not include.
	waitSubscribers(t, servers, "silent", 1)
	stopped(t, servers[0])
	waitFor(t, noticeWait, "the unanswered ping to be reported", func() bool {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return len(obs.errs) > 0 && strings.Contains(errors.Join(obs.errs...).Error(), "no answer to a ping")
	})
	if err := servers[0].Cont(); err != nil {
		t.Fatal(err)
	}
	// With master 1 stopped, a quorum of confirmations and of notices
	// needs master 0's new connection.
	stopped(t, servers[1])
	// Made again within the retry delay (at most 5s).
	within, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.notices.Watch(within, "again-silent"); err != nil {
		t.Fatalf("Watch through the master that answers again: %v", err)
	}
	r.releaseAndHear(t, "again-silent", "released through the master that answers again")
}

// TestWithdrawalTellsTheWaitersBehind: a waiter that leaves the line
// without the key (WithdrawFromLine) tells the key's channel on every
// master it left, once per withdrawal, so that the next checks its turn
// at once; a leave after a grant (LeaveLine), a withdrawal of a ticket no
// longer in the line, and a client without notices tell nobody.
func TestWithdrawalTellsTheWaitersBehind(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	ctx := context.Background()
	r := newNoticeRig(t, servers)
	if err := r.notices.Watch(ctx, "behind"); err != nil {
		t.Fatal(err)
	}
	waitSubscribers(t, servers, "behind", 1)
	head := turn(t, r.holder, "behind", "head", 0)
	next := turn(t, r.waiter, "behind", "next", 0)
	if !head.Go || next.Go {
		t.Fatalf("head %+v, next %+v: want the head's turn only", head, next)
	}
	if err := r.holder.WithdrawFromLine(ctx, "behind", "head", head.Ticket); err != nil {
		t.Fatal(err)
	}
	if k := r.l.next(t, "the head withdrew"); k != "behind" {
		t.Fatalf("notice of %q, want behind", k)
	}
	if tr := turn(t, r.waiter, "behind", "next", next.Ticket); !tr.Go {
		t.Fatalf("the next waiter after the head withdrew: %+v, want its turn", tr)
	}
	// Quiet leaves: granted, a ticket already out, and without notices.
	if err := r.holder.LeaveLine(ctx, "behind", "next", next.Ticket); err != nil {
		t.Fatal(err)
	}
	if err := r.holder.WithdrawFromLine(ctx, "behind", "head", head.Ticket); err != nil {
		t.Fatal(err)
	}
	quiet := newClient(t, redistest.Addrs(servers))
	again := turn(t, quiet, "behind", "again", 0)
	if err := quiet.WithdrawFromLine(ctx, "behind", "again", again.Ticket); err != nil {
		t.Fatal(err)
	}
	// Close waits for the holder's PUBLISHes.
	if err := r.holder.Close(); err != nil {
		t.Fatal(err)
	}
	if err := quiet.Close(); err != nil {
		t.Fatal(err)
	}
	for i, s := range servers {
		if n := commandCalls(t, s)["publish"]; n != 1 {
			t.Errorf("master %d: %d PUBLISH, want 1 (the one withdrawal)", i, n)
		}
	}
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if len(r.l.keys) != 1 {
		t.Errorf("notices called back %v, want once", r.l.keys)
	}
}
