package lockclient_test

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/pkg/lockclient"
)

func newClient(identity string) *lockclient.Client {
	c, err := client.NewWithWatch(env.Cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return lockclient.New(c, lockclient.WithIdentity(identity))
}

func acquire(cl *lockclient.Client, key types.NamespacedName) *lockclient.Grant {
	ctx, cancel := context.WithTimeout(env.Ctx, time.Minute)
	defer cancel()
	g, err := cl.Acquire(ctx, key)
	Expect(err).NotTo(HaveOccurred(), "acquire lock %s", key)
	return g
}

var _ = Describe("Acquire and Release in a process", func() {
	It("grants a fencing token, renews the lease past several leases, and gives the lock back on Release", func() {
		key := newLock("in-process", 3*time.Second)
		g := acquire(newClient("worker"), key)
		Expect(g.Token).To(BeNumerically(">", 0))
		Expect(g.Err()).To(Succeed())
		Expect(g.Deadline()).To(BeTemporally(">", time.Now()))
		l := getLock(key)
		Expect(l.Spec.HolderIdentity).To(Equal(g.Holder), "the request is the grant's holder name")
		Expect(l.Status.Holder.Identity).To(Equal(g.Holder))

		By("renewing the lease in the lock's LockHeartbeat, so that the operator keeps the grant past two leases")
		heartbeat := func() *v1alpha1.LockHeartbeat {
			hb := &v1alpha1.LockHeartbeat{}
			Expect(env.Client.Get(env.Ctx, key, hb)).To(Succeed())
			return hb
		}
		var first time.Time
		Eventually(func(g2 Gomega) {
			hb := heartbeat()
			g2.Expect(hb.Spec.HolderIdentity).To(Equal(g.GrantID))
			g2.Expect(hb.Spec.RenewTime).NotTo(BeNil())
			first = hb.Spec.RenewTime.Time
		}).Should(Succeed(), "LockHeartbeat %s to be renewed for grant %s", key, g.GrantID)
		Eventually(func(g2 Gomega) {
			g2.Expect(heartbeat().Spec.RenewTime.Time).To(BeTemporally(">", first.Add(7*time.Second)))
		}).WithTimeout(30*time.Second).Should(Succeed(), "LockHeartbeat %s to be renewed for over two leases", key)
		st := getLock(key).Status
		Expect(st.GrantID).To(Equal(g.GrantID), "the operator still shows the grant")
		Expect(st.EndedRequest).To(BeNil())
		Expect(g.Err()).To(Succeed())

		By("releasing: Done first, then the request withdrawn and the lock free")
		Expect(g.Release(env.Ctx)).To(Succeed())
		Expect(g.Done()).To(BeClosed())
		Expect(g.Err()).To(MatchError(lockclient.ErrReleased))
		Expect(g.Deadline().IsZero()).To(BeTrue(), "no deadline once released")
		Expect(getLock(key).Spec.HolderIdentity).To(BeEmpty())
		Eventually(func(g2 Gomega) {
			st := getLock(key).Status
			g2.Expect(st.Holder).To(BeNil())
			held := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHeld)
			g2.Expect(held).NotTo(BeNil())
			g2.Expect(held.Reason).To(BeElementOf(v1alpha1.ReasonReleased, v1alpha1.ReasonNotRequested),
				"the holder's own release (its word), not someone else's change of its request")
		}).Should(Succeed(), "lock %s to show no holder after Release", key)
	})

	It("ends the grant by its own count of the lease when its renewals fail, though the operator saw them, and withdraws the request", func() {
		key := newLock("renewals-fail", 3*time.Second)
		var failing atomic.Bool
		c, err := client.NewWithWatch(env.Cfg, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		// A renewal that reaches the API server but whose answer is lost:
		// written, then reported failed. Whether it is lost is decided when
		// it is sent: the renewal the spec waits for below is answered even
		// when its answer comes back after failing is set (under load it
		// can), so that the client counts its lease from it.
		lossy := interceptor.NewClient(c, interceptor.Funcs{
			Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				lose := failing.Load()
				err := c.Update(ctx, obj, opts...)
				if _, ok := obj.(*v1alpha1.LockHeartbeat); ok && err == nil && lose {
					return apierrors.NewServiceUnavailable("the test lost the answer")
				}
				return err
			},
		})
		g := acquire(lockclient.New(lossy, lockclient.WithIdentity("lossy")), key)
		Eventually(func(g2 Gomega) {
			hb := &v1alpha1.LockHeartbeat{}
			g2.Expect(env.Client.Get(env.Ctx, key, hb)).To(Succeed())
			g2.Expect(hb.Spec.HolderIdentity).To(Equal(g.GrantID))
		}).Should(Succeed(), "LockHeartbeat %s to be renewed once for grant %s", key, g.GrantID)

		By("losing the answer of every renewal from now on")
		failing.Store(true)
		Eventually(g.Done()).WithTimeout(30*time.Second).Should(BeClosed(), "the grant of lock %s to end once no renewal was confirmed for a lease", key)
		Expect(g.Err()).To(MatchError(lockclient.ErrExpired))
		Expect(g.Err().Error()).To(ContainSubstring("lease of " + key.String() + " not renewed in time"))
		Expect(g.Err().Error()).To(ContainSubstring("the test lost the answer"), "the renewal's failure is told")
		Expect(g.Deadline().IsZero()).To(BeTrue())

		By("withdrawing the request of the grant that ended, so that the lock passes on")
		Eventually(func(g2 Gomega) {
			l := getLock(key)
			g2.Expect(l.Spec.HolderIdentity).To(BeEmpty())
		}).Should(Succeed(), "the ended grant's request on lock %s to be withdrawn", key)
		Expect(env.EventReasons(ns, key.Name)).NotTo(ContainElement(v1alpha1.ReasonLeaseExpired), "the operator saw the renewals: it did not end the grant")
	})

	It("refuses a lock without a lease or that does not exist, and changes nothing", func() {
		key := newLock("no-lease", 0)
		_, err := newClient("worker").Acquire(env.Ctx, key)
		Expect(err).To(MatchError(lockclient.ErrNoLease))
		l := getLock(key)
		Expect(l.Spec.HolderIdentity).To(BeEmpty(), "nothing asked")
		Expect(l.Generation).To(Equal(int64(1)), "the spec never changed")
		_, err = newClient("worker").Acquire(env.Ctx, types.NamespacedName{Namespace: ns, Name: "missing"})
		Expect(err).To(MatchError(lockclient.ErrLockNotFound))
	})

	It("withdraws its own request when its wait ends after asking", func() {
		key := newLockOn("never-granted", "no-such-masters", 3*time.Second)
		ctx, cancel := context.WithCancel(env.Ctx)
		defer cancel()
		failed := make(chan error, 1)
		go func() {
			_, err := newClient("impatient").Acquire(ctx, key)
			failed <- err
		}()
		Eventually(func(g Gomega) {
			g.Expect(getLock(key).Spec.HolderIdentity).To(HavePrefix("impatient-"))
		}).Should(Succeed(), "the client to ask for lock %s", key)
		cancel()
		var err error
		Eventually(failed).Should(Receive(&err), "Acquire of lock %s to return once its context ended", key)
		Expect(err).To(MatchError(context.Canceled))
		Eventually(func(g Gomega) {
			g.Expect(getLock(key).Spec.HolderIdentity).To(BeEmpty())
		}).Should(Succeed(), "the request on lock %s to be withdrawn", key)
	})

	It("waits while another holds the lock without touching its request, and is granted once it releases", func() {
		key := newLock("busy", 3*time.Second)
		holder := acquire(newClient("first"), key)
		DeferCleanup(func() { _ = holder.Release(env.Ctx) })
		ctx, cancel := context.WithTimeout(env.Ctx, 2*time.Second)
		defer cancel()
		_, err := newClient("second").Acquire(ctx, key)
		Expect(err).To(MatchError(context.DeadlineExceeded))
		Expect(getLock(key).Spec.HolderIdentity).To(Equal(holder.Holder))
		Expect(holder.Err()).To(Succeed())

		By("being granted once the holder releases")
		done := make(chan *lockclient.Grant, 1)
		go func() {
			defer GinkgoRecover()
			done <- acquire(newClient("second"), key)
		}()
		Expect(holder.Release(env.Ctx)).To(Succeed())
		var next *lockclient.Grant
		Eventually(done).WithTimeout(time.Minute).Should(Receive(&next), "the second client to be granted lock %s", key)
		Expect(next.Token).To(BeNumerically(">", holder.Token))
		Expect(next.Release(env.Ctx)).To(Succeed())
	})
})

var _ = Describe("Processes contending through the API server", func() {
	It("hold the lock one at a time, with increasing tokens, and every write is accepted", func() {
		key := newLock("contended", 3*time.Second)
		f := newFenced()
		a := start("a", kubeconfig, key, f, 2*time.Second)
		b := start("b", kubeconfig, key, f, 2*time.Second)
		for _, p := range []*proc{a, b} {
			Eventually(p.exited).WithTimeout(2*time.Minute).Should(BeClosed(), "process %s to hold lock %s and finish", p.name, key)
			Expect(p.err).NotTo(HaveOccurred(), "process %s exit status", p.name)
			_, released := p.first("released")
			Expect(released).To(BeTrue(), "process %s released the lock", p.name)
		}
		writes := f.log()
		Expect(writes).NotTo(BeEmpty())
		runs, tokens := 1, map[string]int64{}
		for i, w := range writes {
			Expect(w.accepted).To(BeTrue(), "write %d (token %d by %s) accepted", i, w.token, w.writer)
			if i > 0 && w.writer != writes[i-1].writer {
				runs++
				Expect(w.token).To(BeNumerically(">", writes[i-1].token), "the next holder's token is larger")
			}
			if t, ok := tokens[w.writer]; ok {
				Expect(w.token).To(Equal(t), "one grant, one token, per process")
			}
			tokens[w.writer] = w.token
		}
		Expect(runs).To(Equal(2), "the writes of one holder, then of the other: never interleaved")
	})

	It("close Done of a process cut off from the API server before the other is granted", func() {
		key := newLock("cut-off", 3*time.Second)
		f := newFenced()
		kc, proxy := proxiedKubeconfig()
		a := start("a", kc, key, f, 10*time.Minute)
		a.eventually("write", time.Minute)
		b := start("b", kubeconfig, key, f, time.Second)

		By("cutting process a off from the API server")
		Expect(proxy.Stall()).To(Succeed())
		done := a.eventually("done", time.Minute)
		Expect(done.fields["reason"]).To(ContainSubstring("deadline passed"))
		granted := b.eventually("granted", 2*time.Minute)
		Expect(done.at).To(BeTemporally("<", granted.at), "process a's Done closed before process b was granted")
		Eventually(b.exited).WithTimeout(time.Minute).Should(BeClosed(), "process b to finish")
		for i, w := range f.log() {
			Expect(w.accepted).To(BeTrue(), "write %d (token %d by %s) accepted", i, w.token, w.writer)
		}
	})

	It("keep the next process waiting until the deadline of a process cut off from the API server whose request someone else cleared", func() {
		key := newLockOn("cut-off-cleared", ms.Name, 30*time.Second)
		f := newFenced()
		kc, proxy := proxiedKubeconfig()
		a := start("a", kc, key, f, 10*time.Minute)
		a.eventually("write", time.Minute)

		By("cutting process a off from the API server, then clearing its request as kubectl redlock handover does")
		Expect(proxy.Stall()).To(Succeed())
		Eventually(func() error {
			l := getLock(key)
			next := l.DeepCopy()
			next.Spec.HolderIdentity = ""
			return env.Client.Patch(env.Ctx, next, client.MergeFromWithOptions(l, client.MergeFromWithOptimisticLock{}))
		}).Should(Succeed(), "lock %s to take the cleared request", key)
		b := start("b", kubeconfig, key, f, time.Second)
		granted := b.eventually("granted", 2*time.Minute)
		done := a.eventually("done", time.Minute)
		Expect(done.at).To(BeTemporally("<", granted.at), "process a's Done closed before process b was granted")
		Eventually(b.exited).WithTimeout(time.Minute).Should(BeClosed(), "process b to finish")
		for i, w := range f.log() {
			Expect(w.accepted).To(BeTrue(), "write %d (token %d by %s) accepted", i, w.token, w.writer)
		}
	})

	It("show a process paused past its lease that its grant ended before it acts again, and the fenced resource refuses its token", func() {
		key := newLock("paused", 3*time.Second)
		f := newFenced()
		a := start("a", kubeconfig, key, f, 10*time.Minute)
		ga := a.eventually("granted", time.Minute)
		a.eventually("write", time.Minute)

		By("pausing process a (SIGSTOP) until process b held the lock and wrote")
		Expect(a.cmd.Process.Signal(syscall.SIGSTOP)).To(Succeed())
		stopped := time.Now()
		b := start("b", kubeconfig, key, f, time.Second)
		gb := b.eventually("granted", 2*time.Minute)
		Expect(strconv.ParseInt(gb.fields["token"], 10, 64)).To(BeNumerically(">", must(strconv.ParseInt(ga.fields["token"], 10, 64))))
		Eventually(b.exited).WithTimeout(time.Minute).Should(BeClosed(), "process b to hold lock %s, write and finish", key)

		By("resuming process a (SIGCONT): its grant is over before it acts")
		resumed := time.Now()
		Expect(a.cmd.Process.Signal(syscall.SIGCONT)).To(Succeed())
		Eventually(a.exited).WithTimeout(time.Minute).Should(BeClosed(), "process a to stop once resumed")
		d, ok := a.first("done")
		Expect(ok).To(BeTrue(), "process a saw its grant end")
		Expect(d.at).To(BeTemporally(">", stopped), "it saw the end after the pause")
		for _, e := range a.Events() {
			if e.name != "write" {
				continue
			}
			sent, err := strconv.ParseInt(e.fields["sent"], 10, 64)
			Expect(err).NotTo(HaveOccurred())
			if time.Unix(0, sent).After(resumed) {
				Expect(e.fields["status"]).NotTo(Equal("accepted"), "a write process a began after the pause succeeded")
			}
		}
		var bWrote bool
		for _, w := range f.log() {
			bWrote = bWrote || w.writer == gb.fields["holder"]
			Expect(bWrote && w.writer == ga.fields["holder"] && w.accepted).To(BeFalse(), "a write of process a accepted after process b's")
		}
		Expect(bWrote).To(BeTrue(), "process b wrote")

		By("refusing process a's token at the fenced resource: a write sent before the pause, arriving late")
		resp, err := http.Post(f.url+"?writer=a-late&token="+ga.fields["token"], "text/plain", nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Body.Close()).To(Succeed())
		Expect(resp.StatusCode).To(Equal(http.StatusConflict))
	})
})

func must[T any](v T, err error) T {
	Expect(err).NotTo(HaveOccurred())
	return v
}
