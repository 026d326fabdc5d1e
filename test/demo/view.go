package demo

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// shownEvents is how many recent events the live view keeps.
const shownEvents = 8

// draw writes the view: in place on a terminal, else as a block.
func (d *demo) draw() {
	d.mu.Lock()
	frame := render(d.snap, &d.rep, d.o, time.Since(d.start), d.events)
	d.printed = len(d.events)
	d.mu.Unlock()
	if d.o.Live {
		_, _ = fmt.Fprint(d.o.Out, "\033[H\033[2J"+frame)
		return
	}
	_, _ = fmt.Fprint(d.o.Out, "\n"+frame+"\n")
}

// printEvents writes the events not yet printed, one per line.
func (d *demo) printEvents() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range d.events[d.printed:] {
		_, _ = fmt.Fprintln(d.o.Out, e)
	}
	d.printed = len(d.events)
}

// render draws one frame of the view from a sample.
func render(s snapshot, rep *Report, o Options, elapsed time.Duration, events []string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("redlock-operator demo · %s · namespace %s", clock(elapsed), o.Namespace)
	if o.Hint != "" {
		w("%s", o.Hint)
	}
	w("")
	renderMasters(w, s, rep.Crash)
	w("")
	renderLocks(w, s)
	w("")
	w("JOBS gated on lock %s (one at a time)", JobsLk)
	renderPods(w, s, func(p *corev1.Pod) bool { return p.Labels[v1alpha1.LockLabel] == JobsLk })
	w("")
	w("DEPLOYMENT %s (active/passive on lock %s)", Deployment, LeaderLk)
	renderPods(w, s, func(p *corev1.Pod) bool { return p.Labels["app"] == Deployment })
	w("")
	w("EVENTS")
	for _, e := range events[max(0, len(events)-shownEvents):] {
		w("  %s", e)
	}
	if len(rep.Violations) > 0 {
		w("")
		w("BROKEN PROMISES: %s", strings.Join(rep.Violations, "; "))
	}
	return b.String()
}

type writeFunc func(format string, args ...any)

func renderMasters(w writeFunc, s snapshot, crash *Crash) {
	if s.set == nil || len(s.set.Status.Members) == 0 {
		w("REDIS MASTERS  starting …")
		return
	}
	st := s.set.Status
	w("REDIS MASTERS  %s: %d/%d serving, quorum %d", s.set.Name, st.Serving, len(st.Members), st.Quorum)
	var cells []string
	for i, m := range st.Members {
		cell := fmt.Sprintf("#%d %s", i, m.State)
		if crash != nil && crash.Member == i && (crash.ServedAgain.IsZero() || m.State != v1alpha1.MemberServing) {
			out := s.at.Sub(crash.At)
			if !crash.ServedAgain.IsZero() {
				out = crash.OutOfService
			}
			cell += fmt.Sprintf(" (crashed: out %s of %s delay)", secs(out), secs(crash.RestartDelay))
		}
		cells = append(cells, cell)
	}
	w("  %s", strings.Join(cells, " · "))
}

func renderLocks(w writeFunc, s snapshot) {
	w("LOCKS  %-20s %-16s %-22s %-17s %s", "NAME", "KEY", "HOLDER", "FENCING TOKEN", "STATE")
	for i := range s.locks {
		l := &s.locks[i]
		holder, token, state := "—", "", heldReason(l)
		if held(l) {
			holder, token = holderName(l), fmt.Sprint(l.Status.FencingToken)
			if l.Status.ValidUntil != nil {
				state = "valid " + secs(l.Status.ValidUntil.Sub(s.at))
			}
		}
		if q := l.Status.Queue; q != nil && q.Count > 0 {
			state += fmt.Sprintf(", %d waiting", q.Count)
		}
		w("       %-20s %-16s %-22s %-17s %s", l.Name, l.Spec.Key, trim(holder, 22), token, state)
	}
}

func renderPods(w writeFunc, s snapshot, show func(*corev1.Pod) bool) {
	for i := range s.pods {
		if p := &s.pods[i]; show(p) {
			w("       %-26s %s", p.Name, podState(p))
		}
	}
}

func podState(p *corev1.Pod) string {
	token := p.Annotations[v1alpha1.FencingTokenAnnotation]
	withToken := func(s string) string {
		if token == "" {
			return s
		}
		return s + ", token " + token
	}
	switch {
	case p.DeletionTimestamp != nil:
		return withToken("terminating")
	case Gated(p):
		return "gated: waiting for the lock"
	case p.Status.Phase == corev1.PodSucceeded:
		return withToken("done")
	case p.Labels[v1alpha1.HoldsLabel] != "":
		return withToken("Ready, marked: holds the lock")
	case p.Labels["app"] == Deployment && Ready(p):
		return "Ready, passive: waiting for the lock"
	default:
		return withToken(strings.ToLower(string(p.Status.Phase)))
	}
}

func clock(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1fs", max(d, 0).Seconds()) }

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
