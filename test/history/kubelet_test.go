package history_test

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/harness/history"
	"github.com/redlock-operator/redlock-operator/internal/harness/podsim"
	"github.com/redlock-operator/redlock-operator/test/demo"
)

// graceFinalizer keeps a deleted pod in place, as its kubelet does during
// the pod's grace period; the schedule removes it.
const graceFinalizer = "test.redlock.dev/grace-period"

// node is the node the semaphores' pods are bound to.
const node = "node-1"

// podRun is what the kubelet knows of one of the schedule's pods.
type podRun struct {
	cluster *cluster
	name    string
	sem     string // the semaphore it waits for
	grace   bool   // it carries graceFinalizer
	deleted bool   // deleted by the schedule
	started bool   // its gate was seen lifted: it may run from run.Start
	bound   bool   // bound to the node and reported running
	stopped bool   // known to have stopped at run.End, or never to run
	run     history.Run
}

// kubelet plays the scheduler and the kubelet for the semaphores' pods
// (envtest has neither). A pod may run from the moment its scheduling
// gate is seen lifted: it is then bound and reported running. It stops
// only when the schedule says so — it finishes, or its containers are
// stopped in its grace period, or it is gone — and its end is recorded
// before the write that tells the operator. A pod deleted before it was
// seen ungated never runs (the scheduler binds no pod being deleted).
type kubelet struct {
	mu       sync.Mutex
	pods     map[string]*podRun // cluster/pod
	versions []version          // every pod version seen, for the report of a violation
	wg       sync.WaitGroup
}

func newKubelet() *kubelet { return &kubelet{pods: map[string]*podRun{}} }

// create creates a pod waiting for the semaphore sm, with a grace period
// (graceFinalizer) when grace.
func (k *kubelet) create(sm semSpec, name string, grace bool) (*podRun, error) {
	pod := podsim.Gated(sm.cluster.ns, name, map[string]string{v1alpha1.SemaphoreLabel: sm.name})
	if grace {
		pod.Finalizers = []string{graceFinalizer}
	}
	p := &podRun{cluster: sm.cluster, name: name, sem: sm.name, grace: grace}
	k.mu.Lock()
	k.pods[sm.cluster.name+"/"+name] = p
	k.mu.Unlock()
	return p, sm.cluster.env.Client.Create(sm.cluster.env.Ctx, pod)
}

// watch starts the pods of c's namespace whose gate is lifted, until stop
// is closed.
func (k *kubelet) watch(c *cluster, stop <-chan struct{}) {
	listWatch(c, func() client.ObjectList { return &corev1.PodList{} }, stop, func(o apiruntime.Object, deleted bool) {
		if pod, isPod := o.(*corev1.Pod); isPod && !deleted {
			k.seen(c, pod)
		}
	}, client.HasLabels{v1alpha1.SemaphoreLabel})
}

// seen starts a pod of the schedule's once its gate is lifted.
func (k *kubelet) seen(c *cluster, pod *corev1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.versions = append(k.versions, version{seen: time.Now(), lock: c.name + "/" + pod.Name, text: describePod(pod)})
	p := k.pods[c.name+"/"+pod.Name]
	if p == nil || p.started || p.stopped || demo.Gated(pod) {
		return
	}
	slot := pod.Labels[v1alpha1.LockLabel]
	p.started = true
	p.run = history.Run{
		Semaphore: c.name + "/" + p.sem, Pod: c.name + "/" + pod.Name,
		Slot: slot, Slots: slotsOf(p.sem, slot), Start: time.Now(),
	}
	if !pod.DeletionTimestamp.IsZero() {
		return // not bound (the API server binds no pod being deleted), yet it may run until gone
	}
	k.wg.Go(func() {
		if err := podsim.Run(c.env.Ctx, c.env.Client, pod, node); err != nil {
			fmt.Fprintf(GinkgoWriter, "kubelet: run pod %s/%s: %v\n", c.name, pod.Name, err)
			return
		}
		k.mu.Lock()
		p.bound = true
		k.mu.Unlock()
	})
}

// slotsOf is the number of slots of the slot lock named slot of the
// semaphore sem (<sem>-<slots>-<index>); 0 when it names none.
func slotsOf(sem, slot string) int {
	rest, ok := strings.CutPrefix(slot, sem+"-")
	if !ok {
		return 0
	}
	n, _ := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
	return n
}

// stop records that p's containers stopped (or will never run), now,
// before the write that tells the operator.
func (k *kubelet) stop(p *podRun) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopLocked(p)
}

func (k *kubelet) stopLocked(p *podRun) {
	if p.started && !p.stopped {
		p.run.End = time.Now()
	}
	p.stopped = true
}

// running are those of pods that may run and were not deleted.
func (k *kubelet) running(pods []*podRun) []*podRun {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(pods), func(p *podRun) bool { return !p.started || p.stopped || p.deleted })
}

// finishable are those of pods that run, bound and not deleted: Job pods
// that may finish.
func (k *kubelet) finishable(pods []*podRun) []*podRun {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(pods), func(p *podRun) bool { return !p.bound || p.stopped || p.deleted })
}

// finish stops p's containers and reports it Succeeded.
func (k *kubelet) finish(p *podRun) error {
	k.stop(p)
	return podsim.Finish(p.cluster.env.Ctx, p.cluster.env.Client, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.cluster.ns, Name: p.name}}, 0)
}

// remove deletes p at once (grace period 0): it is gone unless it carries
// graceFinalizer, and then runs on until endGrace. A pod never seen
// ungated never runs.
func (k *kubelet) remove(p *podRun) error {
	k.mu.Lock()
	p.deleted = true
	if !p.grace || !p.started {
		k.stopLocked(p)
	}
	k.mu.Unlock()
	return client.IgnoreNotFound(p.cluster.env.Client.Delete(p.cluster.env.Ctx,
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.cluster.ns, Name: p.name}}, client.GracePeriodSeconds(0)))
}

// inGrace reports whether p was deleted and may still run.
func (k *kubelet) inGrace(p *podRun) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return p.deleted && p.started && !p.stopped
}

// stopInGrace stops the containers of p, deleted in its grace period, and
// reports them terminated, as the kubelet does before it removes the pod;
// it reports whether it did (only for a pod bound and running).
func (k *kubelet) stopInGrace(p *podRun) (bool, error) {
	k.mu.Lock()
	can := p.bound && !p.stopped
	k.mu.Unlock()
	if !can {
		return false, nil
	}
	return true, k.finish(p)
}

// endGrace ends p's grace period: its containers stopped, its finalizer
// removed, the pod gone.
func (k *kubelet) endGrace(p *podRun) error {
	k.stop(p)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &corev1.Pod{}
		if err := p.cluster.env.Client.Get(p.cluster.env.Ctx, client.ObjectKey{Namespace: p.cluster.ns, Name: p.name}, cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		if !slices.Contains(cur.Finalizers, graceFinalizer) {
			return nil
		}
		cur.Finalizers = slices.DeleteFunc(cur.Finalizers, func(f string) bool { return f == graceFinalizer })
		return client.IgnoreNotFound(p.cluster.env.Client.Update(p.cluster.env.Ctx, cur))
	})
}

// runs are the runs of the pods seen ungated; a pod still running ends
// now.
func (k *kubelet) runs() []history.Run {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := time.Now()
	var out []history.Run
	for _, id := range slices.Sorted(maps.Keys(k.pods)) {
		p := k.pods[id]
		if !p.started {
			continue
		}
		r := p.run
		if !p.stopped {
			r.End = now
		}
		out = append(out, r)
	}
	return out
}

// explain prints the runs of the semaphore of a violation and what the
// watches saw of its pods and its slots' locks, from 10s before the
// violation to 10s after.
func (k *kubelet) explain(sem string, at time.Time, locks *recorder) {
	from, to := at.Add(-10*time.Second), at.Add(10*time.Second)
	var b strings.Builder
	fmt.Fprintf(&b, "\n== the runs of the pods of semaphore %s (start, end, pod, slot)\n", sem)
	runs := k.runs()
	slices.SortFunc(runs, func(x, y history.Run) int { return x.Start.Compare(y.Start) })
	for _, r := range runs {
		if r.Semaphore == sem && !r.End.Before(from) && !r.Start.After(to) {
			fmt.Fprintf(&b, "%s %s %s %s\n", r.Start.UTC().Format("15:04:05.000000"), r.End.UTC().Format("15:04:05.000000"), r.Pod, r.Slot)
		}
	}
	fmt.Fprintf(&b, "== what the watches saw of its pods and its slots' locks (seen time, object, version)\n")
	var vs []version
	k.mu.Lock()
	vs = append(vs, k.versions...)
	k.mu.Unlock()
	locks.mu.Lock()
	vs = append(vs, locks.versions...)
	locks.mu.Unlock()
	slices.SortStableFunc(vs, func(x, y version) int { return x.seen.Compare(y.seen) })
	for _, v := range vs {
		if strings.HasPrefix(v.lock, sem+"-") && !v.seen.Before(from) && !v.seen.After(to) {
			fmt.Fprintf(&b, "%s %s %s\n", v.seen.UTC().Format("15:04:05.000000"), v.lock, v.text)
		}
	}
	fmt.Fprint(GinkgoWriter, b.String())
	fmt.Print(b.String())
}

// describePod is one line of a pod's version.
func describePod(p *corev1.Pod) string {
	deleting := "-"
	if p.DeletionTimestamp != nil {
		deleting = p.DeletionTimestamp.UTC().Format("15:04:05")
	}
	return fmt.Sprintf("uid %.8s rv %s lock %q gated %t token %q node %q phase %s deleting %s finalizers %v",
		p.UID, p.ResourceVersion, p.Labels[v1alpha1.LockLabel], demo.Gated(p), p.Annotations[v1alpha1.FencingTokenAnnotation],
		p.Spec.NodeName, p.Status.Phase, deleting, p.Finalizers)
}

// mostAtOnce is, per semaphore, the most pods that could run at once.
func mostAtOnce(runs []history.Run) map[string]int {
	type edge struct {
		at    time.Time
		delta int
	}
	edges := map[string][]edge{}
	for _, r := range runs {
		edges[r.Semaphore] = append(edges[r.Semaphore], edge{r.Start, 1}, edge{r.End, -1})
	}
	most := map[string]int{}
	for sem, es := range edges {
		// An end before a start at one instant: windows that touch do not
		// overlap.
		slices.SortFunc(es, func(x, y edge) int {
			if c := x.at.Compare(y.at); c != 0 {
				return c
			}
			return x.delta - y.delta
		})
		n := 0
		for _, e := range es {
			n += e.delta
			most[sem] = max(most[sem], n)
		}
	}
	return most
}
