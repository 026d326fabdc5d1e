package gate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	t0 := time.Unix(10_000, 0)
	b0 := time.Hour // the boot clock at t0
	const boot = "boot-1"
	delay := 30 * time.Second
	// at is an instant d after t0 on both clocks, in this boot.
	at := func(d time.Duration) Instant { return Instant{Wall: t0.Add(d), Boot: b0 + d, BootID: boot} }
	run := func(end time.Duration, clean bool) *State {
		s := &State{StartedAt: t0, AliveAt: t0.Add(5 * time.Second), BootID: boot, StartedBoot: b0, AliveBoot: b0 + 5*time.Second, Exit: "signal: killed"}
		if end > 0 {
			s.EndedAt, s.EndedBoot, s.Clean = t0.Add(end), b0+end, clean
		}
		return s
	}
	crashed, clean, unrecorded := run(6*time.Second, false), run(6*time.Second, true), run(0, false)
	older := &State{StartedAt: t0, AliveAt: t0.Add(5 * time.Second), EndedAt: t0.Add(6 * time.Second), Exit: "signal: killed"}
	stepped := at(10 * time.Second)
	stepped.Wall = stepped.Wall.Add(time.Hour) // the wall clock stepped an hour ahead since the crash
	rebooted := Instant{Wall: t0.Add(10 * time.Second), Boot: 5 * time.Second, BootID: "boot-2"}
	tests := []struct {
		name        string
		prev        *State
		persistence string
		now         Instant
		wait        time.Duration
		admission   bool
	}{
		{"new pod", nil, PersistenceNone, at(0), 0, true},
		{"new pod, AOFAlways: the operator decides", nil, AOFAlways, at(0), 0, true},
		{"crash, None", crashed, PersistenceNone, at(10 * time.Second), delay - 4*time.Second, false},
		{"crash, AOFEverySec", crashed, AOFEverySec, at(10 * time.Second), delay - 4*time.Second, false},
		{"crash, AOFAlways", crashed, AOFAlways, at(10 * time.Second), 0, false},
		{"crash long ago", crashed, PersistenceNone, at(time.Hour), 0, false},
		{"clean, None", clean, PersistenceNone, at(10 * time.Second), delay - 4*time.Second, false},
		{"clean, AOFEverySec", clean, AOFEverySec, at(10 * time.Second), 0, false},
		{"clean, AOFAlways", clean, AOFAlways, at(10 * time.Second), 0, false},
		{"unrecorded death: the whole delay from now, whatever the heartbeat", unrecorded, AOFEverySec, at(time.Hour), delay, false},
		{"unrecorded death before the first heartbeat", &State{StartedAt: t0, StartedBoot: b0, BootID: boot}, PersistenceNone, at(10 * time.Second), delay, false},
		{"a wall-clock step since the crash changes nothing", crashed, PersistenceNone, stepped, delay - 4*time.Second, false},
		{"the node rebooted since: the whole delay from now", crashed, PersistenceNone, rebooted, delay, false},
		{"an older gate's record: the wall clock", older, PersistenceNone, at(10 * time.Second), delay - 4*time.Second, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.prev, tc.persistence, delay, tc.now)
			if d.Wait != tc.wait || d.NeedAdmission != tc.admission || d.Reason == "" {
				t.Fatalf("Decide = %+v, want wait %v admission %v", d, tc.wait, tc.admission)
			}
		})
	}
}

func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if s, err := LoadState(dir); s != nil || err != nil {
		t.Fatalf("empty dir: %v, %v", s, err)
	}
	want := &State{Runs: 3, StartedAt: time.Unix(1, 0).UTC(), AliveAt: time.Unix(2, 0).UTC(), EndedAt: time.Unix(3, 0).UTC(), Clean: true, Exit: "exit status 0",
		BootID: "b", StartedBoot: time.Second, AliveBoot: 2 * time.Second, EndedBoot: 3 * time.Second}
	if err := SaveState(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := LoadState(dir)
	if err != nil || *got != *want {
		t.Fatalf("got %+v, %v; want %+v", got, err, want)
	}
	if err := os.WriteFile(filepath.Join(dir, stateFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadState(dir); err == nil {
		t.Fatal("a corrupt record was accepted")
	}
}

func TestReadAdmission(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "annotations")
	if _, ok, err := ReadAdmission(path); ok || err != nil {
		t.Fatalf("missing file: %v %v", ok, err)
	}
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("kubernetes.io/config.seen=\"2026-01-01T00:00:00Z\"\nother=\"x\"\n")
	if _, ok, err := ReadAdmission(path); ok || err != nil {
		t.Fatalf("no annotation: %v %v", ok, err)
	}
	write("a=\"b\"\nredlock.dev/serve-after=\"2026-11-30T02:00:00.5Z\"\n")
	a, ok, err := ReadAdmission(path)
	after := time.Date(2026, 11, 30, 2, 0, 0, 5e8, time.UTC)
	if !ok || err != nil || a.HasDelay || !a.After.Equal(after) {
		t.Fatalf("an older operator's admission: got %+v %v %v", a, ok, err)
	}
	if w := a.Wait(after.Add(-2 * time.Second)); w != 2*time.Second {
		t.Fatalf("an older operator's admission: wait %v, want 2s on the wall clock", w)
	}
	write("redlock.dev/serve-after=\"2026-11-30T02:00:00.5Z\"\nredlock.dev/serve-delay=\"7.5s\"\n")
	a, ok, err = ReadAdmission(path)
	if !ok || err != nil || !a.HasDelay || a.Delay != 7500*time.Millisecond {
		t.Fatalf("got %+v %v %v", a, ok, err)
	}
	if w := a.Wait(after.Add(time.Hour)); w != 7500*time.Millisecond {
		t.Fatalf("wait %v with the gate's wall clock an hour past the operator's instant, want the delay 7.5s", w)
	}
	for _, bad := range []string{"redlock.dev/serve-after=\"soon\"\n", "redlock.dev/serve-delay=\"soon\"\n", "redlock.dev/serve-delay=\"-1s\"\n"} {
		write(bad)
		if _, _, err := ReadAdmission(path); err == nil || !strings.Contains(err.Error(), "redlock.dev/serve-") {
			t.Fatalf("bad value %q: %v", bad, err)
		}
	}
}

func TestVoting(t *testing.T) {
	dir := t.TempDir()
	now := Instant{Wall: time.Unix(10_000, 0), Boot: time.Hour, BootID: "boot-1"}
	if Voting(dir, time.Second, now) == nil {
		t.Fatal("voting without any run")
	}
	started := &State{Runs: 1, StartedAt: now.Wall.Add(-3 * time.Second), StartedBoot: now.Boot - 3*time.Second, BootID: now.BootID}
	if err := SaveState(dir, started); err != nil {
		t.Fatal(err)
	}
	if Voting(dir, 5*time.Second, now) == nil {
		t.Fatal("voting 3s after start with a 5s quarantine")
	}
	if err := Voting(dir, 2*time.Second, now); err != nil {
		t.Fatalf("not voting after its quarantine: %v", err)
	}
	stepped := now
	stepped.Wall = stepped.Wall.Add(time.Hour)
	if Voting(dir, 5*time.Second, stepped) == nil {
		t.Fatal("a wall-clock step made a run 3s old vote with a 5s quarantine")
	}
	if err := SaveState(dir, &State{Runs: 1, StartedAt: now.Wall.Add(-time.Hour), EndedAt: now.Wall}); err != nil {
		t.Fatal(err)
	}
	if Voting(dir, time.Second, now) == nil {
		t.Fatal("voting after the run ended")
	}
}
