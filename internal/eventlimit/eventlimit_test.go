package eventlimit

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
)

func newDropped() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dropped"}, []string{"reason"})
}

// TestWarningsKeepHalfTheBurst: a wave of Normal Events takes at most half
// the burst; warnings then get the rest; and the bucket refills at the
// rate.
func TestWarningsKeepHalfTheBurst(t *testing.T) {
	r := New(events.NewFakeRecorder(100), 10, 10, newDropped(), logr.Discard())
	now := time.Unix(1000, 0)
	normal := 0
	for range 20 {
		if r.allow(corev1.EventTypeNormal, now) {
			normal++
		}
	}
	warnings := 0
	for range 20 {
		if r.allow(corev1.EventTypeWarning, now) {
			warnings++
		}
	}
	// Normal ones go while at least 5 of the 10 tokens are left: 6 go.
	if normal != 6 || warnings != 4 {
		t.Fatalf("let through %d Normal and %d Warning Events of 20 each at once; want 6 and 4 (a burst of 10, half kept for warnings)", normal, warnings)
	}
	if !r.allow(corev1.EventTypeWarning, now.Add(100*time.Millisecond)) {
		t.Fatal("a warning 100 ms later (one token at 10/s) was dropped")
	}
	if r.allow(corev1.EventTypeNormal, now.Add(200*time.Millisecond)) {
		t.Fatal("a Normal Event let through with one token left of a burst of 10")
	}
}

// TestDroppedEventsAreCounted: Events past the limit do not reach the
// recorder and are counted by reason; the ones let through arrive intact.
func TestDroppedEventsAreCounted(t *testing.T) {
	fake := events.NewFakeRecorder(100)
	dropped := newDropped()
	r := New(fake, 1, 4, dropped, logr.Discard())
	for range 10 {
		r.Eventf(&corev1.Pod{}, nil, corev1.EventTypeNormal, "Adopted", "Renew", "resumed %s", "x")
	}
	if got := len(fake.Events); got != 3 {
		t.Fatalf("%d Events recorded of 10 at once with a burst of 4; want 3 (half the burst kept for warnings)", got)
	}
	if got := <-fake.Events; got != "Normal Adopted resumed x" {
		t.Fatalf("recorded %q", got)
	}
	if got := testutil.ToFloat64(dropped.WithLabelValues("Adopted")); got != 7 {
		t.Fatalf("counted %v dropped Adopted Events, want 7", got)
	}
}

// TestNoLimit: a rate of 0 lets every Event through.
func TestNoLimit(t *testing.T) {
	fake := events.NewFakeRecorder(1000)
	r := New(fake, 0, 0, newDropped(), logr.Discard())
	for range 500 {
		r.Eventf(&corev1.Pod{}, nil, corev1.EventTypeNormal, "Granted", "Acquire", "n")
	}
	if got := len(fake.Events); got != 500 {
		t.Fatalf("%d Events recorded of 500 without a limit", got)
	}
}
