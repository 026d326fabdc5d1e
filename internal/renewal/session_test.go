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
			if got := nextRenewal(now, tc.every, tc.failures, valid, tc.at); !got.Equal(tc.want) {
				t.Errorf("nextRenewal = +%v, want +%v", got.Sub(now), tc.want.Sub(now))
			}
		})
	}
}

func TestReports(t *testing.T) {
	r := NewReports()
	a, b := &Session{}, &Session{}
	select {
	case <-r.Ready():
		t.Fatal("Ready fired with nothing posted")
	default:
	}
	for range 10000 { // nobody reads: posting must neither block nor pile up
		r.post(a)
	}
	r.post(b)
	r.post(a)
	select {
	case <-r.Ready():
	default:
		t.Fatal("Ready did not fire after posts")
	}
	if got := r.Take(); len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("Take = %v, want a then b, each once", got)
	}
	if got := r.Take(); len(got) != 0 {
		t.Fatalf("a second Take returned %v", got)
	}
	r.post(b)
	<-r.Ready()
	if got := r.Take(); len(got) != 1 || got[0] != b {
		t.Fatalf("a post after a Take: Take = %v, want b", got)
	}
	var none *Reports
	none.post(a) // a Session without Reports posts nowhere
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

// TestExpiresByCoversOthersCopies: an adopted grant's Session never
// reports its copies gone before those whoever renewed it before wrote.
func TestExpiresByCoversOthersCopies(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name   string
		others time.Time
		want   time.Time
	}{
		{"a grant this process made: its validity plus a TTL", time.Time{}, now.Add(3 * time.Second)},
		{"an adopted grant: the previous renewer's copies, when later", now.Add(25 * time.Second), now.Add(25 * time.Second)},
		{"an adopted grant whose previous copies end sooner", now.Add(time.Second), now.Add(3 * time.Second)},
	} {
		s := Hold(t.Context(), Grant{Key: "k", TTL: 2 * time.Second, Every: time.Hour, ValidUntil: now.Add(time.Second), OthersCopiesUntil: tc.others},
			Config{Client: func() *redlock.Client { return nil }})
		if got := s.State().ExpiresBy; !got.Equal(tc.want) {
			t.Errorf("%s: ExpiresBy = %v, want %v", tc.name, got, tc.want)
		}
		s.Orphan()
	}
}
