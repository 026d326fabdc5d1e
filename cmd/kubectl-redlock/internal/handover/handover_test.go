package handover

import (
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

var now = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func lock(spec string, st v1alpha1.DistributedLockStatus) *v1alpha1.DistributedLock {
	return &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "l"},
		Spec: v1alpha1.DistributedLockSpec{HolderIdentity: spec}, Status: st}
}

// ended records that the static request of l's spec ended (its lease expired).
func ended(l *v1alpha1.DistributedLock) *v1alpha1.DistributedLock {
	l.Status.EndedRequest = &v1alpha1.EndedRequest{Identity: l.Spec.HolderIdentity, Reason: v1alpha1.ReasonLeaseExpired}
	return l
}

func podGrant(pod, grant string, token int64, waiting int32) v1alpha1.DistributedLockStatus {
	return v1alpha1.DistributedLockStatus{
		Holder:     &v1alpha1.LockHolder{Identity: pod, Pod: &v1alpha1.PodReference{Name: pod, UID: "uid-" + "pod"}},
		ValidUntil: v1alpha1.NewPreciseTime(now.Add(20 * time.Second)), GrantID: grant, FencingToken: token,
		Queue: &v1alpha1.LockQueue{Count: waiting},
	}
}

func TestPlanFor(t *testing.T) {
	static := v1alpha1.DistributedLockStatus{Holder: &v1alpha1.LockHolder{Identity: "nightly"}, GrantID: "g1", FencingToken: 7}
	for _, tc := range []struct {
		name    string
		lock    *v1alpha1.DistributedLock
		action  Action
		holder  string
		grant   string
		wantErr string
	}{
		{"static holder", lock("nightly", static), ClearStatic, "nightly", "g1", ""},
		{"static holder not granted yet", lock("nightly", v1alpha1.DistributedLockStatus{GrantID: "g0"}), ClearStatic, "nightly", "", ""},
		{"pod holder", lock("", podGrant("web-0", "g2", 8, 1)), EvictPod, "pod/web-0", "g2", ""},
		{"not held", lock("", v1alpha1.DistributedLockStatus{}), 0, "", "", "lock shop/l is not held (status shows no holder): nothing to hand over"},
		{"static holder being released", lock("", static), 0, "", "", `held by "nightly", which its spec no longer asks for`},
		{"spec asks for another static holder than status shows", lock("weekly", static), 0, "", "", `its spec asks for "weekly" while status still shows nightly`},
		{"spec asks for a static holder, a pod still holds", lock("weekly", podGrant("web-0", "g2", 8, 0)), 0, "", "", `status still shows pod/web-0`},
		{"static request ended, a pod holds", ended(lock("nightly", podGrant("web-0", "g2", 8, 0))), EvictPod, "pod/web-0", "g2", ""},
		{"static request ended, its grant being given up", ended(lock("nightly", static)), 0, "", "", `held by "nightly", which its spec no longer asks for`},
		{"static request ended, nobody holds", ended(lock("nightly", v1alpha1.DistributedLockStatus{})), 0, "", "", "is not held"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := PlanFor(tc.lock)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrNotHeld) {
					t.Fatalf("PlanFor error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || p.Action != tc.action || p.Holder != tc.holder || p.GrantID != tc.grant {
				t.Fatalf("PlanFor = %+v, %v", p, err)
			}
		})
	}
	q := Question(lock("", podGrant("web-0", "g2", 8, 1)), Plan{Holder: "pod/web-0"})
	if q != "hand over lock shop/l held by pod/web-0? [y/N] " {
		t.Fatalf("Question = %q", q)
	}
}

func TestSame(t *testing.T) {
	pod := Plan{Action: EvictPod, Holder: "pod/a", GrantID: "g1", Token: 1, Pod: &v1alpha1.PodReference{Name: "a", UID: "u1"}}
	recreated := pod
	recreated.Pod = &v1alpha1.PodReference{Name: "a", UID: "u2"}
	next := pod
	next.GrantID, next.Token = "g2", 2
	static := Plan{Action: ClearStatic, Holder: "nightly", GrantID: "g1", Token: 1}
	for _, tc := range []struct {
		name string
		a, b Plan
		want bool
	}{
		{"the same pod grant", pod, pod, true},
		{"a pod of the same name", pod, recreated, false},
		{"another grant", pod, next, false},
		{"a static holder instead", pod, static, false},
		{"the same static grant", static, static, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Same(tc.a, tc.b); got != tc.want {
				t.Fatalf("Same = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestConfirmed(t *testing.T) {
	for answer, want := range map[string]bool{"y\n": true, "Yes\n": true, " y ": true, "n\n": false, "\n": false, "": false, "yep\n": false} {
		if got := Confirmed(answer); got != want {
			t.Errorf("Confirmed(%q) = %v, want %v", answer, got, want)
		}
	}
}

func TestProgress(t *testing.T) {
	waiting := Plan{Action: EvictPod, GrantID: "g1", Waiting: 2}
	alone := Plan{Action: EvictPod, GrantID: "g1", Waiting: 0}
	released := v1alpha1.DistributedLockStatus{GrantID: "g1", FencingToken: 1}
	expired := podGrant("b", "g2", 2, 1)
	expired.ValidUntil = v1alpha1.NewPreciseTime(now.Add(-time.Second))
	for _, tc := range []struct {
		name string
		plan Plan
		st   v1alpha1.DistributedLockStatus
		want Outcome
	}{
		{"old grant still shown", waiting, podGrant("a", "g1", 1, 2), Pending},
		{"released, pods still wait", waiting, func() v1alpha1.DistributedLockStatus {
			st := released
			st.Queue = &v1alpha1.LockQueue{Count: 2}
			return st
		}(), Pending},
		{"released, the pods that waited gone", waiting, released, Released},
		{"next grant", waiting, podGrant("b", "g2", 2, 1), NextGrant},
		{"next grant shown with a passed validity", waiting, expired, Pending},
		{"released, nobody waits", alone, released, Released},
		{"released, but a pod came meanwhile", alone, v1alpha1.DistributedLockStatus{Queue: &v1alpha1.LockQueue{Count: 1}}, Pending},
		{"static holder never granted, a pod is granted", Plan{Action: ClearStatic, Waiting: 1}, podGrant("b", "g2", 2, 0), NextGrant},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Progress(tc.plan, tc.st, now); got != tc.want {
				t.Fatalf("Progress = %v, want %v", got, tc.want)
			}
		})
	}
	if d := Describe(podGrant("b", "g2", 2, 0), now); d != "held by pod/b with fencing token 2 (grant g2, valid for 20s)" {
		t.Fatalf("Describe = %q", d)
	}
	st := v1alpha1.DistributedLockStatus{Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHeld, Status: metav1.ConditionFalse, Reason: "QuorumUnavailable", Message: "down"}}}
	if d := Describe(st, now); d != "held by nobody (Held=False, QuorumUnavailable: down)" {
		t.Fatalf("Describe = %q", d)
	}
}

func TestEvictionError(t *testing.T) {
	pdb := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	pdb.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: "DisruptionBudget", Message: "The disruption budget web needs 1 healthy pods and has 1 currently"}}
	for _, tc := range []struct {
		err  error
		says []string
	}{
		{pdb, []string{"eviction of holder pod shop/web-0 refused by a PodDisruptionBudget", "would violate the pod's disruption budget", "(The disruption budget web needs 1 healthy pods and has 1 currently)", "the lock stays with the pod"}},
		{apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "web-0"), []string{"holder pod shop/web-0 is gone already"}},
		{apierrors.NewForbidden(schema.GroupResource{Resource: "pods/eviction"}, "web-0", errors.New("no")), []string{"not allowed to evict holder pod shop/web-0 (RBAC: create pods/eviction)"}},
		{errors.New("connection refused"), []string{"evict holder pod shop/web-0: connection refused"}},
	} {
		got := EvictionError("shop", "web-0", tc.err)
		if !errors.Is(got, tc.err) {
			t.Errorf("EvictionError(%v) does not wrap it", tc.err)
		}
		for _, s := range tc.says {
			if !strings.Contains(got.Error(), s) {
				t.Errorf("EvictionError = %q, does not say %q", got, s)
			}
		}
	}
}
