package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/cmd/kubectl-redlock/internal/report"
)

func (c *cli) statusCommand() *cobra.Command {
	var (
		out        = listing()
		all        bool
		operatorNS string
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Every DistributedLock (its key, holder, validity left, fencing token and waiting pods), then every DistributedSemaphore (slots held of N, waiting pods), then the leading manager's status writer",
		Long: `status lists the locks and the semaphores of the namespace (-A: of all), then
what the leading manager's status writer published in ConfigMap
redlock-operator-status of --operator-namespace: the writes a second the API
server takes by its measure (capacity), those its kept grants need (demand)
and its budget; how many grants it keeps refreshed, is shedding and keeps
waiting for room, and has shed since it leads. The writer publishes at most
every 10 s and at least every minute; a report older than 130 s, or by a
manager that does not hold the leader Lease, is shown not current. Without
get on that ConfigMap the line is left out.`,
		Example: `  kubectl redlock status -n shop
  kubectl redlock status -A -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			k, ns, err := c.client()
			if err != nil {
				return err
			}
			where, opts := scope(ns, all)
			var list v1alpha1.DistributedLockList
			if err := k.List(cmd.Context(), &list, opts...); err != nil {
				return apiError("list DistributedLocks "+where, err)
			}
			locks := report.Locks(list.Items, time.Now())
			sems, err := listSemaphores(cmd.Context(), k, where, opts...)
			if err != nil {
				return err
			}
			locks.Semaphores = report.Semaphores(sems)
			locks.StatusWriter = c.statusWriter(cmd.Context(), k, operatorNS)
			return out.print(c.streams.Out, &locks, func(wide bool) error {
				if len(locks.Items) == 0 && len(locks.Semaphores) == 0 {
					if _, err := fmt.Fprintf(c.streams.ErrOut, "No DistributedLocks found %s.\n", where); err != nil || locks.StatusWriter == nil {
						return err
					}
				}
				return report.WriteStatus(c.streams.Out, &locks, wide)
			})
		},
	}
	out.add(cmd)
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "List the locks of every namespace.")
	cmd.Flags().StringVar(&operatorNS, "operator-namespace", "redlock-system", "The namespace the operator runs in (its --leader-election-namespace), where its status writer publishes.")
	return cmd
}

// statusWriter reads what the leading manager's status writer published
// in ns: nil when there is nothing, or it may not be read (a warning says
// why when that is not a refusal).
func (c *cli) statusWriter(ctx context.Context, k client.Client, ns string) *report.Writer {
	cm := &corev1.ConfigMap{}
	err := k.Get(ctx, client.ObjectKey{Namespace: ns, Name: v1alpha1.StatusConfigMap}, cm)
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return nil
	}
	var r v1alpha1.StatusWriterReport
	if err == nil {
		err = json.Unmarshal([]byte(cm.Data[v1alpha1.StatusWriterKey]), &r)
	}
	var now time.Time
	if err == nil {
		now, err = c.serverTime(ctx)
	}
	if err != nil {
		_, _ = fmt.Fprintf(c.streams.ErrOut, "Warning: the status writer's report in ConfigMap %s/%s was not read: %v\n", ns, v1alpha1.StatusConfigMap, err)
		return nil
	}
	// Who leads, where the Lease may be read: a report by another
	// manager is a former leader's.
	var leader string
	lease := &coordinationv1.Lease{}
	if k.Get(ctx, client.ObjectKey{Namespace: ns, Name: v1alpha1.LeaderLease}, lease) == nil && lease.Spec.HolderIdentity != nil {
		leader = *lease.Spec.HolderIdentity
	}
	return report.WriterOf(r, now, leader)
}

func (c *cli) whoCommand() *cobra.Command {
	out := listing()
	cmd := &cobra.Command{
		Use:   "who KEY",
		Short: "Every DistributedLock in the cluster (all namespaces) on a Redis key, with its holder, and the held slots of semaphores on it",
		Long: `who lists every DistributedLock of the cluster, in every namespace, whose Redis key
is KEY (status.key, or spec.key, or redlock:<namespace>/<name> by default), with
its holder, then the held slots of every DistributedSemaphore whose key is KEY.
Locks with one key exclude each other through Redlock, also in other clusters
whose operators share the masters: those this command cannot see.`,
		Example: `  kubectl redlock who redlock:shop/migrations
  kubectl redlock who payments-ledger -o yaml`,
		Args:              one("KEY"),
		ValidArgsFunction: c.completion(keyNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, _, err := c.client()
			if err != nil {
				return err
			}
			var list v1alpha1.DistributedLockList
			if err := k.List(cmd.Context(), &list); err != nil {
				return apiError("list DistributedLocks in every namespace", err)
			}
			who := report.Who(args[0], list.Items, time.Now())
			sems, err := listSemaphores(cmd.Context(), k, "in every namespace")
			if err != nil {
				return err
			}
			who.Slots = report.SlotsOn(args[0], sems)
			return out.print(c.streams.Out, &who, func(wide bool) error {
				if len(who.Items) == 0 && len(who.Slots) == 0 {
					_, err := fmt.Fprintf(c.streams.ErrOut, "No DistributedLock nor held semaphore slot in this cluster uses key %q.\n", args[0])
					return err
				}
				return report.WriteWho(c.streams.Out, &who, wide)
			})
		},
	}
	out.add(cmd)
	return cmd
}

func (c *cli) queueCommand() *cobra.Command {
	out := listing()
	cmd := &cobra.Command{
		Use:   "queue LOCK|dsem/SEMAPHORE",
		Short: "The pods waiting for a lock, or for a semaphore's slot, in order, with their phase, gate and age",
		Example: `  kubectl redlock queue migrations -n shop
  kubectl redlock queue migrations -n shop -o json
  kubectl redlock queue dsem/report-slots -n shop`,
		Args:              one("LOCK (a DistributedLock's name) or dsem/SEMAPHORE"),
		ValidArgsFunction: c.completion(queueNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if t, _, ok := strings.Cut(args[0], "/"); ok && slices.Contains(semTypes, strings.ToLower(t)) {
				return c.semaphoreQueue(ctx, args[0], out)
			}
			k, ns, lockName, err := c.target(args[0], lockTypes)
			if err != nil {
				return err
			}
			lock, err := getLock(ctx, k, ns, lockName)
			if err != nil {
				return err
			}
			pods, err := queuedPods(ctx, k, lock.Namespace, v1alpha1.LockLabel, lock.Name, lock.Status.Queue)
			if err != nil {
				return err
			}
			return c.printQueue(out, report.QueueOf(lock, pods, time.Now()))
		},
	}
	out.add(cmd)
	return cmd
}

// semaphoreQueue prints the pods waiting for a slot of the semaphore arg
// names (TYPE/NAME).
func (c *cli) semaphoreQueue(ctx context.Context, arg string, out *output) error {
	k, ns, semName, err := c.target(arg, semTypes)
	if err != nil {
		return err
	}
	sem, err := findSemaphore(ctx, k, ns, semName)
	switch {
	case err != nil:
		return err
	case sem == nil:
		return fmt.Errorf("DistributedSemaphore %q %w in namespace %s (list them with `kubectl get dsem -n %s`)", semName, errNotFound, ns, ns)
	}
	pods, err := queuedPods(ctx, k, ns, v1alpha1.SemaphoreLabel, semName, sem.Status.Queue)
	if err != nil {
		return err
	}
	return c.printQueue(out, report.SemaphoreQueueOf(sem, pods, time.Now()))
}

// printQueue prints the output of queue.
func (c *cli) printQueue(out *output, q report.Queue) error {
	return out.print(c.streams.Out, &q, func(wide bool) error { return report.WriteQueue(c.streams.Out, c.streams.ErrOut, &q, wide) })
}

func (c *cli) whyCommand() *cobra.Command {
	var (
		out       = plain("a description")
		maxEvents int
	)
	cmd := &cobra.Command{
		Use:   "why POD",
		Short: "Why a pod is (still) gated: its lock, its place in line, the holder and what it waits for, recent events",
		Example: `  kubectl redlock why migrate-b81d4 -n shop
  kubectl redlock why migrate-b81d4 -n shop -o json`,
		Args:              one("POD (a pod's name)"),
		ValidArgsFunction: c.completion(podNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			if maxEvents < 1 {
				return fmt.Errorf("--events must be at least 1, not %d", maxEvents)
			}
			k, ns, podName, err := c.target(args[0], podTypes)
			if err != nil {
				return err
			}
			in, err := whyInput(cmd.Context(), k, ns, podName)
			if err != nil {
				return err
			}
			in.MaxEvents = maxEvents
			w, err := report.Explain(in)
			if err != nil {
				return err
			}
			return out.print(c.streams.Out, &w, func(bool) error { return report.WriteWhy(c.streams.Out, &w) })
		},
	}
	out.add(cmd)
	cmd.Flags().IntVar(&maxEvents, "events", 10, "How many of the most recent events of the pod and its lock to show.")
	return cmd
}

func (c *cli) tokenCommand() *cobra.Command {
	out := plain("a description")
	cmd := &cobra.Command{
		Use:   "token POD",
		Short: "The fencing token of a pod's grant, or that it holds nothing",
		Example: `  kubectl redlock token migrate-7f9c2 -n shop
  kubectl redlock token migrate-7f9c2 -n shop -o json | jq .fencingToken`,
		Args:              one("POD (a pod's name)"),
		ValidArgsFunction: c.completion(podNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, ns, podName, err := c.target(args[0], podTypes)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			pod, err := getPod(ctx, k, ns, podName)
			if err != nil {
				return err
			}
			var lock *v1alpha1.DistributedLock
			if name := report.LockNameOf(pod); name != "" {
				if lock, err = findLock(ctx, k, ns, name); err != nil {
					return err
				}
			}
			t := report.TokenOf(pod, lock, time.Now())
			return out.print(c.streams.Out, &t, func(bool) error { return report.WriteToken(c.streams.Out, &t) })
		},
	}
	out.add(cmd)
	return cmd
}

// scope is where a command with -A lists: namespace ns, or every one with
// all; where says it for the messages.
func scope(ns string, all bool) (where string, opts []client.ListOption) {
	if all {
		return "in any namespace", nil
	}
	return "in namespace " + ns, []client.ListOption{client.InNamespace(ns)}
}

// getLock reads a lock named on the command line.
func getLock(ctx context.Context, k client.Client, ns, name string) (*v1alpha1.DistributedLock, error) {
	lock, err := findLock(ctx, k, ns, name)
	if err == nil && lock == nil {
		err = fmt.Errorf("DistributedLock %q %w in namespace %s (list them with `kubectl redlock status -n %s`)", name, errNotFound, ns, ns)
	}
	return lock, err
}

// findLock reads a lock, nil when it does not exist.
func findLock(ctx context.Context, k client.Client, ns, name string) (*v1alpha1.DistributedLock, error) {
	lock := &v1alpha1.DistributedLock{}
	switch err := k.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, lock); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, apiError(fmt.Sprintf("get DistributedLock %s/%s", ns, name), err)
	}
	return lock, nil
}

// findSemaphore reads a DistributedSemaphore; nil when it does not exist.
func findSemaphore(ctx context.Context, k client.Client, ns, name string) (*v1alpha1.DistributedSemaphore, error) {
	sem := &v1alpha1.DistributedSemaphore{}
	switch err := k.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, sem); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, apiError(fmt.Sprintf("get DistributedSemaphore %s/%s", ns, name), err)
	}
	return sem, nil
}

// listSemaphores lists the DistributedSemaphores opts select (where says
// which, for the error); none where the kind does not exist (an operator
// older than semaphores).
func listSemaphores(ctx context.Context, k client.Client, where string, opts ...client.ListOption) ([]v1alpha1.DistributedSemaphore, error) {
	var sems v1alpha1.DistributedSemaphoreList
	switch err := k.List(ctx, &sems, opts...); {
	case meta.IsNoMatchError(err):
		return nil, nil
	case err != nil:
		return nil, apiError("list DistributedSemaphores "+where, err)
	}
	return sems.Items, nil
}

// getPod reads a pod named on the command line.
func getPod(ctx context.Context, k client.Client, ns, name string) (*corev1.Pod, error) {
	pod, err := findPod(ctx, k, ns, name, "")
	if err == nil && pod == nil {
		err = fmt.Errorf("pod %q %w in namespace %s", name, errNotFound, ns)
	}
	return pod, err
}

// findPod reads a pod, nil when it does not exist or, with uid set, when
// the pod of that name is another one.
func findPod(ctx context.Context, k client.Client, ns, name string, uid types.UID) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	switch err := k.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, pod); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("get pod %s/%s: %w", ns, name, err)
	}
	if uid != "" && pod.UID != uid {
		return nil, nil
	}
	return pod, nil
}

// queuedPods reads the pods status queue q lists, in namespace ns, by
// name: the pods labelled label=name, and any it lists that no longer
// carry the label (relabelled since status was written).
func queuedPods(ctx context.Context, k client.Client, ns, label, name string, q *v1alpha1.LockQueue) (map[string]*corev1.Pod, error) {
	out := map[string]*corev1.Pod{}
	if q == nil || len(q.Waiting) == 0 {
		return out, nil
	}
	var list corev1.PodList
	if err := k.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{label: name}); err != nil {
		return nil, fmt.Errorf("list the pods labelled %s=%s in namespace %s: %w", label, name, ns, err)
	}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	for _, ref := range q.Waiting {
		if out[ref.Name] != nil {
			continue
		}
		p, err := findPod(ctx, k, ns, ref.Name, "")
		if err != nil {
			return nil, err
		}
		if p != nil {
			out[ref.Name] = p
		}
	}
	return out, nil
}

// whyInput reads what `why` explains: the pod, its lock, the holder and the
// last holder pods, and the events of the pod and the lock.
func whyInput(ctx context.Context, k client.Client, ns, name string) (report.WhyInput, error) {
	in := report.WhyInput{Now: time.Now()}
	pod, err := getPod(ctx, k, ns, name)
	if err != nil {
		return in, err
	}
	in.Pod = pod
	if in.Events, err = eventsOf(ctx, k, ns, pod.UID); err != nil {
		return in, err
	}
	lockName := pod.Labels[v1alpha1.LockLabel]
	if semName := pod.Labels[v1alpha1.SemaphoreLabel]; lockName == "" && semName != "" {
		if in.Semaphore, err = findSemaphore(ctx, k, ns, semName); err != nil || in.Semaphore == nil {
			return in, err // a missing one: Explain says so
		}
		semEvents, err := eventsOf(ctx, k, ns, in.Semaphore.UID)
		in.Events = append(in.Events, semEvents...)
		return in, err
	}
	if lockName == "" {
		return in, nil // Explain says so
	}
	if in.Lock, err = findLock(ctx, k, ns, lockName); err != nil || in.Lock == nil {
		return in, err
	}
	st := in.Lock.Status
	if st.Holder != nil && st.Holder.Pod != nil {
		if in.HolderPod, err = findPod(ctx, k, ns, st.Holder.Pod.Name, st.Holder.Pod.UID); err != nil {
			return in, err
		}
	}
	if st.LastHolderPod != nil {
		if in.LastHolderPod, err = findPod(ctx, k, ns, st.LastHolderPod.Name, st.LastHolderPod.UID); err != nil {
			return in, err
		}
	}
	lockEvents, err := eventsOf(ctx, k, ns, in.Lock.UID)
	if err != nil {
		return in, err
	}
	in.Events = append(in.Events, lockEvents...)
	return in, nil
}

// eventsOf lists the events about the object uid in namespace ns (core
// events and events.k8s.io events alike: they are one resource).
func eventsOf(ctx context.Context, k client.Client, ns string, uid types.UID) ([]corev1.Event, error) {
	var list corev1.EventList
	if err := k.List(ctx, &list, client.InNamespace(ns),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.uid", string(uid))}); err != nil {
		return nil, fmt.Errorf("list the events of %s in namespace %s: %w", uid, ns, err)
	}
	return list.Items, nil
}

// serverTime is the API server's clock (serverTime in check.go).
func (c *cli) serverTime(ctx context.Context) (time.Time, error) {
	cfg, err := c.flags.ToRESTConfig()
	if err != nil {
		return time.Time{}, fmt.Errorf("read the kubeconfig: %w", err)
	}
	now, err := serverTime(ctx, cfg)
	if err != nil {
		return time.Time{}, fmt.Errorf("read the API server's time: %w", err)
	}
	return now, nil
}
