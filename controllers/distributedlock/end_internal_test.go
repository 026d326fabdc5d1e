package distributedlock

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// TestDecideEnd lists every way a grant ends: when status stops showing
// it, when its keys may go, its event, and whether it counts as lost (the
// alert reads that count). The keys go before
// the validity shown only on proof that the holder stopped (its release,
// the agent's word, its pod's end), or when no reader can act on the
// grant. A cause without a row fails the test.
func TestDecideEnd(t *testing.T) {
	rows := map[endCause]struct {
		hide  hideWhen
		keys  keysWhen
		event string
		lost  bool
	}{
		endReleased:        {hideNow, keysNow, EventReleased, false},
		endAgentWord:       {notShown, keysNow, EventReleased, false},
		endPodEnded:        {hideNow, keysNow, EventReleased, false},
		endRequestChanged:  {hideNow, keysAfterShown, EventReleased, false},
		endSpecInvalid:     {hideNow, keysAfterShown, EventReleased, false},
		endDeleted:         {hideNow, keysAfterShown, EventReleased, false},
		endSlotRemoved:     {hideNow, keysAfterShown, EventReleased, false},
		endShed:            {hideNow, keysAfterShown, EventShed, true},
		endLeaseExpired:    {hideNow, keysAfterShown, EventLeaseExpired, true},
		endUnresponsive:    {hideNow, keysAfterShown, EventHolderUnresponsive, true},
		endMaxHold:         {hideNow, keysAfterShown, EventMaxHoldExceeded, true},
		endTerminating:     {hideNow, keysAfterShown, "", false},
		endLost:            {hideNow, keysAfterShown, EventLost, true},
		endLapsed:          {hideAtValidity, keysAfterShown, EventLost, true},
		endAdoptionFailed:  {hideNow, keysAfterShown, EventLost, true},
		endHiddenElsewhere: {notShown, keysAfterShown, EventLost, true},
		endSuperseded:      {notShown, keysNow, EventSuperseded, true},
		endNotCommitted:    {notShown, keysNow, EventNotCommitted, false},
		endCommitUnknown:   {notShown, keysExpire, EventNotCommitted, false},
		endObjectGone:      {notShown, keysAfterShown, "", false},
	}
	for c := endCause(0); c < numEndCauses; c++ {
		want, ok := rows[c]
		if !ok {
			t.Errorf("end cause %q has no row in this table", c)
			continue
		}
		if got := decideEnd(c); got.hide != want.hide || got.keys != want.keys || got.event != want.event || got.lost != want.lost {
			t.Errorf("decideEnd(%q) hides %v, keys %v, event %q, lost %v; want %+v", c, got.hide, got.keys, got.event, got.lost, want)
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

// TestAReconcileEndsOneGrantOnce: the first end decided in a reconcile
// stands. A holder's word (keys at once) and then a spec turned invalid
// (keys kept) in one reconcile used to settle the grant twice, the second
// overwriting the first's record and Held reason, with two events.
func TestAReconcileEndsOneGrantOnce(t *testing.T) {
	now := time.Now()
	lock := &v1alpha1.DistributedLock{}
	lock.Status.Holder = &v1alpha1.LockHolder{Identity: "a"}
	lock.Status.GrantID = "g1"
	lock.Status.ValidUntil = v1alpha1.NewPreciseTime(now.Add(10 * time.Second))
	s := &scope{lock: lock, orig: *lock.Status.DeepCopy(), now: now}
	r := &Reconciler{}
	if !r.endGrant(s, nil, nil, endReleased, v1alpha1.ReasonReleased, "released by its holder") {
		t.Fatal("the first end of the reconcile was refused")
	}
	if r.endGrant(s, nil, nil, endSpecInvalid, v1alpha1.ReasonTTLTooLong, "ttl exceeds maxLockTTL") {
		t.Error("a second end was decided in the same reconcile")
	}
	if len(s.afterCommit) != 1 {
		t.Errorf("%d settlements after the commit, want 1", len(s.afterCommit))
	}
	if got := heldConditionReason(lock.Status); got != v1alpha1.ReasonReleased {
		t.Errorf("Held reason %q, want the first end's %q", got, v1alpha1.ReasonReleased)
	}
	if !s.givingBack || s.ended != "g1" {
		t.Errorf("givingBack %v, ended %q: want the first end's (keys at once, grant g1)", s.givingBack, s.ended)
	}
}

// TestUnseenEnd: how a grant the cached status does not show ended, by
// what the API server shows. A holder shown with the grant's ID (the cache
// was behind, or someone edited its token) is no end: the keys of a grant
// status shows must stay.
func TestUnseenEnd(t *testing.T) {
	h := &grants.Grant{ID: "g1", Holder: "a", Token: 7}
	lock := &v1alpha1.DistributedLock{}
	lock.UID = "u1"
	with := func(uid, grantID, holder string, token int64) *v1alpha1.DistributedLock {
		l := &v1alpha1.DistributedLock{}
		l.UID = types.UID(uid)
		l.Status.GrantID, l.Status.FencingToken = grantID, token
		if holder != "" {
			l.Status.Holder = &v1alpha1.LockHolder{Identity: holder}
		}
		return l
	}
	for _, tc := range []struct {
		name  string
		fresh *v1alpha1.DistributedLock
		cause endCause
		ended bool
	}{
		{"gone", nil, endObjectGone, true},
		{"re-created", with("u2", "g1", "a", 7), endObjectGone, true},
		{"another grant shown", with("u1", "g2", "b", 8), endSuperseded, true},
		{"another grant, hidden since", with("u1", "g2", "", 8), endSuperseded, true},
		{"hidden by a write not seen", with("u1", "g1", "", 7), endHiddenElsewhere, true},
		{"shown (the cache was behind)", with("u1", "g1", "a", 7), 0, false},
		{"shown with an edited token", with("u1", "g1", "a", 9), 0, false},
	} {
		cause, ended := unseenEnd(lock, tc.fresh, h)
		if ended != tc.ended || (ended && cause != tc.cause) {
			t.Errorf("%s: ended %v (%s), want %v (%s)", tc.name, ended, cause, tc.ended, tc.cause)
		}
	}
}
