package metrics

import (
	"context"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// MemberStates are the states of a master set's member, each reported as
// one series of redlock_master_state (1 for the member's state, 0 for the
// others), so that an alert can select a state without knowing the others.
var MemberStates = []string{v1alpha1.MemberServing, v1alpha1.MemberQuarantined, v1alpha1.MemberStarting, v1alpha1.MemberDown}

var (
	descLeading = prometheus.NewDesc("redlock_manager_leading",
		"1 on the elected leader, which reconciles and reports the per-lock and per-set series; 0 on a standby, which reports none of them.", nil, nil)
	descHeld = prometheus.NewDesc("redlock_lock_held",
		"1 while the lock's status shows a holder whose validity has not passed, else 0.", []string{"namespace", "name"}, nil)
	descWaiting = prometheus.NewDesc("redlock_lock_pods_waiting",
		"Pods in the lock's queue (status.queue.count): pods labelled for the lock that do not hold it, standbys of active/passive workloads included.", []string{"namespace", "name"}, nil)
	descOldestWait = prometheus.NewDesc("redlock_lock_oldest_wait_seconds",
		"How long the oldest pod held at the lock's scheduling gate has existed (0 when none is): pods kept from starting, not the running standbys of readiness, label or agent mode.", []string{"namespace", "name"}, nil)
	descSemSlots = prometheus.NewDesc("redlock_semaphore_slots",
		"Slots of a DistributedSemaphore (spec.slots): how many pods may hold it at once.", []string{"namespace", "name"}, nil)
	descSemHeld = prometheus.NewDesc("redlock_semaphore_slots_held",
		"Slots of a DistributedSemaphore held now (status.held, refreshed at most once a second while slots change hands).", []string{"namespace", "name"}, nil)
	descSemWaiting = prometheus.NewDesc("redlock_semaphore_pods_waiting",
		"Pods waiting for a slot of a DistributedSemaphore (status.queue.count).", []string{"namespace", "name"}, nil)
	descSemOldestWait = prometheus.NewDesc("redlock_semaphore_oldest_wait_seconds",
		"How long the oldest pod held at the semaphore's scheduling gate has existed (0 when none is).", []string{"namespace", "name"}, nil)
	descServing = prometheus.NewDesc("redlock_master_set_serving",
		"Masters of a set that can vote now (status.serving, from the last probe).", []string{"namespace", "name"}, nil)
	descAvailable = prometheus.NewDesc("redlock_master_set_available",
		"1 while the set's Available condition is True: a quorum of its masters serves, and locks on it can be granted and renewed.", []string{"namespace", "name"}, nil)
	descQuorum = prometheus.NewDesc("redlock_master_set_quorum",
		"Masters of a set that must vote for a grant (status.quorum); quorum is at risk when redlock_master_set_serving is not above it.", []string{"namespace", "name"}, nil)
	descMembers = prometheus.NewDesc("redlock_master_set_members",
		"Masters of a set (status.total).", []string{"namespace", "name"}, nil)
	descMemberState = prometheus.NewDesc("redlock_master_state",
		"1 for the state status shows a master in (Serving, Quarantined, Starting, Down), 0 for the others.", []string{"namespace", "name", "master", "state"}, nil)
	descCertExpiry = prometheus.NewDesc("redlock_master_set_certificate_expiry_timestamp_seconds",
		"When the certificate a managed set's members serve expires (status.tls.notAfter), in seconds since the epoch.", []string{"namespace", "name", "secret"}, nil)
	descCertRenew = prometheus.NewDesc("redlock_master_set_certificate_renewal_timestamp_seconds",
		"When the operator issues the next certificate of a managed set it issues certificates for (status.tls.renewAt), in seconds since the epoch; absent for a certificate you provide.", []string{"namespace", "name", "secret"}, nil)
)

// StateCollector reports, at each scrape, what the manager's cache shows of
// every DistributedLock, DistributedSemaphore and RedisMasterSet and of the
// pods labelled for them: held, pods waiting and the oldest wait per lock;
// slots, slots held, pods waiting and the oldest wait per semaphore; serving, available,
// quorum, members, members' states and certificate expiry and renewal per
// set. It reads status, which only the elected leader writes, and reports
// these series on the leader only, so that a sum over replicas counts each
// lock once; a standby reports redlock_manager_leading 0 and nothing else
// of its own.
//
// Computing the series at scrape time from the cache keeps them exact
// without bookkeeping: a deleted lock's series are gone at the next scrape.
type StateCollector struct {
	// Objects reads DistributedLocks, DistributedSemaphores and
	// RedisMasterSets (the manager's cache); Pods reads the pods labelled
	// redlock.dev/lock, SemaphorePods those labelled redlock.dev/semaphore
	// (nil: semaphores' oldest waits are reported as 0).
	Objects, Pods, SemaphorePods client.Reader
	// Elected is closed once this manager leads (manager.Elected()).
	Elected <-chan struct{}
	// Synced reports, without blocking, whether the caches Objects and
	// Pods read from have synced: a scrape never waits for them. nil:
	// they have.
	Synced func(context.Context) bool
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	Log logr.Logger
}

// Describe implements prometheus.Collector.
func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLeading, descHeld, descWaiting, descOldestWait, descSemSlots, descSemHeld, descSemWaiting, descSemOldestWait, descServing, descAvailable, descQuorum, descMembers, descMemberState, descCertExpiry, descCertRenew} {
		ch <- d
	}
}

// collectTimeout bounds a scrape's reads of the cache, which wait for its
// first sync.
const collectTimeout = 5 * time.Second

// Collect implements prometheus.Collector.
func (c *StateCollector) Collect(ch chan<- prometheus.Metric) {
	leading := false
	select {
	case <-c.Elected:
		leading = true
	default:
	}
	ch <- prometheus.MustNewConstMetric(descLeading, prometheus.GaugeValue, boolValue(leading))
	if !leading {
		return
	}
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	if c.Synced != nil && !c.Synced(ctx) {
		return // not yet: the next scrape reports them
	}
	var locks v1alpha1.DistributedLockList
	if err := c.Objects.List(ctx, &locks, client.UnsafeDisableDeepCopy); err != nil {
		c.Log.Error(err, "metrics: list locks")
	} else {
		var pods corev1.PodList
		if err := c.Pods.List(ctx, &pods, client.HasLabels{v1alpha1.LockLabel}, client.UnsafeDisableDeepCopy); err != nil {
			c.Log.Error(err, "metrics: list pods; oldest waits reported as 0")
		}
		for _, s := range LockSamples(locks.Items, pods.Items, now) {
			ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, boolValue(s.Held), s.Namespace, s.Name)
			ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(s.Waiting), s.Namespace, s.Name)
			ch <- prometheus.MustNewConstMetric(descOldestWait, prometheus.GaugeValue, s.OldestWait.Seconds(), s.Namespace, s.Name)
		}
	}
	c.collectSemaphores(ctx, ch, now)
	var sets v1alpha1.RedisMasterSetList
	if err := c.Objects.List(ctx, &sets, client.UnsafeDisableDeepCopy); err != nil {
		c.Log.Error(err, "metrics: list master sets")
		return
	}
	for i := range sets.Items {
		ms := &sets.Items[i]
		st := &ms.Status
		ch <- prometheus.MustNewConstMetric(descServing, prometheus.GaugeValue, float64(st.Serving), ms.Namespace, ms.Name)
		ch <- prometheus.MustNewConstMetric(descAvailable, prometheus.GaugeValue, boolValue(meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionAvailable)), ms.Namespace, ms.Name)
		ch <- prometheus.MustNewConstMetric(descQuorum, prometheus.GaugeValue, float64(st.Quorum), ms.Namespace, ms.Name)
		ch <- prometheus.MustNewConstMetric(descMembers, prometheus.GaugeValue, float64(st.Total), ms.Namespace, ms.Name)
		for _, m := range st.Members {
			for _, state := range MemberStates {
				ch <- prometheus.MustNewConstMetric(descMemberState, prometheus.GaugeValue, boolValue(m.State == state), ms.Namespace, ms.Name, m.Address, state)
			}
		}
		if st.TLS != nil && st.TLS.NotAfter != nil {
			ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, float64(st.TLS.NotAfter.Unix()), ms.Namespace, ms.Name, st.TLS.SecretName)
		}
		if st.TLS != nil && st.TLS.RenewAt != nil {
			ch <- prometheus.MustNewConstMetric(descCertRenew, prometheus.GaugeValue, float64(st.TLS.RenewAt.Unix()), ms.Namespace, ms.Name, st.TLS.SecretName)
		}
	}
}

// collectSemaphores reports the series of every DistributedSemaphore.
func (c *StateCollector) collectSemaphores(ctx context.Context, ch chan<- prometheus.Metric, now time.Time) {
	var sems v1alpha1.DistributedSemaphoreList
	if err := c.Objects.List(ctx, &sems, client.UnsafeDisableDeepCopy); err != nil {
		c.Log.Error(err, "metrics: list semaphores")
		return
	}
	var pods corev1.PodList
	if c.SemaphorePods != nil {
		if err := c.SemaphorePods.List(ctx, &pods, client.HasLabels{v1alpha1.SemaphoreLabel}, client.UnsafeDisableDeepCopy); err != nil {
			c.Log.Error(err, "metrics: list semaphore pods; oldest waits reported as 0")
		}
	}
	for _, s := range SemaphoreSamples(sems.Items, pods.Items, now) {
		ch <- prometheus.MustNewConstMetric(descSemSlots, prometheus.GaugeValue, float64(s.Slots), s.Namespace, s.Name)
		ch <- prometheus.MustNewConstMetric(descSemHeld, prometheus.GaugeValue, float64(s.Held), s.Namespace, s.Name)
		ch <- prometheus.MustNewConstMetric(descSemWaiting, prometheus.GaugeValue, float64(s.Waiting), s.Namespace, s.Name)
		ch <- prometheus.MustNewConstMetric(descSemOldestWait, prometheus.GaugeValue, s.OldestWait.Seconds(), s.Namespace, s.Name)
	}
}

// SemaphoreSample is what a scrape reports of one semaphore.
type SemaphoreSample struct {
	Namespace, Name string
	// Slots is spec.slots, Held status.held, Waiting status.queue.count.
	Slots, Held, Waiting int32
	// OldestWait is the age of the oldest pod labelled for the semaphore
	// that still carries the scheduling gate and is not being deleted.
	OldestWait time.Duration
}

// SemaphoreSamples computes the samples of sems at now; pods are the pods
// labelled for semaphores, in any namespace.
func SemaphoreSamples(sems []v1alpha1.DistributedSemaphore, pods []corev1.Pod, now time.Time) []SemaphoreSample {
	oldest := oldestGated(pods, v1alpha1.SemaphoreLabel)
	out := make([]SemaphoreSample, 0, len(sems))
	for i := range sems {
		sem := &sems[i]
		s := SemaphoreSample{Namespace: sem.Namespace, Name: sem.Name, Slots: sem.Spec.Slots, Held: sem.Status.Held}
		if q := sem.Status.Queue; q != nil {
			s.Waiting = q.Count
		}
		if t, ok := oldest[objectName{sem.Namespace, sem.Name}]; ok && now.After(t) {
			s.OldestWait = now.Sub(t)
		}
		out = append(out, s)
	}
	return out
}

// objectName is a namespaced name.
type objectName struct{ namespace, name string }

// oldestGated returns, per value of pods' label, the creation of the oldest
// pod that still carries the scheduling gate and is not being deleted.
func oldestGated(pods []corev1.Pod, label string) map[objectName]time.Time {
	oldest := map[objectName]time.Time{}
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil || !slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == v1alpha1.SchedulingGate }) {
			continue
		}
		k := objectName{p.Namespace, p.Labels[label]}
		if t, ok := oldest[k]; !ok || p.CreationTimestamp.Time.Before(t) {
			oldest[k] = p.CreationTimestamp.Time
		}
	}
	return oldest
}

// LockSample is what a scrape reports of one lock.
type LockSample struct {
	Namespace, Name string
	// Held: status shows a holder whose validity has not passed at now.
	Held bool
	// Waiting is status.queue.count.
	Waiting int32
	// OldestWait is the age of the oldest pod labelled for the lock that
	// still carries its scheduling gate and is not being deleted.
	OldestWait time.Duration
}

// LockSamples computes the samples of locks at now; pods are the pods
// labelled for locks, in any namespace.
func LockSamples(locks []v1alpha1.DistributedLock, pods []corev1.Pod, now time.Time) []LockSample {
	oldest := oldestGated(pods, v1alpha1.LockLabel)
	out := make([]LockSample, 0, len(locks))
	for i := range locks {
		l := &locks[i]
		s := LockSample{Namespace: l.Namespace, Name: l.Name}
		st := &l.Status
		s.Held = st.Holder != nil && st.ValidUntil != nil && now.Before(st.ValidUntil.Time)
		if st.Queue != nil {
			s.Waiting = st.Queue.Count
		}
		if t, ok := oldest[objectName{l.Namespace, l.Name}]; ok && now.After(t) {
			s.OldestWait = now.Sub(t)
		}
		out = append(out, s)
	}
	return out
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
