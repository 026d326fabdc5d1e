package redlock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
)

// TestFencingWriteBackWithoutQuorumFails freezes two of three masters
// between the rounds of a fenced acquisition: the SETs were granted, but the
// write-back reaches only a minority. The acquisition fails, the master that
// answers is cleaned before Acquire returns, and the frozen ones keep the
// value no longer than the TTL.
func TestFencingWriteBackWithoutQuorumFails(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Options{})
	t.Cleanup(func() {
		for _, s := range servers[1:] {
			_ = s.Cont()
		}
	})
	const key, ttl = "writeback-minority", 1500 * time.Millisecond
	c, err := New(redistest.Addrs(servers), WithTries(1), WithNodeTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	var once sync.Once
	c.cfg.beforeFenceWriteBack = func() {
		once.Do(func() {
			for _, s := range servers[1:] {
				if err := s.Stop(); err != nil {
					t.Error(err)
				}
			}
		})
	}
	_, err = c.Acquire(context.Background(), key, ttl, WithFencing())
	if !errors.Is(err, ErrQuorumUnavailable) || !strings.Contains(err.Error(), "write-back") {
		t.Fatalf("err = %v, want ErrQuorumUnavailable in the write-back", err)
	}
	get := func(s *redistest.Server) string {
		rc := s.Client()
		defer rc.Close()
		v, err := rc.Get(context.Background(), key).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("GET on %s: %v", s.Addr(), err)
		}
		return v
	}
	if v := get(servers[0]); v != "" {
		t.Fatalf("the failed acquisition left %q on the reachable master", v)
	}
	for _, s := range servers[1:] {
		if err := s.Cont(); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range servers[1:] {
		rc := s.Client()
		d, err := rc.PTTL(context.Background(), key).Result()
		_ = rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		if d > ttl {
			t.Fatalf("value on %s lives %v, longer than the TTL", s.Addr(), d)
		}
	}
	deadline := time.Now().Add(ttl + 2*time.Second)
	for get(servers[1]) != "" || get(servers[2]) != "" {
		if time.Now().After(deadline) {
			t.Fatalf("the frozen masters still hold the value after the TTL")
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}
