package distributedlock

import (
	"time"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
)

// RefreshPatchFor is the status writer's refresh of the grant lock's status
// shows, showing a renewal at renewedAt valid until validUntil, made by a
// writer that last saw status show the validity shown.
func RefreshPatchFor(lock *v1alpha1.DistributedLock, renewedAt, validUntil, shown time.Time) ([]byte, error) {
	h := &grants.Grant{UID: lock.UID, ID: lock.Status.GrantID, Holder: lock.Status.Holder.Identity, Token: lock.Status.FencingToken}
	return grants.RefreshPatch(h, renewal.State{RenewedAt: renewedAt, ValidUntil: validUntil}, shown, "")
}
