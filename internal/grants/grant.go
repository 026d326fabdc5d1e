package grants

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/conditions"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Grant is a grant this manager renews: what status shows of it, and the
// session that keeps it alive.
type Grant struct {
	UID       types.UID
	Name      types.NamespacedName
	Ref       Ref // the grant in Redis
	MasterSet string
	ID        string
	Holder    string
	Pod       *v1alpha1.PodReference // the holder pod, when a pod holds it
	// Leased: a static holder's grant made or adopted while the lock set
	// spec.holderLease: it ends by the holder's word, not by a change of
	// its request, even if the lease is unset since.
	Leased     bool
	Token      int64
	AcquiredAt time.Time
	Quorum     int
	Session    *renewal.Session
	// OthersCopiesUntil: for an adopted grant, when the copies whoever
	// renewed it before wrote have expired (OthersCopiesUntil); zero
	// otherwise.
	OthersCopiesUntil time.Time
	// Liveness is what this manager saw of the holder pod (Liveness.go);
	// only the lock's reconciles touch it.
	Liveness Liveness

	// dropped: no longer held (Set.Drop).
	dropped atomic.Bool

	// The one record of the validity status shows of this grant. mu
	// guards it; shown changes only under the writer's lock too, which
	// orders its refreshes by shown.
	mu sync.Mutex
	// shown is the validity status shows, as this manager last knew it
	// (it moves back only when status did).
	shown time.Time
	// floor is the latest validity status ever showed: renewals keep the
	// keys at least until then (Floor).
	floor time.Time
	// committed is the latest validity this manager's own writes
	// committed, to the microsecond (OwnValidity).
	committed time.Time
}

// Committed records that a write of this manager committed validity v of g's
// grant (as status shows it, to the microsecond).
func (g *Grant) Committed(v time.Time) {
	v = v.Truncate(time.Microsecond)
	g.mu.Lock()
	defer g.mu.Unlock()
	if v.After(g.committed) {
		g.committed = v
	}
}

// Dropped reports whether g is no longer held: Set.Drop dropped it.
func (g *Grant) Dropped() bool { return g.dropped.Load() }

// Shown is the validity status shows of g, as this manager last knew it.
func (g *Grant) Shown() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shown
}

// Floor is the latest validity status ever showed of g: its Session's
// renewals keep the keys at least until then.
func (g *Grant) Floor() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.floor
}

// setShown records that status shows v. Callers hold the writer's lock.
func (g *Grant) setShown(v time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shown = v
	if v.After(g.floor) {
		g.floor = v
	}
}

// raiseFloor records that status showed v, for a grant no longer
// refreshed.
func (g *Grant) raiseFloor(v time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if v.After(g.floor) {
		g.floor = v
	}
}

// OwnValidity reports whether status's validity v of g's grant is one
// this manager's writes showed, or earlier: not another manager's.
func (g *Grant) OwnValidity(v time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !v.After(g.committed)
}

// Ref names a grant in Redis.
type Ref struct {
	UID     types.UID
	Key     string
	GrantID string
	TTL     time.Duration
	Slot    *redlock.Slot // the semaphore slot the lock is; nil for a plain lock
}

// LockRef is a DistributedLock object that only names a lock (and its UID,
// when given): what a wake-up, a patch by name or an event needs.
func LockRef(name types.NamespacedName, uid types.UID) *v1alpha1.DistributedLock {
	return &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name, UID: uid}}
}

// Ended reports whether g's Session has ended.
func (g *Grant) Ended() bool {
	select {
	case <-g.Session.Done():
		return true
	default:
		return false
	}
}

// ShowsIn reports whether status st shows g, or shows it ended (same
// grant ID, no holder): the same grant ID and token, and, while a holder
// is shown, g's holder.
func (g *Grant) ShowsIn(st v1alpha1.DistributedLockStatus) bool {
	return GrantIDOf(st) == g.ID && st.FencingToken == g.Token && (st.Holder == nil || st.Holder.Identity == g.Holder)
}

// QuorumOf is the status of the masters' votes (nil: no votes).
func QuorumOf(quorum int, votes []redlock.Vote) *v1alpha1.QuorumStatus {
	if len(votes) == 0 {
		return nil
	}
	q := &v1alpha1.QuorumStatus{Quorum: int32(quorum)} //nolint:gosec // a handful of masters
	for _, v := range votes {
		mv := v1alpha1.MasterVote{Address: v.Addr, Vote: voteName(v.Outcome)}
		if v.Err != nil {
			mv.Error = conditions.Message(v.Err.Error())
		}
		if v.Outcome == redlock.OutcomeGranted {
			q.Granted++
		}
		q.Masters = append(q.Masters, mv)
	}
	return q
}

func voteName(o redlock.Outcome) string {
	switch o {
	case redlock.OutcomeGranted:
		return "Granted"
	case redlock.OutcomeHeld:
		return "Held"
	case redlock.OutcomeAbsent:
		return "Absent"
	case redlock.OutcomeError:
		return "Error"
	case redlock.OutcomeQuarantined:
		return "Quarantined"
	default:
		return "Pending"
	}
}

// GrantIDOf returns the ID of the grant status names. Status written before
// grant IDs existed names its grant by the fencing token alone (the value
// was derived from it), which stands in for the ID.
func GrantIDOf(st v1alpha1.DistributedLockStatus) string {
	switch {
	case st.GrantID != "":
		return st.GrantID
	case st.FencingToken > 0:
		return strconv.FormatInt(st.FencingToken, 10)
	default:
		return ""
	}
}

// Liveness is what this manager has seen of one grant's holder pod; only the lock's reconciles touch it.
type Liveness struct {
	// Since is when this manager first looked at the grant with its pod
	// running, under the timeout it counts with: the heartbeat is counted
	// from then at the earliest, and from the look at which the timeout
	// changed (an agent follows a new timeout only from its next renewal).
	Since   time.Time
	Timeout time.Duration
	// Restarts is the pod's container Restarts as last seen.
	Restarts int32
	// TroubleSince and TroubleLast bound the current spell of crashes:
	// first and latest look that found a container down or restarted
	// (zero: none).
	TroubleSince, TroubleLast time.Time
}
