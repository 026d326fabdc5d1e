package distributedlock

import "testing"

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
