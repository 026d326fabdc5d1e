package distributedlock

import (
	"strings"
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

func TestEndVerdict(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name        string
		in          endInputs
		want        string
		wantRecheck time.Duration
		says        string
	}{
		{"nothing asked", endInputs{Now: t0.Add(time.Hour), AcquiredAt: t0}, "", 0, ""},
		{"held less than the bound", endInputs{Now: t0.Add(time.Minute), AcquiredAt: t0, MaxHold: time.Hour}, "", 59 * time.Minute, ""},
		{"held the bound", endInputs{Now: t0.Add(time.Hour), AcquiredAt: t0, MaxHold: time.Hour}, v1alpha1.ReasonMaxHoldExceeded, 0, ""},
		{"a lease renewed", endInputs{Now: t0.Add(50 * time.Second), AcquiredAt: t0, Lease: time.Minute, Since: t0, LastBeat: t0.Add(40 * time.Second)}, "", time.Minute - 10*time.Second, ""},
		{"a lease never renewed, counted from the first look", endInputs{Now: t0.Add(2 * time.Minute), AcquiredAt: t0, Lease: time.Minute, Since: t0.Add(90 * time.Second)}, "", 30 * time.Second, ""},
		{"a lease run out", endInputs{Now: t0.Add(2 * time.Minute), AcquiredAt: t0, Lease: time.Minute, Since: t0, LastBeat: t0.Add(time.Minute)}, v1alpha1.ReasonLeaseExpired, 0, "no heartbeat seen for 1m0s (holderLease 1m0s)"},
		{"no LockHeartbeat to renew: counted as no renewal", endInputs{Now: t0.Add(time.Minute), AcquiredAt: t0, Lease: time.Minute, Since: t0, NoHeartbeat: true}, v1alpha1.ReasonLeaseExpired, 0, "no LockHeartbeat to renew it with"},
		{"no LockHeartbeat yet, within the lease", endInputs{Now: t0.Add(20 * time.Second), AcquiredAt: t0, Lease: time.Minute, Since: t0, NoHeartbeat: true}, "", 40 * time.Second, ""},
		{"both: the earlier deadline", endInputs{Now: t0.Add(10 * time.Second), AcquiredAt: t0, MaxHold: 20 * time.Second, Lease: time.Minute, Since: t0}, "", 10 * time.Second, ""},
	} {
		reason, why, recheck := endVerdict(tc.in)
		if reason != tc.want || recheck != tc.wantRecheck || (reason != "") != (why != "") || !strings.Contains(why, tc.says) {
			t.Errorf("%s: endVerdict = %q (%q), recheck %v; want %q, %v", tc.name, reason, why, recheck, tc.want, tc.wantRecheck)
		}
	}
}
