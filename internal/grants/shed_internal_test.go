package grants

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// TestGrantsChosenToShedAreShownShedInTurn: a grant chosen to shed is not
// refreshed again; the writer asks for its lock's reconcile instead (which
// shows it Shed), no more than shedParallel at once until each is
// forgotten, while the other grants' refreshes go on.
func TestGrantsChosenToShedAreShownShedInTurn(t *testing.T) {
	const kept, doomedN = 6, 20
	var mu sync.Mutex
	patched := map[string]int{}
	c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		SubResourcePatch: func(_ context.Context, _ client.Client, _ string, obj client.Object, _ client.Patch, _ ...client.SubResourcePatchOption) error {
			mu.Lock()
			patched[obj.GetName()]++
			mu.Unlock()
			return nil
		},
	}).Build()
	ss := newSessions()
	w := newStatusWriter(c, nil, metrics.New(), ss, 1000, 0)
	asked := make(chan types.NamespacedName, doomedN*2)
	w.reconcile = func(n types.NamespacedName) { asked <- n }
	now := time.Now()
	byName := map[string]*Grant{}
	for i := range kept + doomedN {
		name := fmt.Sprintf("l%02d", i)
		h := &Grant{UID: types.UID(name), Name: types.NamespacedName{Namespace: "ns", Name: name}, ID: "g" + name, Holder: "h", Token: 1,
			AcquiredAt: now.Add(time.Duration(i) * time.Second)}
		ss.hold(h, func() *renewal.Session {
			return renewal.Hold(t.Context(), renewal.Grant{Key: "k", TTL: time.Minute, Every: time.Hour, ValidUntil: now.Add(time.Hour)},
				renewal.Config{Client: func() *redlock.Client { return nil }})
		})
		t.Cleanup(h.Session.Orphan)
		byName[name] = h
		w.track(h, now.Add(50*time.Second), time.Minute)
	}
	w.mu.Lock()
	for i := kept; i < kept+doomedN; i++ {
		uid := types.UID(fmt.Sprintf("l%02d", i))
		w.shed[uid] = "test"
		w.place(w.entries[uid], parked) // chosen: doomed, whatever it was asked
	}
	for i := range kept {
		w.place(w.entries[types.UID(fmt.Sprintf("l%02d", i))], ready)
	}
	limit := shedParallel(w.parallel())
	w.mu.Unlock()
	if limit >= doomedN {
		t.Fatalf("shedParallel %d: the test needs more grants chosen than that", limit)
	}

	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { w.send(ctx, &wg) })
	defer func() { cancel(); wg.Wait() }()
	seen := map[string]bool{}
	for len(seen) < doomedN {
		// Take every reconcile asked for so far: no more than the limit
		// wait at once, and none is asked again while it waits.
		var batch []types.NamespacedName
		select {
		case n := <-asked:
			batch = append(batch, n)
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d grants chosen to shed asked for; no more", len(seen), doomedN)
		}
	drain:
		for {
			select {
			case n := <-asked:
				batch = append(batch, n)
			case <-time.After(50 * time.Millisecond):
				break drain
			}
		}
		if len(batch) > limit {
			t.Fatalf("%d reconciles asked for at once, want at most %d", len(batch), limit)
		}
		for _, n := range batch {
			if seen[n.Name] {
				t.Fatalf("lock %s asked for again while its reconcile was pending", n.Name)
			}
			seen[n.Name] = true
			w.forget(byName[n.Name]) // its reconcile showed it Shed and dropped it
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for name, h := range byName {
		chosenOne := h.AcquiredAt.Sub(now) >= kept*time.Second
		switch {
		case chosenOne && patched[name] > 0:
			t.Errorf("grant %s chosen to shed was refreshed %d times", name, patched[name])
		case chosenOne && !seen[name]:
			t.Errorf("grant %s chosen to shed was never asked for", name)
		case !chosenOne && seen[name]:
			t.Errorf("grant %s, kept, was asked to be shed", name)
		case !chosenOne && patched[name] == 0:
			t.Errorf("grant %s, kept, was not refreshed", name)
		}
	}
}

// TestMoreIsShedWhileShowingShedOnlyOnTheKeptRefreshes: while a grant
// chosen to shed waits to be shown Shed, a window that measures less
// capacity than the kept grants need chooses no more while their
// refreshes land in time (the Shed writes and their Events took the rest
// of the API server), and does once they land tight, or once minSample
// kept refreshes wait in the writer to land tight (a further drop: keep
// order sends the oldest first, and the youngest kept wait unsent); not
// for one such refresh, nor for more refreshes ready than may be in
// flight with their whole lead left.
func TestMoreIsShedWhileShowingShedOnlyOnTheKeptRefreshes(t *testing.T) {
	const n, ttl = 200, 10 * time.Second
	for _, tc := range []struct {
		name      string
		tight     int
		shown     int // grants shown Shed in the window
		waiting   int // kept refreshes due, unsent, with a quarter of their lead left
		readyFull int // ... with their whole lead left
		more      bool
	}{
		{"the kept refreshes land in time: none more", 0, 0, 0, 0, false},
		{"... beside grants shown Shed: none more", 0, 10, 0, 0, false},
		{"... and more are ready than may be in flight, with their whole lead: none more", 0, 0, 0, minWriteParallel + 1, false},
		{"they land tight: more", 2, 0, 0, 0, true},
		{"... as many beside grants shown Shed, which do not thin their share: more", 2, 10, 0, 0, true},
		{"one waits in the writer to land tight (a lock's retry, say): none more", 0, 0, 1, 0, false},
		{"five wait in the writer to land tight: more", 0, 0, minSample, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 150, 0)
			now := time.Now()
			for i := range n {
				name := fmt.Sprintf("l%03d", i)
				w.track(&Grant{UID: types.UID(name), Name: types.NamespacedName{Namespace: "ns", Name: name}, ID: "g" + name, AcquiredAt: now.Add(time.Duration(i) * time.Second)},
					now.Add(ttl), ttl)
			}
			w.mu.Lock()
			w.shed["l199"] = "chosen before"
			w.place(w.entries["l199"], doomed)
			for i := range tc.waiting + tc.readyFull {
				e := w.entries[types.UID(fmt.Sprintf("l%03d", 198-i))]
				if i < tc.waiting {
					e.h.setShown(now.Add(w.sched.lead(ttl) / 4))
				}
				w.place(e, ready)
			}
			// Four saturated windows of 10 writes/s before: the kept
			// grants need twice that.
			w.load = loadState{capacity: 10, measured: true, overloaded: true, pressed: true, rates: []float64{10, 10, 10, 10}}
			w.strikes = 1
			w.win = loadWindow{written: 10, shown: tc.shown, tight: tc.tight, backlogged: 950 * time.Millisecond, slacks: slices.Repeat([]time.Duration{time.Second}, 10)}
			win := w.win
			win.span, win.budget, win.demand = time.Second, 150, w.keptDemand()
			w.mu.Unlock()
			if _, shed := nextLoad(w.load, win); shed <= 0 {
				t.Fatalf("the load rules ask for no shed (demand %.1f/s): the test shows nothing", win.demand)
			}
			w.judgeLoad(now, time.Second)
			w.mu.Lock()
			defer w.mu.Unlock()
			if more := len(w.shed) > 1; more != tc.more {
				t.Errorf("%d grants chosen to shed after the window, want more than the one before: %v", len(w.shed), tc.more)
			}
		})
	}
}

// TestGrantsChosenToShedInTimeAreShownFirst: of the grants chosen to shed,
// those whose shown validity has not passed are shown Shed first, nearest
// validity first; those whose validity passed (late whatever their turn)
// come after them.
func TestGrantsChosenToShedInTimeAreShownFirst(t *testing.T) {
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 150, 0)
	now := time.Now()
	for name, shown := range map[string]time.Duration{"late": -time.Second, "later": -2 * time.Second, "soon": 2 * time.Second, "then": 5 * time.Second} {
		w.track(&Grant{UID: types.UID(name), Name: types.NamespacedName{Namespace: "ns", Name: name}, ID: "g" + name, AcquiredAt: now},
			now.Add(shown), 10*time.Second)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for uid := range w.entries {
		w.shed[uid] = "chosen"
		w.place(w.entries[uid], parked) // doomed
	}
	var order []types.UID
	for range len(w.entries) {
		e, gone := w.pick(now)
		if e == nil || gone == nil {
			t.Fatalf("pick gave %v, want a grant chosen to shed (after %v)", e, order)
		}
		order = append(order, e.h.UID)
	}
	if want := []types.UID{"soon", "then", "later", "late"}; !slices.Equal(order, want) {
		t.Errorf("shown Shed in the order %v, want %v", order, want)
	}
}

// TestALateShedIsShownWhileRefreshesAreReady: with only grants chosen to
// shed whose validity passed, one is shown Shed at a time, before a ready
// refresh that is not behind, so that a writer whose refreshes are always
// ready still shows them; the next refresh goes before the next of them.
func TestALateShedIsShownWhileRefreshesAreReady(t *testing.T) {
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 150, 0)
	now := time.Now()
	for name, shown := range map[string]time.Duration{"kept": 10 * time.Second, "late": -time.Second, "later": -2 * time.Second} {
		w.track(&Grant{UID: types.UID(name), Name: types.NamespacedName{Namespace: "ns", Name: name}, ID: "g" + name, AcquiredAt: now},
			now.Add(shown), 10*time.Second)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, uid := range []types.UID{"late", "later"} {
		w.shed[uid] = "chosen"
		w.place(w.entries[uid], parked) // doomed
	}
	w.place(w.entries["kept"], ready)
	var order []types.UID
	for range 3 {
		e, _ := w.pick(now)
		if e == nil {
			t.Fatalf("pick gave nothing after %v", order)
		}
		order = append(order, e.h.UID)
	}
	if want := []types.UID{"later", "kept", "late"}; !slices.Equal(order, want) {
		t.Errorf("sent in the order %v, want %v", order, want)
	}
}
