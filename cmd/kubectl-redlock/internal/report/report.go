// Package report turns what the API server shows — DistributedLocks, pods
// and events — into the answers of the kubectl redlock commands, and prints
// them as a table or a description, or as JSON or YAML. It is pure: every
// function takes the objects and the time it reads them at, and does no I/O
// beyond writing to the io.Writer it is given.
//
// The JSON and YAML shapes are the exported types of this package with
// their json tags. Each top-level document is a runtime.Object with the
// apiVersion report.redlock.dev/v1alpha1 and a kind naming its type
// (LockList, KeyHolders, LockQueue, SemaphoreQueue, PodLockExplanation,
// PodToken), so that kubectl's printers (json, yaml, jsonpath,
// go-template) print it. Fields are only ever added to them.
package report

import (
	"fmt"
	"io"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// none is what a table shows for an absent value.
const none = "-"

// table writes rows under headers, aligned as kubectl aligns its tables.
func table(w io.Writer, headers []string, rows [][]string) error {
	tw := printers.GetNewTabWriter(w)
	fmt.Fprintln(tw, strings.Join(headers, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write the table: %w", err)
	}
	return nil
}

// Age is how long ago t was, as kubectl prints an AGE ("-" for the zero
// time).
func Age(t, now time.Time) string {
	if t.IsZero() {
		return none
	}
	return duration.HumanDuration(now.Sub(t))
}

// Key is the Redis key of lock: the one status shows in use, or the one
// the spec asks for (spec.key, or "redlock:<namespace>/<name>").
func Key(lock *v1alpha1.DistributedLock) string {
	if lock.Status.Key != "" {
		return lock.Status.Key
	}
	return lock.RedisKey()
}

// Holder is who holds a lock: a static identity, or a pod.
type Holder struct {
	// Identity is status.holder.identity: the static holder, or the pod's
	// name.
	Identity string `json:"identity"`
	// Pod is the holder pod's name, when a pod holds the lock.
	Pod string `json:"pod,omitempty"`
}

func holderOf(st v1alpha1.DistributedLockStatus) *Holder {
	if st.Holder == nil {
		return nil
	}
	h := &Holder{Identity: st.Holder.Identity}
	if st.Holder.Pod != nil {
		h.Pod = st.Holder.Pod.Name
	}
	return h
}

// String is the holder as the tables show it: "pod/NAME" for a pod, the
// identity for a static holder, "-" for nobody.
func (h *Holder) String() string {
	switch {
	case h == nil:
		return none
	case h.Pod != "":
		return "pod/" + h.Pod
	default:
		return h.Identity
	}
}

// Validity is what status says of the current grant's validity at now:
// the time it ends, whether it is still running, and how long it has left
// ("19s"), "expired" once it has passed, or "-" when nobody holds the
// lock. Status is the only source: a reader must take the lock as not
// held once status.validUntil has passed (see the API reference).
func Validity(st v1alpha1.DistributedLockStatus, now time.Time) (until *time.Time, valid bool, shown string) {
	if st.Holder == nil || st.ValidUntil == nil || st.ValidUntil.IsZero() {
		return nil, false, none
	}
	u := st.ValidUntil.UTC()
	left := u.Sub(now)
	if left <= 0 {
		return &u, false, "expired"
	}
	return &u, true, duration.HumanDuration(left)
}

func token(t int64) string {
	if t == 0 {
		return none
	}
	return fmt.Sprint(t)
}
