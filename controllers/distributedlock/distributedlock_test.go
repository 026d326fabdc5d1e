package distributedlock_test

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/redismasterset"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

var _ = Describe("DistributedLock", Ordered, func() {
	var (
		mgr *testenv.Manager
		ns  string
		ms  *testenv.MasterSet
	)
	BeforeAll(func() {
		mgr = env.StartManager()
		ns = env.NewNamespace()
		// maxLockTTL 4s: room for a 4s lock that survives a manager restart.
		ms = env.NewServingMasters(ns, "masters", 5, 4*time.Second)
	})
	AfterAll(func() { mgr.Stop() })

	It("acquires for a static holder, records it in status, and keeps renewing", func() {
		lock := newLock(ms, "static", "", "team-a", 1500*time.Millisecond)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		By("acquiring for the static holder")
		first := eventuallyHeldBy(lock, "team-a")
		Expect(first.Status.Key).To(Equal("redlock:" + ns + "/static"))
		Expect(first.Status.FencingToken).To(BeNumerically(">", 0))
		Expect(first.Status.GrantID).NotTo(BeEmpty())
		Expect(first.Status.AcquiredAt).NotTo(BeNil())
		Expect(first.Status.Quorum.Quorum).To(Equal(int32(3)))
		Expect(first.Status.Quorum.Granted).To(BeNumerically(">=", 3))
		Expect(readyReason(first)).To(Equal("True/" + v1alpha1.ReasonValid))
		Expect(first.Finalizers).To(ContainElement("redlock.dev/release"))

		// The value on a quorum of masters is the one recorded for the grant.
		Expect(testenv.CountEqual(ms.ValuesOn(first.Status.Key), expectedValue(first))).To(BeNumerically(">=", 3))

		By("moving validUntil forward across renewals (renewInterval = ttl/3) with the same grant")
		last := first.Status.RenewedAt.Time
		for range 3 {
			Eventually(func(g Gomega) {
				cur := fetch(lock)
				expectHeldBy(g, cur, "team-a")
				g.Expect(cur.Status.RenewedAt.Time).To(BeTemporally(">", last), "renewal time of lock static")
				g.Expect(cur.Status.FencingToken).To(Equal(first.Status.FencingToken), "renewals keep the token")
				g.Expect(cur.Status.GrantID).To(Equal(first.Status.GrantID), "renewals keep the grant")
				last = cur.Status.RenewedAt.Time
			}).Should(Succeed(), "lock %s/static to be renewed by holder team-a with the same grant %s", ns, first.Status.GrantID)
		}
		Expect(fetch(lock).Status.ValidUntil.Time).To(BeTemporally(">", first.Status.ValidUntil.Time))

		// Events and metrics.
		Eventually(func() []string { return eventReasons(ns, "static") }).Should(ContainElement("Granted"), "lock %s/static to get event Granted", ns)
		Expect(testutil.ToFloat64(mgr.Metrics.LocksHeld)).To(BeNumerically(">=", 1))
		Expect(testutil.ToFloat64(mgr.Metrics.FencingToken.WithLabelValues(ns, "static"))).To(Equal(float64(first.Status.FencingToken)))
		Expect(testutil.ToFloat64(mgr.Metrics.StatusWrites.WithLabelValues("renewal"))).To(BeNumerically(">=", 3))
		Expect(testutil.CollectAndCount(mgr.Metrics.OpDuration)).To(BeNumerically(">=", 2), "acquire and extend latencies")
	})

	It("shows holder, held, valid-until, token and age as printer columns", func() {
		crd := &unstructured.Unstructured{}
		crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Name: "distributedlocks.coordination.redlock.dev"}, crd)).To(Succeed())
		versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
		Expect(versions).To(HaveLen(1))
		cols, _, _ := unstructured.NestedSlice(versions[0].(map[string]any), "additionalPrinterColumns")
		var names []string
		for _, c := range cols {
			names = append(names, c.(map[string]any)["name"].(string))
		}
		Expect(names).To(Equal([]string{"Holder", "Held", "Valid-Until", "Token", "Waiting", "Next", "Next-Priority", "Age"}))
		shortNames, _, _ := unstructured.NestedStringSlice(crd.Object, "spec", "names", "shortNames")
		Expect(shortNames).To(ContainElement("dlock"))
	})

	It("lets exactly one of two locks with the same key hold it, and hands over on deletion", func() {
		a := newLock(ms, "same-a", "shared-key", "a", 1500*time.Millisecond)
		b := newLock(ms, "same-b", "shared-key", "b", 1500*time.Millisecond)
		Expect(k8s.Create(suiteCtx, a)).To(Succeed())
		eventuallyHeldBy(a, "a")
		Expect(k8s.Create(suiteCtx, b)).To(Succeed())
		Eventually(func() string { return heldReason(fetch(b)) }).Should(Equal(v1alpha1.ReasonHeldElsewhere), "lock %s/same-b to wait while same-a holds key shared-key", ns)
		Consistently(func(g Gomega) {
			expectHeldBy(g, fetch(a), "a")
			g.Expect(heldBy(fetch(b), "b")).To(BeFalse(), "both locks of one key show a holder")
		}, 3*time.Second).Should(Succeed(), "lock %s/same-a alone to hold key shared-key, not %s/same-b", ns, ns)

		Expect(k8s.Delete(suiteCtx, a)).To(Succeed())
		Eventually(func() error { return k8s.Get(suiteCtx, client.ObjectKeyFromObject(a), a) }).Should(Satisfy(apierrors.IsNotFound), "lock %s/same-a to be gone", ns)
		eventuallyHeldBy(b, "b")
		lb := fetch(b)
		Expect(testenv.CountEqual(ms.ValuesOn("shared-key"), expectedValue(lb))).To(BeNumerically(">=", 3))
	})

	It("re-acquires for a new holder with a higher fencing token and releases on no holder", func() {
		lock := newLock(ms, "handover", "", "first", 1500*time.Millisecond)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		eventuallyHeldBy(lock, "first")
		tokens := []int64{fetch(lock).Status.FencingToken}
		for _, holder := range []string{"second", "third"} {
			cur := fetch(lock)
			cur.Spec.HolderIdentity = holder
			Expect(k8s.Update(suiteCtx, cur)).To(Succeed())
			eventuallyHeldBy(lock, holder)
			tokens = append(tokens, fetch(lock).Status.FencingToken)
		}
		Expect(tokens).To(BeStrictlyIncreasing(), "every grant takes a larger token")

		cur := fetch(lock)
		key, value := cur.Status.Key, expectedValue(cur)
		cur.Spec.HolderIdentity = ""
		Expect(k8s.Update(suiteCtx, cur)).To(Succeed())
		Eventually(func() string { return heldReason(fetch(lock)) }).Should(Equal(v1alpha1.ReasonNotRequested), "lock %s/handover to release once no holder is asked for", ns)
		Expect(fetch(lock).Status.Holder).To(BeNil())
		Expect(testenv.CountEqual(ms.ValuesOn(key), value)).To(Equal(0), "released in Redis")
		Expect(fetch(lock).Status.FencingToken).To(Equal(tokens[2]), "the latest token stays in status")
	})

	It("keeps a lock across a manager restart: same value, same holder, no lapse", func() {
		// The grant must outlive the handover: stop, new leader, cache sync,
		// adoption (a third of the ttl is left at worst).
		lock := newLock(ms, "survivor", "", "keeper", 4*time.Second)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		eventuallyHeldBy(lock, "keeper")
		before := fetch(lock)
		value := expectedValue(before)

		mgr.Stop()
		mgr = env.StartManager()

		By("adopting the grant in the new leader and renewing it before it lapses")
		Eventually(func(g Gomega) {
			cur := fetch(lock)
			expectHeldBy(g, cur, "keeper")
			g.Expect(cur.Status.RenewedAt.Time).To(BeTemporally(">", before.Status.RenewedAt.Time), "renewal time of lock survivor")
		}).Should(Succeed(), "lock %s/survivor's grant to be adopted and renewed by the new leader", ns)
		after := fetch(lock)
		Expect(after.Status.FencingToken).To(Equal(before.Status.FencingToken))
		Expect(after.Status.AcquiredAt.Time).To(BeTemporally("==", before.Status.AcquiredAt.Time))
		Expect(testenv.CountEqual(ms.ValuesOn(after.Status.Key), value)).To(BeNumerically(">=", 3))
	})

	It("survives a minority of dead masters, loses the lock cleanly with a majority, and regains it", func() {
		lock := newLock(ms, "faults", "", "f", 1500*time.Millisecond)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		eventuallyHeldBy(lock, "f")

		By("renewing with two of five masters dead")
		for _, s := range ms.Servers[:2] {
			Expect(s.Kill()).To(Succeed())
		}
		held := fetch(lock)
		renewed := held.Status.RenewedAt.Time
		Eventually(func() time.Time { return fetch(lock).Status.RenewedAt.Time }).Should(BeTemporally(">", renewed), "lock %s/faults to be renewed with two of five masters dead", ns)
		// The grant survives: the same grant, held, renewed. (Whether its
		// shown validity is refreshed in time is the status writer's
		// matter: at ttl 1.5s its lead is 150ms, which a CPU-starved API
		// server has missed here once; that lapse is the safe side.)
		Consistently(func(g Gomega) {
			cur := fetch(lock)
			g.Expect(condition(cur, v1alpha1.ConditionHeld)).NotTo(BeNil(), "no Held condition")
			g.Expect(condition(cur, v1alpha1.ConditionHeld).Status).To(Equal(metav1.ConditionTrue), "Held: %+v", condition(cur, v1alpha1.ConditionHeld))
			g.Expect(cur.Status.GrantID).To(Equal(held.Status.GrantID), "the grant changed")
			g.Expect(cur.Status.FencingToken).To(Equal(held.Status.FencingToken), "the token changed")
		}, 2*time.Second).Should(Succeed(), "lock %s/faults to keep grant %s with two of five masters dead", ns, held.Status.GrantID)

		By("losing the lock with three of five dead, and saying why")
		Expect(ms.Servers[2].Kill()).To(Succeed())
		lostToken := fetch(lock).Status.FencingToken
		Eventually(func() string { return heldReason(fetch(lock)) }).
			Should(BeElementOf(v1alpha1.ReasonValidityExpired, v1alpha1.ReasonQuorumUnavailable, v1alpha1.ReasonLost), "lock %s/faults to be lost with three of five masters dead", ns)
		Expect(fetch(lock).Status.Holder).To(BeNil())
		Expect(fetch(lock).Status.ReleasedAt).NotTo(BeNil(), "when status stopped showing the grant")

		By("regaining it with a larger token once the restarted masters' quarantine passed")
		for _, s := range ms.Servers[:3] {
			Expect(s.Restart(false)).To(Succeed())
		}
		eventuallyHeldBy(lock, "f")
		Expect(fetch(lock).Status.FencingToken).To(BeNumerically(">", lostToken), "a grant after masters restarted without persistence still takes a larger token")
	})

	It("rejects bad specs at the API server", func() {
		cases := map[string]func(l *v1alpha1.DistributedLock){
			"zero ttl":       func(l *v1alpha1.DistributedLock) { l.Spec.TTL = metav1.Duration{} },
			"negative ttl":   func(l *v1alpha1.DistributedLock) { l.Spec.TTL = metav1.Duration{Duration: -time.Second} },
			"ttl over 24h":   func(l *v1alpha1.DistributedLock) { l.Spec.TTL = metav1.Duration{Duration: 25 * time.Hour} },
			"renew over ttl": func(l *v1alpha1.DistributedLock) { l.Spec.RenewInterval = &metav1.Duration{Duration: 3 * time.Second} },
			"no master set":  func(l *v1alpha1.DistributedLock) { l.Spec.MasterSet = "" },
		}
		for name, mutate := range cases {
			l := newLock(ms, "bad-"+fmt.Sprint(len(name)), "", "x", 2*time.Second)
			mutate(l)
			Expect(k8s.Create(suiteCtx, l)).NotTo(Succeed(), name)
		}

		long := newLock(ms, strings.Repeat("n", 64), "", "x", 2*time.Second)
		Expect(k8s.Create(suiteCtx, long)).To(MatchError(ContainSubstring("at most 63 characters")), "a name pods cannot put in a label")
		Expect(k8s.Create(suiteCtx, newLock(ms, strings.Repeat("n", 63), "", "x", 2*time.Second))).To(Succeed())

		Expect(k8s.Create(suiteCtx, newLock(ms, "fence-key", "k1:fence", "x", 2*time.Second))).
			To(MatchError(ContainSubstring("must not end in ':fence'")), "another lock's fencing counter as the key")
		Expect(k8s.Create(suiteCtx, newLock(ms, "line-key", "k1:line", "x", 2*time.Second))).
			To(MatchError(ContainSubstring("must not end in ':line'")), "another lock's waiting line as the key")
		Expect(k8s.Create(suiteCtx, newLock(ms, "window-key", redlock.WindowKey, "x", 2*time.Second))).
			To(MatchError(ContainSubstring("is reserved")), "the masters' quarantine window as the key")
		Expect(k8s.Create(suiteCtx, newLock(ms, "roll-key", redismasterset.RollKey, "x", 2*time.Second))).
			To(MatchError(ContainSubstring("is reserved")), "the clusters' turn to replace a member as the key")

		By("refusing semaphores' keys to plain locks, and a slot whose key is not its semaphore's")
		Expect(k8s.Create(suiteCtx, newLock(ms, "slot-key", "s1:slot:0", "", 2*time.Second))).
			To(MatchError(ContainSubstring("is a slot of a semaphore")), "a semaphore's slot as a plain lock's key")
		slot := func(name, key string, so v1alpha1.SemaphoreSlot) *v1alpha1.DistributedLock {
			l := newLock(ms, name, key, "", 2*time.Second)
			l.Spec.SlotOf = &so
			return l
		}
		Expect(k8s.Create(suiteCtx, slot("slot-other-key", "s1:slot:1", v1alpha1.SemaphoreSlot{SemaphoreKey: "s1", Slots: 2, Index: 0}))).
			To(MatchError(ContainSubstring("'<slotOf.semaphoreKey>:slot:<slotOf.index>'")), "slot 0's lock with slot 1's key")
		Expect(k8s.Create(suiteCtx, slot("slot-zero-padded", "s1:slot:01", v1alpha1.SemaphoreSlot{SemaphoreKey: "s1", Slots: 2, Index: 1}))).
			To(MatchError(ContainSubstring("'<slotOf.semaphoreKey>:slot:<slotOf.index>'")), "a zero-padded index")
		Expect(k8s.Create(suiteCtx, slot("slot-out-of-range", "s1:slot:2", v1alpha1.SemaphoreSlot{SemaphoreKey: "s1", Slots: 2, Index: 2}))).
			To(MatchError(ContainSubstring("less than slotOf.slots")), "slot 2 of 2")
		Expect(k8s.Create(suiteCtx, slot("slot-reserved-sem", "k:fence:slot:0", v1alpha1.SemaphoreSlot{SemaphoreKey: "k:fence", Slots: 2, Index: 0}))).
			To(MatchError(ContainSubstring("those keys are reserved")), "a fencing counter as the semaphore's key")
		withHolder := slot("slot-with-holder", "s1:slot:0", v1alpha1.SemaphoreSlot{SemaphoreKey: "s1", Slots: 2, Index: 0})
		withHolder.Spec.HolderIdentity = "x"
		Expect(k8s.Create(suiteCtx, withHolder)).To(MatchError(ContainSubstring("it has no holderIdentity")), "a static holder for a slot")

		By("refusing lists of allowed holders that name nothing, or what no ServiceAccount or namespace can be called")
		allowing := func(name string, a v1alpha1.AllowedHolders) *v1alpha1.DistributedLock {
			l := newLock(ms, name, "", "", 2*time.Second)
			l.Spec.AllowedHolders = &a
			return l
		}
		empty := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.GroupVersion.String(), "kind": "DistributedLock",
			"metadata": map[string]any{"namespace": ns, "name": "allow-empty"},
			"spec":     map[string]any{"masterSet": ms.Name, "ttl": "2s", "allowedHolders": map[string]any{"serviceAccounts": []any{}}},
		}}
		Expect(k8s.Create(suiteCtx, empty)).To(MatchError(ContainSubstring("spec.allowedHolders.serviceAccounts")), "an empty list of ServiceAccounts, which reads as 'nobody' (unset allows everyone)")
		Expect(k8s.Create(suiteCtx, allowing("allow-bad-sa", v1alpha1.AllowedHolders{ServiceAccounts: []string{"App_1"}}))).
			To(MatchError(ContainSubstring("spec.allowedHolders.serviceAccounts[0]")), "a ServiceAccount name with capitals")
		Expect(k8s.Create(suiteCtx, allowing("allow-bad-ns", v1alpha1.AllowedHolders{Namespaces: []string{"team.a"}}))).
			To(MatchError(ContainSubstring("spec.allowedHolders.namespaces[0]")), "a namespace with a dot")
		Expect(k8s.Create(suiteCtx, allowing("allow-dup", v1alpha1.AllowedHolders{Namespaces: []string{"a", "a"}}))).
			To(MatchError(ContainSubstring("Duplicate value")), "a namespace named twice")
		Expect(k8s.Create(suiteCtx, allowing("allow-ok", v1alpha1.AllowedHolders{ServiceAccounts: []string{"app", "system.batch"}, Namespaces: []string{ns}}))).To(Succeed())

		l := newLock(ms, "immutable-key", "k1", "", 2*time.Second)
		Expect(k8s.Create(suiteCtx, l)).To(Succeed())
		// Retried on conflicts with the controller's own writes.
		updateError := func(key string) func() string {
			return func() string {
				cur := fetch(l)
				cur.Spec.Key = key
				if err := k8s.Update(suiteCtx, cur); err != nil {
					return err.Error()
				}
				return "accepted"
			}
		}
		Eventually(updateError("k2")).Should(ContainSubstring("key is immutable"), "lock %s/immutable-key to refuse a change of its key", ns)
		Eventually(updateError("")).Should(ContainSubstring("key is immutable"), "lock %s/immutable-key to refuse removing its key (a change too)", ns)

		bad := &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-address"},
			Spec: v1alpha1.RedisMasterSetSpec{
				External:   &v1alpha1.ExternalMasters{Addresses: []string{"localhost"}},
				MaxLockTTL: metav1.Duration{Duration: time.Minute},
			},
		}
		Expect(k8s.Create(suiteCtx, bad)).NotTo(Succeed())
		bad.Spec.External.Addresses = []string{"127.0.0.1:70000"}
		Expect(k8s.Create(suiteCtx, bad)).NotTo(Succeed())
		bad.Spec.External = nil
		Expect(k8s.Create(suiteCtx, bad)).NotTo(Succeed())
	})

	It("reports what only the controller can check as Ready=False and writes nothing to Redis", func() {
		tooLong := newLock(ms, "too-long", "too-long-key", "x", 5*time.Second) // maxLockTTL is 4s
		Expect(k8s.Create(suiteCtx, tooLong)).To(Succeed())
		Eventually(func() string { return readyReason(fetch(tooLong)) }).Should(Equal("False/"+v1alpha1.ReasonTTLTooLong), "lock %s/too-long to be not ready with ttl above maxLockTTL", ns)

		orphan := newLock(ms, "orphan", "orphan-key", "x", time.Second)
		orphan.Spec.MasterSet = "missing"
		Expect(k8s.Create(suiteCtx, orphan)).To(Succeed())
		Eventually(func() string { return readyReason(fetch(orphan)) }).Should(Equal("False/"+v1alpha1.ReasonMasterSetNotFound), "lock %s/orphan to be not ready without its master set", ns)

		Consistently(func() []string { return append(ms.ValuesOn("too-long-key"), ms.ValuesOn("orphan-key")...) }, time.Second).
			Should(HaveEach(""), "keys too-long-key and orphan-key of locks %s/too-long and %s/orphan to stay unwritten", ns, ns)
		Expect(fetch(tooLong).Status.Holder).To(BeNil())

		// Other locks are unaffected.
		ok := newLock(ms, "unaffected", "", "fine", time.Second)
		Expect(k8s.Create(suiteCtx, ok)).To(Succeed())
		eventuallyHeldBy(ok, "fine")

		// Fixing the master set's limit makes the lock usable.
		set := &v1alpha1.RedisMasterSet{}
		Expect(k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: ms.Name}, set)).To(Succeed())
		Expect(set.Status.Conditions).NotTo(BeEmpty())
	})
})

var _ = Describe("Deleting a lock whose masters are unreachable", func() {
	It("keeps the finalizer until the grant has expired, then lets the object go", func() {
		mgr := env.StartManager()
		DeferCleanup(mgr.Stop)
		ns := env.NewNamespace()
		ms := env.NewMasters(ns, "doomed", 3, 2*time.Second)
		lock := newLock(ms, "doomed", "", "h", 2*time.Second)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		held := eventuallyHeldBy(lock, "h")

		By("reading how long the masters still keep the key, then killing them all")
		var expiry time.Time
		for _, srv := range ms.Servers {
			rdb := srv.Client()
			pttl, err := rdb.PTTL(suiteCtx, held.Status.Key).Result()
			_ = rdb.Close()
			Expect(err).NotTo(HaveOccurred())
			if at := time.Now().Add(pttl); at.After(expiry) {
				expiry = at
			}
		}
		for _, s := range ms.Servers {
			Expect(s.Kill()).To(Succeed())
		}
		Expect(k8s.Delete(suiteCtx, lock)).To(Succeed())

		By("keeping the object while any copy of the grant may still exist")
		gone := func() bool {
			return apierrors.IsNotFound(k8s.Get(suiteCtx, client.ObjectKeyFromObject(lock), &v1alpha1.DistributedLock{}))
		}
		Consistently(gone, time.Until(expiry)).Should(BeFalse(), "lock %s/doomed's finalizer went before the copies seen in Redis expired", ns)
		Eventually(gone).Should(BeTrue(), "lock %s/doomed to be gone once its grant has expired", ns)
	})
})
