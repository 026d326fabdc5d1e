package redistest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
)

// get reads the test key "k".
func get(t *testing.T, s *redistest.Server) (string, error) {
	t.Helper()
	c := s.Client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	return c.Get(ctx, "k").Result()
}

// put writes the test key "k".
func put(t *testing.T, s *redistest.Server) {
	t.Helper()
	c := s.Client()
	defer c.Close()
	if err := c.Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
}

func TestRestartKeepsOrLosesData(t *testing.T) {
	for _, tc := range []struct {
		name        string
		persistence redistest.Persistence
		keep        bool
		clean       bool // shut down cleanly instead of SIGKILL
		survives    bool
	}{
		{"none, killed", redistest.PersistenceNone, true, false, false},
		{"always, killed, data kept", redistest.AOFAlways, true, false, true},
		{"always, killed, data wiped", redistest.AOFAlways, false, false, false},
		{"everysec, clean shutdown", redistest.AOFEverySec, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := redistest.StartN(t, 1, redistest.Options{Persistence: tc.persistence})[0]
			put(t, s)
			port := s.Port()
			if tc.clean {
				if err := s.Shutdown(); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Restart(tc.keep); err != nil {
				t.Fatal(err)
			}
			if s.Port() != port {
				t.Fatalf("port changed from %d to %d", port, s.Port())
			}
			_, err := get(t, s)
			if survived := err == nil; survived != tc.survives {
				t.Fatalf("key survived = %v (err %v), want %v", survived, err, tc.survives)
			}
		})
	}
}

func TestStopContAndKill(t *testing.T) {
	s := redistest.StartN(t, 1, redistest.Options{})[0]
	put(t, s)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, s); err == nil {
		t.Fatal("a stopped server answered")
	}
	if err := s.Cont(); err != nil {
		t.Fatal(err)
	}
	if v, err := get(t, s); err != nil || v != "v" {
		t.Fatalf("after SIGCONT: %q, %v", v, err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if s.PID() != 0 {
		t.Fatal("PID of a killed server is not 0")
	}
	if _, err := get(t, s); err == nil {
		t.Fatal("a killed server answered")
	}
}

func TestPasswordAndMaxMemory(t *testing.T) {
	s := redistest.StartN(t, 1, redistest.Options{Password: "pw", MaxMemory: "1"})[0]
	anon := redis.NewClient(&redis.Options{Addr: s.Addr(), DisableIdentity: true})
	defer anon.Close()
	if err := anon.Set(context.Background(), "k", "v", 0).Err(); err == nil || !contains(err, "NOAUTH") {
		t.Fatalf("unauthenticated SET: %v, want NOAUTH", err)
	}
	c := s.Client()
	defer c.Close()
	if err := c.Set(context.Background(), "k", "v", 0).Err(); err == nil || !contains(err, "OOM") {
		t.Fatalf("SET over maxmemory: %v, want OOM", err)
	}
}

func contains(err error, s string) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && len(rerr.Error()) >= len(s) && rerr.Error()[:len(s)] == s
}
