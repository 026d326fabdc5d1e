package distributedlock

import (
	"time"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
)

// RefreshPatchFor is the status writer's refresh of the grant lock's status
// shows, showing a renewal at renewedAt valid until validUntil, made by a
// writer that last saw status show the validity shown.
func RefreshPatchFor(lock *v1alpha1.DistributedLock, renewedAt, validUntil, shown time.Time) ([]byte, error) {
	h := &held{uid: lock.UID, grantID: lock.Status.GrantID, holder: lock.Status.Holder.Identity, token: lock.Status.FencingToken}
	return refreshPatch(h, renewal.State{RenewedAt: renewedAt, ValidUntil: validUntil}, shown, "")
}

// The refresh schedule of a manager with no failover slack (see
// refreshSchedule).
var (
	StatusLead   = statusLead
	RenewLead    = renewLead
	WritesPerTTL = refreshSchedule{}.writesPerTTL
)
