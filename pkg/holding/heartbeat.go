package holding

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// Beat renews the heartbeat of grantID on lock once: it sets the holder
// identity of the lock's heartbeat Lease (v1alpha1.HeartbeatLeaseName) to
// the grant ID and its renew time to now. The operator creates the Lease;
// the holder needs get and update on it. The operator does not read the
// time written: it counts a renewal when it sees the Lease change with the
// current grant ID, on its own clock.
func Beat(ctx context.Context, c client.Client, lock types.NamespacedName, grantID string, timeout time.Duration, now time.Time) error {
	l := &coordinationv1.Lease{}
	key := types.NamespacedName{Namespace: lock.Namespace, Name: v1alpha1.HeartbeatLeaseName(lock.Name)}
	if err := c.Get(ctx, key, l); err != nil {
		return fmt.Errorf("read heartbeat lease %s: %w", key, err)
	}
	seconds := int32(max((timeout+time.Second-1)/time.Second, 1)) //nolint:gosec // at most 24h
	l.Spec.HolderIdentity = &grantID
	l.Spec.LeaseDurationSeconds = &seconds
	l.Spec.RenewTime = &metav1.MicroTime{Time: now}
	if err := c.Update(ctx, l); err != nil {
		return fmt.Errorf("renew heartbeat lease %s: %w", key, err)
	}
	return nil
}

// Heartbeat renews g's heartbeat on lock (Beat) at once and then every
// third of g.HeartbeatTimeout, until ctx ends. A failed renewal is tried
// again after a second (never later than the next renewal), and reported
// to failed (may be nil). It does nothing when the lock has no heartbeat
// timeout. Run it only while the holder is alive and acting on g — for
// the agent in run mode, while the app runs — and end ctx when g ends.
func Heartbeat(ctx context.Context, c client.Client, lock types.NamespacedName, g *Grant, clk clock.Clock, failed func(error)) {
	if g == nil || g.HeartbeatTimeout <= 0 {
		return
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	every := g.HeartbeatTimeout / 3
	for {
		wait := every
		bctx, cancel := context.WithTimeout(ctx, every)
		err := Beat(bctx, c, lock, g.GrantID, g.HeartbeatTimeout, clk.Now())
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if failed != nil {
				failed(err)
			}
			wait = min(time.Second, every)
		}
		select {
		case <-ctx.Done():
			return
		case <-clk.After(wait):
		}
	}
}
