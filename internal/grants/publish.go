package grants

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// What the writer publishes for kubectl redlock status: its report
// (v1alpha1.StatusWriterReport) in the ConfigMap v1alpha1.StatusConfigMap.
// One write at most every publishEvery, when the report changed, and at
// least every publishBeat: a reader takes an older report as not current.
// The writes go beside the refreshes, at most a tenth of one a second.
const (
	publishEvery = 10 * time.Second
	publishBeat  = v1alpha1.StatusWriterReportBeat
)

// report is what the writer does now. Callers hold w.mu.
func (w *statusWriter) report(now time.Time) v1alpha1.StatusWriterReport {
	r := v1alpha1.StatusWriterReport{
		Published:         metav1.NewTime(now),
		BudgetPerSecond:   float64(w.budget.Limit()),
		CapacityPerSecond: w.load.capacity,
		Measured:          w.load.measured,
		TargetPerSecond:   w.load.target(),
		DemandPerSecond:   w.keptDemand(),
		Overloaded:        w.load.overloaded,
		Waiting:           w.waiters.len(),
		Shed:              w.shedTotal,
	}
	r.Kept, r.Shedding = w.keptAndShedding()
	if r.Overloaded && !w.overloadSince.IsZero() {
		since := metav1.NewTime(w.overloadSince)
		r.OverloadedSince = &since
	}
	return r
}

// keptAndShedding counts the grants the writer refreshes, and those
// chosen to shed it does not. Callers hold w.mu.
func (w *statusWriter) keptAndShedding() (kept, shedding int) {
	for uid := range w.shed {
		if w.entries[uid] != nil {
			shedding++
		}
	}
	return len(w.entries) - shedding, shedding
}

// sameReport reports whether a and b say the same, whenever made.
func sameReport(a, b v1alpha1.StatusWriterReport) bool {
	a.Published, b.Published = metav1.Time{}, metav1.Time{}
	aj, _ := json.Marshal(a)
	bj, _ := json.Marshal(b)
	return string(aj) == string(bj)
}

// publishLoop publishes the writer's report into the ConfigMap at where
// until ctx ends (nothing when where has no name): every publishEvery when
// it changed, at once when the overload turned over, and at least every
// publishBeat. Refused (an install whose RBAC predates the report), it
// says so once and tries again only every publishBeat.
func (w *statusWriter) publishLoop(ctx context.Context, where types.NamespacedName, manager string) {
	if where.Name == "" {
		return
	}
	log := logf.FromContext(ctx).WithName("status-writer")
	tick := time.NewTicker(publishEvery)
	defer tick.Stop()
	var (
		last    v1alpha1.StatusWriterReport
		tried   time.Time // when a write was last tried
		refused bool      // the last write was refused
	)
	for first := true; ; first = false {
		kicked := false
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			case <-w.kickPublish:
				kicked = true
			}
		}
		now := time.Now()
		w.mu.Lock()
		r := w.report(now)
		w.mu.Unlock()
		r.Manager = manager
		if !publishDue(first, kicked, refused, r, last, now.Sub(tried)) {
			continue
		}
		tried = now
		switch err := publish(ctx, w.client, where, r); {
		case apierrors.IsForbidden(err):
			if !refused {
				log.Info("may not publish the status writer's report: kubectl redlock status will not show it; grant create and patch on the ConfigMap",
					"configMap", where, "error", err.Error())
			}
			refused = true
		case err != nil:
			// The next tick tries again; refreshes are not held up.
			log.Info("could not publish the status writer's report", "configMap", where, "error", err.Error())
		default:
			last, refused = r, false
		}
	}
}

// publishDue reports whether report r is to be written, sinceTry after the
// last write tried, when last was the last written: the first, on a kick,
// when it changed, or a beat after the last. A beat is taken as passed
// half a tick early, for ticks that come late; a refused write waits a
// beat.
func publishDue(first, kicked, refused bool, r, last v1alpha1.StatusWriterReport, sinceTry time.Duration) bool {
	beat := sinceTry >= publishBeat-publishEvery/2
	switch {
	case refused:
		return beat
	case first, kicked:
		return true
	}
	return !sameReport(r, last) || r.Published.Sub(last.Published.Time) >= publishBeat-publishEvery/2
}

// publish writes r into the ConfigMap at where, creating it if missing.
func publish(ctx context.Context, c client.Client, where types.NamespacedName, r v1alpha1.StatusWriterReport) error {
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode the status writer's report: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: where.Namespace, Name: where.Name,
		Labels: map[string]string{"app.kubernetes.io/name": "redlock-operator"}}}
	patch, err := json.Marshal(map[string]any{"data": map[string]string{v1alpha1.StatusWriterKey: string(data)}})
	if err != nil {
		return fmt.Errorf("encode the status writer's report: %w", err)
	}
	switch err := c.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch)); {
	case apierrors.IsNotFound(err):
		cm.Data = map[string]string{v1alpha1.StatusWriterKey: string(data)}
		if err := c.Create(ctx, cm); err != nil {
			return fmt.Errorf("create ConfigMap %s: %w", where, err)
		}
	case err != nil:
		return fmt.Errorf("patch ConfigMap %s: %w", where, err)
	}
	return nil
}
