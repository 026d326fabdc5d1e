package report

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// Results of one check.
const (
	CheckOK = "OK"
	// CheckFailed: what was checked is wrong.
	CheckFailed = "Failed"
	// CheckUnknown: it could not be read (access refused). When in doubt,
	// not OK: a run with an Unknown check is not OK either.
	CheckUnknown = "Unknown"
)

// Names of the checks of `check`, in the order they run.
const (
	CheckCRDs       = "crds"
	CheckLeader     = "leader"
	CheckWebhook    = "webhook"
	CheckMasterSets = "mastersets"
)

// CheckResult is the answer of one check.
type CheckResult struct {
	Name    string `json:"name"`
	Result  string `json:"result"`
	Message string `json:"message"`
}

// Checks is the output of `check`.
type Checks struct {
	metav1.TypeMeta `json:",inline"`
	// OK: every check passed.
	OK    bool          `json:"ok"`
	Items []CheckResult `json:"items"`
}

// NewChecks returns the output of results.
func NewChecks(results ...CheckResult) Checks {
	c := Checks{TypeMeta: typeMeta("CheckList"), OK: true, Items: results}
	for _, r := range results {
		if r.Result != CheckOK {
			c.OK = false
		}
	}
	return c
}

// DeepCopyObject copies c.
func (c *Checks) DeepCopyObject() runtime.Object { return deepCopy(c) }

// Resources are the resources of coordination.redlock.dev/v1alpha1 the
// operator serves.
var Resources = []string{"distributedlocks", "distributedsemaphores", "lockheartbeats", "redismastersets"}

// CRDsServed checks what discovery lists of coordination.redlock.dev/v1alpha1.
func CRDsServed(served []string) CheckResult {
	var missing []string
	for _, r := range Resources {
		if !slices.Contains(served, r) {
			missing = append(missing, r)
		}
	}
	if len(missing) > 0 {
		return CheckResult{CheckCRDs, CheckFailed, fmt.Sprintf("%s not served by the API server: install the operator's CRDs (docs/getting-started.md)",
			strings.Join(missing, ", "))}
	}
	return CheckResult{CheckCRDs, CheckOK, fmt.Sprintf("%s served as %s", strings.Join(Resources, ", "), v1alpha1.GroupVersion)}
}

// Leader checks the leader election Lease at now, the API server's time
// (nil: not found): a leader holds it and renewed it within its duration.
func Leader(ns string, lease *coordinationv1.Lease, now time.Time) CheckResult {
	name := ns + "/" + v1alpha1.LeaderLease
	if lease == nil {
		return CheckResult{CheckLeader, CheckFailed, fmt.Sprintf("no Lease %s: no operator has led in namespace %s (is it installed there, with --leader-elect?)", name, ns)}
	}
	s := lease.Spec
	if s.HolderIdentity == nil || *s.HolderIdentity == "" {
		return CheckResult{CheckLeader, CheckFailed, fmt.Sprintf("Lease %s has no holder: the last leader stopped and no replica leads", name)}
	}
	if s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return CheckResult{CheckLeader, CheckFailed, fmt.Sprintf("Lease %s held by %s shows no renewal", name, *s.HolderIdentity)}
	}
	ago := now.Sub(s.RenewTime.Time)
	if d := time.Duration(*s.LeaseDurationSeconds) * time.Second; ago > d {
		return CheckResult{CheckLeader, CheckFailed, fmt.Sprintf("Lease %s held by %s was last renewed %s ago, more than its %s: the leader stopped renewing (grants lapse once their ttl passes)",
			name, *s.HolderIdentity, ago.Round(time.Second), d)}
	}
	return CheckResult{CheckLeader, CheckOK, fmt.Sprintf("%s leads (Lease %s renewed %s ago)", *s.HolderIdentity, name, max(ago, 0).Round(time.Second))}
}

// Webhook checks the pod a dry run created in ns with the label
// redlock.dev/lock returned, and the warnings the API server sent with it.
func Webhook(ns string, gates []string, warnings []string) CheckResult {
	if slices.Contains(gates, v1alpha1.SchedulingGate) {
		return CheckResult{CheckWebhook, CheckOK, fmt.Sprintf("answers: a pod created in namespace %s with label %s gets the gate %s", ns, v1alpha1.LockLabel, v1alpha1.SchedulingGate)}
	}
	msg := fmt.Sprintf("a pod created in namespace %s with label %s gets no gate %s: the operator's mutating webhook is not configured there", ns, v1alpha1.LockLabel, v1alpha1.SchedulingGate)
	if len(warnings) > 0 {
		msg += " (" + strings.Join(warnings, "; ") + ")"
	}
	return CheckResult{CheckWebhook, CheckFailed, msg}
}

// MasterSets checks that every set in sets serves a quorum and is
// Available; where says where they were listed.
func MasterSets(where string, sets []v1alpha1.RedisMasterSet) CheckResult {
	if len(sets) == 0 {
		return CheckResult{CheckMasterSets, CheckOK, "no RedisMasterSet " + where}
	}
	var bad, good []string
	for i := range sets {
		s := &sets[i]
		ref := s.Namespace + "/" + s.Name
		st := s.Status
		switch avail := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionAvailable); {
		case st.Quorum == 0 || st.Serving < st.Quorum:
			bad = append(bad, fmt.Sprintf("%s serves %d of %d masters, below its quorum %d", ref, st.Serving, st.Total, st.Quorum))
		case avail == nil || avail.Status != "True":
			reason := "no Available condition yet"
			if avail != nil {
				reason = "Available " + string(avail.Status) + ", " + avail.Reason
			}
			bad = append(bad, fmt.Sprintf("%s: %s", ref, reason))
		default:
			good = append(good, fmt.Sprintf("%s %d/%d", ref, st.Serving, st.Total))
		}
	}
	if len(bad) > 0 {
		return CheckResult{CheckMasterSets, CheckFailed, strings.Join(bad, "; ")}
	}
	return CheckResult{CheckMasterSets, CheckOK, "serving a quorum: " + strings.Join(good, ", ")}
}

// CheckHeaders are the columns of `check`.
var CheckHeaders = []string{"CHECK", "RESULT", "MESSAGE"}

// WriteChecks prints the table of `check`.
func WriteChecks(w io.Writer, c *Checks) error {
	rows := make([][]string, 0, len(c.Items))
	for _, r := range c.Items {
		rows = append(rows, []string{r.Name, r.Result, r.Message})
	}
	return table(w, CheckHeaders, rows)
}
