package distributedlock

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
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
		{"marked by an earlier verdict: at once", livenessInputs{Now: t0, Since: t0, LastBeat: t0, Marked: true}, "marked", 0},
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
	var lv liveness
	steps := []struct {
		at               time.Duration
		pod              *corev1.Pod
		wantDown         bool
		wantTroubleSince time.Duration // -1: none
	}{
		{0, pod(0, running), false, -1},
		{time.Second, pod(1, running), false, time.Second}, // restarted between looks
		{2 * time.Second, pod(1, backoff), true, time.Second},
		{4 * time.Second, pod(2, running), false, time.Second},
		{4500 * time.Millisecond, pod(2, backoff), true, time.Second}, // still the same spell
		{9 * time.Second, pod(2, running), false, time.Second},        // up: the spell is over, not yet forgotten
		{13 * time.Second, pod(3, backoff), true, 13 * time.Second},   // more than a timeout after the last trouble: a new spell
	}
	for _, st := range steps {
		down := lv.observePod(st.pod, t0.Add(st.at), timeout)
		if down != st.wantDown {
			t.Errorf("at %v: down = %v, want %v", st.at, down, st.wantDown)
		}
		want := time.Time{}
		if st.wantTroubleSince >= 0 {
			want = t0.Add(st.wantTroubleSince)
		}
		if !lv.troubleSince.Equal(want) {
			t.Errorf("at %v: trouble since %v, want %v", st.at, lv.troubleSince, want)
		}
	}
	if !lv.since.Equal(t0) {
		t.Errorf("since = %v, want the first look %v", lv.since, t0)
	}
}

func TestHeartbeatsCountWritesPerHolder(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	b := newHeartbeats(clk)
	lease := func(rv, holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "redlock-heartbeat.l", ResourceVersion: rv},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder},
		}
	}
	key := types.NamespacedName{Namespace: "ns", Name: "redlock-heartbeat.l"}
	b.observe(nil, lease("1", "g1"))
	t1 := clk.Now()
	clk.SetTime(t1.Add(time.Second))
	b.observe(lease("1", "g1"), lease("1", "g1")) // a resync: no write
	if got := b.last(key, "g1"); !got.Equal(t1) {
		t.Errorf("a resync counted as a renewal: last = %v, want %v", got, t1)
	}
	b.observe(lease("1", "g1"), lease("2", "g2"))
	clk.SetTime(t1.Add(2 * time.Second))
	b.observe(lease("2", "g2"), lease("3", "g1")) // a stale writer of g1 in between
	if got := b.last(key, "g2"); !got.Equal(t1.Add(time.Second)) {
		t.Errorf("g2's renewal forgotten after another holder's write: last = %v", got)
	}
	for i := range 2 * maxHoldersSeen {
		b.observe(nil, lease("x", string(rune('a'+i))))
	}
	b.mu.Lock()
	n := len(b.seen[key])
	b.mu.Unlock()
	if n > maxHoldersSeen {
		t.Errorf("%d holders kept, want at most %d", n, maxHoldersSeen)
	}
}
