package report

import (
	"cmp"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// Lock is one DistributedLock as `status` and `who` show it.
type Lock struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Key is the Redis key (status.key, or the key the spec asks for).
	Key string `json:"key"`
	// Holder is status.holder; null when nobody holds the lock.
	Holder *Holder `json:"holder"`
	// Held: a holder is shown and its validity has not passed.
	Held bool `json:"held"`
	// HeldCondition is the status and reason of the Held condition
	// ("True/Acquired", "False/QuorumUnavailable"), empty when absent.
	HeldCondition string `json:"heldCondition,omitempty"`
	// ValidUntil is status.validUntil while a holder is shown.
	ValidUntil *time.Time `json:"validUntil"`
	// ValidFor is the table's VALID-FOR: the time left, "expired" or "-".
	ValidFor string `json:"validFor"`
	// FencingToken is the token of the current (or latest) grant.
	FencingToken int64 `json:"fencingToken"`
	// GrantID is the current (or latest) grant's ID.
	GrantID string `json:"grantID,omitempty"`
	// Waiting is how many pods wait (status.queue.count).
	Waiting int32 `json:"waiting"`
}

// LockList is the output of `status`: the locks, and the semaphores as a
// kind of their own (their slots' locks are among the locks too).
type LockList struct {
	metav1.TypeMeta `json:",inline"`
	Items           []Lock      `json:"items"`
	Semaphores      []Semaphore `json:"semaphores"`
	// StatusWriter is what the leading manager's status writer published;
	// null when there is none, or it could not be read.
	StatusWriter *Writer `json:"statusWriter"`
}

// Semaphore is one DistributedSemaphore as `status` shows it.
type Semaphore struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Key       string `json:"key"`
	// Slots is spec.slots; Held status.held; Waiting status.queue.count.
	Slots   int32 `json:"slots"`
	Held    int32 `json:"held"`
	Waiting int32 `json:"waiting"`
	// ReadyCondition is the Ready condition's status and reason.
	ReadyCondition string `json:"readyCondition,omitempty"`
}

// Semaphores describes sems, sorted by namespace and name.
func Semaphores(sems []v1alpha1.DistributedSemaphore) []Semaphore {
	out := []Semaphore{}
	for i := range sems {
		sem := &sems[i]
		s := Semaphore{Namespace: sem.Namespace, Name: sem.Name, Key: sem.RedisKey(), Slots: sem.Spec.Slots, Held: sem.Status.Held,
			ReadyCondition: conditionShort(meta.FindStatusCondition(sem.Status.Conditions, v1alpha1.ConditionReady))}
		if q := sem.Status.Queue; q != nil {
			s.Waiting = q.Count
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Semaphore) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out
}

// KeyHolders is the output of `who KEY`: every lock in the cluster on the
// key, and the holders of the slots of every semaphore on it.
type KeyHolders struct {
	metav1.TypeMeta `json:",inline"`
	Key             string `json:"key"`
	Items           []Lock `json:"items"`
	Slots           []Slot `json:"slots"`
}

// Slot is one held slot of a semaphore, as `who` shows it.
type Slot struct {
	Namespace string `json:"namespace"`
	Semaphore string `json:"semaphore"`
	Slot      int32  `json:"slot"`
	// Lock is the slot's DistributedLock, whose status is the contract.
	Lock         string `json:"lock"`
	Holder       Holder `json:"holder"`
	FencingToken int64  `json:"fencingToken"`
}

// SlotsOn lists the held slots of the semaphores among sems whose Redis
// key is key, sorted by namespace, semaphore and slot.
func SlotsOn(key string, sems []v1alpha1.DistributedSemaphore) []Slot {
	out := []Slot{}
	for i := range sems {
		sem := &sems[i]
		if sem.RedisKey() != key {
			continue
		}
		for _, h := range sem.Status.Holders {
			holder := Holder{Identity: h.Holder.Identity}
			if h.Holder.Pod != nil {
				holder.Pod = h.Holder.Pod.Name
			}
			out = append(out, Slot{Namespace: sem.Namespace, Semaphore: sem.Name, Slot: h.Slot, Lock: h.Lock, Holder: holder, FencingToken: h.FencingToken})
		}
	}
	slices.SortFunc(out, func(a, b Slot) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Semaphore, b.Semaphore), cmp.Compare(a.Slot, b.Slot))
	})
	return out
}

// LockOf describes lock at now.
func LockOf(lock *v1alpha1.DistributedLock, now time.Time) Lock {
	st := lock.Status
	until, valid, shown := Validity(st, now)
	l := Lock{
		Namespace: lock.Namespace, Name: lock.Name, Key: Key(lock),
		Holder: holderOf(st), Held: valid, ValidUntil: until, ValidFor: shown,
		FencingToken: st.FencingToken, GrantID: st.GrantID,
		HeldCondition: conditionShort(meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHeld)),
	}
	if st.Queue != nil {
		l.Waiting = st.Queue.Count
	}
	return l
}

func conditionShort(c *metav1.Condition) string {
	if c == nil {
		return ""
	}
	return string(c.Status) + "/" + c.Reason
}

// Locks describes locks at now, sorted by namespace and name.
func Locks(locks []v1alpha1.DistributedLock, now time.Time) LockList {
	out := LockList{TypeMeta: typeMeta("LockList"), Items: []Lock{}, Semaphores: []Semaphore{}}
	for i := range locks {
		out.Items = append(out.Items, LockOf(&locks[i], now))
	}
	sortLocks(out.Items)
	return out
}

// Who describes the locks among locks whose Redis key is key, at now.
func Who(key string, locks []v1alpha1.DistributedLock, now time.Time) KeyHolders {
	out := KeyHolders{TypeMeta: typeMeta("KeyHolders"), Key: key, Items: []Lock{}, Slots: []Slot{}}
	for i := range locks {
		if Key(&locks[i]) == key {
			out.Items = append(out.Items, LockOf(&locks[i], now))
		}
	}
	sortLocks(out.Items)
	return out
}

func sortLocks(ls []Lock) {
	slices.SortFunc(ls, func(a, b Lock) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
}

// StatusHeaders are the columns of `status`.
var StatusHeaders = []string{"NAMESPACE", "NAME", "KEY", "HOLDER", "VALID-FOR", "TOKEN", "WAITING"}

// SemaphoreHeaders are the columns of `status`'s semaphores.
var SemaphoreHeaders = []string{"NAMESPACE", "SEMAPHORE", "KEY", "HELD", "WAITING", "READY"}

// StatusWideHeaders are the columns `status -o wide` adds to the locks'.
var StatusWideHeaders = []string{"HELD", "GRANT", "VALID-UNTIL"}

// WriteStatus prints the tables of `status`: the locks, then the
// semaphores (when there are any of each); wide adds StatusWideHeaders.
func WriteStatus(w io.Writer, l *LockList, wide bool) error {
	headers := StatusHeaders
	if wide {
		headers = slices.Concat(StatusHeaders, StatusWideHeaders)
	}
	locks := make([][]string, 0, len(l.Items))
	for _, x := range l.Items {
		row := []string{x.Namespace, x.Name, x.Key, x.Holder.String(), x.ValidFor, token(x.FencingToken), itoa(x.Waiting)}
		if wide {
			row = append(row, x.wide()...)
		}
		locks = append(locks, row)
	}
	sems := make([][]string, 0, len(l.Semaphores))
	for _, x := range l.Semaphores {
		sems = append(sems, []string{x.Namespace, x.Name, x.Key, itoa(x.Held) + "/" + itoa(x.Slots), itoa(x.Waiting), orNone(x.ReadyCondition)})
	}
	var writer [][]string
	if l.StatusWriter != nil {
		writer = append(writer, l.StatusWriter.row())
	}
	return tables(w, section{headers, locks}, section{SemaphoreHeaders, sems}, section{WriterHeaders, writer})
}

// wide is what -o wide adds to a lock's row: the Held condition, the
// grant's ID and the end of the validity shown.
func (l *Lock) wide() []string {
	until := none
	if l.ValidUntil != nil {
		until = l.ValidUntil.UTC().Format(time.RFC3339)
	}
	return []string{orNone(l.HeldCondition), orNone(l.GrantID), until}
}

// WhoHeaders are the columns of `who`.
var WhoHeaders = []string{"NAMESPACE", "NAME", "HOLDER", "VALID-FOR", "TOKEN", "HELD", "WAITING"}

// SlotHeaders are the columns of `who`'s semaphore slots.
var SlotHeaders = []string{"NAMESPACE", "SEMAPHORE", "SLOT", "LOCK", "HOLDER", "TOKEN"}

// WhoWideHeaders are the columns `who -o wide` adds to the locks'.
var WhoWideHeaders = []string{"GRANT", "VALID-UNTIL"}

// WriteWho prints the tables of `who`: the locks on the key, then the
// held slots of the semaphores on it (when there are any of each); wide
// adds WhoWideHeaders.
func WriteWho(w io.Writer, k *KeyHolders, wide bool) error {
	headers := WhoHeaders
	if wide {
		headers = slices.Concat(WhoHeaders, WhoWideHeaders)
	}
	locks := make([][]string, 0, len(k.Items))
	for _, x := range k.Items {
		row := []string{x.Namespace, x.Name, x.Holder.String(), x.ValidFor, token(x.FencingToken), orNone(x.HeldCondition), itoa(x.Waiting)}
		if wide {
			row = append(row, x.wide()[1:]...)
		}
		locks = append(locks, row)
	}
	slots := make([][]string, 0, len(k.Slots))
	for _, x := range k.Slots {
		slots = append(slots, []string{x.Namespace, x.Semaphore, itoa(x.Slot), x.Lock, x.Holder.String(), token(x.FencingToken)})
	}
	return tables(w, section{headers, locks}, section{SlotHeaders, slots})
}

// section is one table of a command's output.
type section struct {
	headers []string
	rows    [][]string
}

// tables prints the sections that have rows, a blank line between two.
func tables(w io.Writer, sections ...section) error {
	first := true
	for _, sec := range sections {
		if len(sec.rows) == 0 {
			continue
		}
		if !first {
			if _, err := io.WriteString(w, "\n"); err != nil {
				return err
			}
		}
		first = false
		if err := table(w, sec.headers, sec.rows); err != nil {
			return err
		}
	}
	return nil
}

// orNone is s, or "-" when it is empty.
func orNone(s string) string {
	if s == "" {
		return none
	}
	return s
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }
