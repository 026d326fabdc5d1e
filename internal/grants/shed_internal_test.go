package grants

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
)

// TestGrantsChosenToShedAreShownShedInTurn: a grant chosen to shed is not
// refreshed again; the writer asks for its lock's reconcile instead (which
// shows it Shed), no more than shedParallel at once until each is
// forgotten, while the other grants' refreshes go on.
func TestGrantsChosenToShedAreShownShedInTurn(t *testing.T) {
	const kept, doomedN = 6, 20
	c, patches := countingPatches()
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
			return idleSession(t, time.Minute, now.Add(time.Hour))
		})
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
	patched := patches()
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

// TestShedsWaitWhileRefreshesWaitForRoom: with every place in flight
// taken and more refreshes due than there is room for, the gate is told,
// and stays told as refreshes are answered (each place freed goes to a
// refresh), and grants chosen to shed go one at a time; once the room
// suffices, the gate is told so and the sheds share the places again.
func TestShedsWaitWhileRefreshesWaitForRoom(t *testing.T) {
	gate := &followed{}
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 150, 0)
	w.gate = gate
	now := time.Now()
	track := func(name string, shown time.Duration) {
		w.track(&Grant{UID: types.UID(name), Name: types.NamespacedName{Namespace: "ns", Name: name}, ID: "g" + name, AcquiredAt: now},
			now.Add(shown), 10*time.Second)
	}
	for i := range 12 {
		track(fmt.Sprint("due", i), 2*time.Second+time.Duration(i)*time.Millisecond)
	}
	for i := range 3 {
		track(fmt.Sprint("chosen", i), 3*time.Second+time.Duration(i)*time.Millisecond)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inflight = 8
	for i := range 3 {
		uid := types.UID(fmt.Sprint("chosen", i))
		w.shed[uid] = "chosen"
		w.place(w.entries[uid], parked) // doomed
	}
	for i := range 12 {
		w.place(w.entries[types.UID(fmt.Sprint("due", i))], ready)
	}
	var sent []string
	pick := func() string {
		e, _ := w.pick(now)
		if e == nil {
			return ""
		}
		name := string(e.h.UID)
		sent = append(sent, name)
		return name
	}
	for range 8 {
		if name := pick(); !strings.HasPrefix(name, "due") {
			t.Fatalf("with room in flight, sent %q after %v, want a due refresh", name, sent)
		}
	}
	if !gate.behind() {
		t.Fatal("12 refreshes due, room for 8: the gate was not told")
	}
	if name := pick(); !strings.HasPrefix(name, "chosen") {
		t.Fatalf("no room, no shed in flight: sent %q, want one grant chosen to shed", name)
	}
	if name := pick(); name != "" {
		t.Fatalf("no room, one shed in flight: sent %q, want nothing", name)
	}
	for i := range 3 { // three answered: 4, 3 then 2 due for 1 place each time
		w.sendingChanged(-1)
		if !gate.behind() {
			t.Fatalf("answer %d: more due than room, but the gate was told otherwise", i)
		}
		if name := pick(); !strings.HasPrefix(name, "due") {
			t.Fatalf("answer %d: sent %q, want a due refresh", i, name)
		}
	}
	w.sendingChanged(-2) // room for the last due one and one more
	if gate.behind() {
		t.Error("room for every due refresh: the gate still holds other writes to one")
	}
	if name := pick(); name != "due11" {
		t.Fatalf("room: sent %q, want the last due refresh", name)
	}
	if name := pick(); !strings.HasPrefix(name, "chosen") {
		t.Fatalf("nothing due: sent %q, want a grant chosen to shed", name)
	}
}

// TestAGrantChosenToShedWaitsForNoRenewal: a late refresh that asked for
// its grant's renewal stops being counted as waiting for it once the
// grant is chosen to shed (it is not refreshed again): counted, it kept
// the backlog open, and every window looked saturated.
func TestAGrantChosenToShedWaitsForNoRenewal(t *testing.T) {
	const ttl = time.Minute
	s := idleSession(t, ttl, time.Now().Add(2*time.Hour))
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 10, 0)
	now := time.Now()
	e := &refresh{h: &Grant{UID: "late", Session: s, shown: now.Add(StatusLead(ttl))}, ttl: ttl, index: -1}
	w.entries[e.h.UID] = e
	w.mu.Lock()
	defer w.mu.Unlock()
	w.place(e, ready)
	// Its grant's last renewal is older than two renewLeads: it asks.
	if ask := w.askForLate(now.Add(3 * time.Second)); len(ask) != 1 || w.poking != 1 {
		t.Fatalf("a late refresh: asked %d, %d waiting for their renewal; want 1 and 1", len(ask), w.poking)
	}
	w.shed[e.h.UID] = "chosen"
	w.place(e, e.where) // chooseToShed: doomed
	if e.where != doomed || w.poking != 0 {
		t.Errorf("chosen to shed: place %v, %d waiting for their renewal; want doomed and 0", e.where, w.poking)
	}
	if !w.backlogSince.IsZero() {
		t.Error("chosen to shed, nothing ready: the backlog is still counted")
	}
}

// TestHandOverLeavesGrantsChosenToShed: a stopping leader refreshes the
// grants whose validity passes within the failover slack, but not one
// chosen to shed: not refreshed again, it may be shown past its validity
// already, and must not be shown held again.
func TestHandOverLeavesGrantsChosenToShed(t *testing.T) {
	c, patches := countingPatches()
	ss := newSessions()
	w := newStatusWriter(c, events.NewFakeRecorder(10), metrics.New(), ss, 100, 10*time.Second)
	now := time.Now()
	for name, shown := range map[string]time.Duration{"kept": 2 * time.Second, "shed": 2 * time.Second, "shedLate": -time.Second} {
		h := &Grant{UID: types.UID(name), Name: types.NamespacedName{Namespace: "ns", Name: name}, ID: "g" + name, Holder: "h", Token: 1, AcquiredAt: now}
		ss.hold(h, func() *renewal.Session {
			return idleSession(t, time.Minute, now.Add(time.Hour))
		})
		w.track(h, now.Add(shown), time.Minute)
	}
	w.mu.Lock()
	for _, uid := range []types.UID{"shed", "shedLate"} {
		w.shed[uid] = "chosen"
		w.place(w.entries[uid], parked) // doomed
	}
	w.mu.Unlock()
	w.handOver(logr.Discard())
	patched := patches()
	if patched["kept"] != 1 || patched["shed"] != 0 || patched["shedLate"] != 0 {
		t.Errorf("handover refreshes %v, want the kept grant's alone, once", patched)
	}
}

// countingPatches is a client whose status patches succeed, and a func
// that returns how many each object got so far.
func countingPatches() (client.Client, func() map[string]int) {
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
	return c, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(patched)
	}
}
