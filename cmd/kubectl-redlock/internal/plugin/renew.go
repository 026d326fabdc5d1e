package plugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/pkg/holding"
)

// ErrRequestEnded is returned when the static holder's request ended (its
// lease expired, or it held past maxHoldDuration).
var ErrRequestEnded = errors.New("the static holder's request ended")

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
(--as, when given, must be that name), and fails when the holder does not
hold the lock, or when its request ended (status.endedRequest: set another
holderIdentity to ask again). With --every it renews at that interval until
interrupted, waiting while the holder is not granted yet.

It needs get on the DistributedLock and get and update on its LockHeartbeat
(docs/tasks/static-holders.md has a Role).`,
		Example: `  kubectl redlock renew release-freeze -n ci --as ci-run-4711
  kubectl redlock renew release-freeze -n ci --every 20s`,
		Args: one("LOCK (a DistributedLock's name)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, ns, lockName, err := c.target(args[0], lockTypes)
			if err != nil {
				return err
			}
			if every <= 0 {
				return c.renew(cmd.Context(), k, ns, lockName, as, false)
			}
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				if err := c.renew(cmd.Context(), k, ns, lockName, as, true); err != nil {
					return err
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-t.C:
				}
			}
		},
	}
	cmd.Flags().StringVar(&as, "as", "", "The static holder renewing: fail unless the lock's spec.holderIdentity is this name.")
	cmd.Flags().DurationVar(&every, "every", 0, "Renew at this interval until interrupted (0: once). Pick a third of spec.holderLease or less.")
	return cmd
}

// renew renews the lease of lock ns/name's static holder once. waiting:
// a holder not granted yet is reported, not an error.
func (c *cli) renew(ctx context.Context, k client.Client, ns, name, as string, waiting bool) error {
	out := c.streams.Out
	lock := &v1alpha1.DistributedLock{}
	if err := k.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, lock); err != nil {
		return apiError("get DistributedLock "+ns+"/"+name, err)
	}
	ref := ns + "/" + name
	static := lock.Spec.HolderIdentity
	switch {
	case static == "":
		return fmt.Errorf("lock %s has no static holder (spec.holderIdentity): nothing to renew", ref)
	case as != "" && as != static:
		return fmt.Errorf("lock %s is requested for %q, not %q: nothing renewed", ref, static, as)
	case lock.Spec.HolderLease == nil:
		return fmt.Errorf("lock %s sets no spec.holderLease: its static holder holds without renewing", ref)
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
			return fmt.Errorf("lock %s has no LockHeartbeat yet (the operator makes it for a lock with spec.holderLease): nothing renewed", ref)
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
