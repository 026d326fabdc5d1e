package redlock_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// BenchmarkAcquireRelease measures one acquire+release pair on five masters.
// hack/bench compares it with go-redsync and a single master (make bench).
func BenchmarkAcquireRelease(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		l, err := c.Acquire(ctx, fmt.Sprint("bench-", i), 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquireReleaseParallel runs acquire+release pairs from
// GOMAXPROCS×16 goroutines, each on its own key.
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	var id atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprint("bench-par-", id.Add(1))
		for pb.Next() {
			l, err := c.Acquire(ctx, key, 10*time.Second)
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// benchClient returns a client on five fresh masters, closed with the
// benchmark.
func benchClient(b *testing.B) *redlock.Client {
	b.Helper()
	servers := redistest.StartN(b, 5, redistest.Options{})
	c, err := redlock.New(redistest.Addrs(servers), redlock.WithTries(1))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}
