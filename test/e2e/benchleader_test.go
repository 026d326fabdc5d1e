//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

// The operator's leader SIGKILLed while agents run (make
// bench-failover-pods).

const (
	managerNamespace = "redlock-system"
	managerLease     = "redlock-operator.redlock.dev" // cmd/manager's LeaderElectionID
	// managerLeaseDuration is the manager's --leader-elect-lease-duration
	// (its default: config/local-cluster does not set it).
	managerLeaseDuration = 8 * time.Second
)

// readyManagers are the manager pods that run, are Ready and are not on
// their way out.
func readyManagers() ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace(managerNamespace), client.MatchingLabels{"control-plane": "controller-manager"}); err != nil {
		return nil, err
	}
	var ready []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].Ready {
			ready = append(ready, p)
		}
	}
	return ready, nil
}

// leaseHolder is the holder of the manager's Lease and whether it renewed
// it within the lease duration.
func leaseHolder() (string, bool, error) {
	l := &coordinationv1.Lease{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: managerNamespace, Name: managerLease}, l); err != nil {
		return "", false, err
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return "", false, nil
	}
	fresh := l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) < managerLeaseDuration
	return *l.Spec.HolderIdentity, fresh, nil
}

// leaderPod is the manager pod that holds the Lease, and the Lease's
// holder identity. The manager runs on the host network, so its identity
// starts with the node's host name, not the pod's: the one Ready manager
// pod is the leader (config/local-cluster runs one); of several, the one whose
// current container logged that it acquired the Lease.
func leaderPod() (*corev1.Pod, string, error) {
	holder, fresh, err := leaseHolder()
	if err != nil {
		return nil, "", err
	}
	if !fresh {
		return nil, "", fmt.Errorf("lease %s/%s: holder %q has not renewed it within %v", managerNamespace, managerLease, holder, managerLeaseDuration)
	}
	ready, err := readyManagers()
	if err != nil {
		return nil, "", err
	}
	var leading []corev1.Pod
	for _, p := range ready {
		logs := filepath.Join("/var/log/pods", fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), p.Status.ContainerStatuses[0].Name,
			strconv.Itoa(int(p.Status.ContainerStatuses[0].RestartCount))+".log")
		if data, err := os.ReadFile(logs); err == nil && strings.Contains(string(data), "acquired lease") { //nolint:gosec // the kubelet's log of a manager pod
			leading = append(leading, p)
		}
	}
	switch {
	case len(ready) == 1:
		return &ready[0], holder, nil
	case len(leading) == 1:
		return &leading[0], holder, nil
	default:
		return nil, "", fmt.Errorf("%d manager pods Ready, %d of them logged that they acquired the Lease", len(ready), len(leading))
	}
}

// killedApp is one agent-run app the leader kills are measured on.
type killedApp struct {
	app     string
	lockTTL time.Duration
	lock    *v1alpha1.DistributedLock
	d       *appsv1.Deployment
	// per round
	before     int
	validUntil time.Time
	// results
	longest, toStop       []time.Duration
	stopped, grantedAgain int
}

// current is nil when a's lock is held for the pod whose app runs, its
// validity shown is later than after (if set), and its app runs.
func (a *killedApp) current(after time.Time) error {
	periods := activePeriods(a.app)
	if len(periods) == 0 || periods[len(periods)-1].Stop != 0 {
		return fmt.Errorf("no app of %s runs", a.app)
	}
	l := &v1alpha1.DistributedLock{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(a.lock), l); err != nil {
		return err
	}
	if !held(l) || l.Status.Holder.Pod == nil || l.Status.Holder.Pod.Name != periods[len(periods)-1].Pod || l.Status.ValidUntil == nil {
		return fmt.Errorf("lock %s is not held for %s, whose app runs", a.app, periods[len(periods)-1].Pod)
	}
	if !l.Status.ValidUntil.After(after) {
		return fmt.Errorf("lock %s: the validity shown (%s) is not past %s", a.app, l.Status.ValidUntil.Format(time.StampMilli), after.Format(time.StampMilli))
	}
	return nil
}

// killLeader SIGKILLs the operator's leader n times while two agent-run
// Deployments hold their locks, one at the suite's ttl (4s, below twice
// the failover slack: a crash may lapse it) and one at longTTL (above:
// a crash must not), and measures how long no app of each ran.
//
// The leader's container process is killed from the host (its PID from
// containerd), and its pod then deleted at once (grace 0) so that the
// Deployment replaces it: the kubelet would otherwise restart the same
// container in place with its crash-loop back-off (10 s, 20 s, 40 s … 5
// min), which after a few rounds would measure the back-off, not the
// failover. A new pod starts in about the time a restart takes, well
// within the lease duration the new process waits out anyway.
func killLeader(n int) {
	apps := []*killedApp{{app: "bench-leader-4s", lockTTL: ttl}, {app: "bench-leader-30s", lockTTL: longTTL}}
	for i, a := range apps {
		resetActive(a.app)
		set := "masters"
		if a.lockTTL > ttl {
			set = longSetName
		}
		a.lock = lockOn(a.app, set, a.lockTTL)
		Expect(k8s.Create(ctx, a.lock)).To(Succeed())
		removeAfterSpec(a.lock)
		a.d = agentDeployment(a.app, agentTemplate(a.app, a.app, int64(23474+i)))
	}
	for _, a := range apps {
		Eventually(func() error { _, err := running(a.app, a.d); return err }, 3*time.Minute, 200*time.Millisecond).Should(Succeed(), "app %s of lock %s to run", a.app, a.lock.Name)
	}

	var toLeader, toRecovered []time.Duration
	deleteErrs := 0 // a pod not deleted after its kill: the round goes on
	errs := rounds("leader kill", n, func(i int) error {
		var leader *corev1.Pod
		var oldID string
		err := poll(3*time.Minute, 200*time.Millisecond, func() (err error) {
			for _, a := range apps {
				if err := a.current(time.Time{}); err != nil {
					return err
				}
			}
			leader, oldID, err = leaderPod()
			return err
		})
		if err != nil {
			return fmt.Errorf("not steady: %w", err)
		}
		for _, a := range apps {
			a.before = len(activePeriods(a.app))
			l := &v1alpha1.DistributedLock{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(a.lock), l)).To(Succeed())
			a.validUntil = l.Status.ValidUntil.Time
		}
		killed := uptimeNow()
		if _, err := demo.KillContainer(ctx, state, leader); err != nil {
			return fmt.Errorf("SIGKILL %s: %w", leader.Name, err)
		}
		if err := k8s.Delete(ctx, leader, client.GracePeriodSeconds(0)); err != nil {
			deleteErrs++
			GinkgoWriter.Printf("leader kill %d: deleting %s after the kill: %v (the kubelet restarts it in place)\n", i, leader.Name, err)
		}
		var leaderAt float64
		err = poll(3*time.Minute, 50*time.Millisecond, func() error {
			if leaderAt == 0 {
				holder, fresh, err := leaseHolder()
				if err != nil {
					return err
				}
				if holder == oldID || !fresh {
					return errors.New("no new leader yet")
				}
				leaderAt = uptimeNow()
			}
			ready, err := readyManagers()
			if err != nil {
				return err
			}
			if len(ready) == 0 || (len(ready) == 1 && ready[0].Name == leader.Name) {
				return errors.New("no new manager pod Ready yet")
			}
			for _, a := range apps {
				if err := a.current(a.validUntil); err != nil {
					return err
				}
			}
			return nil
		})
		recovered := uptimeNow()
		if err != nil {
			return fmt.Errorf("not recovered within 3 minutes: %w", err)
		}
		toLeader = append(toLeader, seconds(leaderAt-killed))
		toRecovered = append(toRecovered, seconds(recovered-killed))
		for _, a := range apps {
			periods := activePeriods(a.app)
			was := periods[a.before-1]
			var longest float64
			for k := a.before; k < len(periods); k++ {
				longest = max(longest, periods[k].Start-periods[k-1].Stop)
			}
			if was.Stop != 0 {
				a.stopped++
				a.toStop = append(a.toStop, seconds(was.Stop-killed))
				GinkgoWriter.Printf("leader kill %d: the app of %s (pod %s, token %s) stopped %.2fs after the kill; %d periods since\n",
					i, a.app, was.Pod, was.Token, was.Stop-killed, len(periods)-a.before)
			}
			if last := periods[len(periods)-1]; last.Token != was.Token {
				a.grantedAgain++
			}
			a.longest = append(a.longest, seconds(longest))
		}
		return nil
	})
	errs += deleteErrs

	GinkgoWriter.Printf("\nthe operator's leader SIGKILLed while agent-run Deployments (2 replicas each) hold their locks, %d kills, %d errors (manager: one replica, lease 8s / renew 6s / retry 1s, failover slack 14.4s):\n\n", len(toLeader), errs)
	rows := []quantileRow{
		{"SIGKILL → a new leader holds the Lease", toLeader},
		{"SIGKILL → recovered: new manager Ready, both locks refreshed or granted again, both apps run", toRecovered},
	}
	for _, a := range apps {
		rows = append(rows, quantileRow{fmt.Sprintf("ttl %v: longest time no app runs (app stopped in %d of %d rounds, granted again in %d)", a.lockTTL, a.stopped, len(a.longest), a.grantedAgain), a.longest})
		if a.stopped > 0 {
			rows = append(rows, quantileRow{fmt.Sprintf("ttl %v: SIGKILL → the app stopped (rounds where it did)", a.lockTTL), a.toStop})
		}
	}
	printQuantiles(rows)
	for _, a := range apps {
		Expect(overlaps(activePeriods(a.app))).To(BeEmpty(), "two apps of %s active at once", a.app)
	}
}
