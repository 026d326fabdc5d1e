package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/benchenv"
	"github.com/redlock-operator/redlock-operator/pkg/lockclient"
)

// The client rows: pkg/lockclient on a DistributedLock, next to client-go's
// leaderelection on a coordination.k8s.io Lease, in the same run. Acquire
// is a call on a free lock until it returns granted (then released, not
// measured); a handover is from the holder's Release (or its elector's
// context ending, with ReleaseOnCancel) to the waiter's grant (or
// OnStartedLeading). Every round starts from a free lock.

// clientResult is one peer's measurements.
type clientResult struct {
	acquire, handover []time.Duration
	errs              []error
}

// lockClientRun measures pkg/lockclient on a lock with a holderLease.
func lockClientRun(ctx context.Context, k8s client.WithWatch, rounds int) clientResult {
	var r clientResult
	lock := &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "client"},
		Spec: v1alpha1.DistributedLockSpec{
			MasterSet: benchenv.MasterSet, TTL: metav1.Duration{Duration: *ttl}, HolderLease: &metav1.Duration{Duration: 3 * time.Second},
		},
	}
	if err := k8s.Create(ctx, lock); err != nil {
		r.errs = append(r.errs, fmt.Errorf("create lock: %w", err))
		return r
	}
	key := client.ObjectKeyFromObject(lock)
	a, b := lockclient.New(k8s, lockclient.WithIdentity("a")), lockclient.New(k8s, lockclient.WithIdentity("b"))
	acquire := func(c *lockclient.Client) (*lockclient.Grant, error) {
		actx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		return c.Acquire(actx, key)
	}
	for range rounds {
		begin := time.Now()
		g, err := acquire(a)
		if err != nil {
			r.errs = append(r.errs, fmt.Errorf("acquire: %w", err))
			continue
		}
		r.acquire = append(r.acquire, time.Since(begin))

		next := make(chan error, 1)
		var granted time.Time
		var ng *lockclient.Grant
		go func() {
			var err error
			ng, err = acquire(b)
			granted = time.Now()
			next <- err
		}()
		time.Sleep(settle)
		released := time.Now()
		if err := g.Release(ctx); err != nil {
			r.errs = append(r.errs, fmt.Errorf("release: %w", err))
		}
		if err := <-next; err != nil {
			r.errs = append(r.errs, fmt.Errorf("acquire after a release: %w", err))
			continue
		}
		r.handover = append(r.handover, granted.Sub(released))
		if err := ng.Release(ctx); err != nil {
			r.errs = append(r.errs, fmt.Errorf("release: %w", err))
		}
		waitFree(ctx, k8s, key)
	}
	return r
}

// settle is how long a waiter is given to start waiting (its watch, or
// its elector's first try) before the holder lets go: the same for both
// peers. Nothing outside the waiter shows that it waits; a waiter slower
// to start only makes its handover look longer.
const settle = 500 * time.Millisecond

// waitFree waits until status shows no holder.
func waitFree(ctx context.Context, k8s client.Client, key types.NamespacedName) {
	for ctx.Err() == nil {
		l := &v1alpha1.DistributedLock{}
		if err := k8s.Get(ctx, key, l); err == nil && l.Status.Holder == nil && l.Spec.HolderIdentity == "" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// electionTimings are a leaderelection configuration.
type electionTimings struct {
	name                                 string
	leaseDuration, renewDeadline, period time.Duration
}

// leaderElectionRun measures client-go's leaderelection on a Lease.
func leaderElectionRun(ctx context.Context, cfg *rest.Config, rounds int, t electionTimings) clientResult {
	var r clientResult
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		r.errs = append(r.errs, err)
		return r
	}
	lease := "election-" + t.name
	elect := func(id string, lead chan<- time.Time) (context.CancelFunc, <-chan struct{}, error) {
		lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, lease, nil, cs.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
		if err != nil {
			return nil, nil, err
		}
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: t.leaseDuration, RenewDeadline: t.renewDeadline, RetryPeriod: t.period, ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { lead <- time.Now() },
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			return nil, nil, err
		}
		ectx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			le.Run(ectx)
		}()
		return cancel, done, nil
	}
	for i := range rounds {
		leadA, leadB := make(chan time.Time, 1), make(chan time.Time, 1)
		begin := time.Now()
		stopA, doneA, err := elect(fmt.Sprintf("a-%d", i), leadA)
		if err != nil {
			r.errs = append(r.errs, err)
			continue
		}
		at, err := within(ctx, leadA, time.Minute)
		if err != nil {
			stopA()
			r.errs = append(r.errs, fmt.Errorf("lead: %w", err))
			continue
		}
		r.acquire = append(r.acquire, at.Sub(begin))
		stopB, doneB, err := elect(fmt.Sprintf("b-%d", i), leadB)
		if err != nil {
			stopA()
			r.errs = append(r.errs, err)
			continue
		}
		time.Sleep(settle)
		released := time.Now()
		stopA()
		<-doneA
		if bt, err := within(ctx, leadB, time.Minute); err != nil {
			r.errs = append(r.errs, fmt.Errorf("lead after a release: %w", err))
		} else {
			r.handover = append(r.handover, bt.Sub(released))
		}
		stopB()
		<-doneB
	}
	return r
}

func within(ctx context.Context, ch <-chan time.Time, d time.Duration) (time.Time, error) {
	select {
	case t := <-ch:
		return t, nil
	case <-time.After(d):
		return time.Time{}, errors.New("not within " + d.String())
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}
