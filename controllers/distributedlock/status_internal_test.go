package distributedlock

import (
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// TestKeepLaterValidity: a status write sent again after a conflict keeps a
// later validity another writer showed meanwhile, and only for the same
// grant held (issue 18, case 3).
func TestKeepLaterValidity(t *testing.T) {
	base := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	shown := func(grantID string, valid time.Duration) v1alpha1.DistributedLockStatus {
		var st v1alpha1.DistributedLockStatus
		showGrant(&st, grantView{holder: "h", grantID: grantID, token: 3, acquiredAt: base, renewedAt: base.Add(valid - 10*time.Second), validUntil: base.Add(valid)}, 1)
		return st
	}
	released := shown("g1", 20*time.Second)
	clearGrant(&released, 1, base, v1alpha1.ReasonReleased, "released")
	for _, tc := range []struct {
		name        string
		mine, fresh v1alpha1.DistributedLockStatus
		want        time.Duration // validity kept, from base; 0: none
	}{
		{"a later validity shown meanwhile is kept", shown("g1", 10*time.Second), shown("g1", 12*time.Second), 12 * time.Second},
		{"an earlier validity shown meanwhile is not", shown("g1", 12*time.Second), shown("g1", 10*time.Second), 12 * time.Second},
		{"another grant's validity is not", shown("g1", 10*time.Second), shown("g2", 12*time.Second), 10 * time.Second},
		{"a release is not undone", released, shown("g1", 12*time.Second), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := *tc.mine.DeepCopy()
			keepLaterValidity(&st, tc.fresh)
			switch {
			case tc.want == 0 && st.ValidUntil != nil:
				t.Errorf("validity %v written into a released status", st.ValidUntil)
			case tc.want != 0 && (st.ValidUntil == nil || !st.ValidUntil.Equal(base.Add(tc.want))):
				t.Errorf("validity %v, want %v", st.ValidUntil, base.Add(tc.want))
			case tc.want != 0 && !st.RenewedAt.Equal(base.Add(tc.want-10*time.Second)):
				t.Errorf("renewedAt %v does not go with the validity kept", st.RenewedAt)
			}
		})
	}
}

func TestAnExpiredGrantEndsAtItsValidity(t *testing.T) {
	now := time.Unix(10_000, 0)
	for _, tc := range []struct {
		reason string
		until  time.Time
		want   time.Time
	}{
		{v1alpha1.ReasonValidityExpired, now.Add(5 * time.Millisecond), now.Add(5 * time.Millisecond)}, // the reconcile began just before the end
		{v1alpha1.ReasonValidityExpired, now.Add(-time.Second), now},
		{v1alpha1.ReasonReleased, now.Add(time.Second), now}, // given back while valid: it ends now
		{v1alpha1.ReasonLost, now.Add(time.Second), now},
	} {
		st := v1alpha1.DistributedLockStatus{Holder: &v1alpha1.LockHolder{Identity: "h"}, ValidUntil: v1alpha1.NewPreciseTime(tc.until)}
		clearGrant(&st, 1, now, tc.reason, "x")
		if st.ReleasedAt == nil || !st.ReleasedAt.Equal(tc.want) {
			t.Errorf("%s with validity until now%+v: releasedAt %v, want now%+v", tc.reason, tc.until.Sub(now), st.ReleasedAt, tc.want.Sub(now))
		}
	}
}
