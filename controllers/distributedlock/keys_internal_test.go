package distributedlock

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// TestKeysRecord: the record of a lock's last ended grant starts afresh
// for another grant but keeps what outlives one grant: when an incomplete
// release's copies expire, and the grant hidden for its pod's deletion
// with whether settleStopped released it; a name's records go with it.
func TestKeysRecord(t *testing.T) {
	k := &keys{}
	name := types.NamespacedName{Namespace: "ns", Name: "l"}
	at := time.Unix(1000, 0)
	k.update("u1", name, "g1", func(r *endRecord) { r.keysAt = at })
	k.expires("u1", name, at.Add(time.Minute))
	k.setStop("u1", name, stopRecord{grantID: "g1", pod: "p1"})
	k.update("u1", name, "g2", func(*endRecord) {})
	rec, _ := k.record("u1")
	switch {
	case rec.grantID != "g2" || !rec.keysAt.IsZero():
		t.Errorf("another grant's record kept %q until %v", rec.grantID, rec.keysAt)
	case !rec.expiry.Equal(at.Add(time.Minute)):
		t.Errorf("expiry %v, want the incomplete release's %v", rec.expiry, at.Add(time.Minute))
	case rec.stop != stopRecord{grantID: "g1", pod: "p1"}:
		t.Errorf("the stopping grant became %+v", rec.stop)
	}
	lock := &v1alpha1.DistributedLock{}
	lock.UID = "u1"
	lock.Status.GrantID = "g2"
	if got, left := k.left(lock, nil); left {
		t.Errorf("a record without a time left the keys until %v", got)
	}
	k.update("u2", types.NamespacedName{Namespace: "ns", Name: "other"}, "g", func(*endRecord) {})
	k.forgetName(name)
	if _, ok := k.record("u1"); ok {
		t.Error("the record of a name that is gone was kept")
	}
	if _, ok := k.record("u2"); !ok {
		t.Error("another name's record was forgotten")
	}
}
