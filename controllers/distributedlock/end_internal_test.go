package distributedlock

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// TestDecideEnd lists every way a grant ends with its two answers: when
// status stops showing it, and when its keys may go. The keys go before
// the validity shown only on proof that the holder stopped (its release,
// the agent's word, its pod's end), or when no reader can act on the
// grant. A cause without a row fails the test.
func TestDecideEnd(t *testing.T) {
	rows := map[endCause]endRule{
		endReleased:        {hideNow, keysNow},
		endAgentWord:       {notShown, keysNow},
		endPodEnded:        {hideNow, keysNow},
		endRequestChanged:  {hideNow, keysAfterShown},
		endSpecInvalid:     {hideNow, keysAfterShown},
		endDeleted:         {hideNow, keysAfterShown},
		endSlotRemoved:     {hideNow, keysAfterShown},
		endShed:            {hideNow, keysAfterShown},
		endLeaseExpired:    {hideNow, keysAfterShown},
		endUnresponsive:    {hideNow, keysAfterShown},
		endMaxHold:         {hideNow, keysAfterShown},
		endTerminating:     {hideNow, keysAfterShown},
		endLost:            {hideNow, keysAfterShown},
		endLapsed:          {hideAtValidity, keysAfterShown},
		endAdoptionFailed:  {hideNow, keysAfterShown},
		endHiddenElsewhere: {notShown, keysAfterShown},
		endSuperseded:      {notShown, keysNow},
		endNotCommitted:    {notShown, keysNow},
		endCommitUnknown:   {notShown, keysExpire},
		endObjectGone:      {notShown, keysAfterShown},
	}
	for c := endCause(0); c < numEndCauses; c++ {
		want, ok := rows[c]
		if !ok {
			t.Errorf("end cause %q has no row in this table", c)
			continue
		}
		if got := decideEnd(c); got != want {
			t.Errorf("decideEnd(%q) = %+v, want %+v", c, got, want)
		}
		if c.String() == "unknown" {
			t.Errorf("end cause %d has no name", c)
		}
	}
	if len(rows) != int(numEndCauses) {
		t.Errorf("the table has %d rows for %d causes", len(rows), numEndCauses)
	}
	if got := decideEnd(numEndCauses); got.keys != keysAfterShown || got.hide != hideNow {
		t.Errorf("an unknown cause gets %+v, want the safe answer (hide now, keys after the validity shown)", got)
	}
}

// TestKeysLeftWithoutRecord: a manager that did not end the grant itself
// (a restart, a failover) keeps its keys until the validity status showed
// last, kept in lastValidUntil when the grant was hidden.
func TestKeysLeftWithoutRecord(t *testing.T) {
	now := time.Unix(1000, 0)
	shown := now.Add(8 * time.Second)
	lock := &v1alpha1.DistributedLock{Spec: v1alpha1.DistributedLockSpec{TTL: metav1.Duration{Duration: 10 * time.Second}}}
	lock.Status.Holder = &v1alpha1.LockHolder{Identity: "job"}
	lock.Status.GrantID = "g1"
	lock.Status.ValidUntil = v1alpha1.NewPreciseTime(shown)
	clearGrant(&lock.Status, 1, now, v1alpha1.ReasonRequestChanged, "changed")
	if lock.Status.LastValidUntil == nil || !lock.Status.LastValidUntil.Equal(shown) {
		t.Fatalf("lastValidUntil = %v, want the validity shown %v", lock.Status.LastValidUntil, shown)
	}
	at, left := (&keys{}).left(lock, nil)
	if want := shown.Add(redlock.Drift(10 * time.Second)); !left || !at.Equal(want) {
		t.Errorf("keys.left = %v, %v; want %v, true", at, left, want)
	}

	// A hide sent again after a conflict keeps the later validity the
	// status writer showed meanwhile.
	fresh := lock.Status.DeepCopy()
	fresh.Holder = &v1alpha1.LockHolder{Identity: "job"}
	later := shown.Add(3 * time.Second)
	fresh.ValidUntil = v1alpha1.NewPreciseTime(later)
	keepLaterValidity(&lock.Status, *fresh)
	if !lock.Status.LastValidUntil.Equal(later) {
		t.Errorf("after a conflict, lastValidUntil = %v, want %v", lock.Status.LastValidUntil, later)
	}

	// A new grant shown forgets it.
	showGrant(&lock.Status, grantView{holder: "next", grantID: "g2", token: 2, acquiredAt: now, renewedAt: now, validUntil: now.Add(time.Second)}, 1)
	if lock.Status.LastValidUntil != nil {
		t.Errorf("a new grant kept lastValidUntil %v", lock.Status.LastValidUntil)
	}
}
