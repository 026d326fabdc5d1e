package distributedlock

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

func TestLivenessVerdict(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const timeout = 3 * time.Second
	for _, tc := range []struct {
		name        string
		in          livenessInputs
		wantWhy     string // a substring; "" for no verdict
		wantRecheck time.Duration
	}{
		{"counted from the first look, no heartbeat yet", livenessInputs{Now: t0.Add(time.Second), Since: t0}, "", 2 * time.Second},
		{"no heartbeat for the timeout since the first look", livenessInputs{Now: t0.Add(timeout), Since: t0}, "no heartbeat seen for 3s", 0},
		{"a heartbeat moves the count on", livenessInputs{Now: t0.Add(4 * time.Second), Since: t0, LastBeat: t0.Add(2 * time.Second)}, "", time.Second},
		{"a heartbeat from before the first look counts from the first look", livenessInputs{Now: t0.Add(2 * time.Second), Since: t0, LastBeat: t0.Add(-time.Minute)}, "", time.Second},
		{"the last heartbeat too long ago", livenessInputs{Now: t0.Add(6 * time.Second), Since: t0, LastBeat: t0.Add(2 * time.Second)}, "no heartbeat seen for 4s", 0},
		{"down, but not for the timeout yet", livenessInputs{Now: t0.Add(2 * time.Second), Since: t0, LastBeat: t0.Add(2 * time.Second), Down: true, TroubleSince: t0.Add(time.Second)}, "", 2 * time.Second},
		{"crash-looping for the timeout, heartbeat or not", livenessInputs{Now: t0.Add(5 * time.Second), Since: t0, LastBeat: t0.Add(5 * time.Second), Down: true, TroubleSince: t0.Add(2 * time.Second)}, "crash-looped for 3s", 0},
		{"up again after a spell of crashes", livenessInputs{Now: t0.Add(5 * time.Second), Since: t0, LastBeat: t0.Add(5 * time.Second), TroubleSince: t0.Add(time.Second)}, "", timeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Timeout = timeout
			why, recheck := livenessVerdict(tc.in)
			if (tc.wantWhy == "") != (why == "") || !strings.Contains(why, tc.wantWhy) {
				t.Errorf("why = %q, want %q", why, tc.wantWhy)
			}
			if why == "" && recheck != tc.wantRecheck {
				t.Errorf("recheck = %v, want %v", recheck, tc.wantRecheck)
			}
		})
	}
}

func TestObservePodCountsASpellOfCrashes(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const timeout = 3 * time.Second
	pod := func(restarts int32, state corev1.ContainerState) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "app", RestartCount: restarts, State: state}}}}
	}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	backoff := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
	exited := func(code int32) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}
	}
	var lv grants.Liveness
	steps := []struct {
		at               time.Duration
		pod              *corev1.Pod
		timeout          time.Duration
		wantDown         bool
		wantTroubleSince time.Duration // -1: none
	}{
		{0, pod(5, running), timeout, false, -1},                    // restarts from before the first look count for nothing
		{time.Second, pod(6, running), timeout, false, time.Second}, // restarted between looks
		{2 * time.Second, pod(6, backoff), timeout, true, time.Second},
		{4 * time.Second, pod(7, running), timeout, false, time.Second},
		{4500 * time.Millisecond, pod(7, exited(1)), timeout, true, time.Second}, // still the same spell
		{9 * time.Second, pod(7, running), timeout, false, time.Second},          // up: the spell is over, not yet forgotten
		{13 * time.Second, pod(8, backoff), timeout, true, 13 * time.Second},     // more than a timeout after the last trouble: a new spell
		{14 * time.Second, pod(8, backoff), 2 * timeout, true, 14 * time.Second}, // a new timeout counts afresh from this look
	}
	for _, st := range steps {
		down := observePod(&lv, st.pod, t0.Add(st.at), st.timeout)
		if down != st.wantDown {
			t.Errorf("at %v: down = %v, want %v", st.at, down, st.wantDown)
		}
		want := time.Time{}
		if st.wantTroubleSince >= 0 {
			want = t0.Add(st.wantTroubleSince)
		}
		if !lv.TroubleSince.Equal(want) {
			t.Errorf("at %v: trouble since %v, want %v", st.at, lv.TroubleSince, want)
		}
	}
	if !lv.Since.Equal(t0.Add(14 * time.Second)) {
		t.Errorf("since = %v, want the look with the new timeout", lv.Since)
	}

	t.Run("a container that exited for good is not down", func(t *testing.T) {
		var lv grants.Liveness
		p := pod(0, exited(0))
		p.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
		if observePod(&lv, p, t0, timeout) {
			t.Error("a container that exited 0 under OnFailure counted as down")
		}
		p.Status.ContainerStatuses[0].State = exited(2)
		if !observePod(&lv, p, t0, timeout) {
			t.Error("a container that failed under OnFailure, to be restarted, not counted as down")
		}
	})
}

func TestHeartbeatsCountOnlyTheWatchedGrant(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	b := newHeartbeats(clk)
	hb := func(rv, holder string) *v1alpha1.LockHeartbeat {
		return &v1alpha1.LockHeartbeat{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "l", ResourceVersion: rv},
			Spec:       v1alpha1.LockHeartbeatSpec{HolderIdentity: holder},
		}
	}
	key := types.NamespacedName{Namespace: "ns", Name: "l"}
	b.observe(nil, hb("1", "g1"))
	if got := b.watch(key, "g1"); !got.IsZero() {
		t.Errorf("a renewal from before the watch counted: %v", got)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	b.observe(hb("1", "g1"), hb("2", "g1"))
	t1 := clk.Now()
	clk.SetTime(t1.Add(time.Second))
	b.observe(hb("2", "g1"), hb("2", "g1")) // a resync: no write
	for i := range 10 {
		b.observe(nil, hb(string(rune('a'+i)), "junk")) // another grant's writes
	}
	if got := b.watch(key, "g1"); !got.Equal(t1) {
		t.Errorf("last renewal of g1 = %v, want %v (resyncs and other grants' writes do not count)", got, t1)
	}
	if got := b.watch(key, "g2"); !got.IsZero() {
		t.Errorf("a new grant starts with g1's renewals: %v", got)
	}
	b.observe(nil, hb("x", "g1"))
	if got := b.watch(key, "g2"); !got.IsZero() {
		t.Errorf("the former grant's late write counted for the new one: %v", got)
	}
}

func TestMarkPassable(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const ttl = 4 * time.Second
	settledAt := t0.Add(ttl + redlock.Drift(ttl))
	m := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: "uid-m"}}
	last := &v1alpha1.PodReference{Name: "m", UID: "uid-m"}
	other := &v1alpha1.PodReference{Name: "q", UID: "uid-q"}
	released := v1alpha1.NewPreciseTime(t0)
	for _, tc := range []struct {
		name string
		st   v1alpha1.DistributedLockStatus
		now  time.Time
		want bool
	}{
		{"the last grant's pod, just given up", v1alpha1.DistributedLockStatus{GrantID: "g", LastHolderPod: last, ReleasedAt: released}, t0.Add(time.Second), false},
		{"the last grant's pod, a ttl and the drift after", v1alpha1.DistributedLockStatus{GrantID: "g", LastHolderPod: last, ReleasedAt: released}, settledAt, true},
		{"the last grant's pod, no release time shown", v1alpha1.DistributedLockStatus{GrantID: "g", LastHolderPod: last}, settledAt.Add(time.Hour), false},
		{"the last grant's pod while status shows a holder", v1alpha1.DistributedLockStatus{GrantID: "g", LastHolderPod: last, ReleasedAt: released, Holder: &v1alpha1.LockHolder{Identity: "m"}}, settledAt.Add(time.Hour), false},
		{"another pod was granted since", v1alpha1.DistributedLockStatus{GrantID: "g", LastHolderPod: other, ReleasedAt: released}, t0, true},
		{"a lock that never granted: a new object under an old key", v1alpha1.DistributedLockStatus{}, settledAt.Add(time.Hour), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := markPassable(tc.st, ttl, tc.now)(m); got != tc.want {
				t.Errorf("passable = %v, want %v", got, tc.want)
			}
		})
	}
}
