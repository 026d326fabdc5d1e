package distributedlock

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/grants"
	"github.com/redlock-operator/redlock-operator/internal/metrics"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// oneClient is the MasterClients of one client.
type oneClient struct{ c *redlock.Client }

func (o oneClient) Client(context.Context, *v1alpha1.RedisMasterSet) (*redlock.Client, error) {
	return o.c, nil
}
func (o oneClient) Lookup(types.NamespacedName) *redlock.Client { return o.c }

// joinedValues derives a grant's value by joining its lock's UID and ID.
type joinedValues struct{}

func (joinedValues) Value(uid, grantID string) string { return uid + "/" + grantID }

// TestALapsedGrantWithALiveSessionEndsOnce: a reconcile that finds the
// validity of a grant passed while its Session, renewing on real masters,
// has not reported a loss ends the grant there: status stops showing it
// (ValidityExpired), and once that committed the Session stops and the
// keys are left until its validity and the drift allowance have passed.
// The loss is counted once: before, the Session went on renewing a grant
// status no longer showed, and its end was counted a second time when it
// reported the loss; now it is dropped, and reports nothing.
func TestALapsedGrantWithALiveSessionEndsOnce(t *testing.T) {
	_, c := lineMasters(t)
	ctx := context.Background()
	const ttl = 10 * time.Second
	lock := &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "l", UID: "uid-l"},
		Spec:       v1alpha1.DistributedLockSpec{Key: "lapsed", MasterSet: "ms", TTL: metav1.Duration{Duration: ttl}},
	}
	name := types.NamespacedName{Namespace: "ns", Name: "l"}
	lk, err := c.Acquire(ctx, "lapsed", ttl, redlock.WithValue(joinedValues{}.Value("uid-l", "g1")), redlock.WithFencing())
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	set := grants.New(grants.Config{Metrics: m}, grants.Callbacks{Reconcile: func(types.NamespacedName) {}})
	h := &grants.Grant{UID: lock.UID, Name: name, Ref: refOf(lock, "g1"), MasterSet: "ms", ID: "g1", Holder: "a", Token: lk.Token(), AcquiredAt: time.Now(), Quorum: c.Quorum()}
	set.Hold(h, renewal.Grant{
		Lock: lk, Client: c, Key: lk.Key(), Value: lk.Value(), Token: lk.Token(), TTL: ttl, Every: ttl * 9 / 10, // no renewal while the test reads its validity
		ValidUntil: lk.ValidUntil(), Votes: lk.Votes(),
	}, renewal.Config{Client: func() *redlock.Client { return c }, Metrics: m, Reasons: heldReason})
	t.Cleanup(func() { h.Session.Orphan() })
	validity := h.Session.State().ValidUntil
	lock.Status = v1alpha1.DistributedLockStatus{
		Holder: &v1alpha1.LockHolder{Identity: "a"}, GrantID: "g1", FencingToken: lk.Token(),
		ValidUntil: v1alpha1.NewPreciseTime(validity),
	}
	recorder := events.NewFakeRecorder(10)
	r := &Reconciler{Recorder: recorder, Metrics: m, Clock: clock.RealClock{}, grants: set}
	r.keys = &keys{grants: set, masters: oneClient{c}, values: joinedValues{}, clock: clock.RealClock{}, wake: func(types.NamespacedName) {}}

	// The reconcile's clock is past the validity; the Session's is not.
	s := &scope{lock: lock, orig: *lock.Status.DeepCopy(), now: validity.Add(time.Second), held: h, client: c}
	r.showHolder(s)
	if got := heldConditionReason(lock.Status); lock.Status.Holder != nil || got != v1alpha1.ReasonValidityExpired {
		t.Fatalf("status shows holder %v, Held reason %q: want the grant hidden as %q", lock.Status.Holder, got, v1alpha1.ReasonValidityExpired)
	}
	if !s.endDecided || s.ended != "g1" {
		t.Fatalf("the reconcile did not end grant g1 (ended %q)", s.ended)
	}
	if h.Dropped() {
		t.Fatal("the Session stopped before the patch hiding its grant committed")
	}
	for _, f := range s.afterCommit { // the patch committed
		f(ctx)
	}
	if !h.Dropped() || set.Get(lock.UID) != nil {
		t.Error("the Session of the hidden grant still runs")
	}
	select {
	case <-h.Session.Done():
	case <-time.After(ttl):
		t.Error("the Session did not stop")
	}
	rec, _ := r.keys.record(lock.UID)
	if want := validity.Add(redlock.Drift(ttl)); rec.grantID != "g1" || rec.keysAt.Before(want) {
		t.Errorf("keys of %q left until %v, want g1's at %v or later", rec.grantID, rec.keysAt, want)
	}
	if got := testutil.ToFloat64(m.GrantsLost.WithLabelValues("ns", "l", v1alpha1.ReasonValidityExpired)); got != 1 {
		t.Errorf("losses counted %v, want 1", got)
	}
}
