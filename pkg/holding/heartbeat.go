package holding

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
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

// SayStopped writes the agent's word that nothing acts on grantID any
// more: the lock's LockHeartbeat's stoppedGrant (its other fields are kept;
// a conflicting write is tried again on the newer version). Say it only
// once status no longer shows the grant (Watcher.Hidden) and everything
// that could act on it has stopped and cannot start again under it: for a
// pod that is being deleted, the operator then releases the grant and
// grants the next pod at once.
func SayStopped(ctx context.Context, c client.Client, lock types.NamespacedName, grantID string) error {
	return say(ctx, c, lock, "stopped", func(s *v1alpha1.LockHeartbeatSpec) *string { return &s.StoppedGrant }, grantID)
}

// SayReleased writes a leased static holder's release of grantID: the
// lock's LockHeartbeat's releasedGrant, on which the operator releases
// the keys at once and ends the request. Say it only once nothing acts on
// the grant any more. The admission policy lets only those who may patch
// the lock write it.
func SayReleased(ctx context.Context, c client.Client, lock types.NamespacedName, grantID string) error {
	return say(ctx, c, lock, "released", func(s *v1alpha1.LockHeartbeatSpec) *string { return &s.ReleasedGrant }, grantID)
}

// say sets the field of lock's LockHeartbeat that field returns to
// grantID, keeping the others, on the version read.
func say(ctx context.Context, c client.Client, lock types.NamespacedName, what string, field func(*v1alpha1.LockHeartbeatSpec) *string, grantID string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		hb := &v1alpha1.LockHeartbeat{}
		if err := c.Get(ctx, lock, hb); err != nil {
			return err
		}
		f := field(&hb.Spec)
		if *f == grantID {
			return nil
		}
		*f = grantID
		return c.Update(ctx, hb)
	})
	if err != nil {
		return fmt.Errorf("say grant %s %s on heartbeat %s: %w", grantID, what, lock, err)
	}
	return nil
}

// Heartbeat renews the heartbeat of grant on lock (Beat) every third of
// the lock's heartbeat timeout, as timeout reports it (the lock's spec
// may set, change or unset it while the grant lasts: it is looked at
// every second, a renewal is made at once when it changes, and nothing is
// written while it is unset), until ctx ends. A failed renewal is tried
// again after a second and reported to failed (may be nil). Run it only
// while the holder is alive and acting on the grant — for the agent in
// run mode, while the app runs — and end ctx when it ends.
func Heartbeat(ctx context.Context, c client.Client, lock types.NamespacedName, grant string, timeout func() time.Duration, clk clock.Clock, failed func(error)) {
	if clk == nil {
		clk = clock.RealClock{}
	}
	var last time.Time           // the latest renewal that succeeded
	var renewedFor time.Duration // the timeout it was made under
	for {
		t := timeout()
		wait := time.Second
		if now := clk.Now(); t > 0 && (last.IsZero() || t != renewedFor || now.Sub(last) >= t/3) {
			bctx, cancel := context.WithTimeout(ctx, max(t/3, time.Second))
			err := Beat(bctx, c, lock, grant, now)
			cancel()
			switch {
			case err == nil:
				last, renewedFor = now, t
				wait = min(wait, t/3)
			case ctx.Err() != nil:
				return
			case failed != nil:
				failed(err) // and again in a second
			}
		} else if t > 0 {
			wait = min(wait, max(last.Add(t/3).Sub(now), time.Millisecond))
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
