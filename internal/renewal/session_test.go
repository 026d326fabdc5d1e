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

func TestNeedStatusWrite(t *testing.T) {
	now := time.Unix(1000, 0)
	every := 3 * time.Second
	for _, tc := range []struct {
		name  string
		shown time.Duration // shown validity, relative to now
		want  bool
	}{
		{"a validity just written needs no write", 10 * time.Second, false},
		{"a validity that survives the next renewal and its write needs none", 6 * time.Second, false},
		{"a validity that might pass before the next renewal is written needs one", 4 * time.Second, true},
		{"a validity ending now needs one", 0, true},
		{"a validity already past needs one", -time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NeedStatusWrite(now.Add(tc.shown), now, every); got != tc.want {
				t.Errorf("NeedStatusWrite(+%v) = %v, want %v", tc.shown, got, tc.want)
			}
		})
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
