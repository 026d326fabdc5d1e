package plugin

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/cmd/kubectl-redlock/internal/report"
)

// Shell completion: cobra's __complete answers the shells' completion
// scripts (kubectl-redlock completion bash|zsh|fish|powershell) and
// kubectl's, which runs kubectl_complete-redlock from PATH (a two-line
// script in the release archives that calls kubectl redlock __complete).
// The names come from the cluster the flags name; a failed read completes
// nothing.

// completion is a ValidArgsFunction that completes the first argument
// with names, and nothing after it.
func (c *cli) completion(names func(ctx context.Context, k client.Client, ns string) []string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return matching(c.read(cmd.Context(), names), toComplete)
	}
}

// read is what names reads from the cluster the flags name, in the
// namespace they choose; nothing when it cannot connect.
func (c *cli) read(ctx context.Context, names func(ctx context.Context, k client.Client, ns string) []string) []string {
	k, ns, err := c.client()
	if err != nil {
		return nil
	}
	return names(ctx, k, ns)
}

// matching are the names that start with prefix, sorted, once each.
func matching(names []string, prefix string) ([]string, cobra.ShellCompDirective) {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), cobra.ShellCompDirectiveNoFileComp
}

// lockNames are the DistributedLocks of ns.
func lockNames(ctx context.Context, k client.Client, ns string) []string {
	var list v1alpha1.DistributedLockList
	if k.List(ctx, &list, client.InNamespace(ns)) != nil {
		return nil
	}
	out := make([]string, 0, len(list.Items))
	for _, l := range list.Items {
		out = append(out, l.Name)
	}
	return out
}

// queueNames are the locks of ns and its semaphores, as dsem/NAME.
func queueNames(ctx context.Context, k client.Client, ns string) []string {
	out := lockNames(ctx, k, ns)
	sems, _ := listSemaphores(ctx, k, "", client.InNamespace(ns))
	for _, s := range sems {
		out = append(out, semTypes[2]+"/"+s.Name)
	}
	return out
}

// podNames are the pods of ns that ask for a lock or a semaphore's slot.
func podNames(ctx context.Context, k client.Client, ns string) []string {
	var out []string
	for _, label := range []string{v1alpha1.LockLabel, v1alpha1.SemaphoreLabel} {
		var list corev1.PodList
		if k.List(ctx, &list, client.InNamespace(ns), client.HasLabels{label}) != nil {
			return nil
		}
		for _, p := range list.Items {
			out = append(out, p.Name)
		}
	}
	return out
}

// keyNames are the Redis keys of the locks and semaphores of every
// namespace.
func keyNames(ctx context.Context, k client.Client, _ string) []string {
	var list v1alpha1.DistributedLockList
	if k.List(ctx, &list) != nil {
		return nil
	}
	out := make([]string, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, report.Key(&list.Items[i]))
	}
	sems, _ := listSemaphores(ctx, k, "")
	for i := range sems {
		out = append(out, sems[i].RedisKey())
	}
	return out
}

// namespaceNames are the namespaces.
func namespaceNames(ctx context.Context, k client.Client, _ string) []string {
	var list corev1.NamespaceList
	if k.List(ctx, &list) != nil {
		return nil
	}
	out := make([]string, 0, len(list.Items))
	for _, n := range list.Items {
		out = append(out, n.Name)
	}
	return out
}

// completeFlags completes kubectl's -n, --context, --cluster and --user.
func (c *cli) completeFlags(root *cobra.Command) {
	_ = root.RegisterFlagCompletionFunc("namespace", func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		return matching(c.read(cmd.Context(), namespaceNames), toComplete)
	})
	fromConfig := func(names func(raw clientcmdapi.Config) []string) cobra.CompletionFunc {
		return func(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			raw, err := c.flags.ToRawKubeConfigLoader().RawConfig()
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return matching(names(raw), toComplete)
		}
	}
	_ = root.RegisterFlagCompletionFunc("context", fromConfig(func(raw clientcmdapi.Config) []string { return slices.Collect(maps.Keys(raw.Contexts)) }))
	_ = root.RegisterFlagCompletionFunc("cluster", fromConfig(func(raw clientcmdapi.Config) []string { return slices.Collect(maps.Keys(raw.Clusters)) }))
	_ = root.RegisterFlagCompletionFunc("user", fromConfig(func(raw clientcmdapi.Config) []string { return slices.Collect(maps.Keys(raw.AuthInfos)) }))
}
