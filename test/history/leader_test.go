package history_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/history"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
)

// validityTracker checks, over every status version watched, that a
// grant's shown validity never moves back and that status never stops
// showing a grant (or shows another) before the validity it showed passed
// (issue 18, case 3). It also feeds the history recorder.
type validityTracker struct {
	*recorder
	mu        sync.Mutex
	last      map[string]time.Time // uid/grantID → the latest validity shown
	hidden    map[string]bool      // uid/grantID → no longer shown
	current   map[string]string    // uid → the grant status shows (uid/grantID)
	decreases []string
	dropped   []string
}

func (t *validityTracker) record(cl string, l *v1alpha1.DistributedLock) {
	t.recorder.record(cl, l)
	st := l.Status
	if st.GrantID == "" {
		return
	}
	id := string(l.UID) + "/" + st.GrantID
	t.mu.Lock()
	defer t.mu.Unlock()
	if prev := t.current[string(l.UID)]; prev != "" && prev != id && !t.hidden[prev] {
		// Another grant replaced it without a version that hid it.
		t.hidden[prev] = true
		if st.AcquiredAt != nil && st.AcquiredAt.Before(t.last[prev]) {
			t.dropped = append(t.dropped, fmt.Sprintf("%s: grant %s replaced at %s while it showed valid until %s",
				l.Name, prev, st.AcquiredAt.UTC().Format(time.RFC3339Nano), t.last[prev].UTC().Format(time.RFC3339Nano)))
		}
	}
	t.current[string(l.UID)] = id
	switch {
	case st.Holder != nil && st.ValidUntil != nil:
		if last, ok := t.last[id]; ok && st.ValidUntil.Before(last) {
			t.decreases = append(t.decreases, fmt.Sprintf("%s: grant %s valid until %s, then %s",
				l.Name, st.GrantID, last.UTC().Format(time.RFC3339Nano), st.ValidUntil.UTC().Format(time.RFC3339Nano)))
		}
		if st.ValidUntil.After(t.last[id]) {
			t.last[id] = st.ValidUntil.Time
		}
	case !t.hidden[id]:
		t.hidden[id] = true
		if last, ok := t.last[id]; ok && st.ReleasedAt != nil && st.ReleasedAt.Before(last) {
			t.dropped = append(t.dropped, fmt.Sprintf("%s: grant %s hidden at %s while it showed valid until %s",
				l.Name, st.GrantID, st.ReleasedAt.UTC().Format(time.RFC3339Nano), last.UTC().Format(time.RFC3339Nano)))
		}
	}
}

// twoManagers starts an API server, a set of n masters whose maxLockTTL is
// maxTTL, and two manager processes with leader election (and args),
// stopped when the spec ends.
func twoManagers(n int, maxTTL time.Duration, args ...string) (*testenv.Env, string, *testenv.MasterSet, []*cluster) {
	logs := GinkgoT().TempDir()
	env := testenv.Start()
	DeferCleanup(env.Stop)
	kubeconfig := env.Kubeconfig(logs)
	ns := env.NewNamespace()
	ms := env.NewMasters(ns, "masters", n, maxTTL)
	managers := []*cluster{
		{name: "m1", env: env, kubeconfig: kubeconfig, logs: logs, ns: ns, args: args},
		{name: "m2", env: env, kubeconfig: kubeconfig, logs: logs, ns: ns, args: args},
	}
	for _, m := range managers {
		m.start()
		DeferCleanup(m.kill)
	}
	return env, ns, ms, managers
}

// createHeldLock creates lock-i on ms for the static holder "holder".
func createHeldLock(env *testenv.Env, ns string, ms *testenv.MasterSet, i int, ttl time.Duration) {
	Expect(env.Client.Create(env.Ctx, &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("lock-%d", i)},
		Spec:       v1alpha1.DistributedLockSpec{MasterSet: ms.Name, TTL: metav1.Duration{Duration: ttl}, HolderIdentity: "holder"},
	})).To(Succeed())
}

// leaderElectionID names the Lease cmd/manager elects its leader with.
const leaderElectionID = "redlock-operator.redlock.dev"

// leaseHolder returns the running manager of ms whose current log shows it
// acquired the leader Lease, or nil.
func leaseHolder(ms []*cluster) *cluster {
	for _, m := range ms {
		if m.hasExited() {
			continue
		}
		m.mu.Lock()
		starts := m.starts
		m.mu.Unlock()
		b, err := os.ReadFile(filepath.Join(m.logs, fmt.Sprintf("%s-manager-%d.log", m.name, starts)))
		if err == nil && strings.Contains(strings.ToLower(string(b)), "successfully acquired lease") {
			return m
		}
	}
	return nil
}

var _ = Describe("Two managers on one API server, the leader paused for longer than its Lease", func() {
	It("never moves a grant's validity back, and never hides a grant whose shown validity stands", func() {
		// Pauses alternate: longer than a standby takes to lead (2s Lease
		// + 4 × 220ms, cluster.start) but not the ttl, and longer than the
		// ttl too, so that the woken leader's Sessions have lapsed while
		// the new leader renews their grants.
		const (
			lockTTL = 6 * time.Second
			locks   = 8
		)
		pauses := []time.Duration{4 * time.Second, lockTTL + 1500*time.Millisecond}
		rounds := max(3, int(*durationFlag/(12*time.Second)))
		By("starting one API server, five masters and two manager processes with leader election")
		env, ns, ms, managers := twoManagers(5, lockTTL)
		for i := range locks {
			createHeldLock(env, ns, ms, i, lockTTL)
		}
		tracker := &validityTracker{
			recorder: newRecorder(),
			last:     map[string]time.Time{}, hidden: map[string]bool{}, current: map[string]string{},
		}
		stop := make(chan struct{})
		var watchers sync.WaitGroup
		watchers.Go(func() { watchLocks(managers[0], tracker, stop) })

		allHeld := func(g Gomega) {
			var list v1alpha1.DistributedLockList
			g.Expect(env.Client.List(env.Ctx, &list, client.InNamespace(ns))).To(Succeed())
			g.Expect(list.Items).To(HaveLen(locks))
			for _, l := range list.Items {
				g.Expect(l.Status.Holder).NotTo(BeNil(), "lock %s/%s has no holder", ns, l.Name)
				g.Expect(l.Status.ValidUntil.Time).To(BeTemporally(">", time.Now()), "lock %s/%s shows a validity that passed", ns, l.Name)
			}
		}
		// The Lease the managers elect their leader with.
		leaseKey := client.ObjectKey{Namespace: testenv.OperatorNamespace, Name: leaderElectionID}
		leaseHeld := func() (string, time.Time) {
			var l coordinationv1.Lease
			if err := env.Client.Get(env.Ctx, leaseKey, &l); err != nil || l.Spec.HolderIdentity == nil || l.Spec.RenewTime == nil {
				return "", time.Time{}
			}
			return *l.Spec.HolderIdentity, l.Spec.RenewTime.Time
		}
		// On a loaded machine the standby may not take the Lease within a
		// pause, and the woken leader renews it: such a round injected no
		// deposition and is tried again, up to twice the rounds.
		deposed := 0
		for round := 0; deposed < rounds && round < 2*rounds; round++ {
			pause := pauses[round%len(pauses)]
			for _, m := range managers {
				m.ensureRunning() // a leader that kept its Lease may have given it up since
			}
			By(fmt.Sprintf("round %d: every lock held, then the leader SIGSTOPped for %v", round+1, pause))
			Eventually(allHeld, 60*time.Second, 100*time.Millisecond).Should(Succeed(), "every one of the %d locks in %s to be held before round %d", locks, ns, round+1)
			var leader *cluster
			Eventually(func() *cluster { leader = leaseHolder(managers); return leader }, 30*time.Second).ShouldNot(BeNil(), "a manager to lead (hold Lease %s)", leaderElectionID)
			holder, _ := leaseHeld()
			leader.signal(syscall.SIGSTOP)
			time.Sleep(pause) // the pause is the fault being injected
			leader.signal(syscall.SIGCONT)
			woke := time.Now()

			By("the woken leader, deposed, exits and is started again as the standby; or it kept its Lease, the standby not having taken it")
			var outcome string
			Eventually(func() string {
				if leader.hasExited() {
					outcome = "exited"
				} else if h, renewed := leaseHeld(); holder != "" && h == holder && renewed.After(woke) {
					outcome = "kept"
				}
				return outcome
			}, 30*time.Second, 50*time.Millisecond).ShouldNot(BeEmpty(), "the deposed manager %s to exit, or to renew its Lease", leader.name)
			if outcome == "exited" {
				deposed++
				leader.start()
			}
		}
		for _, m := range managers {
			m.ensureRunning()
		}
		Expect(deposed).To(Equal(rounds), "pauses that deposed the leader in %d tries: the standby did not take the Lease in the others", 2*rounds)
		Eventually(allHeld, 60*time.Second, 100*time.Millisecond).Should(Succeed(), "every one of the %d locks in %s to be held after the rounds", locks, ns)
		close(stop)
		watchers.Wait()

		By("checking every status version watched")
		grants := tracker.all()
		table := fmt.Sprintf("\nleader pauses: %d rounds deposing the leader (of %v), %d status versions, %d grants of %d locks (%d granted again after a lapse); validity moved back %d times, grants hidden while valid %d\n",
			deposed, pauses, tracker.events, len(grants), locks, len(grants)-locks, len(tracker.decreases), len(tracker.dropped))
		fmt.Fprint(GinkgoWriter, table)
		_, _ = os.Stdout.WriteString(table)
		Expect(tracker.decreases).To(BeEmpty(), "a grant's validity moved back")
		Expect(tracker.dropped).To(BeEmpty(), "a grant was hidden or replaced while status showed it valid")
		Expect(history.Check(grants)).To(Succeed())
	})
})
