package distributedlock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/writegate"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

func TestDecideHolder(t *testing.T) {
	now := time.Unix(1000, 0)
	later, earlier := now.Add(time.Second), now.Add(-time.Second)
	tests := []struct {
		in   holderInputs
		want holderAction
	}{
		{holderInputs{Now: now}, actNone},
		{holderInputs{Requested: "a", Now: now}, actAcquire},
		{holderInputs{Requested: "a", Holder: "a", ValidUntil: later, InMemory: true, Now: now}, actNone},
		{holderInputs{Requested: "a", Holder: "a", ValidUntil: later, Now: now}, actAdopt},
		{holderInputs{Requested: "a", Holder: "a", ValidUntil: earlier, Now: now}, actAcquire}, // lapsed: never adopted
		{holderInputs{Requested: "a", Holder: "a", ValidUntil: now, Now: now}, actAcquire},     // validity ends at now
		{holderInputs{Requested: "", Holder: "a", ValidUntil: later, Now: now}, actRelease},
		{holderInputs{Requested: "", Holder: "a", ValidUntil: earlier, InMemory: true, Now: now}, actRelease},
		{holderInputs{Requested: "", Holder: "a", ValidUntil: earlier, Now: now}, actNone},
		{holderInputs{Requested: "b", Holder: "a", ValidUntil: later, Now: now}, actHandover},
		{holderInputs{Requested: "b", Holder: "a", ValidUntil: later, InMemory: true, Now: now}, actHandover},
		{holderInputs{Requested: "b", Holder: "a", ValidUntil: earlier, Now: now}, actAcquire},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%+v", tc.in), func(t *testing.T) {
			if got := decideHolder(tc.in); got != tc.want {
				t.Fatalf("decideHolder = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestHeldReason(t *testing.T) {
	for err, want := range map[error]string{
		redlock.ErrLockHeld:                      v1alpha1.ReasonHeldElsewhere,
		redlock.ErrSlotsConflict:                 v1alpha1.ReasonSlotsConflict,
		redlock.ErrKindConflict:                  v1alpha1.ReasonKeyKindConflict,
		redlock.ErrQuorumUnavailable:             v1alpha1.ReasonQuorumUnavailable,
		redlock.ErrExpired:                       v1alpha1.ReasonValidityExpired,
		redlock.ErrNotHeld:                       v1alpha1.ReasonLost,
		fmt.Errorf("x: %w", redlock.ErrLockHeld): v1alpha1.ReasonHeldElsewhere,
	} {
		if got := heldReason(err); got != want {
			t.Errorf("heldReason(%v) = %s, want %s", err, got, want)
		}
	}
}

// TestHeldMessageOfKindConflict: the message names the kind that holds
// the key and what to do; other errors keep their own message.
func TestHeldMessageOfKindConflict(t *testing.T) {
	err := fmt.Errorf("x: %w", redlock.ErrKindConflict)
	plain := &v1alpha1.DistributedLock{Spec: v1alpha1.DistributedLockSpec{Key: "k"}}
	slot := &v1alpha1.DistributedLock{Spec: v1alpha1.DistributedLockSpec{Key: "k:slot:0", SlotOf: &v1alpha1.SemaphoreSlot{SemaphoreKey: "k", Slots: 1}}}
	for _, tc := range []struct {
		lock *v1alpha1.DistributedLock
		want []string
	}{
		{plain, []string{`a DistributedSemaphore`, `the key "k" has holders`, "a key is one kind", "another key", "delete that semaphore"}},
		{slot, []string{`a DistributedLock`, `the semaphore's key "k"`, "a key is one kind", "another key", "delete that lock"}},
	} {
		got := heldMessage(tc.lock, err)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("heldMessage(%s) = %q, does not say %q", tc.lock.Spec.Key, got, w)
			}
		}
	}
	if got := heldMessage(plain, redlock.ErrLockHeld); got != redlock.ErrLockHeld.Error() {
		t.Errorf("heldMessage(ErrLockHeld) = %q", got)
	}
}

func TestRenewalTiming(t *testing.T) {
	spec := v1alpha1.DistributedLockSpec{TTL: metav1.Duration{Duration: 9 * time.Second}}
	if got := renewInterval(spec); got != 3*time.Second {
		t.Errorf("default renew interval = %v, want ttl/3", got)
	}
	spec.RenewInterval = &metav1.Duration{Duration: time.Second}
	if got := renewInterval(spec); got != time.Second {
		t.Errorf("renew interval = %v", got)
	}
	for range 100 {
		d := retryDelay(10*time.Second, jitter)
		if d < time.Second || d > 2500*time.Millisecond {
			t.Fatalf("retry delay %v outside [1s, 2.5s]", d)
		}
	}
	if d := retryDelay(time.Minute, func(time.Duration) time.Duration { return 0 }); d != 2*time.Second {
		t.Errorf("retry delay floor for 1m = %v", d)
	}
}

// TestCommitOutcome: a failed status write's new grant is given back only
// when the write was refused; a write that may still be applied is left to
// expire unless a fresh read shows it committed.
func TestCommitOutcome(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.redlock.dev", Resource: "distributedlocks"}
	shows := func(b bool, err error) func() (bool, error) { return func() (bool, error) { return b, err } }
	unread := func() (bool, error) { t.Error("a refused write was read back"); return false, nil }
	conflict := apierrors.NewConflict(gr, "l", errors.New("rv"))
	for _, tc := range []struct {
		name string
		err  error
		read func() (bool, error)
		want writeResult
	}{
		{"a conflict committed nothing", conflict, shows(false, nil), writeRefused},
		{"a conflict answering the resend of a committed new grant: committed", conflict, shows(true, nil), writeCommitted},
		{"a conflict and a failed read: refused", conflict, shows(false, errors.New("read failed")), writeRefused},
		{"an invalid write committed nothing", apierrors.NewInvalid(schema.GroupKind{Kind: "DistributedLock"}, "l", nil), unread, writeRefused},
		{"a gone object took no write", apierrors.NewNotFound(gr, "l"), unread, writeRefused},
		{"a timeout, and status shows the grant: committed", apierrors.NewTimeoutError("slow", 1), shows(true, nil), writeCommitted},
		{"a timeout, and status does not show it yet: unknown", apierrors.NewTimeoutError("slow", 1), shows(false, nil), writeUnknown},
		{"a request cancelled as the manager stops: unknown", context.Canceled, shows(false, nil), writeUnknown},
		{"a request cancelled while it waited in the manager: refused", &url.Error{Op: "Patch", URL: "https://api/l", Err: fmt.Errorf("%w: %w", writegate.ErrNotSent, context.Canceled)}, unread, writeRefused},
		{"a failed read says nothing", errors.New("connection reset"), shows(false, errors.New("read failed")), writeUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := commitOutcome(tc.err, tc.read); got != tc.want {
				t.Errorf("commitOutcome = %v, want %v", got, tc.want)
			}
		})
	}
}
