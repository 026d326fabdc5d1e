package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/metrics"
)

var now = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func lock(holder bool, validFor time.Duration, waiting int32) v1alpha1.DistributedLock {
	l := v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "l"}}
	if holder {
		l.Status.Holder = &v1alpha1.LockHolder{Identity: "h"}
		l.Status.ValidUntil = &v1alpha1.PreciseTime{Time: now.Add(validFor)}
	}
	if waiting > 0 {
		l.Status.Queue = &v1alpha1.LockQueue{Count: waiting}
	}
	return l
}

func pod(ns, name, lockName string, age time.Duration, gated, deleting bool) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.LockLabel: lockName},
		CreationTimestamp: metav1.Time{Time: now.Add(-age)}}}
	if gated {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGate}}
	}
	if deleting {
		p.DeletionTimestamp = &metav1.Time{Time: now}
	}
	return p
}

func TestLockSamples(t *testing.T) {
	for _, tc := range []struct {
		name string
		lock v1alpha1.DistributedLock
		pods []corev1.Pod
		want metrics.LockSample
	}{
		{"not held, nobody waits", lock(false, 0, 0), nil,
			metrics.LockSample{Namespace: "a", Name: "l"}},
		{"held while its validity has not passed", lock(true, time.Second, 0), nil,
			metrics.LockSample{Namespace: "a", Name: "l", Held: true}},
		{"a holder shown past its validity is not held", lock(true, -time.Millisecond, 0), nil,
			metrics.LockSample{Namespace: "a", Name: "l"}},
		{"the oldest gated pod of the lock sets the oldest wait", lock(true, time.Second, 2), []corev1.Pod{
			pod("a", "p1", "l", time.Minute, true, false),
			pod("a", "p2", "l", 3*time.Minute, true, false),
		}, metrics.LockSample{Namespace: "a", Name: "l", Held: true, Waiting: 2, OldestWait: 3 * time.Minute}},
		{"running standbys, deleting pods and other locks' pods do not wait at the gate", lock(true, time.Second, 1), []corev1.Pod{
			pod("a", "standby", "l", time.Hour, false, false),
			pod("a", "leaving", "l", 2*time.Hour, true, true),
			pod("a", "other", "m", 3*time.Hour, true, false),
			pod("b", "elsewhere", "l", 4*time.Hour, true, false),
		}, metrics.LockSample{Namespace: "a", Name: "l", Held: true, Waiting: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := metrics.LockSamples([]v1alpha1.DistributedLock{tc.lock}, tc.pods, now)
			if len(got) != 1 || got[0] != tc.want {
				t.Fatalf("LockSamples = %+v, want [%+v]", got, tc.want)
			}
		})
	}
}

// semPod is a pod labelled for semaphore sem, given a slot's lock when
// slot is not "".
func semPod(name, sem, slot string, age time.Duration, gated bool) corev1.Pod {
	p := pod("a", name, slot, age, gated, false)
	if slot == "" {
		delete(p.Labels, v1alpha1.LockLabel)
	}
	p.Labels[v1alpha1.SemaphoreLabel] = sem
	return p
}

func TestSemaphoreSamples(t *testing.T) {
	sem := v1alpha1.DistributedSemaphore{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "s"}}
	sem.Spec.Slots = 3
	sem.Status.Held, sem.Status.Queue = 2, &v1alpha1.LockQueue{Count: 2}
	pods := []corev1.Pod{
		semPod("holder", "s", "s-3-0", 2*time.Hour, false),         // running: not waiting
		semPod("given", "s", "s-3-1", 90*time.Minute, true),        // given a slot, not lifted yet: still at the gate
		semPod("waiting", "s", "", time.Hour, true),                // waiting for a slot
		semPod("other", "t", "", 3*time.Hour, true),                // another semaphore's
		{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "x"}}, // no label
	}
	got := metrics.SemaphoreSamples([]v1alpha1.DistributedSemaphore{sem}, pods, now)
	want := metrics.SemaphoreSample{Namespace: "a", Name: "s", Slots: 3, Held: 2, Waiting: 2, OldestWait: 90 * time.Minute}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("SemaphoreSamples = %+v, want [%+v]", got, want)
	}
}

// stateCollector is a StateCollector over a fake client holding one lock
// with a waiting pod and one managed set with TLS, on a leader.
func stateCollector(t *testing.T, leading bool) *metrics.StateCollector {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	l := lock(true, time.Second, 1)
	p := pod("a", "p", "l", time.Minute, true, false)
	ms := &v1alpha1.RedisMasterSet{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "masters"}}
	ms.Status.Quorum, ms.Status.Total, ms.Status.Serving = 2, 3, 3
	ms.Status.Members = []v1alpha1.MemberStatus{{Address: "m-0:6379", State: v1alpha1.MemberServing}, {Address: "m-1:6379", State: v1alpha1.MemberDown}}
	ms.Status.TLS = &v1alpha1.MasterTLSStatus{SecretName: "masters-tls-1", NotAfter: &metav1.Time{Time: now.Add(90 * 24 * time.Hour)},
		RenewAt: &metav1.Time{Time: now.Add(60 * 24 * time.Hour)}}
	sem := &v1alpha1.DistributedSemaphore{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "s"}}
	sem.Spec.Slots, sem.Status.Held, sem.Status.Queue = 2, 1, &v1alpha1.LockQueue{Count: 1}
	sp := semPod("w", "s", "", 2*time.Minute, true)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&l, &p, ms, sem, &sp).Build()
	elected := make(chan struct{})
	if leading {
		close(elected)
	}
	return &metrics.StateCollector{Objects: c, Pods: c, SemaphorePods: c, Elected: elected, Now: func() time.Time { return now }}
}

func TestStateCollectorOnTheLeader(t *testing.T) {
	want := `
# HELP redlock_lock_held 1 while the lock's status shows a holder whose validity has not passed, else 0.
# TYPE redlock_lock_held gauge
redlock_lock_held{name="l",namespace="a"} 1
# HELP redlock_lock_oldest_wait_seconds How long the oldest pod held at the lock's scheduling gate has existed (0 when none is): pods kept from starting, not the running standbys of readiness, label or agent mode.
# TYPE redlock_lock_oldest_wait_seconds gauge
redlock_lock_oldest_wait_seconds{name="l",namespace="a"} 60
# HELP redlock_semaphore_oldest_wait_seconds How long the oldest pod held at the semaphore's scheduling gate has existed (0 when none is).
# TYPE redlock_semaphore_oldest_wait_seconds gauge
redlock_semaphore_oldest_wait_seconds{name="s",namespace="a"} 120
# HELP redlock_semaphore_slots_held Slots of a DistributedSemaphore held now (status.held, refreshed at most once a second while slots change hands).
# TYPE redlock_semaphore_slots_held gauge
redlock_semaphore_slots_held{name="s",namespace="a"} 1
# HELP redlock_master_set_certificate_expiry_timestamp_seconds When the certificate a managed set's members serve expires (status.tls.notAfter), in seconds since the epoch.
# TYPE redlock_master_set_certificate_expiry_timestamp_seconds gauge
redlock_master_set_certificate_expiry_timestamp_seconds{name="masters",namespace="a",secret="masters-tls-1"} 1.8040752e+09
# HELP redlock_master_set_certificate_renewal_timestamp_seconds When the operator issues the next certificate of a managed set it issues certificates for (status.tls.renewAt), in seconds since the epoch; absent for a certificate you provide.
# TYPE redlock_master_set_certificate_renewal_timestamp_seconds gauge
redlock_master_set_certificate_renewal_timestamp_seconds{name="masters",namespace="a",secret="masters-tls-1"} 1.8014832e+09
# HELP redlock_master_state 1 for the state status shows a master in (Serving, Quarantined, Starting, Down), 0 for the others.
# TYPE redlock_master_state gauge
redlock_master_state{master="m-0:6379",name="masters",namespace="a",state="Down"} 0
redlock_master_state{master="m-0:6379",name="masters",namespace="a",state="Quarantined"} 0
redlock_master_state{master="m-0:6379",name="masters",namespace="a",state="Serving"} 1
redlock_master_state{master="m-0:6379",name="masters",namespace="a",state="Starting"} 0
redlock_master_state{master="m-1:6379",name="masters",namespace="a",state="Down"} 1
redlock_master_state{master="m-1:6379",name="masters",namespace="a",state="Quarantined"} 0
redlock_master_state{master="m-1:6379",name="masters",namespace="a",state="Serving"} 0
redlock_master_state{master="m-1:6379",name="masters",namespace="a",state="Starting"} 0
`
	c := stateCollector(t, true)
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "redlock_lock_held", "redlock_lock_oldest_wait_seconds",
		"redlock_semaphore_oldest_wait_seconds", "redlock_semaphore_slots_held",
		"redlock_master_state", "redlock_master_set_certificate_expiry_timestamp_seconds", "redlock_master_set_certificate_renewal_timestamp_seconds"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(c); n != 1+3+4+4+8+2 {
		t.Fatalf("the leader reports %d series, want 22 (leading; held, waiting, oldest wait; slots, held, waiting, oldest wait of the semaphore; serving, available, quorum, members; 8 member states; expiry, renewal)", n)
	}
}

func TestStateCollectorOnAStandby(t *testing.T) {
	want := `
# HELP redlock_manager_leading 1 on the elected leader, which reconciles and reports the per-lock and per-set series; 0 on a standby, which reports none of them.
# TYPE redlock_manager_leading gauge
redlock_manager_leading 0
`
	c := stateCollector(t, false)
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// TestMetricsFollowPrometheusConventions lints every metric the manager
// exports (client_golang's promlint: names, units, suffixes, help).
func TestMetricsFollowPrometheusConventions(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := metrics.New()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(stateCollector(t, true)); err != nil {
		t.Fatal(err)
	}
	// Vectors gather only the label values they have seen.
	m.OpDuration.WithLabelValues("a", "masters", "acquire", "ok").Observe(0.001)
	m.Votes.WithLabelValues("a", "masters", "m-0:6379", "acquire", "granted").Inc()
	m.Quarantines.WithLabelValues("a", "masters", "m-0:6379").Inc()
	m.RenewFailures.WithLabelValues("timeout").Inc()
	m.FencingToken.WithLabelValues("a", "l").Set(1)
	m.StatusWrites.WithLabelValues("renewal").Inc()
	m.EventsDropped.WithLabelValues("Granted").Inc()
	m.GrantsLost.WithLabelValues("a", "l", v1alpha1.ReasonLost).Inc()
	m.Grants.WithLabelValues("a", "l").Inc()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) < 30 {
		t.Fatalf("gathered %d families, want every metric (at least 30)", len(families))
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				if b.GetUpperBound() < 0 {
					t.Errorf("%s: a bucket below zero (%g): a histogram observes amounts, split signs into two", f.GetName(), b.GetUpperBound())
				}
			}
		}
	}
	problems, err := promlint.NewWithMetricFamilies(families).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}
