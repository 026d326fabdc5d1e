package renewal

import (
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

var redlockDrift = redlock.Drift

func TestNextRenewal(t *testing.T) {
	now := time.Unix(1000, 0)
	valid := now.Add(9 * time.Second)
	for _, tc := range []struct {
		name     string
		every    time.Duration
		failures int
		at       time.Time
		want     time.Time
	}{
		{"a healthy grant is renewed one interval after the last renewal", 3 * time.Second, 0, now, now.Add(3 * time.Second)},
		{"after a failure the renewal is retried within a second", 3 * time.Second, 1, now.Add(4 * time.Second), now.Add(4*time.Second + 750*time.Millisecond)},
		{"an interval too long for the validity is pulled in to two thirds of it", 8 * time.Second, 0, now, now.Add(6 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NextRenewal(now, tc.every, tc.failures, valid, tc.at); !got.Equal(tc.want) {
				t.Errorf("NextRenewal = +%v, want +%v", got.Sub(now), tc.want.Sub(now))
			}
		})
	}
}

func TestStatusWriteSchedule(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		name             string
		ttl              time.Duration
		lead, renewLead  time.Duration
		writesPerTTLLess float64
	}{
		{"ttl 10s: the write lands a second ahead, its renewal 200ms before it", 10 * time.Second, time.Second, 200 * time.Millisecond, 1.16},
		{"ttl 60s: six seconds ahead, renewal a second before", time.Minute, 6 * time.Second, time.Second, 1.15},
		{"ttl 1s: at least a quarter of the ttl ahead", time.Second, 250 * time.Millisecond, 20 * time.Millisecond, 1.4},
		{"ttl 3s: at least 500ms ahead", 3 * time.Second, 500 * time.Millisecond, 60 * time.Millisecond, 1.25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := StatusLead(tc.ttl); got != tc.lead {
				t.Errorf("StatusLead(%v) = %v, want %v", tc.ttl, got, tc.lead)
			}
			if got := RenewLead(tc.ttl); got != tc.renewLead {
				t.Errorf("RenewLead(%v) = %v, want %v", tc.ttl, got, tc.renewLead)
			}
			if got := WritesPerTTL(tc.ttl); got <= 1 || got >= tc.writesPerTTLLess {
				t.Errorf("WritesPerTTL(%v) = %.3f, want in (1, %v)", tc.ttl, got, tc.writesPerTTLLess)
			}
			shown := now.Add(tc.ttl)
			due := WriteDue(shown, tc.ttl)
			if !due.Equal(shown.Add(-tc.lead)) {
				t.Errorf("WriteDue = shown-%v, want shown-%v", shown.Sub(due), tc.lead)
			}
			pre := PreWriteRenewal(shown, tc.ttl, now)
			if !pre.Equal(due.Add(-tc.renewLead)) {
				t.Errorf("PreWriteRenewal after an old renewal = due-%v, want due-%v", due.Sub(pre), tc.renewLead)
			}
			if !FreshForWrite(shown, tc.ttl, pre) {
				t.Error("the pre-write renewal is not fresh enough to write")
			}
			if got := PreWriteRenewal(shown, tc.ttl, pre.Add(-tc.renewLead)); !got.IsZero() {
				t.Errorf("a renewal a RenewLead before the pre-write one still asks for another at %v", got)
			}
			if FreshForWrite(shown, tc.ttl, pre.Add(-tc.renewLead-time.Millisecond)) {
				t.Error("a renewal older than two RenewLeads before the due write counts as fresh")
			}
		})
	}
	if !WriteDue(time.Time{}, time.Second).IsZero() || !PreWriteRenewal(time.Time{}, time.Second, now).IsZero() || FreshForWrite(time.Time{}, time.Second, now) {
		t.Error("with nothing shown, a write or pre-write renewal is scheduled")
	}
}

func TestCoveringTTL(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		name  string
		ttl   time.Duration
		shown time.Duration // relative to now
		want  func(time.Duration) bool
	}{
		{"nothing shown: the spec's ttl", 10 * time.Second, -time.Second, func(d time.Duration) bool { return d == 10*time.Second }},
		{"shown within the ttl's reach: the spec's ttl", 10 * time.Second, 5 * time.Second, func(d time.Duration) bool { return d == 10*time.Second }},
		{"shown beyond a shrunk ttl: long enough to cover it", 2 * time.Second, 8 * time.Second, func(d time.Duration) bool {
			return d-redlockDrift(d) >= 8*time.Second && d < 8200*time.Millisecond && d%time.Millisecond == 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := CoveringTTL(tc.ttl, now.Add(tc.shown), now); !tc.want(got) {
				t.Errorf("CoveringTTL(%v, +%v) = %v", tc.ttl, tc.shown, got)
			}
		})
	}
}
