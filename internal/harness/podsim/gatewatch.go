package podsim

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redlock-operator/redlock-operator/api/v1alpha1"
)

// IsGated reports whether pod still waits behind the operator's
// scheduling gate.
func IsGated(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == v1alpha1.SchedulingGate })
}

// GateWatch records when a watch first showed each pod without the
// operator's scheduling gate: the moment the scheduler may place it. One
// GateWatch may watch several API servers; pod names must then differ
// between them. One Wait at a time.
type GateWatch struct {
	mu   sync.Mutex
	seen map[string]time.Time
	wake chan struct{}
}

// NewGateWatch returns a GateWatch watching nothing yet.
func NewGateWatch() *GateWatch {
	return &GateWatch{seen: map[string]time.Time{}, wake: make(chan struct{}, 1)}
}

// Watch starts watching the pods of namespace ns through c, until ctx
// ends. Pods ungated before it are not recorded.
func (w *GateWatch) Watch(ctx context.Context, c client.WithWatch, ns string) error {
	var list corev1.PodList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("list pods of %s: %w", ns, err)
	}
	watcher, err := c.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		return fmt.Errorf("watch pods of %s: %w", ns, err)
	}
	go func() {
		defer watcher.Stop()
		for ev := range watcher.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) || IsGated(pod) {
				continue
			}
			now := time.Now()
			w.mu.Lock()
			if _, ok := w.seen[pod.Name]; !ok {
				w.seen[pod.Name] = now
			}
			w.mu.Unlock()
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}()
	return nil
}

// Wait returns the first of names the watch showed ungated, and when; an
// error when none is within timeout.
func (w *GateWatch) Wait(ctx context.Context, timeout time.Duration, names ...string) (string, time.Time, error) {
	deadline := time.After(timeout)
	for {
		first, at := "", time.Time{}
		w.mu.Lock()
		for _, n := range names {
			if t, ok := w.seen[n]; ok && (first == "" || t.Before(at)) {
				first, at = n, t
			}
		}
		w.mu.Unlock()
		if first != "" {
			return first, at, nil
		}
		select {
		case <-w.wake:
		case <-deadline:
			return "", time.Time{}, fmt.Errorf("none of pods %v ungated within %v", names, timeout)
		case <-ctx.Done():
			return "", time.Time{}, ctx.Err()
		}
	}
}
