package plugin

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/cmd/kubectl-redlock/internal/handover"
)

// ErrNotConfirmed is returned when handover may not ask for confirmation.
var ErrNotConfirmed = errors.New("not confirmed")

func (c *cli) handoverCommand() *cobra.Command {
	var (
		yes     bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "handover LOCK",
		Short: "Hand a lock on now: clear a static holder, or evict the holder pod and wait for the next grant",
		Long: `handover hands LOCK on to the next holder.

For a static holder (spec.holderIdentity set) it clears spec.holderIdentity, so
that the pods waiting for the lock are served. For a pod holder it evicts the
pod through the Eviction API, so PodDisruptionBudgets apply (a budget that
forbids the eviction is reported, and nothing else is done). Then it waits, up
to --timeout, until the lock's status shows the next grant, and prints it.

It never writes status and never touches Redis: the operator releases the grant
once the holder has stopped and grants the next pod, as it always does. It asks
for confirmation unless --yes is given, and refuses to run without --yes when
stdin is not a terminal.`,
		Example: `  kubectl redlock handover migrations -n shop
  kubectl redlock handover nightly-report -n shop --yes --timeout 5m`,
		Args:              one("LOCK (a DistributedLock's name)"),
		ValidArgsFunction: c.completion(lockNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, ns, lockName, err := c.target(args[0], lockTypes)
			if err != nil {
				return err
			}
			return c.handover(cmd.Context(), k, ns, lockName, yes, timeout)
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "Do not ask for confirmation.")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "How long to wait for the next grant; 0 does not wait.")
	return cmd
}

func (c *cli) handover(ctx context.Context, k client.Client, ns, name string, yes bool, timeout time.Duration) error {
	out := c.streams.Out
	lock, err := getLock(ctx, k, ns, name)
	if err != nil {
		return err
	}
	plan, err := handover.PlanFor(lock)
	if err != nil {
		return err
	}
	ref := ns + "/" + name
	if !yes {
		fresh, ok, err := c.confirmed(ctx, k, lock, plan)
		if err != nil || !ok {
			return err
		}
		lock = fresh
	}
	switch plan.Action {
	case handover.ClearStatic:
		if err := clearStatic(ctx, k, lock); err != nil {
			return err
		}
		fmt.Fprintf(out, "lock %s: spec.holderIdentity %q cleared.\n", ref, plan.Holder)
	case handover.EvictPod:
		gone, err := evict(ctx, k, ns, plan.Pod)
		if err != nil {
			return err
		}
		if gone {
			fmt.Fprintf(out, "holder pod %s/%s is gone already: the operator hands the lock on once it sees that.\n", ns, plan.Pod.Name)
		} else {
			fmt.Fprintf(out, "pod/%s evicted (the Eviction API accepted it).\n", plan.Pod.Name)
		}
	}
	if timeout <= 0 {
		return nil
	}
	fmt.Fprintf(out, "Waiting up to %s for the next grant of lock %s...\n", timeout, ref)
	var (
		last    v1alpha1.DistributedLockStatus
		outcome handover.Outcome
		readErr error // of the last read, when it failed
	)
	err = wait.PollUntilContextTimeout(ctx, c.opts.PollInterval, timeout, true, func(ctx context.Context) (bool, error) {
		l, err := findLock(ctx, k, ns, name)
		switch {
		case err != nil:
			readErr = err // the API server may be busy: read again
			return false, nil
		case l == nil:
			return false, fmt.Errorf("lock %s was deleted", ref)
		}
		last, readErr = l.Status, nil
		outcome = handover.Progress(plan, last, time.Now())
		return outcome != handover.Pending, nil
	})
	if err != nil {
		if wait.Interrupted(err) && ctx.Err() == nil {
			msg := fmt.Sprintf("no next grant of lock %s within %s: status shows it %s (the holder may still be stopping: see `kubectl redlock why` for a waiting pod)",
				ref, timeout, handover.Describe(last, time.Now()))
			if readErr != nil {
				msg += fmt.Sprintf("; the last read failed: %v", readErr)
			}
			return errors.New(msg)
		}
		return fmt.Errorf("wait for the next grant of lock %s: %w", ref, err)
	}
	switch outcome {
	case handover.NextGrant:
		_, err = fmt.Fprintf(out, "lock %s handed over: %s.\n", ref, handover.Describe(last, time.Now()))
	default:
		_, err = fmt.Fprintf(out, "lock %s released: no pod waits for it.\n", ref)
	}
	return err
}

// confirmed asks whether to hand over lock's grant as plan says and, once
// the user said yes, reads the lock again: the lock to act on, whether to
// go ahead, and an error when the lock moved on while the question was
// open (nothing is done then).
func (c *cli) confirmed(ctx context.Context, k client.Client, lock *v1alpha1.DistributedLock, plan handover.Plan) (*v1alpha1.DistributedLock, bool, error) {
	ref := lock.Namespace + "/" + lock.Name
	ok, err := c.confirm(handover.Question(lock, plan))
	if err != nil {
		return nil, false, fmt.Errorf("refusing to hand over lock %s held by %s: %w", ref, plan.Holder, err)
	}
	if !ok {
		_, err := fmt.Fprintf(c.streams.Out, "Handover cancelled: lock %s stays with %s.\n", ref, plan.Holder)
		return nil, false, err
	}
	fresh, err := getLock(ctx, k, lock.Namespace, lock.Name)
	if err != nil {
		return nil, false, err
	}
	now, err := handover.PlanFor(fresh)
	if err != nil {
		return nil, false, fmt.Errorf("lock %s changed while you were asked; nothing done: %w", ref, err)
	}
	if !handover.Same(plan, now) {
		return nil, false, fmt.Errorf("lock %s changed while you were asked (now held by %s, token %d); nothing done: run the handover again", ref, now.Holder, now.Token)
	}
	return fresh, true, nil
}

// confirm asks question on the terminal and reads the answer.
func (c *cli) confirm(question string) (bool, error) {
	if !c.opts.IsTerminal(c.streams.In) {
		return false, fmt.Errorf("stdin is not a terminal to confirm on; pass --yes: %w", ErrNotConfirmed)
	}
	if _, err := fmt.Fprint(c.streams.Out, question); err != nil {
		return false, fmt.Errorf("ask for confirmation: %w", err)
	}
	answer, err := bufio.NewReader(c.streams.In).ReadString('\n')
	if err != nil && answer == "" {
		return false, fmt.Errorf("read the answer: %w", err)
	}
	return handover.Confirmed(answer), nil
}

// clearStatic clears spec.holderIdentity, on the version of the lock that
// was read: a holder set again since is not cleared unseen.
func clearStatic(ctx context.Context, k client.Client, lock *v1alpha1.DistributedLock) error {
	patch := client.MergeFromWithOptions(lock.DeepCopy(), client.MergeFromWithOptimisticLock{})
	lock.Spec.HolderIdentity = ""
	if err := k.Patch(ctx, lock, patch); err != nil {
		if apierrors.IsConflict(err) {
			return fmt.Errorf("lock %s/%s changed since it was read; run the handover again: %w", lock.Namespace, lock.Name, err)
		}
		return fmt.Errorf("clear spec.holderIdentity of lock %s/%s: %w", lock.Namespace, lock.Name, err)
	}
	return nil
}

// evict evicts the holder pod through the Eviction API, on the condition
// that it is still the pod status shows (its UID). gone: it no longer
// exists.
func evict(ctx context.Context, k client.Client, ns string, ref *v1alpha1.PodReference) (gone bool, err error) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ref.Name}}
	uid := ref.UID
	ev := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Namespace: ns, Name: ref.Name},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
	}
	err = k.SubResource("eviction").Create(ctx, pod, ev)
	switch {
	case err == nil:
		return false, nil
	case apierrors.IsNotFound(err):
		return true, nil
	default:
		return false, handover.EvictionError(ns, ref.Name, err)
	}
}
