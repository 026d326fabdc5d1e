package plugin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/cmd/kubectl-redlock/internal/report"
)

// errChecksFailed is returned unless every check passed.
var errChecksFailed = errors.New("not every check passed")

func (c *cli) checkCommand() *cobra.Command {
	var (
		out        = plain("a table")
		operatorNS string
		wait       time.Duration
		all        bool
	)
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Whether the operator is installed and answering: its CRDs served, a leader, the webhook gating pods, the master sets serving a quorum",
		Long: `check asks the API server what a working install shows, and prints one line a check:

  crds        coordination.redlock.dev/v1alpha1 serves the operator's four resources;
  leader      a replica holds the leader Lease (redlock-operator.redlock.dev in
              --operator-namespace) and renewed it within its duration;
  webhook     a pod created (dry run: nothing is stored) in the namespace with the
              label redlock.dev/lock comes back with the gate redlock.dev/lock;
  mastersets  every RedisMasterSet of the namespace (-A: of all) serves a quorum and
              is Available.

It exits 1 unless every check passed: a check it may not read (access
refused) is Unknown, which is not a pass either. The leader's renewal is
compared with the API server's clock, not this machine's. With --wait it
checks again until every check passes or the time is up, as after an
install.

It needs get on the Lease, create on pods (a dry run) and list on
RedisMasterSets.`,
		Example: `  kubectl redlock check
  kubectl redlock check -n shop --wait 2m   # after an install
  kubectl redlock check --operator-namespace ops -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			cfg, err := c.flags.ToRESTConfig()
			if err != nil {
				return fmt.Errorf("read the kubeconfig: %w", err)
			}
			k, ns, err := c.client()
			if err != nil {
				return err
			}
			until := time.Now().Add(wait)
			for {
				checks := checkAll(ctx, cfg, k, ns, operatorNS, all)
				if checks.OK || !time.Now().Before(until) || ctx.Err() != nil {
					if err := out.print(c.streams.Out, &checks, func(bool) error { return report.WriteChecks(c.streams.Out, &checks) }); err != nil {
						return err
					}
					if !checks.OK {
						return errChecksFailed
					}
					return nil
				}
				select {
				case <-ctx.Done():
				case <-time.After(c.opts.PollInterval):
				}
			}
		},
	}
	out.add(cmd)
	cmd.Flags().StringVar(&operatorNS, "operator-namespace", "redlock-system", "The namespace the operator runs in (its --leader-election-namespace).")
	cmd.Flags().DurationVar(&wait, "wait", 0, "Check again until every check passes, for at most this long (0: once).")
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "Check the RedisMasterSets of every namespace.")
	_ = cmd.RegisterFlagCompletionFunc("operator-namespace", func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		return matching(c.read(cmd.Context(), namespaceNames), toComplete)
	})
	return cmd
}

// checkAll runs the checks once.
func checkAll(ctx context.Context, cfg *rest.Config, k client.Client, ns, operatorNS string, all bool) report.Checks {
	return report.NewChecks(
		checkCRDs(cfg),
		checkLeader(ctx, cfg, k, operatorNS),
		checkWebhook(ctx, cfg, k.Scheme(), ns),
		checkMasterSets(ctx, k, ns, all),
	)
}

func checkCRDs(cfg *rest.Config) report.CheckResult {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return unread(report.CheckCRDs, "connect to the API server", err)
	}
	var served []string
	switch list, err := dc.ServerResourcesForGroupVersion(v1alpha1.GroupVersion.String()); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return unread(report.CheckCRDs, "discover "+v1alpha1.GroupVersion.String(), err)
	default:
		for _, r := range list.APIResources {
			served = append(served, r.Name)
		}
	}
	return report.CRDsServed(served)
}

func checkLeader(ctx context.Context, cfg *rest.Config, k client.Client, ns string) report.CheckResult {
	lease := &coordinationv1.Lease{}
	switch err := k.Get(ctx, client.ObjectKey{Namespace: ns, Name: v1alpha1.LeaderLease}, lease); {
	case apierrors.IsNotFound(err):
		lease = nil
	case err != nil:
		return unread(report.CheckLeader, "get Lease "+ns+"/"+v1alpha1.LeaderLease, err)
	}
	now, err := serverTime(ctx, cfg)
	if err != nil {
		return unread(report.CheckLeader, "read the API server's time", err)
	}
	return report.Leader(ns, lease, now)
}

// serverTime is the API server's clock, from the Date of its answer to
// GET /version (to the second): the leader's renewal times are its own
// clock's, which the API server's is closer to than this machine's.
func serverTime(ctx context.Context, cfg *rest.Config) (time.Time, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return time.Time{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/version", nil)
	if err != nil {
		return time.Time{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return time.Time{}, err
	}
	_ = resp.Body.Close()
	return http.ParseTime(resp.Header.Get("Date"))
}

// checkWebhook creates, as a dry run, a pod that asks for a lock, and
// reads the gate and the warnings it comes back with.
func checkWebhook(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, ns string) report.CheckResult {
	w := &warnings{}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = w
	k, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return unread(report.CheckWebhook, "connect to the API server", err)
	}
	// A pod the restricted Pod Security level and a quota's limits admit.
	small := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "redlock-check-" + rand.String(5), Labels: map[string]string{v1alpha1.LockLabel: "redlock-check"}},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: new(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{Name: "check", Image: "redlock-check",
				Resources:       corev1.ResourceRequirements{Requests: small, Limits: small},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: new(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
		},
	}
	if err := k.Create(ctx, pod, client.DryRunAll); err != nil {
		if refused(err) {
			return unread(report.CheckWebhook, "create a pod (dry run) in namespace "+ns, err)
		}
		return report.CheckResult{Name: report.CheckWebhook, Result: report.CheckFailed,
			Message: fmt.Sprintf("a pod created (dry run) in namespace %s was refused: %v", ns, err)}
	}
	gates := make([]string, 0, len(pod.Spec.SchedulingGates))
	for _, g := range pod.Spec.SchedulingGates {
		gates = append(gates, g.Name)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return report.Webhook(ns, gates, w.list)
}

func checkMasterSets(ctx context.Context, k client.Client, ns string, all bool) report.CheckResult {
	where, opts := scope(ns, all)
	var sets v1alpha1.RedisMasterSetList
	if err := k.List(ctx, &sets, opts...); err != nil {
		return unread(report.CheckMasterSets, "list RedisMasterSets "+where, err)
	}
	return report.MasterSets(where, sets.Items)
}

// unread is the result of a check that could not read what it checks:
// Unknown when RBAC refused access, else Failed.
func unread(name, what string, err error) report.CheckResult {
	if refused(err) {
		return report.CheckResult{Name: name, Result: report.CheckUnknown, Message: fmt.Sprintf("%s: %v", what, err)}
	}
	return report.CheckResult{Name: name, Result: report.CheckFailed, Message: fmt.Sprintf("%s: %v", what, err)}
}

// refused reports whether err is the authorizer's refusal (403, "User …
// cannot VERB resource …"), not admission's (403 too: a webhook's or Pod
// Security's denial) nor bad credentials (401: a failure).
func refused(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), " cannot ")
}

// warnings collects the warnings the API server answers with.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(code int, _, text string) {
	if code != 299 || text == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}
