package history_test

import (
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

var _ = Describe("Two managers on one API server, the leader stopped with locks held", func() {
	It("SIGKILL: the standby adopts every lock before its status lapses, when the ttl is at least twice the failover slack", func() {
		// The managers' Lease (cluster.start: 2s, retry 200ms) gives a
		// failover slack of 2s + 4 × 220ms + 2s = 4.88s: status keeps
		// that much validity ahead of a lock with a 10s ttl. Without it
		// (a tenth of the ttl, 1s) a lock whose refresh is due lapses
		// before the standby leads, and is granted again.
		failover(syscall.SIGKILL)
	})

	It("SIGTERM: the stopping leader refreshes the locks the standby could not adopt in time, before it releases its Lease", func() {
		// A retry period of 1s: the standby takes the released Lease up to
		// 2.2s later, more than the lead of a 10s ttl (1s; the failover
		// slack, 3s + 4.4s + 2s, is more than half the ttl). Without the
		// stopping leader's refreshes a lock whose refresh is due lapses
		// meanwhile, and is granted again.
		failover(syscall.SIGTERM, "--leader-elect-lease-duration=3s", "--leader-elect-renew-deadline=2s", "--leader-elect-retry-period=1s")
	})
})

// failover runs 20 locks at ttl 10s, spread over the refresh cycle, on two
// manager processes (with args), stops the leader with sig, and checks that
// the standby adopted every lock without a lapse: none granted again, no
// Lost or StatusWriteLate event.
func failover(sig syscall.Signal, args ...string) {
	const (
		lockTTL = 10 * time.Second
		locks   = 20
	)
	By("starting one API server, three masters and two manager processes with leader election")
	env, ns, ms, managers := twoManagers(3, lockTTL, args...)
	env.WaitServing(ms, time.Minute)

	By("creating the locks one by one over a ttl, so that at any instant some lock's shown validity is near the least the schedule lets it get")
	tick := time.NewTicker(lockTTL / locks)
	defer tick.Stop()
	for i := range locks {
		createHeldLock(env, ns, ms, i, lockTTL)
		<-tick.C // spreading the grants over the refresh cycle is the setup, not a wait for anything
	}
	list := func(g Gomega) []v1alpha1.DistributedLock {
		var l v1alpha1.DistributedLockList
		g.Expect(env.Client.List(env.Ctx, &l, client.InNamespace(ns))).To(Succeed())
		g.Expect(l.Items).To(HaveLen(locks))
		return l.Items
	}

	By("waiting until every lock has been refreshed at least once, so that their shown validities spread over the refresh cycle")
	grants := map[string]string{} // lock → grant ID/token
	Eventually(func(g Gomega) {
		for _, l := range list(g) {
			g.Expect(l.Status.Holder).NotTo(BeNil(), "lock %s/%s has no holder", ns, l.Name)
			g.Expect(l.Status.RenewedAt.After(l.Status.AcquiredAt.Time)).To(BeTrue(), "lock %s/%s not refreshed yet", ns, l.Name)
			grants[l.Name] = fmt.Sprintf("%s/%d", l.Status.GrantID, l.Status.FencingToken)
		}
	}, 60*time.Second, 100*time.Millisecond).Should(Succeed(), "every one of the %d locks in %s to be held and refreshed once", locks, ns)
	var leader *cluster
	Eventually(func() *cluster { leader = leaseHolder(managers); return leader }, 30*time.Second).ShouldNot(BeNil(), "a manager to lead (hold Lease %s)", leaderElectionID)
	var ahead []time.Duration // validity each lock's status shows ahead
	for _, l := range list(Default) {
		ahead = append(ahead, time.Until(l.Status.ValidUntil.Time).Round(time.Millisecond))
	}
	slices.Sort(ahead)
	fmt.Fprintf(GinkgoWriter, "validity shown ahead when the leader is stopped: %v\n", ahead)

	By(fmt.Sprintf("sending the leader %s %v", leader.name, sig))
	stopped := time.Now()
	leader.signal(sig)

	By("waiting until the standby has refreshed every lock")
	Eventually(func(g Gomega) {
		for _, l := range list(g) {
			g.Expect(l.Status.Holder).NotTo(BeNil(), "lock %s/%s has no holder", ns, l.Name)
			g.Expect(l.Status.RenewedAt.After(stopped)).To(BeTrue(), "lock %s/%s not refreshed since the leader was stopped", ns, l.Name)
		}
		g.Expect(leader.hasExited()).To(BeTrue(), "the stopped leader %s has not exited", leader.name)
	}, 60*time.Second, 100*time.Millisecond).Should(Succeed(), "every lock in %s to be refreshed by the new leader once leader %s was stopped", ns, leader.name)
	took := time.Since(stopped)

	var regranted []string
	for _, l := range list(Default) {
		if now := fmt.Sprintf("%s/%d", l.Status.GrantID, l.Status.FencingToken); now != grants[l.Name] {
			regranted = append(regranted, fmt.Sprintf("%s: %s, then %s", l.Name, grants[l.Name], now))
		}
	}
	var lapses []string
	for i := range locks {
		name := fmt.Sprintf("lock-%d", i)
		for _, r := range env.EventReasons(ns, name) {
			if slices.Contains([]string{"Lost", "StatusWriteLate"}, r) {
				lapses = append(lapses, name+": "+r)
			}
		}
	}
	table := fmt.Sprintf("\nleader %v: %d locks at ttl %v, least validity shown ahead %v; every lock refreshed since %v later; granted again %d, Lost or StatusWriteLate events %d\n",
		sig, locks, lockTTL, ahead[0], took.Round(time.Millisecond), len(regranted), len(lapses))
	fmt.Fprint(GinkgoWriter, table)
	_, _ = os.Stdout.WriteString(table)
	Expect(regranted).To(BeEmpty(), "locks granted again after the failover: their status lapsed before the standby adopted them")
	Expect(lapses).To(BeEmpty(), "locks whose status lapsed")
}
