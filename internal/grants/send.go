package grants

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
	"github.com/redlock-operator/redlock-operator/internal/renewal"
)

// Retries of a refresh that failed without an answer (a timeout, an
// overloaded API server) back off from retryBase to retryMax.
const (
	retryBase = 100 * time.Millisecond
	retryMax  = 5 * time.Second
)

// send writes ready refreshes in the order next gives (nearest shown
// validity first, or the oldest grant first while that one lands tight),
// and shows the grants chosen to shed Shed in their turn (shed.go), within
// the budget and at most w.parallel() refreshes at a time, until ctx ends.
func (w *statusWriter) send(ctx context.Context, wg *sync.WaitGroup) {
	for {
		w.mu.Lock()
		refresh, shed := w.canSend()
		w.mu.Unlock()
		if !refresh && !shed {
			// A refresh made ready, or a write done, kicks.
			select {
			case <-ctx.Done():
				return
			case <-w.kickSend:
			}
			continue
		}
		waited := time.Now()
		if err := w.budget.Wait(ctx); err != nil {
			return // the manager is stopping
		}
		w.mu.Lock()
		w.win.limited += time.Since(waited)
		e, gone := w.pick(time.Now())
		w.mu.Unlock()
		switch {
		case e == nil:
		case gone != nil:
			wg.Go(func() {
				defer w.shedSent()
				w.shedWrite(ctx, e, gone)
			})
		default:
			wg.Go(func() {
				defer w.sent()
				w.write(ctx, e)
			})
		}
	}
}

// canSend reports whether a refresh, and a grant chosen to shed, may be
// sent now. Callers hold w.mu.
func (w *statusWriter) canSend() (refresh, shed bool) {
	refresh = w.ready.Len() > 0 && w.sending < w.parallel()
	// While more refreshes are due than there is room for in flight,
	// grants chosen to shed go one at a time: at an API server that serves
	// in turn, each write in flight takes its share of what it serves, and
	// one keeps them shown Shed at last while refreshes stay behind.
	room := shedParallel(w.parallel())
	if w.behindInFlight() {
		room = 1
	}
	shed = w.toShed.Len()+w.toShedLate.Len() > 0 && w.shedSending < room
	return refresh, shed
}

// pick takes what send sends next: a refresh, or a grant chosen to shed
// (with the channel closed when it is forgotten), nearest shown validity
// first, but refreshes first while they are behind (keep.go), and grants
// chosen to shed whose shown validity passed last (shed.go). Callers hold
// w.mu.
func (w *statusWriter) pick(now time.Time) (*refresh, chan struct{}) {
	w.passShed(now)
	refresh, shed := w.canSend()
	if refresh && (!shed || w.refreshFirst(now)) {
		e := w.next(now)
		w.place(e, inFlight)
		w.donePoking(e)
		w.sendingChanged(1)
		return e, nil
	}
	if shed {
		return w.shedTurn()
	}
	return nil, nil
}

// sent counts a write of send's done, and wakes send.
func (w *statusWriter) sent() {
	w.mu.Lock()
	w.sendingChanged(-1)
	w.mu.Unlock()
	kick(w.kickSend)
}

// write sends one refresh and schedules the next.
func (w *statusWriter) write(ctx context.Context, e *refresh) {
	h := e.h
	w.mu.Lock()
	shown, shownText := e.h.shown, e.shownText
	w.mu.Unlock()
	st := h.Session.State()
	switch {
	case w.sessions.get(h.UID) != h || st.ValidUntil.IsZero():
		w.forget(h) // released, lost or replaced: the reconcile shows that
		return
	case !st.ValidUntil.After(shown):
		// Nothing newer: after the next renewal (or at once, if one
		// landed since the state was read: renewed skipped it in flight).
		w.mu.Lock()
		if w.entries[h.UID] == e {
			if h.Session.State().Renewals > st.Renewals {
				w.place(e, ready)
			} else {
				w.schedule(e, time.Time{})
			}
		}
		w.mu.Unlock()
		return
	}
	patch, err := RefreshPatch(h, st, shown, shownText)
	if err != nil {
		logf.FromContext(ctx).Error(err, "build a validity refresh", "lock", h.Name)
		w.forget(h)
		return
	}
	// Renewals keep the keys at least until the validity shown: raise the
	// floor before the write may commit.
	h.raiseFloor(st.ValidUntil)
	obj := LockRef(h.Name, "")
	octx, cancel := context.WithTimeout(ctx, writeTimeout)
	start := time.Now()
	err = w.client.Status().Patch(octx, obj, client.RawPatch(types.JSONPatchType, patch))
	cancel()
	now := time.Now()
	if err == nil || apierrors.IsInvalid(err) || apierrors.IsNotFound(err) {
		// Answered by the API server's own work, not a timeout or a
		// throttle (whose retries the client hides in the round trip).
		w.observeRTT(now.Sub(start))
	}
	switch {
	case err == nil:
	case apierrors.IsInvalid(err) && w.relearn(ctx, e, shown):
		// Status shows the grant with another validity than this writer
		// last saw (its own write that timed out yet committed, or a
		// deposed leader's late one): sent again on the validity shown.
		return
	case apierrors.IsInvalid(err) || apierrors.IsNotFound(err):
		// A test failed: status no longer shows this grant (released,
		// lost, replaced) or the object is gone. The reconcile sees to
		// the grant.
		w.refuse(h, now)
		return
	default:
		w.failed(ctx, e, err, now)
		return
	}
	w.landed(e, st, shown, now)
}

// landed records a refresh of e that committed at now, showing st's
// validity in place of shown, and schedules the next.
func (w *statusWriter) landed(e *refresh, st renewal.State, shown, now time.Time) {
	h := e.h
	h.Committed(st.ValidUntil)
	w.written.add(h.Name, h.UID)
	w.metrics.StatusWrites.WithLabelValues("renewal").Inc()
	slack := shown.Sub(now)
	if slack >= 0 {
		w.metrics.StatusWriteSlack.Observe(slack.Seconds())
	} else {
		w.metrics.StatusWriteLapse.Observe(-slack.Seconds())
	}
	w.mu.Lock()
	w.count(e, slack)
	delete(w.refused, h.ID)
	e.fails, e.askedAt, e.shownText = 0, time.Time{}, ""
	report := slack < 0 && !e.lapsed
	e.lapsed = slack < 0
	if st.ValidUntil.After(h.shown) {
		h.setShown(st.ValidUntil)
	}
	if w.entries[h.UID] == e {
		w.schedule(e, w.sched.due(e.h.shown, e.ttl))
	}
	demand, budget := w.demand, float64(w.budget.Limit())
	w.mu.Unlock()
	if slack < 0 {
		w.metrics.StatusWritesLate.Inc()
	}
	if report {
		w.recorder.Eventf(LockRef(h.Name, h.UID), nil, corev1.EventTypeWarning, EventStatusWriteLate, "Renew",
			"status showed a validity until %s that passed %v before its refresh was written, though the masters held the grant: status writes are behind (budget %.0f/s; the locks held need %.0f/s)",
			shown.UTC().Format(time.RFC3339Nano), (-slack).Round(time.Millisecond), budget, demand)
	}
}

// failed sees to a refresh of e that failed without an answer on the
// grant (a timeout, an overloaded or unreachable API server): retried with
// a backoff, or left to handOver when the manager stops.
func (w *statusWriter) failed(ctx context.Context, e *refresh, err error, now time.Time) {
	h := e.h
	if ctx.Err() != nil {
		// The manager stops: handOver sends it again (if it has not
		// committed, the validity shown is still this one).
		w.mu.Lock()
		if w.entries[h.UID] == e && e.where == inFlight {
			w.place(e, ready)
		}
		w.mu.Unlock()
		return
	}
	logf.FromContext(ctx).Error(err, "refresh a held lock's validity", "lock", h.Name, "token", h.Token)
	w.mu.Lock()
	e.fails++
	if congestion(err) {
		w.rtt.congested++ // the limit in flight halves when enough do
	}
	// Back off, but not past half the time the shown validity has
	// left: the rate limiter bounds the total.
	backoff := min(retryBase<<min(e.fails-1, 10), retryMax, max(retryBase, e.h.shown.Sub(now)/2))
	w.mu.Unlock()
	w.reschedule(e, now.Add(backoff)) // then in deadline order again
}

// count adds a refresh of e that committed with slack left to the load
// window. Callers hold w.mu.
func (w *statusWriter) count(e *refresh, slack time.Duration) {
	w.win.written++
	// An adopted grant's first refresh is written whatever validity it
	// inherited: it says nothing of this writer's pace.
	if w.settleAdoption(e) {
		return
	}
	w.win.slacks = append(w.win.slacks, slack)
	lead := e.lead
	if lead <= 0 {
		lead = w.sched.lead(e.ttl)
	}
	if slack < lead/2 {
		w.win.tight++
		if slack < 0 {
			w.win.late++
		}
	}
}

// refuse stops refreshing h's grant, which status no longer shows, and
// asks for a reconcile of its lock; the grant's refreshes are held back
// for refusedBackoff.
func (w *statusWriter) refuse(h *Grant, now time.Time) {
	w.mu.Lock()
	if len(w.refused) > 256 && now.Sub(w.pruned) > refusedBackoff {
		w.pruned = now
		for id, at := range w.refused {
			if now.Sub(at) > refusedBackoff {
				delete(w.refused, id)
			}
		}
	}
	w.refused[h.ID] = now
	w.mu.Unlock()
	w.forget(h)
	w.reconcile(h.Name)
}

// relearn reads the lock after a refresh of e, made while status showed
// validity shown, was refused. When status still shows e's grant, with
// another validity, e takes that validity as the one its next refresh
// replaces, is due again, and relearn reports true. A refresh never
// moves the validity back: the next one is sent only with a later one.
func (w *statusWriter) relearn(ctx context.Context, e *refresh, shown time.Time) bool {
	h := e.h
	fresh := &v1alpha1.DistributedLock{}
	octx, cancel := context.WithTimeout(ctx, writeTimeout)
	err := w.client.Get(octx, h.Name, fresh)
	cancel()
	st := fresh.Status
	if err != nil || fresh.UID != h.UID || st.Holder == nil || !h.ShowsIn(st) || st.ValidUntil == nil {
		return false
	}
	if st.ValidUntil.Equal(shown.Truncate(time.Microsecond)) {
		// The same instant in another form than this writer's (an earlier
		// version wrote whole seconds): test the text status holds.
		return w.retestAs(ctx, e, shown)
	}
	logf.FromContext(ctx).Info("validity changed under the status writer", "lock", h.Name, "token", h.Token,
		"expected", shown.UTC().Format(time.RFC3339Nano), "shown", st.ValidUntil.UTC().Format(time.RFC3339Nano))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.entries[h.UID] != e {
		h.raiseFloor(st.ValidUntil.Time)
		return true // forgotten meanwhile
	}
	h.setShown(st.ValidUntil.Time)
	if h.Session.State().ValidUntil.After(h.shown) {
		w.place(e, ready)
	} else {
		w.schedule(e, time.Time{}) // after the next renewal
	}
	return true
}

// retestAs reads the text of the validity status shows for e's grant and,
// when it is not the form this writer would test (shown), makes e's next
// refresh test that text; it reports whether it did.
func (w *statusWriter) retestAs(ctx context.Context, e *refresh, shown time.Time) bool {
	raw := &unstructured.Unstructured{}
	raw.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("DistributedLock"))
	octx, cancel := context.WithTimeout(ctx, writeTimeout)
	err := w.client.Get(octx, e.h.Name, raw)
	cancel()
	text, _, _ := unstructured.NestedString(raw.Object, "status", "validUntil")
	if err != nil || text == "" || text == v1alpha1.NewPreciseTime(shown).UTC().Format(metav1.RFC3339Micro) {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.entries[e.h.UID] == e && e.h.shown.Equal(shown) {
		e.shownText = text
		w.place(e, ready)
	}
	return true
}

// awaitRenewal asks s for a renewal and waits until it is made, for up to
// timeout.
func awaitRenewal(ctx context.Context, s *renewal.Session, timeout time.Duration) {
	before := s.State().Renewals
	s.RenewSoon()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(timeout)
	for s.State().Renewals == before {
		select {
		case <-ctx.Done():
			return
		case <-deadline:
			return
		case <-tick.C:
		}
	}
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// RefreshPatch is the JSON patch that shows st's validity for h's grant,
// on the condition that status still shows that grant, with the validity
// shown that it replaces: a writer with a stale view (a deposed leader
// woken from a pause) cannot move it, backwards or forwards.
func RefreshPatch(h *Grant, st renewal.State, shown time.Time, shownText string) ([]byte, error) {
	var prev any = v1alpha1.NewPreciseTime(shown)
	if shownText != "" {
		prev = shownText
	}
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	ops := []op{
		{"test", "/metadata/uid", h.UID},
		{"test", "/status/grantID", h.ID},
		{"test", "/status/fencingToken", h.Token},
		{"test", "/status/holder/identity", h.Holder},
		{"test", "/status/validUntil", prev},
		{"add", "/status/renewedAt", v1alpha1.NewPreciseTime(st.RenewedAt)},
		{"add", "/status/validUntil", v1alpha1.NewPreciseTime(st.ValidUntil)},
	}
	if q := QuorumOf(h.Quorum, st.Votes); q != nil {
		ops = append(ops, op{"add", "/status/quorum", q})
	}
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("refresh %s: %w", h.Name, err)
	}
	return b, nil
}
