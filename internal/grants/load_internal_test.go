package grants

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestNextLoad(t *testing.T) {
	const budget = 150.0
	win := func(written, tight, late int, backlogged time.Duration, demand float64) loadWindow {
		return loadWindow{span: time.Second, written: written, tight: tight, late: late, backlogged: backlogged, demand: demand, budget: budget}
	}
	measured := func(c float64) loadState { return loadState{capacity: c, measured: true} }
	// waited: grants waited for room in the window, whose grants held
	// are refreshed every period.
	waited := func(w loadWindow, period time.Duration) loadWindow {
		w.waiting, w.period = true, period
		return w
	}
	paced := func(w loadWindow, n int, least time.Duration) loadWindow {
		w.slacks = slices.Repeat([]time.Duration{least}, n)
		return w
	}
	for _, tc := range []struct {
		name      string
		prev      loadState
		w         loadWindow
		want      loadState
		wantShed  float64
		admitsAdd float64 // a grant of this many writes/s is admitted after the window...
		admits    bool    // ... or not
	}{
		{
			name: "keeping up: the budget stands",
			prev: initialLoad(budget), w: win(100, 0, 0, 100*time.Millisecond, 110),
			want: loadState{capacity: budget}, admitsAdd: 1, admits: true,
		},
		{
			name: "keeping up, demand near the budget: no grant beyond shedTarget of it",
			prev: initialLoad(budget), w: win(115, 0, 0, 0, 119.5),
			want: loadState{capacity: budget}, admitsAdd: 1, admits: false,
		},
		{
			name: "saturated below demand, refreshes landing tight: overloaded, shed down to shedTarget of what committed, then a cool-down",
			prev: initialLoad(budget), w: win(60, 10, 0, 950*time.Millisecond, 115),
			want: loadState{capacity: 60, measured: true, overloaded: true, cooldown: cooldownWindows}, wantShed: 115 - shedTarget*60, admitsAdd: 0.1, admits: false,
		},
		{
			name: "saturated, grants shown Shed beside the refreshes: they count in the capacity, not in the share landing tight",
			prev: initialLoad(budget), w: func() loadWindow {
				w := win(12, 2, 0, 950*time.Millisecond, 115) // 2 of 12 tight: more than a tenth (2 of 20 is not)
				w.shown = 8
				return w
			}(),
			want:     loadState{capacity: 20, measured: true, overloaded: true, cooldown: cooldownWindows},
			wantShed: 115 - shedTarget*20, admitsAdd: 0.1, admits: false,
		},
		{
			name: "saturated below demand, every refresh with half its lead left: overloaded (grants wait), nothing shed",
			prev: initialLoad(budget), w: win(60, 0, 0, 950*time.Millisecond, 115),
			want: loadState{capacity: 60, measured: true, overloaded: true}, admitsAdd: 0.1, admits: false,
		},
		{
			name: "behind, a short lead: at the pace the backlog grows refreshes land late within the horizon: shed",
			prev: initialLoad(budget), w: paced(win(100, 0, 0, 950*time.Millisecond, 116), 100, 700*time.Millisecond),
			want: loadState{capacity: 100, measured: true, overloaded: true, cooldown: cooldownWindows}, wantShed: 116 - shedTarget*100, admitsAdd: 0.1, admits: false,
		},
		{
			name: "behind, a long lead: the backlog is absorbed for longer than the horizon: nothing shed",
			prev: initialLoad(budget), w: paced(win(100, 0, 0, 950*time.Millisecond, 116), 100, 10*time.Second),
			want: loadState{capacity: 100, measured: true, overloaded: true}, admitsAdd: 0.1, admits: false,
		},
		{
			name: "behind, one refresh of a hundred with little slack (a short ttl's, or a retry): nothing shed",
			prev: initialLoad(budget), w: func() loadWindow {
				w := paced(win(100, 0, 0, 950*time.Millisecond, 116), 99, 10*time.Second)
				w.slacks = append(w.slacks, 700*time.Millisecond)
				return w
			}(),
			want: loadState{capacity: 100, measured: true, overloaded: true}, admitsAdd: 0.1, admits: false,
		},
		{
			name: "behind with demand at the capacity itself, a ttl-10s lead: the backlog's wander reaches a tenth of the refreshes within the horizon: shed",
			prev: initialLoad(budget), w: paced(win(34, 0, 0, 900*time.Millisecond, 34.05), 34, 1200*time.Millisecond),
			want: loadState{capacity: 34, measured: true, overloaded: true, cooldown: cooldownWindows}, wantShed: 34.05 - shedTarget*34, admitsAdd: 0.1, admits: false,
		},
		{
			name: "behind with demand at the capacity itself, a ttl-60s lead: nothing shed",
			prev: initialLoad(budget), w: paced(win(34, 0, 0, 900*time.Millisecond, 34.05), 34, 6*time.Second),
			want: loadState{capacity: 34, measured: true, overloaded: true}, admitsAdd: 0.1, admits: false,
		},
		{
			name: "keeping up with a short lead: nothing shed",
			prev: initialLoad(budget), w: paced(win(100, 0, 0, 100*time.Millisecond, 100), 100, 100*time.Millisecond),
			want: loadState{capacity: budget}, admitsAdd: 1, admits: true,
		},
		{
			name: "one saturated window's dip among steadier ones: capacity is their median (tight refreshes: grants wait, nothing shed below it)",
			prev: loadState{capacity: 120, measured: true, rates: []float64{120, 125, 130, 118}}, w: win(60, 10, 0, time.Second, 110),
			want: loadState{capacity: 120, measured: true, overloaded: true}, admitsAdd: 1, admits: false,
		},
		{
			name: "saturated by the budget itself (demand above it): overloaded at the budget",
			prev: initialLoad(budget), w: win(150, 0, 0, time.Second, 230),
			want: loadState{capacity: budget, overloaded: true, cooldown: cooldownWindows}, wantShed: 230 - shedTarget*budget, admitsAdd: 0.1, admits: false,
		},
		{
			name: "demand above the budget, before any backlog: overloaded at once",
			prev: initialLoad(budget), w: win(100, 0, 0, 0, 160),
			want: loadState{capacity: budget, overloaded: true, cooldown: cooldownWindows}, wantShed: 160 - shedTarget*budget, admitsAdd: 0.1, admits: false,
		},
		{
			name: "saturated but demand within what committed: a burst, not overload",
			prev: initialLoad(budget), w: win(120, 0, 0, 900*time.Millisecond, 80),
			want: measured(120), admitsAdd: 10, admits: true,
		},
		{
			name: "refreshes waited for the budget, not the API server (a small budget, bunched refreshes): no capacity measured",
			prev: initialLoad(budget), w: func() loadWindow {
				w := win(1, 0, 0, 900*time.Millisecond, 1.5)
				w.limited = 800 * time.Millisecond
				return w
			}(),
			want: loadState{capacity: budget}, admitsAdd: 0.3, admits: true,
		},
		{
			name: "nothing committed while refreshes waited (API server unreachable): no information",
			prev: measured(90), w: win(0, 0, 0, time.Second, 60),
			want: measured(90), admitsAdd: 1, admits: true,
		},
		{
			name: "a window far longer than a tick (the manager paused): no information",
			prev: measured(90), w: loadWindow{span: 10 * time.Second, written: 3, backlogged: 10 * time.Second, demand: 60, budget: budget},
			want: measured(90), admitsAdd: 1, admits: true,
		},
		{
			name: "refreshes landing tight: overloaded (grants wait), nothing shed",
			prev: initialLoad(budget), w: win(100, 20, 0, 200*time.Millisecond, 100),
			want: loadState{capacity: budget, overloaded: true}, admitsAdd: 0.1, admits: false,
		},
		{
			name: "refreshes landing late: overloaded, shed the least share",
			prev: initialLoad(budget), w: win(100, 20, 20, 200*time.Millisecond, 100),
			want: loadState{capacity: budget, overloaded: true, cooldown: cooldownWindows}, wantShed: shedLeast * 100, admitsAdd: 0.1, admits: false,
		},
		{
			name: "tight and late, but too few refreshes to tell",
			prev: initialLoad(budget), w: win(2, 2, 2, 0, 2),
			want: loadState{capacity: budget}, admitsAdd: 1, admits: true,
		},
		{
			name: "a few tight refreshes are no overload",
			prev: initialLoad(budget), w: win(100, 5, 0, 200*time.Millisecond, 100),
			want: loadState{capacity: budget}, admitsAdd: 1, admits: true,
		},
		{
			name: "overloaded, then a window that keeps up with demand still above shedTarget of capacity: still overloaded",
			prev: loadState{capacity: 90, measured: true, overloaded: true}, w: win(95, 0, 0, 0, 95),
			want: loadState{capacity: 90, measured: true, overloaded: true}, admitsAdd: 0.1, admits: false,
		},
		{
			name: "... until the demand is back within shedTarget of it",
			prev: loadState{capacity: 100, measured: true, overloaded: true}, w: waited(win(70, 0, 0, 0, 70), 0),
			want: loadState{capacity: 105, measured: true}, admitsAdd: 1, admits: true,
		},
		{
			name: "calm during the cool-down after a shed: capacity stays put",
			prev: loadState{capacity: 60, measured: true, overloaded: true, cooldown: 5}, w: win(45, 0, 0, 0, 45),
			want: loadState{capacity: 60, measured: true, cooldown: 4}, admitsAdd: 3, admits: true,
		},
		{
			name: "calm after the cool-down, grants waiting for room: capacity recovers by a twentieth",
			prev: measured(60), w: waited(win(45, 0, 0, 0, 45), 0),
			want: measured(63), admitsAdd: 5, admits: true,
		},
		{
			name: "... but the writes met a queue at the API server: capacity stays put",
			prev: loadState{capacity: 60, measured: true, sinceGrowth: 8}, w: func() loadWindow { w := waited(win(45, 0, 0, 0, 45), 9*time.Second); w.apiQueue = true; return w }(),
			want: measured(60), admitsAdd: 5, admits: false,
		},
		{
			name: "... a queue for ten refresh periods: it grows all the same",
			prev: loadState{capacity: 60, measured: true, sinceGrowth: 89}, w: func() loadWindow { w := waited(win(45, 0, 0, 0, 45), 9*time.Second); w.apiQueue = true; return w }(),
			want: measured(63), admitsAdd: 5, admits: true,
		},
		{
			name: "... but nothing waits: capacity stays put",
			prev: measured(60), w: win(45, 0, 0, 0, 45),
			want: measured(60), admitsAdd: 3, admits: true,
		},
		{
			name: "... grown less than a refresh period ago: capacity stays put",
			prev: loadState{capacity: 60, measured: true, sinceGrowth: 3}, w: waited(win(45, 0, 0, 0, 45), 9*time.Second),
			want: measured(60), admitsAdd: 5, admits: false,
		},
		{
			name: "... a refresh period ago: it grows",
			prev: loadState{capacity: 60, measured: true, sinceGrowth: 8}, w: waited(win(45, 0, 0, 0, 45), 9*time.Second),
			want: measured(63), admitsAdd: 5, admits: true,
		},
		{
			name: "more committed than the estimate over five windows, keeping up: capacity is their median at once",
			prev: loadState{capacity: 60, measured: true, cooldown: 5, recent: []float64{72, 68, 70, 75}}, w: win(70, 0, 0, 0, 70),
			want: loadState{capacity: 70, measured: true, cooldown: 4}, admitsAdd: 1, admits: false,
		},
		{
			name: "more committed than the estimate in one window (a second's boundary): capacity stays put",
			prev: loadState{capacity: 60, measured: true, cooldown: 5, recent: []float64{55, 56, 58, 57}}, w: win(70, 0, 0, 0, 70),
			want: loadState{capacity: 60, measured: true, cooldown: 4}, admitsAdd: 1, admits: false,
		},
		{
			name: "recovered up to the budget: measured no more",
			prev: measured(145), w: waited(win(45, 0, 0, 0, 45), 0),
			want: loadState{capacity: budget}, admitsAdd: 1, admits: true,
		},
		{
			name: "nothing held: any grant the budget can refresh is admitted, whatever the capacity",
			prev: loadState{capacity: 0.5, measured: true}, w: waited(win(0, 0, 0, 0, 0), 0),
			want: loadState{capacity: 0.525, measured: true}, admitsAdd: 1, admits: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, shed := nextLoad(tc.prev, tc.w)
			if got.overloaded != tc.want.overloaded || got.measured != tc.want.measured || got.cooldown != tc.want.cooldown || !near(got.capacity, tc.want.capacity) {
				t.Errorf("state = %+v, want %+v", got, tc.want)
			}
			if !near(shed, tc.wantShed) {
				t.Errorf("shed %.2f/s, want %.2f/s", shed, tc.wantShed)
			}
			if a := got.admits(tc.w.demand, tc.admitsAdd, budget); a != tc.admits {
				t.Errorf("admits(%v + %v) = %v, want %v", tc.w.demand, tc.admitsAdd, a, tc.admits)
			}
		})
	}
}

func near(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }

func TestChooseShedTakesTheYoungest(t *testing.T) {
	now := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	c := func(uid string, age time.Duration) shedCandidate {
		return shedCandidate{uid: types.UID(uid), acquiredAt: now.Add(-age), perSecond: 0.1}
	}
	cands := []shedCandidate{c("oldest", time.Hour), c("youngest", 0), c("middle", time.Minute), c("second", 2*time.Second)}
	for _, tc := range []struct {
		perSecond float64
		want      []types.UID
	}{
		{0, nil},
		{0.05, []types.UID{"youngest"}},
		{0.2, []types.UID{"youngest", "second"}},
		{0.25, []types.UID{"youngest", "second", "middle"}},
		{10, []types.UID{"youngest", "second", "middle", "oldest"}},
	} {
		if got := chooseShed(cands, tc.perSecond); !slices.Equal(got, tc.want) {
			t.Errorf("chooseShed(%.2f/s) = %v, want %v", tc.perSecond, got, tc.want)
		}
	}
}

// TestOverloadLastsWithoutPressing: a window that keeps up while demand is
// still above shedTarget of capacity keeps the writer overloaded, but
// presses for no shed (judgeLoad counts no strike and spares grants
// chosen before).
func TestOverloadLastsWithoutPressing(t *testing.T) {
	prev := loadState{capacity: 90, measured: true, overloaded: true, pressed: true}
	got, shed := nextLoad(prev, loadWindow{span: time.Second, written: 95, demand: 95, budget: 150})
	if !got.overloaded || got.pressed || shed != 0 {
		t.Fatalf("after a window that kept up at demand 95 of capacity 90: overloaded %v, pressed %v, shed %.1f; want overloaded, not pressed, nothing shed", got.overloaded, got.pressed, shed)
	}
}

// TestShedNow: a pressed window sheds when it lasts or demand is over the
// budget; while grants chosen before wait for their Shed, only when the
// capacity measured fell below what the others need over shedTarget.
func TestShedNow(t *testing.T) {
	for _, c := range []struct {
		name                           string
		strikes                        int
		pending                        bool
		demand, budget, target, perSec float64
		want                           bool
	}{
		{name: "nothing to shed", strikes: 3, demand: 40, budget: 150, target: 40, perSec: 0},
		{name: "one pressed window, within the budget", strikes: 1, demand: 60, budget: 150, target: 40, perSec: 20},
		{name: "one pressed window, over the budget", strikes: 1, demand: 200, budget: 150, target: 120, perSec: 80, want: true},
		{name: "two pressed windows", strikes: 2, demand: 60, budget: 150, target: 40, perSec: 20, want: true},
		{name: "Sheds pending, the others within the target", strikes: 5, pending: true, demand: 40, budget: 150, target: 40, perSec: 0.1},
		{name: "Sheds pending, the target fell", strikes: 5, pending: true, demand: 40, budget: 150, target: 33.6, perSec: 6.4, want: true},
	} {
		if got := shedNow(c.strikes, c.pending, c.demand, c.budget, c.target, c.perSec); got != c.want {
			t.Errorf("%s: shedNow = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestShareFollowsTheSpread: demand is brought down to, and admitted up
// to, shedTarget of capacity while the saturated seconds took about the
// estimate; to the low tenth of what they took over the estimate when
// that is less (never below minShare); and dips older than dipWindows are
// forgotten.
func TestShareFollowsTheSpread(t *testing.T) {
	dips := func(ratios ...float64) []dip {
		out := make([]dip, len(ratios))
		for i, r := range ratios {
			out[i] = dip{ratio: r}
		}
		return out
	}
	for _, c := range []struct {
		name string
		dips []dip
		want float64
	}{
		{name: "nothing measured", want: shedTarget},
		{name: "fewer than minDips", dips: dips(0.5, 0.5, 0.5, 0.5), want: shedTarget},
		{name: "an API server that takes what it is let: within a tenth", dips: dips(0.93, 1.07, 0.98, 1.02, 0.95, 1.05, 1), want: shedTarget},
		{name: "one slow second in ten is not the low tenth", dips: dips(1, 1.1, 0.95, 1.05, 0.62, 1.2, 0.9, 1, 1.1, 0.97), want: shedTarget},
		{name: "two in ten are", dips: dips(1, 1.1, 0.95, 1.05, 0.62, 1.2, 0.75, 1, 1.1, 0.97), want: 0.75},
		{name: "beside CPU hogs: from 55 % to 120 %", dips: dips(0.55, 1.2, 0.7, 1.1, 0.6, 0.9, 1, 0.65, 1.05, 0.8), want: 0.6},
		{name: "deeper than minShare", dips: dips(0.2, 0.3, 0.3, 0.4, 1), want: minShare},
	} {
		l := loadState{capacity: 100, measured: true, dips: c.dips}
		if got := l.share(); !near(got, c.want) {
			t.Errorf("%s: share = %.3f, want %.3f", c.name, got, c.want)
		}
		if got := l.target(); !near(got, 100*c.want) {
			t.Errorf("%s: target = %.3f, want %.3f", c.name, got, 100*c.want)
		}
	}

	// A saturated window below the estimate is a dip; one while unmeasured is not.
	sat := loadWindow{span: time.Second, written: 30, backlogged: time.Second, demand: 45, budget: 150}
	next, _ := nextLoad(loadState{capacity: 150}, sat)
	if len(next.dips) != 0 {
		t.Fatalf("dips after the first measurement: %v, want none (the budget was no estimate)", next.dips)
	}
	next, _ = nextLoad(loadState{capacity: 50, measured: true}, sat)
	if len(next.dips) != 1 || !near(next.dips[0].ratio, 0.6) {
		t.Fatalf("dips = %v, want one of 0.6 (30 of an estimated 50)", next.dips)
	}
	// A dip counts for dipWindows windows, its own included.
	quiet := loadWindow{span: time.Second, written: 10, demand: 10, budget: 150}
	for range dipWindows - 1 {
		next, _ = nextLoad(next, quiet)
	}
	if len(next.dips) != 1 {
		t.Fatalf("dips in the dip's %dth window: %v, want it", dipWindows, next.dips)
	}
	next, _ = nextLoad(next, quiet)
	if len(next.dips) != 0 {
		t.Fatalf("dips after %d windows: %v, want none", dipWindows, next.dips)
	}
}
