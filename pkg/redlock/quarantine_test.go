package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

// switchProxy is a TCP proxy on a loopback port whose backend can be
// switched, as a failover or a re-pointed DNS name switches the server
// behind an address. Switching breaks the connections made through it.
type switchProxy struct {
	ln net.Listener

	mu      sync.Mutex
	backend string
	conns   map[net.Conn]struct{}
	closed  bool
}

func newSwitchProxy(t *testing.T, backend string) *switchProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{ln: ln, backend: backend, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *switchProxy) addr() string { return p.ln.Addr().String() }

func (p *switchProxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		backend := p.backend
		p.mu.Unlock()
		out, err := net.Dial("tcp", backend)
		if err != nil {
			_ = in.Close()
			continue
		}
		if !p.track(in, out) {
			continue
		}
		go func() {
			_, _ = io.Copy(out, in)
			_ = out.Close()
			_ = in.Close()
		}()
		go func() {
			_, _ = io.Copy(in, out)
			_ = in.Close()
			_ = out.Close()
		}()
	}
}

// track records a connection pair, or closes it when the proxy is closed.
func (p *switchProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// switchTo points the proxy at another backend and breaks every connection.
func (p *switchProxy) switchTo(backend string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.backend = backend
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

func (p *switchProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// waitUp waits until every server reports an uptime of at least d plus
// the second a client takes off it: longer than a quarantine window d, they
// vote on a first connection.
func waitUp(t *testing.T, servers []*redistest.Server, d time.Duration) {
	t.Helper()
	d += time.Second
	waitFor(t, 3*d, fmt.Sprintf("every server to report an uptime of %v", d), func() bool {
		for _, s := range servers {
			if uptime(t, s) < d {
				return false
			}
		}
		return true
	})
}

// uptime reads a server's uptime_in_seconds.
func uptime(t *testing.T, s *redistest.Server) time.Duration {
	t.Helper()
	c := s.Client()
	defer c.Close()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "uptime_in_seconds:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return time.Duration(n) * time.Second
		}
	}
	t.Fatal("INFO server lacks uptime_in_seconds")
	return 0
}

// TestRunIDChangeQuarantinesLongRunningServer: while a lock is held, two of
// three master addresses start answering from other servers that have been
// up for longer than the quarantine window (a failover to long-running
// replicas, a re-pointed name). Those servers lack the lock's key; a client
// that saw the previous servers at those addresses must not let them vote,
// so it cannot take the key within the holder's validity.
func TestRunIDChangeQuarantinesLongRunningServer(t *testing.T) {
	const window, ttl = 2 * time.Second, time.Second
	masters := redistest.StartN(t, 3, redistest.Options{})
	others := redistest.StartN(t, 2, redistest.Options{})
	all := append(append([]*redistest.Server(nil), masters...), others...)
	waitUp(t, all, window)
	proxies := make([]*switchProxy, len(masters))
	addrs := make([]string, len(masters))
	for i, s := range masters {
		proxies[i] = newSwitchProxy(t, s.Addr())
		addrs[i] = proxies[i].addr()
	}
	obs := &observer{}
	contender := newClient(t, addrs, redlock.WithTries(1), redlock.WithQuarantine(window), redlock.WithObserver(obs),
		redlock.WithNodeTimeout(500*time.Millisecond))
	ctx := context.Background()
	// The contender knows the current servers (long-running: they vote).
	res, err := contender.Probe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if !r.Serving(time.Now()) {
			t.Fatalf("master %s not serving before the switch: %+v", r.Addr, r)
		}
	}

	holder := newClient(t, redistest.Addrs(masters), redlock.WithTries(1), redlock.WithNodeTimeout(500*time.Millisecond))
	lock, err := holder.Acquire(ctx, "switched", ttl)
	if err != nil {
		t.Fatal(err)
	}
	proxies[1].switchTo(others[0].Addr())
	proxies[2].switchTo(others[1].Addr())

	attempts, quarantined := 0, 0
	for time.Now().Before(lock.ValidUntil()) {
		_, err := contender.Acquire(ctx, "switched", ttl)
		if err == nil {
			t.Fatalf("the contender acquired the key within the holder's validity (attempt %d): the new servers voted", attempts+1)
		}
		if !errors.Is(err, redlock.ErrQuorumUnavailable) && !errors.Is(err, redlock.ErrLockHeld) {
			t.Fatalf("attempt %d: %v", attempts+1, err)
		}
		attempts++
		quarantined = max(quarantined, countOutcome(votesOf(t, err), redlock.OutcomeQuarantined))
	}
	if quarantined != 2 {
		t.Fatalf("%d attempts within the validity; at most %d masters voted quarantined, want the 2 switched ones", attempts, quarantined)
	}
	for i, m := range contender.Masters()[1:] {
		if !m.QuarantinedUntil.After(time.Now()) {
			t.Errorf("switched master %d: %+v, want quarantined", i+1, m)
		}
	}
	if ev := obs.quarantines(); len(ev) < 2 || ev[len(ev)-1].Uptime < window {
		t.Errorf("quarantine events %+v, want the switched long-running servers", ev)
	}
}

// Two clients name the same servers by different addresses (127.0.0.1 and
// localhost) with different quarantine windows, as two RedisMasterSets with
// different maxLockTTLs sharing servers would. After a majority of the
// servers restarts empty, the short-window client must not grant the key
// while the long-window holder's validity still stands: it quarantines the
// restarted servers by the longest window registered on them before their
// restart — whichever client met the servers first (the short one learns a
// window registered after it connected on its next probe, as the operator
// probes every set's masters periodically).
func TestSharedServersQuarantineByTheLargestWindow(t *testing.T) {
	for _, shortFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("short-window client connected first: %v", shortFirst), func(t *testing.T) {
			const short, long, ttl = 1200 * time.Millisecond, 3 * time.Second, 2500 * time.Millisecond
			masters := redistest.StartN(t, 3, redistest.Options{})
			waitUp(t, masters, long)
			aliases := redistest.Aliases(masters)
			ctx := context.Background()
			contender := newClient(t, aliases, redlock.WithTries(1), redlock.WithQuarantine(short), redlock.WithNodeTimeout(500*time.Millisecond))
			if shortFirst {
				if _, err := contender.Probe(ctx); err != nil {
					t.Fatal(err)
				}
			}
			holder := newClient(t, redistest.Addrs(masters), redlock.WithTries(1), redlock.WithQuarantine(long), redlock.WithNodeTimeout(500*time.Millisecond))
			lock, err := holder.Acquire(ctx, "shared", ttl)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := contender.Acquire(ctx, "shared", time.Second); !errors.Is(err, redlock.ErrLockHeld) {
				t.Fatalf("the contender while the holder holds the key: %v, want ErrLockHeld", err)
			}
			// The holder's acquisition needed only a quorum: its connection to
			// the third master (and the window registered on it) may come
			// later, as it did under a CPU hog. The operator probes the
			// holder's set too, which registers its window on every master.
			if _, err := holder.Probe(ctx); err != nil {
				t.Fatal(err)
			}
			// The operator's periodic probe: it registers and learns on every
			// master, on connections made before the holder registered.
			if _, err := contender.Probe(ctx); err != nil {
				t.Fatal(err)
			}
			for _, m := range contender.Masters() {
				if m.Window != long || m.WindowErr != nil {
					t.Fatalf("the contender's view of %s: window %v (%v), want the holder's %v registered on the server", m.Addr, m.Window, m.WindowErr, long)
				}
			}

			// A majority of the servers restarts without its keys.
			for _, s := range masters[1:] {
				if err := s.Restart(false); err != nil {
					t.Fatal(err)
				}
			}
			attempts := 0
			for time.Now().Before(lock.ValidUntil()) {
				l, err := contender.Acquire(ctx, "shared", time.Second)
				if err == nil {
					t.Fatalf("the short-window client acquired the key %v before the long-window holder's validity ended (attempt %d, token %d)",
						time.Until(lock.ValidUntil()).Round(time.Millisecond), attempts+1, l.Token())
				}
				attempts++
			}
			t.Logf("%d attempts of the short-window client within the holder's validity, all refused", attempts)
			for _, m := range contender.Masters()[1:] {
				if m.Window != long {
					t.Errorf("restarted master %s: window %v after the restart, want %v carried over", m.Addr, m.Window, long)
				}
			}
		})
	}
}

// A registration lapses twice its window after the last one: a set deleted
// (or given a shorter maxLockTTL) stops holding the others back, and not
// before its locks have expired.
func TestRegisteredWindowLapses(t *testing.T) {
	const short, long = 300 * time.Millisecond, time.Second
	masters := redistest.StartN(t, 1, redistest.Options{})
	ctx := context.Background()
	longClient, err := redlock.New(redistest.Addrs(masters), redlock.WithQuarantine(long))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := longClient.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	registered := time.Now()
	_ = longClient.Close()
	shortClient := newClient(t, redistest.Addrs(masters), redlock.WithQuarantine(short))
	if _, err := shortClient.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	if w := shortClient.Masters()[0].Window; w != long {
		t.Fatalf("window %v, want the %v registered", w, long)
	}
	waitFor(t, 10*time.Second, "the registration to lapse", func() bool {
		if _, err := shortClient.Probe(ctx); err != nil {
			t.Fatal(err)
		}
		return shortClient.Masters()[0].Window == short
	})
	if lapsed := time.Since(registered); lapsed < 2*long {
		t.Fatalf("the %v window lapsed %v after its last registration, before twice the window", long, lapsed)
	}
}

// A master whose ACL does not allow the window registration (narrowed to
// the application's keys before WindowKey existed) still votes, by the
// client's own window, and the client says why; an ACL narrowed to the
// operator's default prefix covers WindowKey.
func TestWindowRegistrationRefusedByTheACL(t *testing.T) {
	ctx := context.Background()
	narrow := redistest.StartN(t, 3, redistest.Options{
		ACL:      []string{"user default off", "user locker on >pw ~app:* resetchannels " + redlock.ACLRules},
		Username: "locker", Password: "pw",
	})
	// Fresh servers sit out the window first.
	acquire := func(c *redlock.Client, key string) {
		t.Helper()
		var err error
		waitFor(t, 10*time.Second, "an acquisition once the fresh servers vote", func() bool {
			_, err = c.Acquire(ctx, key, time.Second)
			return err == nil
		})
	}
	c := newClient(t, redistest.Addrs(narrow), redlock.WithAuth("locker", "pw"), redlock.WithQuarantine(1100*time.Millisecond))
	acquire(c, "app:x")
	for _, m := range c.Masters() {
		if m.WindowErr == nil || !strings.Contains(m.WindowErr.Error(), "NOPERM") {
			t.Errorf("master %s: WindowErr %v, want the NOPERM refusal", m.Addr, m.WindowErr)
		}
	}
	prefixed := redistest.StartN(t, 3, redistest.Options{
		ACL:      []string{"user default off", "user locker on >pw ~redlock:* resetchannels " + redlock.ACLRules},
		Username: "locker", Password: "pw",
	})
	c = newClient(t, redistest.Addrs(prefixed), redlock.WithAuth("locker", "pw"), redlock.WithQuarantine(1100*time.Millisecond))
	acquire(c, "redlock:ns/x")
	if _, err := c.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Masters() {
		if m.WindowErr != nil {
			t.Errorf("master %s with ~redlock:*: %v", m.Addr, m.WindowErr)
		}
	}
}
