package grants

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// TestRefreshPatchIsConditional applies validity refreshes with the JSON
// patch library the API server applies them with: a refresh lands only on
// the object and grant it was made for, and only while status shows that
// grant held.
func TestRefreshPatchIsConditional(t *testing.T) {
	shown := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	h := &Grant{UID: "uid-1", ID: "g1", Holder: "team-a", Token: 7, Quorum: 2}
	st := renewal.State{
		RenewedAt: shown.Add(-time.Second), ValidUntil: shown.Add(9 * time.Second),
		Votes: []redlock.Vote{{Addr: "a:1", Outcome: redlock.OutcomeGranted}, {Addr: "b:1", Outcome: redlock.OutcomeGranted}, {Addr: "c:1", Outcome: redlock.OutcomeError}},
	}
	patch, err := RefreshPatch(h, st, shown, "")
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatal(err)
	}
	showing := func(mutate func(*v1alpha1.DistributedLock)) []byte {
		l := &v1alpha1.DistributedLock{}
		l.UID = "uid-1"
		l.Status = showingG1(shown)
		if mutate != nil {
			mutate(l)
		}
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name    string
		mutate  func(*v1alpha1.DistributedLock)
		applies bool
	}{
		{"status shows the grant: the validity is refreshed", nil, true},
		{"another grant was committed since", func(l *v1alpha1.DistributedLock) { l.Status.GrantID = "g2" }, false},
		{"another token was committed since", func(l *v1alpha1.DistributedLock) { l.Status.FencingToken = 8 }, false},
		{"the grant was released (status shows no holder)", func(l *v1alpha1.DistributedLock) {
			l.Status.Holder, l.Status.ValidUntil, l.Status.ReleasedAt = nil, nil, v1alpha1.NewPreciseTime(shown)
		}, false},
		{"another holder is shown", func(l *v1alpha1.DistributedLock) { l.Status.Holder.Identity = "team-b" }, false},
		{"the object was re-created under the name", func(l *v1alpha1.DistributedLock) { l.UID = "uid-2" }, false},
		{"another writer moved the validity forward since (a deposed leader's late refresh)", func(l *v1alpha1.DistributedLock) {
			l.Status.ValidUntil = v1alpha1.NewPreciseTime(shown.Add(time.Second))
		}, false},
		{"another writer moved the validity back since", func(l *v1alpha1.DistributedLock) {
			l.Status.ValidUntil = v1alpha1.NewPreciseTime(shown.Add(-time.Microsecond))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := p.Apply(showing(tc.mutate))
			if !tc.applies {
				if err == nil {
					t.Fatalf("the refresh applied: %s", out)
				}
				return
			}
			if err != nil {
				t.Fatalf("the refresh did not apply: %v", err)
			}
			var l v1alpha1.DistributedLock
			if err := json.Unmarshal(out, &l); err != nil {
				t.Fatal(err)
			}
			if !l.Status.ValidUntil.Equal(st.ValidUntil) || !l.Status.RenewedAt.Equal(st.RenewedAt) {
				t.Errorf("validity %v renewed %v, want %v and %v", l.Status.ValidUntil, l.Status.RenewedAt, st.ValidUntil, st.RenewedAt)
			}
			if l.Status.Quorum == nil || l.Status.Quorum.Granted != 2 || len(l.Status.Quorum.Masters) != 3 {
				t.Errorf("quorum = %+v, want the renewal's votes", l.Status.Quorum)
			}
			if l.Status.Holder == nil || l.Status.Holder.Identity != "team-a" || l.Status.GrantID != "g1" || l.Status.FencingToken != 7 {
				t.Errorf("the refresh changed the grant: %+v", l.Status)
			}
		})
	}
}

// TestRefreshSchedule: a refresh is due a tenth of the ttl (at least
// min(ttl/4, 500ms)) before the shown validity passes, or the failover
// slack when the ttl is at least twice that; it asks for its renewal a
// fiftieth of the ttl (in [20ms, 1s]) before that, and takes any renewal
// within two of those as fresh.
func TestRefreshSchedule(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		name             string
		ttl, failover    time.Duration
		lead, renewLead  time.Duration
		writesPerTTLLess float64
	}{
		{"ttl 10s: the write lands a second ahead, its renewal 200ms before it", 10 * time.Second, 0, time.Second, 200 * time.Millisecond, 1.16},
		{"ttl 60s: six seconds ahead, renewal a second before", time.Minute, 0, 6 * time.Second, time.Second, 1.15},
		{"ttl 1s: at least a quarter of the ttl ahead", time.Second, 0, 250 * time.Millisecond, 20 * time.Millisecond, 1.4},
		{"ttl 3s: at least 500ms ahead", 3 * time.Second, 0, 500 * time.Millisecond, 60 * time.Millisecond, 1.25},
		{"ttl 60s, failover 21s: the failover slack ahead, at 40% more writes", time.Minute, 21 * time.Second, 21 * time.Second, time.Second, 1.62},
		{"ttl 42s, failover 21s: exactly twice the slack, under 2.2 writes per ttl", 42 * time.Second, 21 * time.Second, 21 * time.Second, 840 * time.Millisecond, 2.2},
		{"ttl 41s, failover 21s: too short to cover a failover, a tenth as without one", 41 * time.Second, 21 * time.Second, 4100 * time.Millisecond, 820 * time.Millisecond, 1.16},
		{"ttl 10s, failover 21s: a tenth", 10 * time.Second, 21 * time.Second, time.Second, 200 * time.Millisecond, 1.16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := refreshSchedule{failover: tc.failover}
			if got := p.lead(tc.ttl); got != tc.lead {
				t.Errorf("lead(%v) = %v, want %v", tc.ttl, got, tc.lead)
			}
			if got := RenewLead(tc.ttl); got != tc.renewLead {
				t.Errorf("renewLead(%v) = %v, want %v", tc.ttl, got, tc.renewLead)
			}
			if got := p.writesPerTTL(tc.ttl); got <= 1 || got >= tc.writesPerTTLLess {
				t.Errorf("writesPerTTL(%v) = %.3f, want in (1, %v)", tc.ttl, got, tc.writesPerTTLLess)
			}
			shown := now.Add(tc.ttl)
			due := p.due(shown, tc.ttl)
			if !due.Equal(shown.Add(-tc.lead)) {
				t.Errorf("due = shown-%v, want shown-%v", shown.Sub(due), tc.lead)
			}
			if !p.fresh(shown, tc.ttl, due.Add(-tc.renewLead)) {
				t.Error("the renewal asked for before the write is not fresh enough to write")
			}
			if p.fresh(shown, tc.ttl, due.Add(-2*tc.renewLead-time.Millisecond)) {
				t.Error("a renewal older than two renewLeads before the due write counts as fresh")
			}
			w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 10, tc.failover)
			e := &refresh{h: &Grant{UID: "a", shown: shown}, ttl: tc.ttl, index: -1}
			w.schedule(e, due)
			if !e.wake.Equal(due.Add(-tc.renewLead)) {
				t.Errorf("a scheduled refresh wakes at due-%v, want due-%v", due.Sub(e.wake), tc.renewLead)
			}
		})
	}
	if p := (refreshSchedule{}); !p.due(time.Time{}, time.Second).IsZero() || p.fresh(time.Time{}, time.Second, now) {
		t.Error("with nothing shown, a write is scheduled")
	}
}

// TestRefreshAsksForItsRenewal: renewLead before a refresh is due, the
// writer asks the grant's Session for the renewal the refresh will show,
// unless one fresh enough was made; at the due time it sends what it has.
func TestRefreshAsksForItsRenewal(t *testing.T) {
	const ttl = 10 * time.Second
	// A Session renewing on its own only in half an hour: its last
	// renewal is the grant's (now).
	s := idleSession(t, ttl, time.Now().Add(2*time.Hour))
	renewed := s.State().RenewedAt
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 10, 0)
	track := func(uid string, due time.Time) *refresh {
		e := &refresh{h: &Grant{UID: types.UID(uid), Session: s, shown: due.Add(StatusLead(ttl))}, ttl: ttl, index: -1}
		w.entries[e.h.UID] = e
		w.schedule(e, due)
		return e
	}

	t.Log("a refresh due in 5s, its grant renewed now: it asks at due-200ms and waits until due")
	old := track("old", renewed.Add(5*time.Second))
	if ask := w.wakeUp(old.wake.Add(-time.Millisecond)); len(ask) != 0 || old.where != waiting {
		t.Fatalf("before its wake time: asked %d, place %v", len(ask), old.where)
	}
	if ask := w.wakeUp(old.wake); len(ask) != 1 || ask[0] != old.h || old.where != waiting || !old.wake.Equal(old.due) {
		t.Fatalf("at its wake time: asked %d, place %v, wakes at due%+v", len(ask), old.where, old.wake.Sub(old.due))
	}
	if ask := w.wakeUp(old.due); len(ask) != 0 || old.where != ready {
		t.Fatalf("at its due time: asked %d, place %v; want it ready without asking again", len(ask), old.where)
	}

	t.Log("a refresh due in 300ms: the grant's renewal now is fresh enough, sent at its wake time without asking")
	fresh := track("fresh", renewed.Add(300*time.Millisecond))
	if ask := w.wakeUp(fresh.wake); len(ask) != 0 || fresh.where != ready {
		t.Fatalf("asked %d, place %v; want it ready", len(ask), fresh.where)
	}

	t.Log("a reported renewal fresh enough makes a waiting refresh ready before its due time")
	soon := track("soon", time.Now().Add(100*time.Millisecond))
	w.renewed(soon.h)
	if soon.where != ready {
		t.Fatalf("after a fresh renewal: place %v, want ready", soon.where)
	}
	later := track("later", time.Now().Add(5*time.Second))
	w.renewed(later.h)
	if later.where != waiting {
		t.Fatalf("after a renewal too early to show: place %v, want waiting", later.where)
	}
}

// TestBackedOffRefreshesWaitTheirTime: a refresh retried after a failed
// or refused write is not sent before its retry time, whatever renewals
// come meanwhile; a late refresh that asked for a renewal is sent when the
// renewal is reported, not on an older one at its wake time.
func TestBackedOffRefreshesWaitTheirTime(t *testing.T) {
	const ttl = time.Minute // renewLead 1s: as long as the refused backoff
	s := idleSession(t, ttl, time.Now().Add(2*time.Hour))
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 10, 0)
	now := time.Now()
	entry := func(uid string) *refresh {
		// Due now, the grant's last renewal (now) fresh enough to show.
		e := &refresh{h: &Grant{UID: types.UID(uid), Session: s, shown: now.Add(StatusLead(ttl))}, ttl: ttl, index: -1}
		w.entries[e.h.UID] = e
		return e
	}

	t.Log("a refused refresh re-tracked by a reconcile backs off")
	// Refused "later" than now, so that the backoff (then up to half the
	// lead before the shown validity: 3s) does not pass while the test runs.
	w.refused["g-refused"] = now.Add(time.Hour)
	refused := &Grant{UID: "refused", ID: "g-refused", Session: s}
	w.track(refused, now.Add(StatusLead(ttl)), ttl)
	e := w.entries["refused"]
	if e.where != waiting || !e.due.Equal(e.h.shown.Add(-StatusLead(ttl)/2)) {
		t.Fatalf("re-tracked after a refusal: place %v, due in %v", e.where, e.due.Sub(now))
	}
	w.renewed(refused)
	if ask := w.wakeUp(e.due.Add(-time.Millisecond)); len(ask) != 0 || e.where != waiting {
		t.Fatalf("before its retry time, after a fresh renewal: place %v, asked %d; want it waiting", e.where, len(ask))
	}
	w.wakeUp(e.due)
	if e.where != ready {
		t.Fatalf("at its retry time: place %v, want ready", e.where)
	}

	t.Log("a refresh whose write failed retries at its backoff, not on the next renewal")
	failed := entry("failed")
	failed.where = inFlight
	w.reschedule(failed, now.Add(30*time.Second))
	w.renewed(failed.h)
	if ask := w.wakeUp(now.Add(30*time.Second - time.Millisecond)); len(ask) != 0 || failed.where != waiting {
		t.Fatalf("before its backoff passed: place %v, asked %d; want it waiting", failed.where, len(ask))
	}

	t.Log("a late refresh that asked for a renewal waits for it, not for an older one")
	w.remove(e)
	w.remove(failed)
	late := entry("late")
	w.place(late, ready)
	// Its grant's last renewal is older than two renewLeads: ask.
	if ask := w.askForLate(now.Add(3 * time.Second)); len(ask) != 1 || ask[0] != late.h || late.where != waiting {
		t.Fatalf("a late refresh: asked %d, place %v; want it asking and waiting", len(ask), late.where)
	}
	if ask := w.wakeUp(now.Add(3 * time.Second)); len(ask) != 0 || late.where != waiting {
		t.Fatalf("right after asking: place %v, asked %d; want it waiting for the renewal", late.where, len(ask))
	}
	w.renewed(late.h)
	if late.where != waiting {
		t.Fatalf("a renewal older than the ask made it ready: place %v", late.where)
	}
	late.askedAt = time.Time{} // as if the renewal came after the ask
	w.renewed(&Grant{UID: "late", Session: s})
	if late.where != waiting {
		t.Fatal("a renewal of another grant of the same lock moved the refresh")
	}
	w.renewed(late.h)
	if late.where != ready {
		t.Fatalf("after the renewal it asked for: place %v, want ready", late.where)
	}
	if w.poking != 1 {
		t.Fatalf("%d refreshes counted as waiting for their renewal, want 1", w.poking)
	}
	w.track(late.h, late.h.shown.Add(time.Second), ttl)
	if w.poking != 0 || !late.askedAt.IsZero() {
		t.Fatalf("re-tracked with a later validity, it still waits for the renewal it asked for (poking %d)", w.poking)
	}
}

// TestReportsReachTheWriter: a Session that lost its grant asks, through
// its report, for a reconcile of its lock; a Session never or no longer
// registered asks for nothing.
func TestReportsReachTheWriter(t *testing.T) {
	ss := newSessions()
	w := newStatusWriter(nil, nil, metrics.New(), ss, 10, 0)
	asked := make(chan types.NamespacedName, 4)
	w.reconcile = func(name types.NamespacedName) { asked <- name }
	go w.readReports(t.Context())
	// Sessions without a client fail to renew until their validity passes,
	// then report the loss.
	loseIn := func(d time.Duration) func() *renewal.Session {
		return func() *renewal.Session {
			return renewal.Hold(t.Context(), renewal.Grant{Key: "k", TTL: time.Second, Every: 20 * time.Millisecond, ValidUntil: time.Now().Add(d)},
				renewal.Config{Client: func() *redlock.Client { return nil }, Reports: w.reports})
		}
	}
	registered := &Grant{UID: "a", Name: types.NamespacedName{Name: "a"}}
	ss.hold(registered, loseIn(200*time.Millisecond))
	loseIn(200 * time.Millisecond)() // never registered
	dropped := &Grant{UID: "b", Name: types.NamespacedName{Name: "b"}}
	ss.hold(dropped, loseIn(200*time.Millisecond))
	ss.drop(dropped)
	// Lost last: once its report is read, the others' were (in order).
	last := &Grant{UID: "c", Name: types.NamespacedName{Name: "c"}}
	ss.hold(last, loseIn(time.Second))
	var got []string
	for len(got) < 2 {
		select {
		case n := <-asked:
			got = append(got, n.Name)
		case <-time.After(10 * time.Second):
			t.Fatalf("reconciles asked for %v; want a then c", got)
		}
	}
	if got[0] != "a" || got[1] != "c" {
		t.Fatalf("reconciles asked for %v; want a then c (b was dropped, the other never registered)", got)
	}
}

// TestDueRefreshesGoNearestValidityFirst: among due refreshes, the one
// whose shown validity passes first is sent first; waiting ones become due
// in the order of their due times.
func TestDueRefreshesGoNearestValidityFirst(t *testing.T) {
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 10, 0)
	base := time.Unix(1000, 0)
	mk := func(uid string, shown time.Duration) *refresh {
		e := &refresh{h: &Grant{UID: types.UID(uid), shown: base.Add(shown)}, ttl: 10 * time.Second, index: -1}
		w.entries[e.h.UID] = e
		return e
	}
	for _, e := range []*refresh{mk("c", 3*time.Second), mk("a", time.Second), mk("d", 4*time.Second), mk("b", 2*time.Second)} {
		w.place(e, ready)
	}
	var got string
	for w.ready.Len() > 0 {
		got += string(heap.Pop(&w.ready).(*refresh).h.UID)
	}
	if got != "abcd" {
		t.Errorf("due refreshes went out in the order %q, want abcd", got)
	}
	for _, e := range []*refresh{mk("y", 20*time.Second), mk("x", 10*time.Second), mk("z", 30*time.Second)} {
		w.schedule(e, w.sched.due(e.h.shown, e.ttl))
	}
	got = ""
	for w.waiting.Len() > 0 {
		got += string(heap.Pop(&w.waiting).(*refresh).h.UID)
	}
	if got != "xyz" {
		t.Errorf("waiting refreshes fall due in the order %q, want xyz", got)
	}
}

// TestRefreshQueueKeepsItsHeaps moves refreshes at random between the
// writer's places, as tracks, renewals, dispatches, writes and forgets do,
// and checks after each move that every tracked refresh is in the heap its
// place names, at its index, and that both heaps keep their order.
func TestRefreshQueueKeepsItsHeaps(t *testing.T) {
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 10, 0)
	rnd := rand.New(rand.NewPCG(1, 2))
	base := time.Now()
	sess := idleSession(t, 10*time.Second, base.Add(2*time.Hour))
	var all []*refresh
	for i := range 50 {
		e := &refresh{h: &Grant{UID: types.UID(string(rune('A' + i))), Session: sess}, ttl: 10 * time.Second, index: -1}
		all = append(all, e)
	}
	check := func(step int) {
		t.Helper()
		for _, hp := range []*refreshHeap{&w.waiting, &w.ready} {
			for i, e := range hp.items {
				if e.index != i {
					t.Fatalf("step %d: %s at %d has index %d", step, e.h.UID, i, e.index)
				}
				if c := (i - 1) / 2; i > 0 && hp.less(e, hp.items[c]) {
					t.Fatalf("step %d: heap order broken at %d", step, i)
				}
			}
		}
		for _, e := range w.entries {
			var hp *refreshHeap
			switch e.where {
			case waiting:
				hp = &w.waiting
			case ready:
				hp = &w.ready
			case doomed:
				hp = &w.toShed
			case doomedLate:
				hp = &w.toShedLate
			default:
				if e.index != -1 {
					t.Fatalf("step %d: %s is %v with index %d", step, e.h.UID, e.where, e.index)
				}
				continue
			}
			if e.index < 0 || e.index >= hp.Len() || hp.items[e.index] != e {
				t.Fatalf("step %d: %s is not where its place says", step, e.h.UID)
			}
		}
		bySlot := calendar{}
		for _, e := range w.waiting.items {
			bySlot.add(slotOf(e.due))
		}
		if !maps.Equal(bySlot, w.cal) {
			t.Fatalf("step %d: the calendar counts %v, the waiting refreshes are due in %v", step, w.cal, bySlot)
		}
	}
	for step := range 5000 {
		e := all[rnd.IntN(len(all))]
		tracked := w.entries[e.h.UID] == e
		switch op := rnd.IntN(11); {
		case op == 0: // track, with a later validity now and then
			if !tracked {
				w.entries[e.h.UID] = e
			}
			e.h.shown = base.Add(time.Duration(rnd.IntN(100)) * time.Second)
			if e.where != inFlight {
				w.schedule(e, w.sched.due(e.h.shown, e.ttl))
			}
		case op == 1 && tracked && e.where != inFlight: // a fresh renewal
			w.place(e, ready)
		case op == 2 && w.ready.Len() > 0: // dispatched
			d := heap.Pop(&w.ready).(*refresh)
			d.where, d.index = inFlight, -1
		case op == 3 && tracked && e.where == inFlight: // written
			w.schedule(e, base.Add(time.Duration(rnd.IntN(100))*time.Second))
		case op == 4 && tracked && e.where == inFlight: // nothing newer
			w.schedule(e, time.Time{})
		case op == 5 && tracked: // forgotten
			w.remove(e)
		case op == 6: // the writer wakes: asks for renewals, readies due refreshes
			w.wakeUp(base.Add(time.Duration(rnd.IntN(100)) * time.Second))
		case op == 7 && tracked && e.where != inFlight: // chosen to shed
			w.shed[e.h.UID] = "chosen"
			w.place(e, e.where)
		case op == 8 && tracked && w.chosen(e) && e.where != inFlight: // spared
			delete(w.shed, e.h.UID)
			w.schedule(e, w.sched.due(e.h.shown, e.ttl))
		case op == 9 && tracked && e.where == inFlight: // failed: backed off
			w.backOff(e, base.Add(time.Duration(rnd.IntN(100))*time.Second))
		case op == 10 && tracked && e.where == ready: // late: waits for the renewal it asked for
			w.awaitRenewal(e, base.Add(time.Duration(rnd.IntN(100))*time.Second))
		}
		check(step)
	}
}

// TestNewGrantsWaitWhileRefreshesAreBehind: a new grant waits while more
// refreshes are due than the writer can have in flight, or while the first
// due one is about to lapse.
func TestNewGrantsWaitWhileRefreshesAreBehind(t *testing.T) {
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 10, 0)
	now := time.Now()
	admitted := func() bool { return w.admit(types.NamespacedName{Name: "new"}, 10*time.Second) }
	if !admitted() {
		t.Fatal("an idle writer holds a grant back")
	}
	add := func(uid string, shown time.Duration) {
		e := &refresh{h: &Grant{UID: types.UID(uid), shown: now.Add(shown)}, ttl: 10 * time.Second, index: -1}
		w.entries[e.h.UID] = e
		w.place(e, ready)
	}
	add("far", 5*time.Second)
	if !admitted() {
		t.Error("one due refresh with seconds to spare holds a grant back")
	}
	add("near", 400*time.Millisecond) // under half the 1s lead of ttl 10s
	if admitted() {
		t.Error("a due refresh about to lapse does not hold a grant back")
	}
	w.remove(w.entries["near"])
	for i := range minWriteParallel {
		add(fmt.Sprintf("more-%d", i), 5*time.Second)
	}
	if admitted() {
		t.Errorf("%d due refreshes, more than can be in flight, do not hold a grant back", w.ready.Len())
	}
}

// TestWaitingGrantsWakeWhenRoomAppears: a lock whose grant waited is
// woken once a grant of its size fits, longest waiting first, and the
// wake-up stops at the first that does not fit; a newcomer does not pass
// a lock waiting longer; a lock granted meanwhile is not woken; a woken
// lock refused keeps its place, and one whose reconcile never decides
// gives its room back.
func TestWaitingGrantsWakeWhenRoomAppears(t *testing.T) {
	ss := newSessions()
	w := newStatusWriter(nil, nil, metrics.New(), ss, 10, 0)
	const ttl = 10 * time.Second
	per := w.sched.perSecond(ttl)         // 0.115/s
	holders := int(shedTarget * 10 / per) // as many as the budget admits
	now := time.Now()
	var kept []*Grant
	for i := range holders {
		h := &Grant{UID: types.UID(fmt.Sprintf("h%d", i)), Name: types.NamespacedName{Name: fmt.Sprintf("h%d", i)}}
		ss.hold(h, func() *renewal.Session {
			return idleSession(t, ttl, now.Add(time.Hour))
		})
		w.track(h, now.Add(time.Hour), ttl)
		kept = append(kept, h)
	}
	name := func(s string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: s} }
	for _, n := range []string{"first", "second", "third", "granted"} {
		if w.admit(name(n), ttl) {
			t.Fatalf("lock %s admitted with demand %.2f/s of a %.0f/s budget", n, w.demand, 10.0)
		}
	}
	if got := w.wakeWaiters(now); len(got) != 0 {
		t.Fatalf("woken %v with no room made", got)
	}
	granted := &Grant{UID: "g", Name: name("granted")}
	ss.hold(granted, func() *renewal.Session { return kept[0].Session })
	w.track(granted, now.Add(time.Hour), ttl) // granted by a reconcile of its own
	w.remove(w.entries["g"])
	<-w.kickWaiters // drained: the next kick is the room below
	w.forget(kept[0])
	w.forget(kept[1]) // room for two grants
	select {
	case <-w.kickWaiters:
	default:
		t.Error("room made without a kick to wake the waiting grants")
	}
	if w.admit(name("newcomer"), ttl) {
		t.Error("a newcomer was admitted ahead of the locks waiting longer")
	}
	got := w.wakeWaiters(now)
	if want := []types.NamespacedName{name("first"), name("second")}; !slices.Equal(got, want) {
		t.Fatalf("woken %v, want %v (longest waiting first, as many as fit)", got, want)
	}
	if got := w.wakeWaiters(now); len(got) != 0 {
		t.Errorf("woken again while the room is kept: %v", got)
	}
	if w.admit(name("third"), ttl) {
		t.Error("third admitted into the room kept for the woken locks")
	}

	// The woken first is refused (the room went elsewhere meanwhile): it
	// keeps its place ahead of third.
	w.setDemand(w.demand + 2*per)
	if w.admit(name("first"), ttl) {
		t.Fatal("first admitted with no room")
	}
	w.setDemand(w.demand - 2*per)
	if got := w.wakeWaiters(now); !slices.Equal(got, []types.NamespacedName{name("first")}) {
		t.Errorf("woken %v, want first again (second's room is still kept)", got)
	}
	// Neither reconcile decides: their room is given back after
	// promiseHold, to the locks behind them.
	if got, want := w.wakeWaiters(now.Add(promiseHold+time.Second)), []types.NamespacedName{name("third"), name("newcomer")}; !slices.Equal(got, want) {
		t.Errorf("woken %v, want %v in the room first and second did not take", got, want)
	}
	if w.waiters.len() != 0 {
		t.Errorf("still counted as waiting: %v (a woken lock that never decided loses its place)", w.waiters.byName)
	}

	// third's reconcile is admitted: its room stays kept until its grant
	// is tracked, round trips later, so a lock waiting behind it is not
	// woken into the same room meanwhile.
	if !w.admit(name("third"), ttl) {
		t.Fatal("woken third refused in the room kept for it")
	}
	if w.admit(name("late"), ttl) {
		t.Fatal("late admitted into the room of third's grant in the making")
	}
	if got := w.wakeWaiters(time.Now()); len(got) != 0 {
		t.Fatalf("woken %v into the room of third's grant, admitted but not yet tracked", got)
	}
	third := &Grant{UID: "t3", Name: name("third")}
	ss.hold(third, func() *renewal.Session { return kept[3].Session })
	w.track(third, now.Add(time.Hour), ttl)
	if _, kept := w.promised[name("third")]; kept {
		t.Error("third's room still kept apart once its grant is tracked")
	}
	w.forget(kept[2])
	if got := w.wakeWaiters(time.Now()); !slices.Equal(got, []types.NamespacedName{name("late")}) {
		t.Errorf("woken %v once a grant went, want late", got)
	}
}

// TestRefreshPatchTouchesOnlyItsFields: the status writer writes only the
// fields doc.go gives it (renewedAt, validUntil, quorum); everything else
// in its patch is a test.
func TestRefreshPatchTouchesOnlyItsFields(t *testing.T) {
	now := time.Now()
	h := &Grant{UID: "u", ID: "g", Holder: "h", Token: 1, Quorum: 2}
	patch, err := RefreshPatch(h, renewal.State{RenewedAt: now, ValidUntil: now.Add(time.Second), Votes: []redlock.Vote{{Addr: "a:1", Outcome: redlock.OutcomeGranted}}}, now, "")
	if err != nil {
		t.Fatal(err)
	}
	var ops []struct{ Op, Path string }
	if err := json.Unmarshal(patch, &ops); err != nil {
		t.Fatal(err)
	}
	owned := map[string]bool{"/status/renewedAt": true, "/status/validUntil": true, "/status/quorum": true}
	for _, o := range ops {
		if o.Op != "test" && !owned[o.Path] {
			t.Errorf("the refresh %ss %s, which the reconciler owns", o.Op, o.Path)
		}
	}
}

// TestRefreshPatchTestsTheTextStatusHolds: a validity an earlier version
// wrote in whole seconds is tested as that text (the JSON patch compares
// text, not instants), and only that text.
func TestRefreshPatchTestsTheTextStatusHolds(t *testing.T) {
	shown := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	h := &Grant{UID: "uid-1", ID: "g1", Holder: "team-a", Token: 7}
	st := renewal.State{RenewedAt: shown, ValidUntil: shown.Add(9 * time.Second)}
	l := &v1alpha1.DistributedLock{}
	l.UID = "uid-1"
	l.Status = showingG1(shown)
	micro, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	seconds := []byte(strings.Replace(string(micro), `"validUntil":"2026-11-30T12:00:00.000000Z"`, `"validUntil":"2026-11-30T12:00:00Z"`, 1))
	if string(seconds) == string(micro) {
		t.Fatalf("no validUntil to rewrite in %s", micro)
	}
	for _, tc := range []struct {
		name    string
		text    string
		doc     []byte
		applies bool
	}{
		{"this writer's form, over its form", "", micro, true},
		{"this writer's form, over whole seconds", "", seconds, false},
		{"the text status holds, over it", "2026-11-30T12:00:00Z", seconds, true},
		{"the text status held, over another form", "2026-11-30T12:00:00Z", micro, false},
	} {
		patch, err := RefreshPatch(h, st, shown, tc.text)
		if err != nil {
			t.Fatal(err)
		}
		p, err := jsonpatch.DecodePatch(patch)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Apply(tc.doc); (err == nil) != tc.applies {
			t.Errorf("%s: applied = %v, want %v (%v)", tc.name, err == nil, tc.applies, err)
		}
	}
}

// TestAdoptedGrantsAreRefreshedAtOnce: an adopted grant's first refresh is
// ready at once, however far its shown validity (that write fences off a
// deposed leader's write decided on the same status), and adopted grants
// go nearest shown validity first; a grant tracked otherwise waits for its
// due time.
func TestAdoptedGrantsAreRefreshedAtOnce(t *testing.T) {
	const ttl = time.Minute
	s := idleSession(t, ttl, time.Now().Add(2*time.Hour))
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 10, 0)
	now := time.Now()
	far, near := &Grant{UID: "far", ID: "g-far", Session: s}, &Grant{UID: "near", ID: "g-near", Session: s}
	w.writeAdopted(far, now.Add(50*time.Second), ttl)
	w.writeAdopted(near, now.Add(20*time.Second), ttl)
	tracked := &Grant{UID: "tracked", ID: "g-tracked", Session: s}
	w.track(tracked, now.Add(40*time.Second), ttl)
	if got := w.entries["tracked"].where; got != waiting {
		t.Errorf("a grant tracked with 40s shown: place %v, want waiting", got)
	}
	if w.ready.Len() != 2 {
		t.Fatalf("%d refreshes ready, want the 2 adopted", w.ready.Len())
	}
	if first := w.ready.items[0].h.UID; first != "near" {
		t.Errorf("first ready refresh %s, want the adopted grant nearest its shown validity", first)
	}
}

// TestWritesInFlightFollowTheRoundTrip: behind an API server that takes
// 300ms a write, the writer has as many refreshes in flight as its budget
// needs at that round trip (Little's law), past the least it starts with
// and never past maxWriteParallel; every refresh is written once.
func TestWritesInFlightFollowTheRoundTrip(t *testing.T) {
	const (
		rtt    = 300 * time.Millisecond
		budget = 400
		locks  = 400
	)
	var mu sync.Mutex
	var inFlight, peak, done int
	finished := make(chan struct{})
	c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, _ client.Client, _ string, _ client.Object, _ client.Patch, _ ...client.SubResourcePatchOption) error {
			mu.Lock()
			inFlight++
			peak = max(peak, inFlight)
			mu.Unlock()
			select {
			case <-time.After(rtt):
			case <-ctx.Done():
			}
			mu.Lock()
			inFlight--
			if done++; done == locks {
				close(finished)
			}
			mu.Unlock()
			return nil
		},
	}).Build()
	ss := newSessions()
	w := newStatusWriter(c, nil, metrics.New(), ss, budget, 0)
	now := time.Now()
	for i := range locks {
		h := &Grant{UID: types.UID(fmt.Sprintf("u%d", i)), Name: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("l%d", i)},
			ID: fmt.Sprintf("g%d", i), Holder: "h", Token: 1}
		ss.hold(h, func() *renewal.Session {
			return idleSession(t, time.Minute, now.Add(time.Hour))
		})
		w.track(h, now.Add(50*time.Second), time.Minute)
		w.mu.Lock()
		w.place(w.entries[h.UID], ready) // due now (not adopted: a new leader's adoptions keep the least in flight)
		w.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { w.send(ctx, &wg) })
	wg.Go(func() { w.loadLoop(ctx) }) // sizes the limit every second
	select {
	case <-finished:
	case <-time.After(time.Minute):
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if done != locks {
		t.Fatalf("%d of %d refreshes written within a minute", done, locks)
	}
	if want := writeConcurrency(budget, rtt); peak <= minWriteParallel || peak > maxWriteParallel {
		t.Errorf("at most %d refreshes in flight at once; want more than %d (about %d for %d/s at %v), at most %d",
			peak, minWriteParallel, want, budget, rtt, maxWriteParallel)
	}
}

// TestNextInflight: the limit in flight follows Little's law at the mean
// round trip, growing by half at most per window, and never lets a write
// sent last wait at the API server more than a quarter of the shortest
// lead beyond the least round trip, at the capacity estimated.
func TestNextInflight(t *testing.T) {
	ms := func(d int) time.Duration { return time.Duration(d) * time.Millisecond }
	win := func(mean int) rttWindow { return rttWindow{rtts: slices.Repeat([]time.Duration{ms(mean)}, 10)} }
	const budget = 400
	for _, tc := range []struct {
		name     string
		prev     int
		w        rttWindow
		capacity float64
		lead     time.Duration
		want     int
		base     time.Duration // the base round trip (zero: the window's least)
	}{
		{"nothing answered: unchanged", 40, rttWindow{}, 0, time.Second, 40, 0},
		{"a fast API server: the least", 32, win(20), 100, 15 * time.Second, 32, 0},
		{"a slow one, long leads: grows by half", 32, win(300), 100, 15 * time.Second, 48, 0},
		{"... up to what the budget needs", 100, win(300), 120, 15 * time.Second, 128, 0},
		{"faster again: Little's law at once", 128, win(100), 300, 15 * time.Second, 60, 0},
		{"short leads, a slow API server: what waits a quarter lead past the least round trip", 100, win(300), 200, time.Second, 110, 0},
		{"a near API server that takes few: few in flight, the rest wait in the writer's order", 100, win(10), 40, time.Second, 10, 0},
		{"... every write queued at it this window: the base round trip from before counts", 100, win(1000), 40, time.Second, 10, ms(10)},
		{"... never below the least", 100, win(10), 2, time.Second, leastWriteParallel, 0},
		{"nothing held: no lead to keep", 32, win(300), 0, 0, 48, 0},
		{"writes timed out or were throttled: halves", 128, rttWindow{rtts: slices.Repeat([]time.Duration{ms(300)}, 10), congested: 2}, 300, 15 * time.Second, 64, 0},
		{"one congested write among many: sized as usual", 128, rttWindow{rtts: slices.Repeat([]time.Duration{ms(300)}, 100), congested: 1}, 300, 15 * time.Second, 128, 0},
		{"two among a hundred: not a twentieth", 128, rttWindow{rtts: slices.Repeat([]time.Duration{ms(300)}, 100), congested: 2}, 300, 15 * time.Second, 128, 0},
		{"... halves again", 40, rttWindow{congested: 3}, 0, 15 * time.Second, 20, 0},
		{"... down to the least", 3, rttWindow{congested: 3}, 0, 15 * time.Second, leastWriteParallel, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := tc.base
			if base == 0 {
				base = tc.w.least()
			}
			if got := nextInflight(tc.prev, tc.w, budget, tc.capacity, base, tc.lead); got != tc.want {
				t.Errorf("nextInflight = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestWriteConcurrency: the refreshes in flight are what the budget needs
// at the round trip measured, half as many again, within the bounds.
func TestWriteConcurrency(t *testing.T) {
	for _, tc := range []struct {
		budget  float64
		latency time.Duration
		want    int
	}{
		{150, 0, minWriteParallel},                     // nothing measured yet
		{150, 20 * time.Millisecond, minWriteParallel}, // a fast API server: 4.5
		{300, 100 * time.Millisecond, 45},
		{300, 650 * time.Millisecond, maxWriteParallel}, // 293
		{100, 500 * time.Millisecond, 75},
	} {
		if got := writeConcurrency(tc.budget, tc.latency); got != tc.want {
			t.Errorf("writeConcurrency(%v/s, %v) = %d, want %d", tc.budget, tc.latency, got, tc.want)
		}
	}
}

// TestHandOverResendsWritesCutShort: a refresh in flight when the manager
// stops (its write cut short by the stop) is sent again by the handover,
// not skipped as in flight: it is the one nearest its shown validity.
func TestHandOverResendsWritesCutShort(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	started := make(chan struct{})
	c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, _ client.Client, _ string, _ client.Object, _ client.Patch, _ ...client.SubResourcePatchOption) error {
			mu.Lock()
			calls++
			first := calls == 1
			mu.Unlock()
			if first {
				close(started)
				<-ctx.Done() // in flight until the manager stops
				return ctx.Err()
			}
			return nil
		},
	}).Build()
	ss := newSessions()
	w := newStatusWriter(c, nil, metrics.New(), ss, 100, 10*time.Second)
	now := time.Now()
	h := &Grant{UID: "u", Name: types.NamespacedName{Namespace: "ns", Name: "l"}, ID: "g", Holder: "h", Token: 1}
	ss.hold(h, func() *renewal.Session {
		return idleSession(t, time.Minute, now.Add(time.Hour))
	})
	w.writeAdopted(h, now.Add(2*time.Second), time.Minute) // ready at once, within the failover slack
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { w.run(ctx); close(done) }()
	select {
	case <-started:
	case <-time.After(time.Minute):
		t.Fatal("the refresh was never sent")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the writer did not stop")
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Errorf("%d writes of the refresh, want 2: the one cut short by the stop, and the handover's", calls)
	}
}

// TestShortLeadIsTheTenthShortest: the lead that caps the writes in flight
// is that of the tenth of the grants with the shortest leads, so one lock
// of a short ttl among thousands of long ones does not pin the limit.
func TestShortLeadIsTheTenthShortest(t *testing.T) {
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 10, 20*time.Second)
	if got := w.shortLead(w.sched); got != 0 {
		t.Fatalf("shortLead with nothing held = %v, want 0", got)
	}
	w.countTTL(0, 5*time.Second)
	for range 1000 {
		w.countTTL(0, time.Minute)
	}
	if got, want := w.shortLead(w.sched), w.sched.lead(time.Minute); got != want {
		t.Fatalf("one ttl 5s among 1,000 of 1m: shortLead %v, want the 1m lead %v", got, want)
	}
	for range 200 {
		w.countTTL(0, 5*time.Second)
	}
	if got, want := w.shortLead(w.sched), w.sched.lead(5*time.Second); got != want {
		t.Fatalf("201 ttl 5s among 1,201: shortLead %v, want the 5s lead %v", got, want)
	}
	for range 201 {
		w.countTTL(5*time.Second, time.Minute)
	}
	if got, want := w.shortLead(w.sched), w.sched.lead(time.Minute); got != want || len(w.ttls) != 1 {
		t.Fatalf("every ttl 1m again: shortLead %v (ttls %v), want %v", got, w.ttls, want)
	}
}

// TestCongestion: timeouts, throttling and the API server's failures are
// congestion; a write refused for its own sake is not.
func TestCongestion(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.redlock.dev", Resource: "distributedlocks"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{fmt.Errorf("patch: %w", context.DeadlineExceeded), true},
		{apierrors.NewTimeoutError("slow", 1), true},
		{apierrors.NewServerTimeout(gr, "patch", 1), true},
		{apierrors.NewTooManyRequests("throttled", 1), true},
		{apierrors.NewServiceUnavailable("down"), true},
		{apierrors.NewInternalError(errors.New("etcd")), true},
		{apierrors.NewForbidden(gr, "l", errors.New("no")), false},
		{apierrors.NewBadRequest("webhook says no"), false},
		{apierrors.NewConflict(gr, "l", errors.New("changed")), false},
		{context.Canceled, false},
	} {
		if got := congestion(tc.err); got != tc.want {
			t.Errorf("congestion(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestNextLeadFloor: the lead floor grows to three mean round trips, or
// twice the 90th percentile when that is more, once refreshes land tight,
// not on round trips alone; it follows them down by
// a tenth per window at most, and a window with no answer keeps it.
func TestNextLeadFloor(t *testing.T) {
	ms := func(d int) time.Duration { return time.Duration(d) * time.Millisecond }
	win := func(mean int) rttWindow { return rttWindow{rtts: slices.Repeat([]time.Duration{ms(mean)}, 10)} }
	for _, tc := range []struct {
		name  string
		prev  time.Duration
		w     rttWindow
		tight bool
		want  time.Duration
	}{
		{"refreshes landing tight at a 400ms round trip: three of them", 0, win(400), true, ms(1200)},
		{"the same round trips, nothing tight: no writes spent on them", 0, win(400), false, 0},
		{"slower round trips with nothing tight keep the floor", ms(600), win(400), false, ms(600)},
		{"slower and tight: up at once", ms(600), win(400), true, ms(1200)},
		{"faster: down by a tenth", ms(1200), win(100), false, ms(1080)},
		{"a little faster: down to three round trips", ms(1200), win(390), true, ms(1170)},
		{"nothing answered: kept", ms(1200), rttWindow{congested: 5}, true, ms(1200)},
		{"tight, but three round trips are no measure", 0, rttWindow{rtts: slices.Repeat([]time.Duration{ms(400)}, 3)}, true, 0},
		{"a tail: twice the 90th percentile when that is more than three means", 0,
			rttWindow{rtts: []time.Duration{ms(100), ms(1000), ms(100), ms(100), ms(100), ms(1000), ms(100), ms(100), ms(100), ms(100)}}, true, ms(2000)},
		{"no tail: three means", 0,
			rttWindow{rtts: slices.Repeat([]time.Duration{ms(300)}, 10)}, true, ms(900)},
		{"tight, nine round trips: one slow write would be their 90th percentile, no raise", 0,
			rttWindow{rtts: append(slices.Repeat([]time.Duration{ms(100)}, 8), 3*time.Second)}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextLeadFloor(tc.prev, tc.w, tc.tight); got != tc.want {
				t.Errorf("nextLeadFloor(%v, mean %v, tight %v) = %v, want %v", tc.prev, tc.w.mean(), tc.tight, got, tc.want)
			}
		})
	}
}

// TestLeadFloorRaisesTheLeadAndTheDemand: round trips of 400ms raise
// nothing while refreshes land with their lead; once they land tight,
// every lead rises to three round trips, up to a quarter of the ttl, the
// refreshes waiting for their due time are brought forward to it, the
// demand of the grants held is what those leads cost, and the floor is
// exported as a metric. A refresh sent with the old lead is judged tight
// against that lead, not the raised one.
func TestLeadFloorRaisesTheLeadAndTheDemand(t *testing.T) {
	m := metrics.New()
	w := newStatusWriter(nil, nil, m, newSessions(), 100, 0)
	const short, long = 4 * time.Second, 20 * time.Second
	for range 10 {
		w.countTTL(0, short)
		w.countTTL(0, long)
	}
	before := w.sched.perSecond(short)
	if got := w.sched.lead(short); got != StatusLead(short) {
		t.Fatalf("lead(%v) before anything was measured = %v, want statusLead %v", short, got, StatusLead(short))
	}
	now := time.Now()
	queued := &refresh{h: &Grant{UID: "w", shown: now.Add(3 * time.Second)}, ttl: short, index: -1}
	sent := &refresh{h: &Grant{UID: "s", shown: now.Add(3 * time.Second)}, ttl: short, index: -1}
	// Due in 300ms at the 500ms lead; at the raised lead its due time
	// would have passed.
	soon := &refresh{h: &Grant{UID: "n", shown: now.Add(800 * time.Millisecond)}, ttl: short, index: -1}
	w.mu.Lock()
	w.schedule(queued, w.sched.due(queued.h.shown, short))
	w.schedule(sent, w.sched.due(sent.h.shown, short))
	w.schedule(soon, w.sched.due(soon.h.shown, short))
	soonDue := soon.due
	w.mu.Unlock()
	window := func(tight int) {
		for range 10 {
			w.observeRTT(400 * time.Millisecond)
		}
		w.mu.Lock()
		w.win = loadWindow{written: 10, tight: tight, slacks: make([]time.Duration, 10)}
		w.mu.Unlock()
		w.judgeLoad(time.Now(), time.Second)
	}

	window(0)
	if w.sched.floor != 0 {
		t.Fatalf("lead floor %v after a window with nothing tight, want none", w.sched.floor)
	}
	window(3)
	if got, want := w.sched.floor, 1200*time.Millisecond; got != want {
		t.Fatalf("lead floor %v, want %v (three 400ms round trips)", got, want)
	}
	if got, want := w.sched.lead(short), short/4; got != want {
		t.Errorf("lead(%v) = %v, want a quarter of the ttl, %v", short, got, want)
	}
	if got, want := w.sched.lead(long), 2*time.Second; got != want {
		t.Errorf("lead(%v) = %v, want its tenth %v (above the floor)", long, got, want)
	}
	if got, want := queued.h.shown.Sub(queued.due), short/4; got != want || queued.where != waiting {
		t.Errorf("a waiting refresh is due %v before its shown validity (%v), want %v, waiting", got, queued.where, want)
	}
	if !soon.due.Equal(soonDue) || soon.lead != StatusLead(short) || soon.where != waiting {
		t.Errorf("a refresh whose raised due time has passed: due %v, lead %v, %v; want its own due time %v and lead %v, waiting (not a burst sent at once)",
			soon.due.Sub(now), soon.lead, soon.where, soonDue.Sub(now), StatusLead(short))
	}
	if w.sched.perSecond(short) <= before {
		t.Errorf("a ttl %v lock needs %.3f writes/s with the floor, want more than %.3f", short, w.sched.perSecond(short), before)
	}
	want := 10*w.sched.perSecond(short) + 10*w.sched.perSecond(long)
	if got := testutil.ToFloat64(m.StatusWriteDemand); got < want-1e-9 || got > want+1e-9 {
		t.Errorf("demand %.4f/s, want %.4f/s: what the held grants need at the new leads", got, want)
	}
	if got := testutil.ToFloat64(m.StatusWriteLeadFloor); got != 1.2 {
		t.Errorf("redlock_status_write_lead_floor_seconds = %v, want 1.2", got)
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	sent.lead = StatusLead(short) // sent before the raise, with 500ms
	w.win = loadWindow{}
	w.count(sent, 300*time.Millisecond)
	if w.win.tight != 0 {
		t.Errorf("a refresh sent with a 500ms lead landing with 300ms left counts tight against the raised lead")
	}
	w.count(sent, 200*time.Millisecond)
	if w.win.tight != 1 {
		t.Errorf("a refresh sent with a 500ms lead landing with 200ms left does not count tight")
	}
}

// TestLeadFloorLeavesTheLimitInFlight: the limit on writes in flight is
// sized from the leads without the floor. The floor follows the round
// trips; a limit that grew with it would let more writes queue as they
// slow down. And a floor decays to none once round trips are fast.
func TestLeadFloorLeavesTheLimitInFlight(t *testing.T) {
	sized := func(floor time.Duration) int {
		w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 100, 0)
		for range 100 {
			w.countTTL(0, 10*time.Second)
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.sched.floor = floor
		w.inflight = 20
		w.rtt = rttWindow{rtts: slices.Repeat([]time.Duration{200 * time.Millisecond}, 20)}
		w.sizeInflight(false)
		if floor > 0 && w.sched.lead(10*time.Second) <= StatusLead(10*time.Second) {
			t.Fatalf("lead floor %v: the lead is no longer above the tenth of the ttl, so this test shows nothing", w.sched.floor)
		}
		return w.inflight
	}
	if none, floored := sized(0), sized(2*time.Second); none != floored {
		t.Errorf("limit in flight %d with a 2s lead floor, %d without: want the same", floored, none)
	}

	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 100, 0)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.setLeadFloor(1200 * time.Millisecond)
	for i := 0; w.sched.floor > 0; i++ {
		if i > 200 {
			t.Fatalf("lead floor still %v after %d fast windows, want none", w.sched.floor, i)
		}
		w.rtt = rttWindow{rtts: slices.Repeat([]time.Duration{100 * time.Microsecond}, 20)}
		w.sizeInflight(false)
	}
}

// showingG1 is the status of a lock showing grant g1 (token 7) to team-a,
// valid until shown.
func showingG1(shown time.Time) v1alpha1.DistributedLockStatus {
	return v1alpha1.DistributedLockStatus{
		Holder: &v1alpha1.LockHolder{Identity: "team-a"}, GrantID: "g1", FencingToken: 7,
		AcquiredAt: v1alpha1.NewPreciseTime(shown.Add(-time.Minute)), RenewedAt: v1alpha1.NewPreciseTime(shown.Add(-9 * time.Second)),
		ValidUntil: v1alpha1.NewPreciseTime(shown),
	}
}

// idleSession is a Session of a grant valid until validUntil that renews
// on its own only in an hour, with no masters: its last renewal is now.
// It is orphaned when the test ends.
func idleSession(t *testing.T, ttl time.Duration, validUntil time.Time) *renewal.Session {
	t.Helper()
	s := renewal.Hold(t.Context(), renewal.Grant{Key: "k", TTL: ttl, Every: time.Hour, ValidUntil: validUntil},
		renewal.Config{Client: func() *redlock.Client { return nil }})
	t.Cleanup(s.Orphan)
	return s
}

// followed records what a writer told its gate.
type followed struct {
	mu     sync.Mutex
	limits []int
	// lastBehind is whether the writer last told it refreshes wait.
	lastBehind bool
}

func (f *followed) Follow(n int, behind bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastBehind = behind
	f.limits = append(f.limits, n)
}

func (f *followed) behind() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastBehind
}

func (f *followed) last() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.limits) == 0 {
		return -1
	}
	return f.limits[len(f.limits)-1]
}

func TestTheGateFollowsTheLimitInFlight(t *testing.T) {
	gate := &followed{}
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 100, 0)
	w.gate = gate
	window := func() int {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.rtt = rttWindow{rtts: slices.Repeat([]time.Duration{20 * time.Millisecond}, 20)}
		w.load.capacity = 10
		w.sizeInflight(false)
		return w.inflight
	}
	if window(); gate.last() != 0 {
		t.Fatalf("gate follows %d with no grant held, want 0 (open)", gate.last())
	}
	w.mu.Lock()
	w.entries["held"] = &refresh{}
	w.countTTL(0, 10*time.Second)
	w.mu.Unlock()
	limit := window()
	if limit == minWriteParallel {
		t.Fatalf("limit in flight still %d: this test shows nothing", limit)
	}
	if got := gate.last(); got != limit {
		t.Fatalf("gate follows %d with a grant held, want the limit in flight %d", got, limit)
	}
	w.mu.Lock()
	delete(w.entries, "held")
	w.mu.Unlock()
	if window(); gate.last() != 0 {
		t.Fatalf("gate follows %d once no grant is held, want 0 (open)", gate.last())
	}
}

func TestAStoppedWriterOpensTheGate(t *testing.T) {
	gate := &followed{}
	s := New(Config{Metrics: metrics.New(), WritesPerSecond: 100, Gate: gate}, Callbacks{Reconcile: func(types.NamespacedName) {}})
	// A grant held, valid for an hour: the writer starts with the gate
	// closed, and must open it as it stops.
	now := time.Now()
	h := &Grant{UID: "l", Name: types.NamespacedName{Namespace: "ns", Name: "l"}, ID: "g", Holder: "h", Token: 1, AcquiredAt: now}
	s.sessions.hold(h, func() *renewal.Session { return idleSession(t, time.Minute, now.Add(time.Hour)) })
	s.writer.track(h, now.Add(time.Hour), time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if len(gate.limits) < 2 || gate.limits[0] == 0 {
		t.Fatalf("gate followed %v: want it closed as the writer started with a grant held", gate.limits)
	}
	if got := gate.last(); got != 0 {
		t.Fatalf("gate follows %d once the writer stopped, want 0 (open)", got)
	}
}

// TestAPIQueue: the writes of a window met a queue at the API server when
// their mean round trip exceeds the base by more than an eighth of the
// shortest lead held (1 s at ttl 10s), not before, and not in a window
// with nothing answered.
func TestAPIQueue(t *testing.T) {
	w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 100, 0)
	w.countTTL(0, 10*time.Second)
	w.leasts = []time.Duration{10 * time.Millisecond}
	for _, tc := range []struct {
		rtt  time.Duration
		want bool
	}{
		{0, false},
		{100 * time.Millisecond, false},
		{200 * time.Millisecond, true},
	} {
		w.rtt = rttWindow{}
		if tc.rtt > 0 {
			w.rtt.rtts = slices.Repeat([]time.Duration{tc.rtt}, 10)
		}
		w.mu.Lock()
		got := w.apiQueue()
		w.mu.Unlock()
		if got != tc.want {
			t.Errorf("apiQueue with round trips of %v over a base of 10ms, lead 1s = %v, want %v", tc.rtt, got, tc.want)
		}
	}
}

// TestRecoveryWaitsOutAQueueAtTheAPIServer: a refresh period after the
// last growth, with grants waiting for room, the capacity estimate grows
// by a twentieth in a window whose writes met no queue at the API server,
// and stays put in one whose round trips ran 200ms over the base of a
// ttl-10s lead (1 s).
func TestRecoveryWaitsOutAQueueAtTheAPIServer(t *testing.T) {
	for _, tc := range []struct {
		rtt  time.Duration
		want float64
	}{
		{20 * time.Millisecond, 42},
		{210 * time.Millisecond, 40},
	} {
		w := newStatusWriter(nil, nil, metrics.New(), newSessions(), 100, 0)
		w.countTTL(0, 10*time.Second)
		w.leasts = []time.Duration{10 * time.Millisecond}
		w.waiters.put(waiter{name: types.NamespacedName{Namespace: "ns", Name: "waits"}, ttl: 10 * time.Second, since: time.Now()})
		w.load = loadState{capacity: 40, measured: true, sinceGrowth: 9}
		for range 10 {
			w.observeRTT(tc.rtt)
		}
		w.judgeLoad(time.Now(), time.Second)
		if got := w.load.capacity; !near(got, tc.want) {
			t.Errorf("capacity after a window of %v round trips = %.2f, want %.2f", tc.rtt, got, tc.want)
		}
	}
}
