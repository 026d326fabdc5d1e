package distributedlock

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
)

// TestWaitingForRoom: a lock waiting for room in the status writes keeps
// the message of the writer's shed (no second status write per grant
// shed), but no other Shed message, and shows StatusWritesBehind
// otherwise.
func TestWaitingForRoom(t *testing.T) {
	shedMsg := grants.ShedWhy + ": the held locks need 130/s, the API server took 50/s and they are kept within 40/s (budget 150/s); the youngest grants are shed, and granted again once status writes leave room"
	for _, c := range []struct {
		name       string
		held       *metav1.Condition
		wantReason string
		keepsMsg   bool
	}{
		{name: "no condition yet", wantReason: v1alpha1.ReasonStatusWritesBehind},
		{name: "waiting already", held: &metav1.Condition{Reason: v1alpha1.ReasonStatusWritesBehind, Message: "waiting: …"}, wantReason: v1alpha1.ReasonStatusWritesBehind},
		{name: "shed by the writer", held: &metav1.Condition{Reason: v1alpha1.ReasonShed, Message: shedMsg}, wantReason: v1alpha1.ReasonShed, keepsMsg: true},
		{name: "shed, then its keys found kept", held: &metav1.Condition{Reason: v1alpha1.ReasonShed, Message: "the last grant's keys are kept until 2026-12-06T12:00:00Z; the next is granted then: lock held"}, wantReason: v1alpha1.ReasonShed},
		{name: "lost", held: &metav1.Condition{Reason: v1alpha1.ReasonLost, Message: "lost"}, wantReason: v1alpha1.ReasonStatusWritesBehind},
	} {
		reason, msg := waitingForRoom(c.held)
		if reason != c.wantReason {
			t.Errorf("%s: Held reason %s, want %s", c.name, reason, c.wantReason)
		}
		if kept := c.held != nil && msg == c.held.Message; kept != c.keepsMsg {
			t.Errorf("%s: message %q, kept the one before: %v, want %v", c.name, msg, kept, c.keepsMsg)
		}
	}
}
