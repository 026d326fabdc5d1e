package distributedlock

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// lineMasters starts three real masters and a client of them.
func lineMasters(t *testing.T) ([]*redistest.Server, *redlock.Client) {
	t.Helper()
	servers := redistest.StartN(t, 3, redistest.Options{})
	c, err := redlock.New(redistest.Addrs(servers), redlock.WithNodeTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return servers, c
}

// TestLinesTurnAndBound plays one lock's checks against three real
// masters, on a clock of its own: behind two waiters of another cluster,
// with the key free, it waits; a waiter ahead leaving starts the bound
// again; the bound lets it attempt; a line that cannot be used lets it
// attempt at once, keeps its ticket, and spares its master set's locks
// failing rounds for a while.
func TestLinesTurnAndBound(t *testing.T) {
	servers, c := lineMasters(t)
	ctx := context.Background()
	now := time.Unix(1000, 0)
	checks := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "checks"}, []string{"result"})
	l := newLines(func() time.Time { return now }, checks)
	lock := &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "z", UID: "uid-z"}, Spec: v1alpha1.DistributedLockSpec{Key: "turns"}}
	name := types.NamespacedName{Namespace: "ns", Name: "z"}
	for _, w := range []string{"x", "y"} {
		if tr := c.CheckTurn(ctx, "turns", w, 0, time.Minute); tr.Err != nil {
			t.Fatal(tr.Err)
		}
	}
	expect := func(step string, wantOK bool, wantRecheck time.Duration) {
		t.Helper()
		ok, recheck := l.mayAttempt(ctx, name, lock, string(lock.UID), c, 2*time.Second)
		if ok != wantOK || recheck != wantRecheck {
			t.Fatalf("%s: may attempt %v, look again in %v; want %v, %v", step, ok, recheck, wantOK, wantRecheck)
		}
	}
	expect("two waiting ahead, the key free", false, lineBound)
	if p := l.places[name]; p.ticket != 3 || p.ahead != 2 {
		t.Fatalf("its place: %+v, want ticket 3 behind 2", p)
	}
	now = now.Add(5 * time.Second)
	if err := c.LeaveLine(ctx, "turns", "x", 0); err != nil {
		t.Fatal(err)
	}
	expect("one ahead left: the bound starts again", false, lineBound)
	now = now.Add(5 * time.Second)
	expect("5 s free since", false, time.Second)
	now = now.Add(time.Second)
	expect("6 s free since", true, 0)
	if n := testutil.ToFloat64(checks.WithLabelValues(lineBounded)); n != 1 {
		t.Errorf("checks at the bound: %v, want 1", n)
	}

	for _, s := range servers[1:] {
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	expect("two masters not answering", true, 0)
	if p := l.places[name]; p.ticket != 3 {
		t.Errorf("its ticket after the line could not be used: %d, want 3 kept", p.ticket)
	}
	expect("within a minute of that", true, 0)
	if n := testutil.ToFloat64(checks.WithLabelValues(lineUnavailable)); n != 1 {
		t.Errorf("checks of a line that could not be used: %v, want 1 (the second made no round)", n)
	}
	for _, s := range servers[1:] {
		if err := s.Cont(); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(lineRetry)
	expect("a minute later, the line in use again, y still ahead and the key free all along: the bound", true, 0)

}

// TestSlotLocksWaitInTheSemaphoreLine: a semaphore's slot lock waits in
// the semaphore's line for the pod it attempts for, whose first N waiters
// may attempt: with one waiter of another cluster it attempts at once
// (two slots), behind two it waits, and attempts once one of them left;
// attempting for another pod, it withdraws the first pod's ticket.
func TestSlotLocksWaitInTheSemaphoreLine(t *testing.T) {
	servers, c := lineMasters(t)
	ctx := context.Background()
	l := newLines(time.Now, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "checks"}, []string{"result"}))
	slot := redlock.Slot{Semaphore: "sem", Slots: 2, Index: 0}
	lock := &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sem-2-0", UID: "uid-slot"},
		Spec:       v1alpha1.DistributedLockSpec{SlotOf: &v1alpha1.SemaphoreSlot{SemaphoreKey: slot.Semaphore, Slots: 2, Index: 0}},
	}
	name := client.ObjectKeyFromObject(lock)
	holder := func(pod string) *v1alpha1.LockHolder {
		return &v1alpha1.LockHolder{Identity: pod, Pod: &v1alpha1.PodReference{Name: pod, UID: types.UID("uid-" + pod)}}
	}
	if w := lineWaiter(lock, holder("a")); w != "uid-a" {
		t.Fatalf("the slot lock's waiter for pod a: %q, want the pod's UID", w)
	}
	if w := lineWaiter(lock, nil); w != "uid-slot" {
		t.Fatalf("the slot lock's waiter for no pod: %q, want its own UID", w)
	}
	register := func(waiter string) {
		t.Helper()
		if tr := c.CheckSlotTurn(ctx, slot, waiter, 0, time.Minute); tr.Err != nil || !tr.Registered {
			t.Fatalf("%s's ticket: %+v", waiter, tr)
		}
	}
	waiters := func() map[string]int {
		t.Helper()
		seen, err := redistest.LineWaiters(ctx, servers, redlock.LineKey(slot.Semaphore), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return seen
	}

	register("other-1")
	if ok, _ := l.mayAttempt(ctx, name, lock, "uid-a", c, 2*time.Second); !ok {
		t.Fatal("one waiter of another cluster in a line of two heads: the slot lock waited")
	}
	register("other-2")
	l.join(ctx, name, lock, "uid-a", c, 2*time.Second)
	if p := l.places[name]; p.ticket == 0 || p.key != slot.Semaphore || p.waiter != "uid-a" {
		t.Fatalf("its place after the key was found held: %+v, want a ticket in the semaphore's line for pod a", p)
	}
	if ok, _ := l.mayAttempt(ctx, name, lock, "uid-a", c, 2*time.Second); ok {
		t.Fatal("behind two waiters in a line of two heads: the slot lock attempted")
	}
	if err := c.LeaveLine(ctx, slot.Semaphore, "other-1", 0); err != nil {
		t.Fatal(err)
	}
	if ok, _ := l.mayAttempt(ctx, name, lock, "uid-a", c, 2*time.Second); !ok {
		t.Fatal("behind one waiter in a line of two heads: the slot lock waited")
	}
	l.join(ctx, name, lock, "uid-b", c, 2*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for waiters()["uid-a"] > 0 {
		if time.Now().After(deadline) {
			t.Fatal("pod a's ticket stayed in the line after its slot lock attempted for pod b")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := waiters(); got["uid-b"] == 0 || got["other-2"] == 0 {
		t.Fatalf("the semaphore's line: %v, want pod b and other-2", got)
	}
}

// TestWithdrawTellsTheWaitersBehind: a lock that leaves its line without
// the key tells the key's waiters (a release notice at a quorum), one
// granted leaves quietly; both take their own entry out (of a majority).
func TestWithdrawTellsTheWaitersBehind(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	c, err := redlock.New(redistest.Addrs(servers), redlock.WithNodeTimeout(100*time.Millisecond), redlock.WithReleaseNotices())
	if err != nil {
		t.Fatal(err)
	}
	listener, err := redlock.New(redistest.Addrs(servers), redlock.WithNodeTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = listener.Close() })
	told := make(chan string, 4)
	notices, err := listener.Notices(func(key string) { told <- key })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = notices.Close() })
	ctx := context.Background()
	if err := notices.Watch(ctx, "withdrawn"); err != nil {
		t.Fatal(err)
	}
	l := newLines(time.Now, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "checks"}, []string{"result"}))
	place := func(name string) types.NamespacedName {
		tr := c.CheckTurn(ctx, "withdrawn", "uid-"+name, 0, time.Minute)
		if tr.Err != nil || !tr.Registered {
			t.Fatalf("%s's ticket: %+v", name, tr)
		}
		n := types.NamespacedName{Namespace: "ns", Name: name}
		l.places[n] = linePlace{uid: types.UID("uid-" + name), waiter: "uid-" + name, ticket: tr.Ticket, client: c, key: "withdrawn"}
		return n
	}
	// inLine: uid's ticket is on a majority of the masters. A leave is
	// best effort, each master within its node timeout (one may miss it
	// on a loaded machine), and a ticket on a minority holds nobody up.
	inLine := func(uid string) bool {
		seen, err := redistest.LineWaiters(ctx, servers, redlock.LineKey("withdrawn"), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return 2*seen[uid] > len(servers)
	}
	waitOut := func(uid string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for inLine(uid) {
			if time.Now().After(deadline) {
				t.Fatalf("%s still in the line after 10s", uid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	granted, withdrawn := place("granted"), place("withdrawn")
	l.granted(granted)
	waitOut("uid-granted")
	l.withdraw(withdrawn)
	select {
	case k := <-told:
		if k != "withdrawn" {
			t.Fatalf("told of %q", k)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the withdrawal told no waiter within 10s")
	}
	waitOut("uid-withdrawn")
	// Close waits for the client's PUBLISHes: the withdrawal's, one on
	// each master it left (a majority at least: the notice was told), and
	// none of the granted lock's leave.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	published := 0
	for i, s := range servers {
		rc := s.Client()
		stats, err := rc.Info(ctx, "commandstats").Result()
		_ = rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.Contains(stats, "cmdstat_publish:calls=1,"):
			published++
		case strings.Contains(stats, "cmdstat_publish:"):
			t.Errorf("master %d: PUBLISH calls not 1:\n%s", i, stats)
		}
	}
	if 2*published <= len(servers) {
		t.Errorf("the withdrawal published on %d of %d masters, want a majority", published, len(servers))
	}
}
