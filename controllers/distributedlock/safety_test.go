package distributedlock_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/controllers/distributedlock"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/internal/harness/testenv"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// Regression tests of the lifecycle's safety cases: status shows only
// committed grants that Redis backs, renewals do not outlive their objects,
// and writers with a stale view give up.
var _ = Describe("DistributedLock safety", Ordered, func() {
	var (
		mgr *testenv.Manager
		ns  string
		ms  *testenv.MasterSet
	)
	BeforeAll(func() {
		mgr = env.StartManager()
		ns = env.NewNamespace()
		ms = env.NewServingMasters(ns, "masters", 3, 4*time.Second)
	})
	AfterAll(func() { mgr.Stop() })

	It("never shows a grant whose status write was refused, and gives it back in Redis", func() {
		By("refusing, at the API server, every status write that names a holder of this lock")
		denyStatus(ns, "refused", "has(object.status.holder)", func(st *v1alpha1.DistributedLockStatus) {
			st.Holder = &v1alpha1.LockHolder{Identity: "probe"}
		})
		lock := newLock(ms, "refused", "refused-key", "h", 4*time.Second)
		lock.Labels = map[string]string{denyLabel: "refused"}
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())

		By("giving the grant back and saying so")
		Eventually(func() []string { return eventReasons(ns, "refused") }).Should(ContainElement("GrantNotCommitted"), "lock %s/refused to give back its grant with event GrantNotCommitted", ns)
		Expect(fetch(lock).Status.Holder).To(BeNil())

		By("leaving no key behind once the lock is gone")
		Expect(k8s.Delete(suiteCtx, lock)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(suiteCtx, client.ObjectKeyFromObject(lock), &v1alpha1.DistributedLock{}))
		}).Should(BeTrue(), "lock %s/refused to be gone", ns)
		Eventually(func() []string { return ms.ValuesOn("refused-key") }, 2*time.Second).Should(HaveEach(""), "key refused-key of lock %s/refused to be gone from every master", ns)
		Consistently(func() []string { return ms.ValuesOn("refused-key") }, time.Second).Should(HaveEach(""), "key refused-key of lock %s/refused to stay gone from every master", ns)
	})

	It("stops renewing when the object is gone, releases its keys once the validity shown passed, and serves a new object of the same name", func() {
		lock := newLock(ms, "reborn", "", "old", 4*time.Second)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		old := eventuallyHeldBy(lock, "old")
		value := expectedValue(old)
		shown := latestValidity(lock, old.Status.GrantID)

		By("stripping the finalizer by hand and deleting the object")
		stripped := old.DeepCopy()
		stripped.Finalizers = nil
		Expect(k8s.Patch(suiteCtx, stripped, client.MergeFrom(old))).To(Succeed())
		Expect(k8s.Delete(suiteCtx, stripped)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(suiteCtx, client.ObjectKeyFromObject(lock), &v1alpha1.DistributedLock{}))
		}).Should(BeTrue(), "lock %s/reborn to be gone once its finalizer is stripped", ns)

		v := shown()

		By("granting a new object of the same name once the validity the old grant showed has passed, with a larger token")
		reborn := newLock(ms, "reborn", "", "new", 4*time.Second)
		Expect(k8s.Create(suiteCtx, reborn)).To(Succeed())
		cur := eventuallyHeldBy(reborn, "new")
		Expect(cur.Status.FencingToken).To(BeNumerically(">", old.Status.FencingToken))
		Expect(cur.Status.AcquiredAt.Time).To(BeTemporally(">=", v), "granted after the validity the old object showed (%s)", v.Format(time.RFC3339Nano))
		Expect(testenv.CountEqual(ms.ValuesOn(old.Status.Key), value)).To(BeZero(), "old grant of lock %s/reborn released on the masters", ns)
		Consistently(func() int { return testenv.CountEqual(ms.ValuesOn(old.Status.Key), value) }, time.Second).Should(BeZero(), "old grant of lock %s/reborn to stay released on the masters", ns)
	})

	It("refuses to move a lock to another master set", func() {
		lock := newLock(ms, "pinned", "", "", 2*time.Second)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		Eventually(func() string {
			cur := fetch(lock)
			cur.Spec.MasterSet = "elsewhere"
			if err := k8s.Update(suiteCtx, cur); err != nil {
				return err.Error()
			}
			return "accepted"
		}).Should(ContainSubstring("masterSet is immutable"), "lock %s/pinned to refuse a change of masterSet", ns)
	})

	It("draws a new value for every acquisition attempt", func() {
		const key = "contended-key"
		holder := newLock(ms, "contended-a", key, "a", 4*time.Second)
		Expect(k8s.Create(suiteCtx, holder)).To(Succeed())
		a := eventuallyHeldBy(holder, "a")

		By("watching the acquisition attempts of a rival lock on one master")
		attempts := monitorAcquisitions(ms, key)
		rival := newLock(ms, "contended-b", key, "b", 4*time.Second)
		Expect(k8s.Create(suiteCtx, rival)).To(Succeed())
		Eventually(func() int { return len(attempts.values(expectedValue(a))) }, 10*time.Second).Should(BeNumerically(">=", 3), "at least 3 acquisition attempts of rival lock %s/contended-b on key %s", ns, key)

		vals := attempts.values(expectedValue(a))
		seen := map[string]bool{}
		for _, v := range vals {
			Expect(seen).NotTo(HaveKey(v), "two acquisition attempts used the same value")
			seen[v] = true
		}
		Expect(k8s.Delete(suiteCtx, rival)).To(Succeed())
		Expect(k8s.Delete(suiteCtx, holder)).To(Succeed())
	})

	It("gives up its grant, without writing it back, when status shows another grant", func() {
		lock := newLock(ms, "usurped", "", "mine", 4*time.Second)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		mine := eventuallyHeldBy(lock, "mine")
		value := expectedValue(mine)

		By("committing a foreign grant to status, as another manager would")
		foreign := mine.DeepCopy()
		foreign.Status.Holder = &v1alpha1.LockHolder{Identity: "theirs"}
		foreign.Status.GrantID = "foreign-grant"
		foreign.Status.FencingToken = mine.Status.FencingToken + 1
		foreign.Status.ValidUntil = v1alpha1.NewPreciseTime(time.Now().Add(3 * time.Second))
		Expect(k8s.Status().Patch(suiteCtx, foreign, client.MergeFromWithOptions(mine, client.MergeFromWithOptimisticLock{}))).To(Succeed())

		By("never writing its own grant back, nor pairing its holder or token with the foreign grant")
		// The spec asks for "mine": once the foreign grant is handed over
		// (it is not in Redis), a new grant of its own may follow.
		Consistently(func(g Gomega) {
			cur := fetch(lock)
			g.Expect(cur.Status.GrantID).NotTo(Equal(mine.Status.GrantID), "the superseded grant was written back")
			if cur.Status.Holder != nil && cur.Status.GrantID == "foreign-grant" {
				g.Expect(cur.Status.Holder.Identity).To(Equal("theirs"), "holder of the foreign grant")
				g.Expect(cur.Status.FencingToken).To(Equal(foreign.Status.FencingToken), "fencing token of the foreign grant")
			}
		}, 2*time.Second).Should(Succeed(), "lock %s/usurped never to show its superseded grant %s again", ns, mine.Status.GrantID)

		By("releasing its own grant in Redis")
		Eventually(func() int { return testenv.CountEqual(ms.ValuesOn(mine.Status.Key), value) }, 2*time.Second).Should(BeZero(), "superseded grant of lock %s/usurped to be released on the masters", ns)
		Eventually(func() []string { return eventReasons(ns, "usurped") }).Should(ContainElement("Superseded"), "lock %s/usurped to get event Superseded", ns)
	})

	It("flips Held to False by itself once a lost grant's status write goes through", func() {
		lock := newLock(ms, "lapsed", "", "h", 2*time.Second)
		lock.Labels = map[string]string{denyLabel: "lapsed"}
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		eventuallyHeldBy(lock, "h")

		By("refusing status writes without a holder while the masters are stopped")
		policy := denyStatus(ns, "lapsed", "!has(object.status.holder)", func(st *v1alpha1.DistributedLockStatus) {
			st.Holder = nil
		})
		for _, s := range ms.Servers {
			Expect(s.Stop()).To(Succeed())
		}
		held := fetch(lock)
		Expect(held.Status.Holder).NotTo(BeNil())
		Eventually(func() []string { return eventReasons(ns, "lapsed") }).Should(ContainElement("Lost"), "lock %s/lapsed to get event Lost", ns)
		for _, s := range ms.Servers {
			Expect(s.Cont()).To(Succeed())
		}
		Expect(k8s.Delete(suiteCtx, policy)).To(Succeed())

		By("no longer showing the lost grant, with no change to the lock to trigger it")
		Eventually(func(g Gomega) {
			cur := fetch(lock)
			g.Expect(cur.Status.Holder == nil || cur.Status.GrantID != held.Status.GrantID).To(BeTrue(), "the lost grant is still shown")
		}, 20*time.Second).Should(Succeed(), "lock %s/lapsed to stop showing lost grant %s", ns, held.Status.GrantID)
	})

	It("adopts a grant written by the previous version (whole-second times, no grant ID)", func() {
		// A ttl long enough that the adoption comes before the legacy
		// validity passes even on a loaded machine (it is not the subject).
		const ttl = 10 * time.Second
		set := env.NewServingMasters(ns, "legacy-masters", 3, ttl)
		lock := newLock(set, "legacy", "", "", ttl)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		Eventually(func() string { return readyReason(fetch(lock)) }).Should(Equal("True/"+v1alpha1.ReasonValid), "lock %s/legacy to be ready", ns)

		By("stopping the manager, as an upgrade stops the previous version")
		// The previous version's spec and status appear together: with a
		// manager running, a reconcile between the two writes would see a
		// grant nobody asks for, and rightly release it.
		mgr.Stop()

		By("holding the key in Redis with the value the previous version derived from the token")
		const token = 7
		cur := fetch(lock)
		value := env.Values.Value(string(cur.UID), "7")
		for _, srv := range set.Servers {
			rdb := srv.Client()
			Expect(rdb.Set(suiteCtx, cur.Status.Key, value, ttl).Err()).To(Succeed())
			_ = rdb.Close()
		}

		By("writing status as the previous version did, then asking for that holder")
		valid := time.Now().Add(ttl - time.Second).UTC().Truncate(time.Second)
		raw := map[string]any{"status": map[string]any{
			"holder":       map[string]any{"identity": "legacy"},
			"fencingToken": token,
			"acquiredAt":   time.Now().UTC().Format(time.RFC3339),
			"renewedAt":    time.Now().UTC().Format(time.RFC3339),
			"validUntil":   valid.Format(time.RFC3339),
		}}
		Expect(k8s.Status().Patch(suiteCtx, cur, client.RawPatch(types.MergePatchType, mustJSON(raw)))).To(Succeed())
		cur = fetch(lock)
		cur.Spec.HolderIdentity = "legacy"
		Expect(k8s.Update(suiteCtx, cur)).To(Succeed())
		mgr = env.StartManager()

		By("renewing that very grant: same holder, same token, same value in Redis")
		Eventually(func(g Gomega) {
			l := fetch(lock)
			expectHeldBy(g, l, "legacy")
			g.Expect(l.Status.FencingToken).To(Equal(int64(token)), "fencing token of adopted lock legacy")
			g.Expect(l.Status.ValidUntil.Time).To(BeTemporally(">", valid), "renewed")
		}).Should(Succeed(), "lock %s/legacy to renew the adopted grant of holder legacy, token %d", ns, token)
		Expect(testenv.CountEqual(set.ValuesOn(cur.Status.Key), value)).To(Equal(3))
		Eventually(func() []string { return eventReasons(ns, "legacy") }).Should(ContainElement("Adopted"), "lock %s/legacy to get event Adopted", ns)
	})

	It("releases what a grant it stops showing left: lost at adoption, or lapsed while no manager ran", func() {
		// A window long enough to adopt a validity shown 8s ahead.
		set := env.NewServingMasters(ns, "giveback-masters", 3, 10*time.Second)
		lapsed := newLock(set, "lapsed-unrun", "lapsed-unrun-key", "", 4*time.Second)
		unasked := newLock(set, "lapsed-unasked", "lapsed-unasked-key", "", 4*time.Second)
		lost := newLock(set, "lost-at-adoption", "lost-at-adoption-key", "", 4*time.Second)
		for _, l := range []*v1alpha1.DistributedLock{lapsed, unasked, lost} {
			Expect(k8s.Create(suiteCtx, l)).To(Succeed())
			Eventually(func() string { return readyReason(fetch(l)) }).Should(Equal("True/"+v1alpha1.ReasonValid), "lock %s/%s to be ready", ns, l.Name)
		}
		mgr.Stop()

		By("showing grant g1 of each, with copies that outlive its validity by a minute: on every master for the lapsed ones (as a late extension leaves them), on one of three for the one still shown valid")
		showGrant := func(l *v1alpha1.DistributedLock, validUntil time.Time, copies []*redistest.Server, holder string) string {
			cur := fetch(l)
			value := env.Values.Value(string(cur.UID), "g1")
			for _, srv := range copies {
				rdb := srv.Client()
				Expect(rdb.Set(suiteCtx, cur.Status.Key, value, time.Minute).Err()).To(Succeed())
				_ = rdb.Close()
			}
			now := time.Now()
			raw := map[string]any{"status": map[string]any{
				"holder":       map[string]any{"identity": "h"},
				"grantID":      "g1",
				"fencingToken": 5,
				"acquiredAt":   now.UTC().Format(time.RFC3339Nano),
				"renewedAt":    now.UTC().Format(time.RFC3339Nano),
				"validUntil":   validUntil.UTC().Format(time.RFC3339Nano),
			}}
			Expect(k8s.Status().Patch(suiteCtx, cur, client.RawPatch(types.MergePatchType, mustJSON(raw)))).To(Succeed())
			cur = fetch(l)
			cur.Spec.HolderIdentity = holder
			Expect(k8s.Update(suiteCtx, cur)).To(Succeed())
			return value
		}
		lapsedValue := showGrant(lapsed, time.Now().Add(-time.Second), set.Servers, "h")
		unaskedValue := showGrant(unasked, time.Now().Add(-time.Second), set.Servers, "")
		lostValue := showGrant(lost, time.Now().Add(8*time.Second), set.Servers[:1], "h")
		mgr = env.StartManager()

		By("hiding the lapsed grant nobody asks for any more, and releasing its copies")
		Eventually(func(g Gomega) {
			cur := fetch(unasked)
			g.Expect(cur.Status.Holder).To(BeNil(), "the lapsed grant is still shown")
			g.Expect(testenv.CountEqual(set.ValuesOn(cur.Status.Key), unaskedValue)).To(BeZero(), "copies of g1 left on the masters")
		}, 20*time.Second).Should(Succeed(), "lock %s/lapsed-unasked", ns)

		By("granting both again, to a new grant, well before the copies would have expired")
		for _, c := range []struct {
			lock  *v1alpha1.DistributedLock
			value string
		}{{lapsed, lapsedValue}, {lost, lostValue}} {
			Eventually(func(g Gomega) {
				cur := fetch(c.lock)
				expectHeldBy(g, cur, "h")
				g.Expect(cur.Status.GrantID).NotTo(Equal("g1"), "a new grant")
				g.Expect(testenv.CountEqual(set.ValuesOn(cur.Status.Key), c.value)).To(BeZero(), "copies of g1 left on the masters")
			}, 20*time.Second).Should(Succeed(), "lock %s/%s", ns, c.lock.Name)
		}
		Eventually(func() []string { return eventReasons(ns, "lost-at-adoption") }).Should(ContainElement("Lost"), "lock %s/lost-at-adoption lost at its adoption", ns)
	})

	It("on deletion, releases in Redis only a grant status stopped showing, even when the cache shows the deletion but not its grant", func() {
		lock := newLock(ms, "deleted-lagging", "deleted-lagging-key", "", 4*time.Second)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		Eventually(func() string { return readyReason(fetch(lock)) }).Should(Equal("True/"+v1alpha1.ReasonValid), "lock %s/deleted-lagging to be ready", ns)
		ungranted := fetch(lock).Status

		var (
			stale      atomic.Bool // the next cached read of the deleted lock lags
			mu         sync.Mutex
			violations []string
		)
		isLock := func(o client.Object) bool { return o.GetNamespace() == ns && o.GetName() == "deleted-lagging" }
		// Before any write of the lock: if the API server shows a grant
		// still valid, a quorum of the masters holds its value.
		check := func(what string) {
			cur := &v1alpha1.DistributedLock{}
			if err := k8s.Get(suiteCtx, client.ObjectKeyFromObject(lock), cur); err != nil || cur.Status.Holder == nil || cur.Status.ValidUntil == nil || !time.Now().Before(cur.Status.ValidUntil.Time) {
				return
			}
			if n := testenv.CountEqual(ms.ValuesOn(cur.Status.Key), expectedValue(cur)); n < 2 {
				mu.Lock()
				violations = append(violations, fmt.Sprintf("before %s: status shows grant %s valid until %s, held on %d of 3 masters", what, cur.Status.GrantID, cur.Status.ValidUntil.Format(time.RFC3339Nano), n))
				mu.Unlock()
			}
		}
		mgr.Stop()
		mgr = env.StartScopedManager(testenv.Scope{Intercept: &interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if err := c.Get(ctx, key, obj, opts...); err != nil {
					return err
				}
				if l, ok := obj.(*v1alpha1.DistributedLock); ok && isLock(l) && !l.DeletionTimestamp.IsZero() && stale.CompareAndSwap(true, false) {
					l.Status = *ungranted.DeepCopy() // the deletion is in the cache, the grant's commit not yet
				}
				return nil
			},
			Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				if isLock(obj) {
					check("an update")
				}
				return c.Update(ctx, obj, opts...)
			},
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				if isLock(obj) {
					check("a status patch")
				}
				return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			},
		}}, nil)

		By("granting the lock, then deleting it while the manager's next cached read lags behind the grant")
		cur := fetch(lock)
		cur.Spec.HolderIdentity = "h"
		Expect(k8s.Update(suiteCtx, cur)).To(Succeed())
		eventuallyHeldBy(lock, "h")
		stale.Store(true)
		Expect(k8s.Delete(suiteCtx, lock)).To(Succeed())

		By("letting the object go with its grant hidden before its keys were released")
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(suiteCtx, client.ObjectKeyFromObject(lock), &v1alpha1.DistributedLock{}))
		}).Should(BeTrue(), "lock %s/deleted-lagging to be gone", ns)
		Expect(stale.Load()).To(BeFalse(), "the lagging read was served")
		mu.Lock()
		defer mu.Unlock()
		Expect(violations).To(BeEmpty())
		mgr.Stop()
		mgr = env.StartManager()
	})

	It("records a grant whose validity passed before its adoption as ended at that validity, not earlier", func() {
		lock := newLock(ms, "adopted-late", "adopted-late-key", "", 4*time.Second)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		Eventually(func() string { return readyReason(fetch(lock)) }).Should(Equal("True/"+v1alpha1.ReasonValid), "lock %s/adopted-late to be ready", ns)
		mgr.Stop()

		By("showing grant g1 valid until a moment ago, with its copies on every master (so that the hiding write is not also a new grant's)")
		cur := fetch(lock)
		value := env.Values.Value(string(cur.UID), "g1")
		for _, srv := range ms.Servers {
			rdb := srv.Client()
			Expect(rdb.Set(suiteCtx, cur.Status.Key, value, time.Minute).Err()).To(Succeed())
			_ = rdb.Close()
		}
		validUntil := time.Now().Add(-300 * time.Millisecond).Truncate(time.Microsecond)
		raw := map[string]any{"status": map[string]any{
			"holder":       map[string]any{"identity": "h"},
			"grantID":      "g1",
			"fencingToken": 5,
			"acquiredAt":   validUntil.Add(-4 * time.Second).UTC().Format(time.RFC3339Nano),
			"renewedAt":    validUntil.Add(-4 * time.Second).UTC().Format(time.RFC3339Nano),
			"validUntil":   validUntil.UTC().Format(time.RFC3339Nano),
		}}
		Expect(k8s.Status().Patch(suiteCtx, cur, client.RawPatch(types.MergePatchType, mustJSON(raw)))).To(Succeed())
		cur = fetch(lock)
		cur.Spec.HolderIdentity = "h"
		Expect(k8s.Update(suiteCtx, cur)).To(Succeed())

		By("starting a manager whose reconcile began, by its clock, before that validity passed: a pause between a reconcile's start and its adopting extension, as a loaded machine gives")
		var (
			mu  sync.Mutex
			hid *v1alpha1.DistributedLockStatus // the committed status that stopped showing g1
		)
		mgr = env.StartScopedManager(testenv.Scope{
			Clock: laggingClock{lag: 10 * time.Second},
			Intercept: &interceptor.Funcs{
				SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
					err := c.SubResource(sub).Patch(ctx, obj, patch, opts...)
					if l, ok := obj.(*v1alpha1.DistributedLock); ok && err == nil && l.Namespace == ns && l.Name == "adopted-late" && l.Status.GrantID == "g1" && l.Status.Holder == nil {
						mu.Lock()
						if hid == nil {
							hid = l.Status.DeepCopy()
						}
						mu.Unlock()
					}
					return err
				},
			},
		}, nil)

		By("hiding g1 with the end it showed, its validity, as when status stopped showing it")
		hidden := func() *v1alpha1.DistributedLockStatus {
			mu.Lock()
			defer mu.Unlock()
			return hid
		}
		Eventually(hidden, 20*time.Second).ShouldNot(BeNil(), "a committed status of lock %s/adopted-late that hides g1", ns)
		Expect(hidden().ReleasedAt).NotTo(BeNil(), "releasedAt of the status of lock %s/adopted-late that hid g1", ns)
		Expect(hidden().ReleasedAt.Time).To(BeTemporally(">=", validUntil), "lock %s/adopted-late: g1 recorded as ended before the validity status showed", ns)
		Eventually(func() []string { return eventReasons(ns, "adopted-late") }).Should(ContainElement("Lost"), "lock %s/adopted-late lost at its adoption", ns)
		mgr.Stop()
		mgr = env.StartManager()
	})

	It("never lets the keys expire before the validity status shows when the ttl shrinks", func() {
		lock := newLock(ms, "shrinking", "", "h", 4*time.Second)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		eventuallyHeldBy(lock, "h")
		cur := fetch(lock)
		cur.Spec.TTL = metav1.Duration{Duration: time.Second}
		Expect(k8s.Update(suiteCtx, cur)).To(Succeed())

		By("checking, again and again, that a quorum of masters holds the key at least as long as status says")
		checked := 0
		Consistently(func(g Gomega) {
			l := fetch(lock)
			if l.Status.ValidUntil == nil {
				return
			}
			backed := 0
			for _, srv := range ms.Servers {
				rdb := srv.Client()
				pttl, err := rdb.PTTL(suiteCtx, l.Status.Key).Result()
				_ = rdb.Close()
				if err == nil && pttl > 0 && !time.Now().Add(pttl).Before(l.Status.ValidUntil.Time) {
					backed++
				}
			}
			// A sample counts only if status still shows the same validity
			// after the keys were read: a refresh that committed meanwhile
			// (showing less, at the new ttl) lets the keys be renewed for
			// that, and the first read no longer says what status shows.
			// On a loaded machine the reads are that far apart.
			if again := fetch(lock).Status.ValidUntil; again == nil || !again.Time.Equal(l.Status.ValidUntil.Time) {
				return
			}
			checked++
			g.Expect(backed).To(BeNumerically(">=", 2), "status shows validity until %v that Redis does not back", l.Status.ValidUntil.Time)
		}, 5*time.Second, 50*time.Millisecond).Should(Succeed(), "lock %s/%s's validity in status to be backed by a quorum of masters", lock.Namespace, lock.Name)
		Expect(checked).To(BeNumerically(">=", 10), "samples of lock %s/shrinking in which status stood still while the keys were read", lock.Namespace)
		expectHeldBy(Default, fetch(lock), "h")
	})

	It("keeps renewing with the last working client while its auth Secret cannot be read", func() {
		By("running three masters that require a password from a Secret")
		servers := testenv.StartServers(3, redistest.Options{Password: "s3cret"})
		Expect(k8s.Create(suiteCtx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "redis-auth", Labels: map[string]string{v1alpha1.RedisCredentialsLabel: "true"}},
			StringData: map[string]string{"password": "s3cret"},
		})).To(Succeed())
		Expect(k8s.Create(suiteCtx, &v1alpha1.RedisMasterSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "authed"},
			Spec: v1alpha1.RedisMasterSetSpec{
				External:      &v1alpha1.ExternalMasters{Addresses: redistest.Addrs(servers)},
				MaxLockTTL:    metav1.Duration{Duration: 4 * time.Second},
				NodeTimeout:   &metav1.Duration{Duration: testenv.MasterNodeTimeout},
				AuthSecretRef: &v1alpha1.SecretKeyRef{Name: "redis-auth"},
			},
		})).To(Succeed())
		authed := &testenv.MasterSet{Servers: servers, Name: "authed", NS: ns}
		lock := newLock(authed, "authed", "", "h", 2*time.Second)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		first := eventuallyHeldBy(lock, "h")

		By("deleting the Secret: the set cannot be used for new grants, the held one keeps being renewed")
		Expect(k8s.Delete(suiteCtx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "redis-auth"}})).To(Succeed())
		// A change of the set's spec makes the next reconcile read the Secret.
		updateSet(ns, "authed", func(set *v1alpha1.RedisMasterSet) {
			set.Spec.NodeTimeout = &metav1.Duration{Duration: testenv.MasterNodeTimeout + 50*time.Millisecond}
		})
		Eventually(func() string { return readyReason(fetch(lock)) }).Should(Equal("False/"+v1alpha1.ReasonMasterSetNotReady), "lock %s/authed to be not ready without Secret redis-auth", ns)
		Consistently(func(g Gomega) {
			l := fetch(lock)
			expectHeldBy(g, l, "h")
			g.Expect(l.Status.GrantID).To(Equal(first.Status.GrantID), "the same grant")
		}, 3*2*time.Second).Should(Succeed(), "lock %s/authed to keep grant %s through three TTLs without Secret redis-auth", ns, first.Status.GrantID)
	})

	It("gives a lock back when maxLockTTL shrinks below its ttl", func() {
		own := env.NewServingMasters(ns, "own", 3, 4*time.Second)
		lock := newLock(own, "shrunk", "", "h", 3*time.Second)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		first := eventuallyHeldBy(lock, "h")

		By("shrinking the set's maxLockTTL below the lock's ttl")
		updateSet(ns, own.Name, func(set *v1alpha1.RedisMasterSet) {
			set.Spec.MaxLockTTL = metav1.Duration{Duration: 2 * time.Second}
		})
		Eventually(func() string { return readyReason(fetch(lock)) }).Should(Equal("False/"+v1alpha1.ReasonTTLTooLong), "lock %s/shrunk to be not ready with ttl above maxLockTTL", ns)
		Expect(fetch(lock).Status.Holder).To(BeNil())
		// Someone else's change is no proof that the holder stopped: the
		// keys stay until the validity shown (a renewal, ttl/3, ago at
		// most: 2s ahead at least) has passed, and are removed then.
		Expect(testenv.CountEqual(own.ValuesOn(first.Status.Key), expectedValue(first))).To(BeNumerically(">=", 2),
			"grant of lock %s/shrunk kept on a quorum of masters while the validity it showed lasts", ns)
		Eventually(func() int { return testenv.CountEqual(own.ValuesOn(first.Status.Key), expectedValue(first)) }, 5*time.Second).Should(BeZero(),
			"grant of lock %s/shrunk to be given back on the masters once its validity passed", ns)
	})

	It("refuses a validity refresh made from a stale view of the validity, backwards or forwards", func() {
		lock := newLock(ms, "stale-writer", "", "h", 4*time.Second)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		first := eventuallyHeldBy(lock, "h")
		var now *v1alpha1.DistributedLock
		Eventually(func(g Gomega) {
			now = fetch(lock)
			g.Expect(now.Status.GrantID).To(Equal(first.Status.GrantID), "grant of lock stale-writer")
			g.Expect(now.Status.ValidUntil.Time).To(BeTemporally(">", first.Status.ValidUntil.Time), "the writer to refresh %s/stale-writer", ns)
		}).Should(Succeed(), "lock %s/stale-writer to refresh grant %s", ns, first.Status.GrantID)

		By("sending, as a deposed leader woken from a pause would, refreshes built while status showed the first validity")
		stale := first.Status.ValidUntil.Time
		for name, validUntil := range map[string]time.Time{
			"backwards": now.Status.ValidUntil.Add(-time.Second),
			"forwards":  now.Status.ValidUntil.Add(time.Hour),
		} {
			patch, err := distributedlock.RefreshPatchFor(first, validUntil.Add(-4*time.Second), validUntil, stale)
			Expect(err).NotTo(HaveOccurred())
			err = k8s.Status().Patch(suiteCtx, &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: lock.Namespace, Name: lock.Name}}, client.RawPatch(types.JSONPatchType, patch))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "the %s refresh was not refused: %v", name, err)
		}
		Expect(fetch(lock).Status.ValidUntil.Time).To(BeTemporally(">=", now.Status.ValidUntil.Time), "the validity moved back")
		Expect(fetch(lock).Status.ValidUntil.Time).To(BeTemporally("<", now.Status.ValidUntil.Add(time.Hour)), "the validity moved beyond the renewals")

		By("accepting the same refresh made over the validity status shows (retried: the manager's own refreshes land meanwhile)")
		Eventually(func() error {
			cur := fetch(lock)
			next := cur.Status.ValidUntil.Add(time.Millisecond)
			patch, err := distributedlock.RefreshPatchFor(cur, next.Add(-4*time.Second), next, cur.Status.ValidUntil.Time)
			if err != nil {
				return err
			}
			return k8s.Status().Patch(suiteCtx, &v1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: lock.Namespace, Name: lock.Name}}, client.RawPatch(types.JSONPatchType, patch))
		}).Should(Succeed(), "lock %s/%s to accept a refresh over the validity status shows", lock.Namespace, lock.Name)
		Expect(k8s.Delete(suiteCtx, lock)).To(Succeed())
	})

	It("leaves no copy of a lost grant on the masters its last renewals reached", func() {
		lock := newLock(ms, "lost", "lost-key", "h", 4*time.Second)
		Expect(k8s.Create(suiteCtx, lock)).To(Succeed())
		value := expectedValue(eventuallyHeldBy(lock, "h"))

		By("killing two masters of three: renewals fail at once (quorum unavailable), each refreshing the third's copy for a whole ttl, until the validity passes")
		for _, s := range ms.Servers[1:] {
			Expect(s.Kill()).To(Succeed())
		}
		// Counted lost with its reason, and no longer shown: the Held
		// reason itself may already say the next grant waits for room in
		// the status writes (StatusWritesBehind, on a loaded machine).
		lost := func() float64 {
			n := 0.0
			for _, reason := range []string{v1alpha1.ReasonValidityExpired, v1alpha1.ReasonQuorumUnavailable, v1alpha1.ReasonLost} {
				n += testutil.ToFloat64(mgr.Metrics.GrantsLost.WithLabelValues(lock.Namespace, lock.Name, reason))
			}
			return n
		}
		Eventually(func(g Gomega) {
			g.Expect(lost()).To(BeNumerically(">", 0), "grants of lock %s/lost counted lost", ns)
			g.Expect(fetch(lock).Status.Holder).To(BeNil(), "lock %s/lost shown held", ns)
		}).Should(Succeed(), "lock %s/lost to be lost", ns)

		By("removing the copy left on the reachable master once status stopped showing the grant, long before it would expire")
		// Retries every quarter of the renew interval refreshed it for 4s
		// until the loss: it would outlive this wait by more than a second.
		Eventually(func() string { return testenv.Get(ms.Servers[0], "lost-key") }, 2*time.Second, 20*time.Millisecond).
			ShouldNot(Equal(value), "master %s to drop the lost grant's copy", ms.Servers[0].Addr())
		// Its Session stopped when status stopped showing it: the loss it
		// reports is not counted again.
		Expect(lost()).To(Equal(1.0), "losses counted for the one grant of lock %s/lost", ns)
		for _, s := range ms.Servers[1:] {
			Expect(s.Restart(false)).To(Succeed())
		}
	})
})

// denyLabel marks the DistributedLocks a denyStatus policy applies to.
const denyLabel = "test.redlock.dev/deny-status"

// denyStatus installs a ValidatingAdmissionPolicy that refuses the status
// writes, for which cond (CEL over object) holds, of the DistributedLocks in
// ns labelled denyLabel=name; mutate makes a status change for which cond
// holds, to probe that the policy is in force before it returns. The policy
// is removed when the spec ends; deleting the returned policy lifts it
// earlier.
func denyStatus(ns, name, cond string, mutate func(*v1alpha1.DistributedLockStatus)) *admissionv1.ValidatingAdmissionPolicy {
	policyName := "deny-" + ns + "-" + name
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: policyName},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{
				ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{denyLabel: name}},
				ResourceRules: []admissionv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionv1.RuleWithOperations{
						Operations: []admissionv1.OperationType{admissionv1.Update},
						Rule: admissionv1.Rule{
							APIGroups: []string{v1alpha1.GroupVersion.Group}, APIVersions: []string{"*"},
							Resources: []string{"distributedlocks/status"},
						},
					},
				}},
			},
			Validations: []admissionv1.Validation{{Expression: "!(" + cond + ")", Message: "refused by the test"}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policyName},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policyName,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns},
			}},
		},
	}
	Expect(k8s.Create(suiteCtx, policy)).To(Succeed())
	Expect(k8s.Create(suiteCtx, binding)).To(Succeed())
	DeferCleanup(func() {
		_ = k8s.Delete(context.Background(), binding)
		_ = k8s.Delete(context.Background(), policy)
	})

	By("waiting until the API server enforces the policy (probed with a dry run)")
	probe := &v1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe-" + name, Labels: map[string]string{denyLabel: name}},
		Spec:       v1alpha1.DistributedLockSpec{MasterSet: "no-such-set", TTL: metav1.Duration{Duration: time.Second}},
	}
	Expect(k8s.Create(suiteCtx, probe)).To(Succeed())
	DeferCleanup(func() { _ = k8s.Delete(context.Background(), probe) })
	Eventually(func() string {
		cur := &v1alpha1.DistributedLock{}
		if err := k8s.Get(suiteCtx, client.ObjectKeyFromObject(probe), cur); err != nil {
			return err.Error()
		}
		mutate(&cur.Status)
		if err := k8s.Status().Update(suiteCtx, cur, client.DryRunAll); err != nil {
			return err.Error()
		}
		return "accepted"
	}).Should(ContainSubstring("refused by the test"), "policy %s to refuse a status write of lock %s/%s (dry run)", policyName, ns, probe.Name)
	return policy
}

func ptr[T any](v T) *T { return &v }

// updateSet changes a RedisMasterSet's spec, retried on conflicts with the
// operator's own status writes.
func updateSet(ns, name string, mutate func(*v1alpha1.RedisMasterSet)) {
	Eventually(func() error {
		set := &v1alpha1.RedisMasterSet{}
		if err := k8s.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, set); err != nil {
			return err
		}
		mutate(set)
		return k8s.Update(suiteCtx, set)
	}).Should(Succeed(), "master set %s/%s to take the change of its spec", ns, name)
}

// acquisitions records the values of the acquisition attempts of one key
// seen by a master's MONITOR.
type acquisitions struct {
	mu   sync.Mutex
	vals []string
}

func (a *acquisitions) values(except string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, v := range a.vals {
		if v != except {
			out = append(out, v)
		}
	}
	return out
}

var quoted = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)

// monitorAcquisitions watches the first master for acquisitions of key
// (the fenced SET script names the key's fence counter, then the value),
// over a plain connection in MONITOR mode.
func monitorAcquisitions(ms *testenv.MasterSet, key string) *acquisitions {
	a := &acquisitions{}
	conn, err := net.Dial("tcp", ms.Servers[0].Addr())
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(conn.Close)
	_, err = conn.Write([]byte("MONITOR\r\n"))
	Expect(err).NotTo(HaveOccurred())
	r := bufio.NewReader(conn)
	first, err := r.ReadString('\n')
	Expect(err).NotTo(HaveOccurred())
	Expect(first).To(HavePrefix("+OK"))
	go func() {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return // closed at the end of the spec
			}
			args := quoted.FindAllStringSubmatch(line, -1)
			for i := 0; i+1 < len(args); i++ {
				if args[i][1] == redlock.FenceKey(key) && len(args[i+1][1]) == 43 && !strings.ContainsAny(args[i+1][1], " ") {
					a.mu.Lock()
					a.vals = append(a.vals, args[i+1][1])
					a.mu.Unlock()
				}
			}
		}
	}()
	return a
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	Expect(err).NotTo(HaveOccurred())
	return b
}

// laggingClock reads real time lag behind.
type laggingClock struct{ lag time.Duration }

func (c laggingClock) Now() time.Time                  { return time.Now().Add(-c.lag) }
func (c laggingClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
