package lockclient_test

import (
	"context"
	"net/http"
	"strconv"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
		l := getLock(key)
		Expect(l.Spec.HolderIdentity).To(Equal(g.Holder), "the request is the grant's holder name")
		Expect(l.Status.Holder.Identity).To(Equal(g.Holder))

		By("renewing the lease in the lock's LockHeartbeat")
		Eventually(func(g2 Gomega) {
			hb := &v1alpha1.LockHeartbeat{}
			g2.Expect(env.Client.Get(env.Ctx, key, hb)).To(Succeed())
			g2.Expect(hb.Spec.HolderIdentity).To(Equal(g.GrantID))
		}).Should(Succeed(), "LockHeartbeat %s to be renewed for grant %s", key, g.GrantID)
		Consistently(g.Err).WithTimeout(7*time.Second).WithPolling(100*time.Millisecond).Should(Succeed(),
			"the grant of lock %s to last over two leases, renewed", key)
		Expect(getLock(key).Status.FencingToken).To(Equal(g.Token), "the same grant")

		By("releasing: Done first, then the request withdrawn and the lock free")
		Expect(g.Release(env.Ctx)).To(Succeed())
		Expect(g.Done()).To(BeClosed())
		Expect(g.Err()).To(MatchError(lockclient.ErrReleased))
		Expect(getLock(key).Spec.HolderIdentity).To(BeEmpty())
		Eventually(func(g2 Gomega) {
			g2.Expect(getLock(key).Status.Holder).To(BeNil())
		}).Should(Succeed(), "lock %s to show no holder after Release", key)
	})

	It("refuses a lock without a lease or that does not exist, and changes nothing", func() {
		key := newLock("no-lease", 0)
		_, err := newClient("worker").Acquire(env.Ctx, key)
		Expect(err).To(MatchError(lockclient.ErrNoLease))
		Expect(getLock(key).Spec.HolderIdentity).To(BeEmpty(), "nothing asked")
		_, err = newClient("worker").Acquire(env.Ctx, types.NamespacedName{Namespace: ns, Name: "missing"})
		Expect(err).To(MatchError(lockclient.ErrLockNotFound))
	})

	It("waits while another holds the lock, and leaves the other's request alone when its wait ends", func() {
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
		var after []event
		for _, e := range a.Events() {
			Expect(e.at.After(stopped) && e.at.Before(resumed)).To(BeFalse(), "process a printed %s while stopped", e.name)
			if e.at.After(resumed) {
				after = append(after, e)
			}
		}
		Expect(after).NotTo(BeEmpty())
		Expect(after[0].name).To(Equal("done"), "the first thing process a does after the pause is to see its grant ended")
		for _, e := range after {
			Expect(e.name).NotTo(Equal("write"), "process a wrote after the pause")
		}

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
