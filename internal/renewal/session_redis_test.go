package renewal_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// reported counts what a Session's owner reads from its Reports.
type reported struct {
	takes atomic.Int32 // reports taken
	lost  atomic.Int32 // reports taken once the Session was lost
	// next receives the Session's state at each report taken (dropped
	// when nobody reads it).
	next chan renewal.State
}

// read takes reports until the test ends, as an owner does.
func read(t *testing.T, r *renewal.Reports) *reported {
	t.Helper()
	out := &reported{next: make(chan renewal.State, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-r.Ready():
			}
			for _, s := range r.Take() {
				out.takes.Add(1)
				if errors.Is(s.Err(), renewal.ErrLost) {
					out.lost.Add(1)
				}
				select {
				case out.next <- s.State():
				default:
				}
			}
		}
	}()
	return out
}

// session acquires key on three real masters and holds it in a Session.
func session(t *testing.T, key string, ttl time.Duration) (*renewal.Session, []*redistest.Server, *metrics.Metrics, *reported) {
	t.Helper()
	servers := redistest.StartN(t, 3, redistest.Options{})
	c, err := redlock.New(redistest.Addrs(servers), redlock.WithNodeTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	lk, err := c.Acquire(context.Background(), key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	reports := renewal.NewReports()
	s := renewal.Hold(context.Background(), renewal.Grant{
		Lock: lk, Client: c, Key: key, Value: lk.Value(), TTL: ttl, Every: ttl / 3, ValidUntil: lk.ValidUntil(), Votes: lk.Votes(),
	}, renewal.Config{
		Client:  func() *redlock.Client { return c },
		Reports: reports,
		Metrics: m,
	})
	t.Cleanup(s.Orphan)
	return s, servers, m, read(t, reports)
}

func valueOn(t *testing.T, s *redistest.Server, key string) string {
	t.Helper()
	rdb := s.Client()
	defer func() { _ = rdb.Close() }()
	v, _ := rdb.Get(context.Background(), key).Result()
	return v
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
}

func TestRenewSoonRenewsAtOnceAndReportsIt(t *testing.T) {
	// On its own the Session renews every 10s: a renewal reported within
	// five is the ask's.
	s, _, _, rep := session(t, "renew-soon", 30*time.Second)
	before := s.State()
	asked := time.Now()
	s.RenewSoon()
	var st renewal.State
	select {
	case st = <-rep.next:
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal was reported within 5s of RenewSoon")
	}
	if st.Renewals <= before.Renewals || st.RenewedAt.Before(asked) {
		t.Fatalf("the report shows no renewal made after the ask: %+v, asked at %v", st, asked)
	}
	if !st.ValidUntil.After(before.ValidUntil) {
		t.Errorf("the renewal did not extend the validity: %v, then %v", before.ValidUntil, st.ValidUntil)
	}
}

func TestSessionRenewsUntilReleased(t *testing.T) {
	s, servers, m, _ := session(t, "renewed", 1500*time.Millisecond)
	first := s.State().ValidUntil
	waitFor(t, "two renewals happened", 5*time.Second, func() bool { return s.State().Renewals >= 2 })
	if st := s.State(); !st.ValidUntil.After(first) {
		t.Fatalf("validity did not move forward: %v, then %v", first, st.ValidUntil)
	}
	if got := testutil.ToFloat64(m.LocksHeld); got != 1 {
		t.Errorf("locks held = %v, want 1", got)
	}
	if err := s.Release(context.Background()); err != nil {
		t.Fatalf("release: %v", err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done not closed after Release")
	}
	if !errors.Is(s.Err(), renewal.ErrReleased) {
		t.Errorf("Err = %v, want ErrReleased", s.Err())
	}
	// Release returns on a quorum; slower masters are cleaned just after.
	waitFor(t, "no master holds the released key", 5*time.Second, func() bool {
		for _, srv := range servers {
			if valueOn(t, srv, "renewed") != "" {
				return false
			}
		}
		return true
	})
	if got := testutil.ToFloat64(m.LocksHeld); got != 0 {
		t.Errorf("locks held after release = %v, want 0", got)
	}
	s.Orphan() // a second ending is a no-op
	if !errors.Is(s.Err(), renewal.ErrReleased) || testutil.ToFloat64(m.LocksHeld) != 0 {
		t.Errorf("a second ending changed the session: %v, held %v", s.Err(), testutil.ToFloat64(m.LocksHeld))
	}
}

func TestSessionOrphanKeepsTheKeys(t *testing.T) {
	s, servers, _, rep := session(t, "orphaned", 3*time.Second)
	// The acquisition returned on a quorum: a slow master may not hold the
	// key, and never will once its SET timed out. Those that do must keep it.
	var holding []int
	for i, srv := range servers {
		if valueOn(t, srv, "orphaned") != "" {
			holding = append(holding, i)
		}
	}
	if len(holding) < 2 {
		t.Fatalf("only masters %v hold the key after the acquisition", holding)
	}
	s.Orphan()
	if !errors.Is(s.Err(), renewal.ErrOrphaned) {
		t.Fatalf("Err = %v, want ErrOrphaned", s.Err())
	}
	for _, i := range holding {
		if v := valueOn(t, servers[i], "orphaned"); v == "" {
			t.Errorf("master %d lost the key of an orphaned grant", i)
		}
	}
	if rep.lost.Load() != 0 {
		t.Error("an orphaned session reported a loss")
	}
}

func TestSessionReportsLossWhenTheKeysAreGone(t *testing.T) {
	s, servers, _, rep := session(t, "stolen", 1500*time.Millisecond)
	for _, srv := range servers {
		rdb := srv.Client()
		if err := rdb.Del(context.Background(), "stolen").Err(); err != nil {
			t.Fatal(err)
		}
		_ = rdb.Close()
	}
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the session did not notice that its keys are gone")
	}
	var lost *renewal.LostError
	if !errors.As(s.Err(), &lost) || !errors.Is(s.Err(), redlock.ErrNotHeld) {
		t.Fatalf("Err = %v, want a LostError wrapping ErrNotHeld", s.Err())
	}
	// The loss is recorded (Done, Err) before it is reported, so that the
	// owner reading the report sees it.
	waitFor(t, "the lost session's report was read", 2*time.Second, func() bool { return rep.lost.Load() > 0 })
	if !s.State().ValidUntil.IsZero() {
		t.Error("a lost session still reports a validity")
	}
}

func TestSessionLosesAtItsValidityWhenMastersStopAnswering(t *testing.T) {
	s, servers, _, _ := session(t, "silent", 1500*time.Millisecond)
	valid := s.State().ValidUntil
	for _, srv := range servers {
		if err := srv.Stop(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Cont() })
	}
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the session outlived its validity")
	}
	var lost *renewal.LostError
	if !errors.As(s.Err(), &lost) || lost.Reason != v1alpha1.ReasonValidityExpired {
		t.Fatalf("Err = %v, want a LostError for the validity", s.Err())
	}
	if time.Now().Before(valid) {
		t.Errorf("lost before the validity %v passed", valid)
	}
}

// TestShrunkTTLCoversTheLatestValidity: after the ttl shrank, a renewal
// keeps the keys at least until the latest renewal's validity, which the
// status writer may show while the renewal is on its way, even when no
// validity was shown yet (no Floor). Extensions never shorten a copy
// (PEXPIRE GT); the copy a renewal puts back on a master that lost it is
// set with the TTL asked for, so that is what the test looks at.
func TestShrunkTTLCoversTheLatestValidity(t *testing.T) {
	s, servers, _, rep := session(t, "shrunk", 30*time.Second)
	renew := func(what string) {
		t.Helper()
		before := s.State()
		s.RenewSoon()
		select {
		case st := <-rep.next:
			if st.Renewals <= before.Renewals {
				t.Fatalf("%s: the report shows no renewal: %+v", what, st)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no renewal was reported within 10s of RenewSoon", what)
		}
	}
	shown := s.State().ValidUntil // what the status writer may show
	s.SetTiming(2*time.Second, 10*time.Second)
	// The renewal under way when the ttl changes may still ask for 30s;
	// the next one asks for 2s, and puts the key back on a master that
	// lost it.
	renew("the first renewal after the change")
	rdb := servers[0].Client()
	defer func() { _ = rdb.Close() }()
	if err := rdb.Del(context.Background(), "shrunk").Err(); err != nil {
		t.Fatal(err)
	}
	renew("the second renewal after the change")
	waitFor(t, "master 0 has the key back", 5*time.Second, func() bool { return valueOn(t, servers[0], "shrunk") != "" })
	pttl, err := rdb.PTTL(context.Background(), "shrunk").Result()
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(shown); pttl < left {
		t.Errorf("the copy put back lives %v more, less than the %v left of the validity before the ttl shrank", pttl, left)
	}
}
