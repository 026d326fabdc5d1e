package plugin

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/pkg/holding"
)

func (c *cli) releaseCommand() *cobra.Command {
	var as string
	cmd := &cobra.Command{
		Use:   "release LOCK",
		Short: "Release a static holder's grant on a lock: its word, then its request withdrawn",
		Long: `release is the static holder's own release of LOCK (spec.holderIdentity).

--holder names the holder releasing, and must be the name spec.holderIdentity and
status show: a release is the holder's own, never someone else's. On a lock
with spec.holderLease, when status shows the holder's grant, it first writes
the holder's word for that grant into the lock's LockHeartbeat (releasedGrant):
the operator releases the keys at once, ends the request and serves the next
holder. Then it clears spec.holderIdentity if it still names the holder. Run it
only once the work the lock guards has stopped.

On a leased lock the word is what makes a release: a change of
spec.holderIdentity without it (kubectl redlock handover, an edit) is taken as
someone else's, and the operator keeps the keys until the validity status
showed has passed. On a lock without a lease, clearing spec.holderIdentity is
the release, and no word is written.

It needs get and patch on the DistributedLock and get and update on its
LockHeartbeat (docs/tasks/static-holders.md has a Role).`,
		Example:           `  kubectl redlock release release-freeze -n ci --holder ci-run-4711`,
		Args:              one("LOCK (a DistributedLock's name)"),
		ValidArgsFunction: c.completion(lockNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, ns, lockName, err := c.target(args[0], lockTypes)
			if err != nil {
				return err
			}
			return c.release(cmd.Context(), k, ns, lockName, as)
		},
	}
	cmd.Flags().StringVar(&as, "holder", "", "The static holder releasing (required): fail unless the lock's spec.holderIdentity is this name. (kubectl's --as impersonates a user, as on every command.)")
	_ = cmd.MarkFlagRequired("holder")
	return cmd
}

// release writes the static holder's word for the grant status shows, then
// withdraws its request.
func (c *cli) release(ctx context.Context, k client.Client, ns, name, as string) error {
	lock, err := getLock(ctx, k, ns, name)
	if err != nil {
		return err
	}
	ref := ns + "/" + name
	static := lock.Spec.HolderIdentity
	switch {
	case static == "":
		return fmt.Errorf("lock %s has no static holder (spec.holderIdentity): nothing to release", ref)
	case as != static:
		return fmt.Errorf("lock %s is requested for %q, not %q: nothing released", ref, static, as)
	}
	st := lock.Status
	said := false
	if lock.Spec.HolderLease != nil && st.Holder != nil && st.Holder.Pod == nil && st.Holder.Identity == static && st.GrantID != "" {
		if err := holding.SayReleased(ctx, k, client.ObjectKey{Namespace: ns, Name: name}, st.GrantID); err != nil {
			return apiError("write the release of "+ref, err)
		}
		said = true
	}
	if err := withdraw(ctx, k, lock, static); err != nil {
		return apiError("withdraw the request of "+ref, err)
	}
	what := "withdrew its request"
	if said {
		what = fmt.Sprintf("released grant %d and withdrew its request", st.FencingToken)
	}
	_, err = fmt.Fprintf(c.streams.Out, "%s on lock %s: %s.\n", static, ref, what)
	return err
}

// errRequestMoved: the request names another holder than the one withdrawn.
var errRequestMoved = errors.New("the request names another holder now")

// withdraw clears spec.holderIdentity if it still names static, on the
// version read (a conflict is tried again on the newer one).
func withdraw(ctx context.Context, k client.Client, lock *v1alpha1.DistributedLock, static string) error {
	key := client.ObjectKeyFromObject(lock)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &v1alpha1.DistributedLock{}
		if err := k.Get(ctx, key, cur); err != nil {
			return err
		}
		if cur.Spec.HolderIdentity != static {
			return errRequestMoved
		}
		next := cur.DeepCopy()
		next.Spec.HolderIdentity = ""
		return k.Patch(ctx, next, client.MergeFromWithOptions(cur, client.MergeFromWithOptimisticLock{}))
	})
	if errors.Is(err, errRequestMoved) {
		return nil // someone else's request now: not ours to clear
	}
	return err
}
