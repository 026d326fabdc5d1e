package plugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/pkg/holding"
)

// ErrRequestEnded is returned when the static holder's request ended (its
// lease expired, or it held past maxHoldDuration).
var ErrRequestEnded = errors.New("the static holder's request ended")

// errNothingToRenew marks what renewing again cannot change: the lock
// asks for no (or another) static holder, or sets no lease.
var errNothingToRenew = errors.New("nothing to renew")

// renewEvery renews every interval until ctx ends or renewing cannot go
// on (renewsAgain): a failed write, a conflict or an API server away for
// a while is reported and tried again at the next tick, so a renewer
// that exits means the lease is no longer being renewed.
func (c *cli) renewEvery(ctx context.Context, k client.Client, ns, name, as string, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	warned := false
	for {
		err := c.renew(ctx, k, ns, name, as, true)
		switch {
		case err != nil && !renewsAgain(err):
			return err
		case err != nil && ctx.Err() == nil:
			if _, werr := fmt.Fprintf(c.streams.ErrOut, "renewing failed, trying again in %s: %v\n", every, err); werr != nil {
				return werr
			}
		case err == nil && !warned:
			warned = true
			if lease := c.leaseOf(ctx, k, ns, name); lease > 0 && every > lease/3 {
				if _, werr := fmt.Fprintf(c.streams.ErrOut, "warning: --every %s is more than a third of the lock's holderLease %s: one slow or failed renewal may end the grant\n", every, lease); werr != nil {
					return werr
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// renewsAgain reports whether renewing after err may succeed: not once
// the request ended, the lock asks for nothing to renew, or is gone, or
// the caller may not read or renew it.
func renewsAgain(err error) bool {
	return !errors.Is(err, ErrRequestEnded) && !errors.Is(err, errNothingToRenew) &&
		!apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err) && !meta.IsNoMatchError(err) &&
		!errors.Is(err, errLockGone)
}

// errLockGone: the lock renewed was deleted.
var errLockGone = errors.New("the lock is gone")

// leaseOf reads lock ns/name's spec.holderLease (0 when it cannot).
func (c *cli) leaseOf(ctx context.Context, k client.Client, ns, name string) time.Duration {
	lock := &v1alpha1.DistributedLock{}
	if err := k.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, lock); err != nil || lock.Spec.HolderLease == nil {
		return 0
	}
	return lock.Spec.HolderLease.Duration
}

func (c *cli) renewCommand() *cobra.Command {
	var (
		as    string
		every time.Duration
	)
	cmd := &cobra.Command{
		Use:   "renew LOCK",
		Short: "Renew a static holder's lease on a lock (spec.holderLease)",
		Long: `renew renews the lease of LOCK's static holder (spec.holderIdentity): it writes
the grant ID status shows and the time into the lock's LockHeartbeat, which the
operator watches. A lock with spec.holderLease ends a static holder's grant
that is not renewed for that long, and serves its pods.

It renews only the grant status shows for the static holder the spec names
(--holder, when given, must be that name), and fails when the holder does not
hold the lock, or when its request ended (status.endedRequest: set another
holderIdentity to ask again). With --every it renews at that interval until
interrupted, waiting while the holder is not granted yet: a renewal that fails
(a conflict, the API server away for a while) is reported on stderr and tried
again at the next tick, and it exits with an error only once renewing cannot go
on: the request ended, the lock no longer asks for that holder or for a lease,
the lock is gone, or access is refused. Stop the work it guards when it exits.

It needs get on the DistributedLock and get and update on its LockHeartbeat
(docs/tasks/static-holders.md has a Role).`,
		Example: `  kubectl redlock renew release-freeze -n ci --holder ci-run-4711
  kubectl redlock renew release-freeze -n ci --every 20s`,
		Args:              one("LOCK (a DistributedLock's name)"),
		ValidArgsFunction: c.completion(lockNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, ns, lockName, err := c.target(args[0], lockTypes)
			if err != nil {
				return err
			}
			if every <= 0 {
				return c.renew(cmd.Context(), k, ns, lockName, as, false)
			}
			return c.renewEvery(cmd.Context(), k, ns, lockName, as, every)
		},
	}
	cmd.Flags().StringVar(&as, "holder", "", "The static holder renewing: fail unless the lock's spec.holderIdentity is this name. (kubectl's --as impersonates a user, as on every command.)")
	cmd.Flags().DurationVar(&every, "every", 0, "Renew at this interval until interrupted (0: once). Pick a third of spec.holderLease or less.")
	return cmd
}

// renew renews the lease of lock ns/name's static holder once. waiting:
// a holder not granted yet is reported, not an error.
func (c *cli) renew(ctx context.Context, k client.Client, ns, name, as string, waiting bool) error {
	out := c.streams.Out
	lock := &v1alpha1.DistributedLock{}
	if err := k.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, lock); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: get DistributedLock %s/%s: %w", errLockGone, ns, name, err)
		}
		return apiError("get DistributedLock "+ns+"/"+name, err)
	}
	ref := ns + "/" + name
	static := lock.Spec.HolderIdentity
	switch {
	case static == "":
		return fmt.Errorf("lock %s has no static holder (spec.holderIdentity): %w", ref, errNothingToRenew)
	case as != "" && as != static:
		return fmt.Errorf("lock %s is requested for %q, not %q: %w", ref, static, as, errNothingToRenew)
	case lock.Spec.HolderLease == nil:
		return fmt.Errorf("lock %s sets no spec.holderLease, so its static holder holds without renewing: %w", ref, errNothingToRenew)
	}
	if er := lock.Status.EndedRequest; er != nil && er.Identity == static {
		return fmt.Errorf("%w: %q on lock %s ended (%s)%s; set another spec.holderIdentity to ask again", ErrRequestEnded, static, ref, er.Reason, at(er.At))
	}
	st := lock.Status
	if st.Holder == nil || st.Holder.Pod != nil || st.Holder.Identity != static || st.GrantID == "" {
		if waiting {
			_, err := fmt.Fprintf(out, "%s waits for lock %s: nothing to renew yet.\n", static, ref)
			return err
		}
		return fmt.Errorf("%q does not hold lock %s (yet): nothing renewed", static, ref)
	}
	if err := holding.Beat(ctx, k, client.ObjectKey{Namespace: ns, Name: name}, st.GrantID, time.Now()); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("lock %s has no LockHeartbeat yet (the operator makes one for a lock with spec.holderLease, unless it runs with --agent-access=false; without one the lease runs out): nothing renewed", ref)
		}
		return apiError("renew the lease of "+ref, err)
	}
	_, err := fmt.Fprintf(out, "renewed %s's lease on lock %s (fencing token %d): it runs out %s from now unless renewed.\n",
		static, ref, st.FencingToken, lock.Spec.HolderLease.Duration)
	return err
}

func at(t *v1alpha1.PreciseTime) string {
	if t == nil {
		return ""
	}
	return " at " + t.UTC().Format(time.RFC3339)
}
