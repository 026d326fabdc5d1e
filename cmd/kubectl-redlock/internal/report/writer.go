package report

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// Writer is what the leading manager's status writer published
// (v1alpha1.StatusWriterReport), as `status` shows it.
type Writer struct {
	v1alpha1.StatusWriterReport
	// Age is how long ago it was published, by the API server's clock.
	Age string `json:"age"`
	// Leader is the holder of the leader Lease, when it could be read.
	Leader string `json:"leader,omitempty"`
	// Current: published within v1alpha1.StatusWriterReportMaxAge, by the
	// manager that leads (when the Lease could be read). Otherwise it is
	// from a manager that stopped publishing: no leader, one that cannot
	// write the ConfigMap, or a former leader.
	Current bool `json:"current"`
	// OverloadedFor is how long the overload has lasted, when it has.
	OverloadedFor string `json:"overloadedFor,omitempty"`
}

// WriterOf describes r at now, the API server's time, when leader holds
// the leader Lease ("": not known).
func WriterOf(r v1alpha1.StatusWriterReport, now time.Time, leader string) *Writer {
	age := max(now.Sub(r.Published.Time), 0)
	w := &Writer{StatusWriterReport: r, Age: age.Round(time.Second).String(), Leader: leader,
		Current: age <= v1alpha1.StatusWriterReportMaxAge && (leader == "" || leads(r.Manager, leader))}
	if r.Overloaded && r.OverloadedSince != nil {
		w.OverloadedFor = max(now.Sub(r.OverloadedSince.Time), 0).Round(time.Second).String()
	}
	return w
}

// WriterHeaders are the columns of `status`'s status writer line.
var WriterHeaders = []string{"STATUS-WRITER", "STATE", "CAPACITY/S", "TARGET/S", "DEMAND/S", "BUDGET/S", "KEPT", "SHEDDING", "WAITING", "SHED"}

// row is the writer's line under WriterHeaders.
func (x *Writer) row() []string {
	state := "keeping up"
	switch {
	case !x.Current && x.Leader != "" && !leads(x.Manager, x.Leader):
		state = "not current (" + x.Leader + " leads)"
	case !x.Current:
		state = "not current (published " + x.Age + " ago)"
	case x.OverloadedFor != "":
		state = "overloaded for " + x.OverloadedFor
	case x.Overloaded:
		state = "overloaded"
	}
	capacity := perSecond(x.CapacityPerSecond)
	if !x.Measured {
		capacity += " (budget)"
	}
	return []string{x.Manager, state, capacity, perSecond(x.TargetPerSecond), perSecond(x.DemandPerSecond), perSecond(x.BudgetPerSecond),
		strconv.Itoa(x.Kept), strconv.Itoa(x.Shedding), strconv.Itoa(x.Waiting), strconv.FormatInt(x.Shed, 10)}
}

// leads reports whether the manager named manager holds the leader Lease
// held as leader: controller-runtime names a holder host_UUID.
func leads(manager, leader string) bool {
	return manager != "" && (leader == manager || strings.HasPrefix(leader, manager+"_"))
}

func perSecond(v float64) string { return fmt.Sprintf("%.1f", v) }
