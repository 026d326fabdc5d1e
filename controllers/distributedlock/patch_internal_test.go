package distributedlock

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
)

// TestNoRetry: a status patch refused for a conflict is retried on the
// fresh lock only when what the reconcile decided on still stands; a new
// grant never commits over a semaphore's fence, a spec changed since, or
// a pod that no longer asks for the lock (a fence set and cleared again
// shows the lock as before, but its pod moved).
func TestNoRetry(t *testing.T) {
	slot := func(fence string, generation int64) *v1alpha1.DistributedLock {
		l := &v1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{UID: "lock", Generation: generation},
			Spec:       v1alpha1.DistributedLockSpec{Key: "s:slot:0", SlotOf: &v1alpha1.SemaphoreSlot{SemaphoreKey: "s", Slots: 1}},
		}
		if fence != "" {
			l.Annotations = map[string]string{v1alpha1.MovingPodAnnotation: fence}
		}
		return l
	}
	granting := &scope{pending: &grants.Grant{}}
	plain := &scope{}
	other := slot("", 1)
	other.Status = v1alpha1.DistributedLockStatus{Holder: &v1alpha1.LockHolder{Identity: "x"}, GrantID: "g2", FencingToken: 9}
	for _, tc := range []struct {
		name   string
		s      *scope
		fresh  *v1alpha1.DistributedLock
		asks   bool
		refuse bool
	}{
		{"a new grant, only another write's version moved", granting, slot("", 1), true, false},
		{"a new grant, its pod moved by a fence set and cleared since", granting, slot("", 1), false, true},
		{"a new grant, the semaphore fenced the lock since", granting, slot("pod-a", 1), true, true},
		{"a new grant, the spec changed since", granting, slot("", 2), true, true},
		{"no new grant, fenced since", plain, slot("pod-a", 1), true, false},
		{"another writer showed another grant", granting, other, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if why := noRetry(tc.s, slot("", 1), tc.fresh, tc.asks); (why != "") != tc.refuse {
				t.Errorf("noRetry = %q, want a refusal: %v", why, tc.refuse)
			}
		})
	}
}
