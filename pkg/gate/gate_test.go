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
	delay, beat := 30*time.Second, time.Second
	crashed := &State{StartedAt: t0, AliveAt: t0.Add(5 * time.Second), EndedAt: t0.Add(6 * time.Second), Exit: "signal: killed"}
	clean := &State{StartedAt: t0, AliveAt: t0.Add(5 * time.Second), EndedAt: t0.Add(6 * time.Second), Clean: true, Exit: "exit status 0"}
	unrecorded := &State{StartedAt: t0, AliveAt: t0.Add(5 * time.Second)}
	tests := []struct {
		name        string
		prev        *State
		persistence string
		until       time.Time
		admission   bool
	}{
		{"new pod", nil, PersistenceNone, time.Time{}, true},
		{"new pod, AOFAlways: the operator decides", nil, AOFAlways, time.Time{}, true},
		{"crash, None", crashed, PersistenceNone, t0.Add(6*time.Second + delay), false},
		{"crash, AOFEverySec", crashed, AOFEverySec, t0.Add(6*time.Second + delay), false},
		{"crash, AOFAlways", crashed, AOFAlways, time.Time{}, false},
		{"clean, None", clean, PersistenceNone, t0.Add(6*time.Second + delay), false},
		{"clean, AOFEverySec", clean, AOFEverySec, time.Time{}, false},
		{"clean, AOFAlways", clean, AOFAlways, time.Time{}, false},
		{"unrecorded death: last heartbeat + one beat", unrecorded, AOFEverySec, t0.Add(5*time.Second + beat + delay), false},
		{"unrecorded death before the first heartbeat", &State{StartedAt: t0}, PersistenceNone, t0.Add(beat + delay), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.prev, tc.persistence, delay, beat)
			if !d.Until.Equal(tc.until) || d.NeedAdmission != tc.admission || d.Reason == "" {
				t.Fatalf("Decide = %+v, want until %v admission %v", d, tc.until, tc.admission)
			}
		})
	}
}

func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if s, err := LoadState(dir); s != nil || err != nil {
		t.Fatalf("empty dir: %v, %v", s, err)
	}
	want := &State{Runs: 3, StartedAt: time.Unix(1, 0).UTC(), AliveAt: time.Unix(2, 0).UTC(), EndedAt: time.Unix(3, 0).UTC(), Clean: true, Exit: "exit status 0"}
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
	at, ok, err := ReadAdmission(path)
	if !ok || err != nil || !at.Equal(time.Date(2026, 11, 30, 2, 0, 0, 5e8, time.UTC)) {
		t.Fatalf("got %v %v %v", at, ok, err)
	}
	write("redlock.dev/serve-after=\"soon\"\n")
	if _, _, err := ReadAdmission(path); err == nil || !strings.Contains(err.Error(), AdmissionAnnotation) {
		t.Fatalf("bad value: %v", err)
	}
}

func TestVoting(t *testing.T) {
	dir := t.TempDir()
	now := time.Unix(10_000, 0)
	if Voting(dir, time.Second, now) == nil {
		t.Fatal("voting without any run")
	}
	if err := SaveState(dir, &State{Runs: 1, StartedAt: now.Add(-3 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	if Voting(dir, 5*time.Second, now) == nil {
		t.Fatal("voting 3s after start with a 5s quarantine")
	}
	if err := Voting(dir, 2*time.Second, now); err != nil {
		t.Fatalf("not voting after its quarantine: %v", err)
	}
	if err := SaveState(dir, &State{Runs: 1, StartedAt: now.Add(-time.Hour), EndedAt: now}); err != nil {
		t.Fatal(err)
	}
	if Voting(dir, time.Second, now) == nil {
		t.Fatal("voting after the run ended")
	}
}
