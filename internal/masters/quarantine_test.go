package masters

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/managed"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

func TestQuarantine(t *testing.T) {
	const ttl = 10 * time.Second
	sitOut := managed.SitOut(ttl)       // 10s + 102ms + 1s
	drifted := ttl + redlock.Drift(ttl) // 10.102s
	managedSet := func(persistence string, restartDelay time.Duration) *v1alpha1.RedisMasterSet {
		ms := &v1alpha1.RedisMasterSet{Spec: v1alpha1.RedisMasterSetSpec{
			MaxLockTTL: metav1.Duration{Duration: ttl},
			Managed:    &v1alpha1.ManagedMasters{Replicas: 3, Persistence: persistence},
		}}
		if restartDelay > 0 {
			ms.Spec.Managed.RestartDelay = &metav1.Duration{Duration: restartDelay}
		}
		return ms
	}
	external := &v1alpha1.RedisMasterSet{Spec: v1alpha1.RedisMasterSetSpec{
		MaxLockTTL: metav1.Duration{Duration: ttl},
		External:   &v1alpha1.ExternalMasters{Addresses: []string{"a:1", "b:1", "c:1"}},
	}}
	mixed := func(ms *v1alpha1.RedisMasterSet) *v1alpha1.RedisMasterSet {
		ms.Spec.Managed.Replicas = 2
		ms.Spec.External = &v1alpha1.ExternalMasters{Addresses: []string{"c:1"}}
		return ms
	}
	for _, tc := range []struct {
		name string
		ms   *v1alpha1.RedisMasterSet
		want time.Duration
	}{
		{"an external set is quarantined for maxLockTTL + drift + margin", external, sitOut},

		{"None with the default restart delay is quarantined for it", managedSet(v1alpha1.PersistenceNone, 0), sitOut},
		{"None with a restart delay just above maxLockTTL is still quarantined for the sit-out", managedSet(v1alpha1.PersistenceNone, ttl+time.Millisecond), sitOut},
		{"None with a restart delay equal to maxLockTTL + drift is quarantined for the sit-out", managedSet(v1alpha1.PersistenceNone, drifted), sitOut},
		{"None with a restart delay just above maxLockTTL + drift is quarantined for the sit-out", managedSet(v1alpha1.PersistenceNone, drifted+time.Millisecond), sitOut},
		{"None with a long restart delay is quarantined for the delay", managedSet(v1alpha1.PersistenceNone, time.Minute), time.Minute},

		{"unset persistence with a short restart delay is quarantined for the sit-out", managedSet("", ttl+time.Millisecond), sitOut},

		{"AOFEverySec with the default restart delay is quarantined for it", managedSet(v1alpha1.PersistenceAOFEverySec, 0), sitOut},
		{"AOFEverySec with a restart delay just above maxLockTTL is still quarantined for the sit-out", managedSet(v1alpha1.PersistenceAOFEverySec, ttl+time.Millisecond), sitOut},
		{"AOFEverySec with a restart delay equal to maxLockTTL + drift is quarantined for the sit-out", managedSet(v1alpha1.PersistenceAOFEverySec, drifted), sitOut},
		{"AOFEverySec with a long restart delay is quarantined for the delay", managedSet(v1alpha1.PersistenceAOFEverySec, time.Minute), time.Minute},

		{"AOFAlways with a short restart delay is not quarantined", managedSet(v1alpha1.PersistenceAOFAlways, time.Second), 0},
		{"AOFAlways with a restart delay equal to maxLockTTL + drift is not quarantined", managedSet(v1alpha1.PersistenceAOFAlways, drifted), 0},
		{"AOFAlways with a restart delay above maxLockTTL + drift is quarantined for the delay", managedSet(v1alpha1.PersistenceAOFAlways, drifted+time.Millisecond), drifted + time.Millisecond},
		{"AOFAlways with the default restart delay is quarantined for it", managedSet(v1alpha1.PersistenceAOFAlways, 0), sitOut},
		{"AOFAlways with a long restart delay is quarantined for the delay", managedSet(v1alpha1.PersistenceAOFAlways, time.Minute), time.Minute},

		{"AOFAlways with external members is quarantined for the sit-out: they may lose their keys", mixed(managedSet(v1alpha1.PersistenceAOFAlways, time.Second)), sitOut},
		{"None with external members and a long restart delay is quarantined for the delay", mixed(managedSet(v1alpha1.PersistenceNone, time.Minute)), time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Quarantine(tc.ms); got != tc.want {
				t.Errorf("Quarantine = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestProbeTimeout(t *testing.T) {
	withSpec := &v1alpha1.RedisMasterSet{Spec: v1alpha1.RedisMasterSetSpec{NodeTimeout: &metav1.Duration{Duration: 300 * time.Millisecond}}}
	withoutSpec := &v1alpha1.RedisMasterSet{}
	for _, tc := range []struct {
		name string
		r    *Registry
		ms   *v1alpha1.RedisMasterSet
		want time.Duration
	}{
		{"the set's node timeout bounds its probe", &Registry{DefaultNodeTimeout: 50 * time.Millisecond}, withSpec, 300 * time.Millisecond},
		{"the operator's default node timeout bounds the probe of a set without one", &Registry{DefaultNodeTimeout: 50 * time.Millisecond}, withoutSpec, 50 * time.Millisecond},
		{"without any node timeout the probe is bounded by the client's maximum", &Registry{}, withoutSpec, redlock.MaxNodeTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.ProbeTimeout(tc.ms); got != tc.want {
				t.Errorf("ProbeTimeout = %v, want %v", got, tc.want)
			}
		})
	}
}
