package holding

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// Beat renews the heartbeat of grantID on lock once: it sets the holder
// identity of the lock's LockHeartbeat (same name and namespace) to the
// grant ID and its renew time to now. The operator creates the
// LockHeartbeat; the holder needs get and update on it. The operator does
// not read the time written: it counts a renewal when it sees the object
// change with the current grant ID, on its own clock.
func Beat(ctx context.Context, c client.Client, lock types.NamespacedName, grantID string, now time.Time) error {
	hb := &v1alpha1.LockHeartbeat{}
	if err := c.Get(ctx, lock, hb); err != nil {
		return fmt.Errorf("read heartbeat %s: %w", lock, err)
	}
	hb.Spec.HolderIdentity = grantID
	hb.Spec.RenewTime = &metav1.MicroTime{Time: now}
	if err := c.Update(ctx, hb); err != nil {
		return fmt.Errorf("renew heartbeat %s: %w", lock, err)
	}
	return nil
}

// Heartbeat renews the heartbeat of grant on lock (Beat) every third of
// the lock's heartbeat timeout, as timeout reports it at each turn (the
// lock's spec may set, change or unset it while the grant lasts: while it
// is unset nothing is written, and it is looked at again every second),
// until ctx ends. A failed renewal is tried again after a second (never
// later than the next renewal), and reported to failed (may be nil). Run
// it only while the holder is alive and acting on the grant — for the
// agent in run mode, while the app runs — and end ctx when it ends.
func Heartbeat(ctx context.Context, c client.Client, lock types.NamespacedName, grant string, timeout func() time.Duration, clk clock.Clock, failed func(error)) {
	if clk == nil {
		clk = clock.RealClock{}
	}
	for {
		wait := time.Second
		if t := timeout(); t > 0 {
			every := t / 3
			bctx, cancel := context.WithTimeout(ctx, every)
			err := Beat(bctx, c, lock, grant, clk.Now())
			cancel()
			switch {
			case err == nil:
				wait = every
			case ctx.Err() != nil:
				return
			default:
				if failed != nil {
					failed(err)
				}
				wait = min(time.Second, every)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-clk.After(wait):
		}
	}
}

// HeartbeatTimeout returns, for Heartbeat, the heartbeat timeout of grant
// as the watcher last observed it (0 once the grant is no longer shown).
func (w *Watcher) HeartbeatTimeout(grant string) func() time.Duration {
	return func() time.Duration {
		if g := w.Current(); g != nil && g.GrantID == grant {
			return g.HeartbeatTimeout
		}
		return 0
	}
}
