// Package redistest runs real redis-server processes on loopback ports for
// tests and benchmarks, and injects faults into them: SIGKILL, SIGSTOP and
// SIGCONT, clean shutdown, and restarts on the same port with or without the
// data directory.
//
// The redis-server binary is taken from $REDIS_SERVER or $PATH; on Debian,
// hack/install-redis.sh installs it. Every server runs in its own directory
// with its own log, bound to 127.0.0.1 only.
package redistest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// Persistence selects how a server persists its keys.
type Persistence string

// Persistence modes, matching the RedisMasterSet API.
const (
	PersistenceNone Persistence = "None"        // no RDB, no AOF: a restart loses every key
	AOFEverySec     Persistence = "AOFEverySec" // appendonly, fsync every second
	AOFAlways       Persistence = "AOFAlways"   // appendonly, fsync on every write
	startTimeout                = 10 * time.Second
	defaultLogLevel             = "warning"
)

// Options configures one server.
type Options struct {
	// Persistence defaults to PersistenceNone.
	Persistence Persistence
	// Password sets requirepass; clients from Server.Client use it.
	Password string
	// ACL lines are written to an ACL file the server loads (instead of
	// requirepass); Username and Password are what Server.Client logs in
	// with.
	ACL      []string
	Username string
	// MaxMemory sets maxmemory ("1" makes every write fail with -OOM under
	// the noeviction policy every server runs with).
	MaxMemory string
	// TLS, when set, makes the server listen for TLS only (no plaintext
	// port).
	TLS *TLS
	// Args are extra "--directive value" arguments.
	Args []string
}

// TLS is a server's TLS material, all PEM.
type TLS struct {
	// Cert and Key are what the server presents.
	Cert, Key []byte
	// CA verifies client certificates, and Server.Client trusts it.
	CA []byte
	// AuthClients makes the server require a client certificate of CA.
	AuthClients bool
	// ClientCert and ClientKey are what Server.Client presents.
	ClientCert, ClientKey []byte
}

// Server is one redis-server process. Its port and directory stay the same
// across restarts.
type Server struct {
	bin  string
	dir  string
	port int
	opts Options

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// Binary returns the redis-server executable: $REDIS_SERVER, or redis-server
// on $PATH.
func Binary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redis-server not found: run hack/install-redis.sh (Debian package redis-server) or set REDIS_SERVER")
	}
	return p, nil
}

// Start starts a server in dir (created if missing) on a free loopback port
// and waits until it answers PING.
func Start(dir string, opts Options) (*Server, error) {
	var lastErr error
	for range 5 { // a free port can be taken between probe and bind
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		s, err := StartAt(dir, port, opts)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// StartAt starts a server in dir on the given loopback port: where a
// managed set's host-network member i listens (port+i), for a test that
// plays the kubelet.
func StartAt(dir string, port int, opts Options) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	s := &Server{bin: bin, dir: dir, port: port, opts: opts}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

// FreePorts returns the first of n consecutive TCP ports free on 127.0.0.1
// a moment ago.
func FreePorts(n int) (int, error) {
	for range 20 {
		first, err := FreePort()
		if err != nil {
			return 0, err
		}
		free := true
		for p := first + 1; p < first+n && free; p++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				free = false
				continue
			}
			_ = l.Close()
		}
		if free {
			return first, nil
		}
	}
	return 0, fmt.Errorf("redistest: no %d consecutive free ports", n)
}

// StartN starts n servers with the same options, each in its own temporary
// directory, and stops them all when the test ends.
func StartN(tb testing.TB, n int, opts Options) []*Server {
	tb.Helper()
	servers := make([]*Server, 0, n)
	tb.Cleanup(func() {
		for _, s := range servers {
			_ = s.Close()
		}
	})
	for i := range n {
		s, err := Start(filepath.Join(tb.TempDir(), "redis-"+strconv.Itoa(i)), opts)
		if err != nil {
			tb.Fatalf("start redis %d: %v", i, err)
		}
		servers = append(servers, s)
	}
	return servers
}

// Addrs returns the servers' addresses.
func Addrs(servers []*Server) []string {
	out := make([]string, len(servers))
	for i, s := range servers {
		out[i] = s.Addr()
	}
	return out
}

// Aliases names the servers by localhost rather than 127.0.0.1: the same
// servers under other address strings.
func Aliases(servers []*Server) []string {
	out := make([]string, len(servers))
	for i, s := range servers {
		out[i] = net.JoinHostPort("localhost", strconv.Itoa(s.Port()))
	}
	return out
}

// FreePort returns a TCP port free on 127.0.0.1 a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redistest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Addr returns "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the TCP port.
func (s *Server) Port() int { return s.port }

// Dir returns the server's working directory (data and log).
func (s *Server) Dir() string { return s.dir }

// PID returns the running process's ID, or 0 when it is not running.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

func (s *Server) args() []string {
	a := []string{"--port", strconv.Itoa(s.port)}
	if t := s.opts.TLS; t != nil {
		auth := "no"
		if t.AuthClients {
			auth = "yes"
		}
		a = []string{
			"--port", "0", "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", filepath.Join(s.dir, "tls.crt"),
			"--tls-key-file", filepath.Join(s.dir, "tls.key"),
			"--tls-ca-cert-file", filepath.Join(s.dir, "ca.crt"),
			"--tls-auth-clients", auth,
		}
	}
	a = append(a,
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
		"--loglevel", defaultLogLevel,
		"--daemonize", "no",
		"--save", "",
		"--maxmemory-policy", "noeviction",
	)
	switch s.opts.Persistence {
	case AOFEverySec:
		a = append(a, "--appendonly", "yes", "--appendfsync", "everysec")
	case AOFAlways:
		a = append(a, "--appendonly", "yes", "--appendfsync", "always")
	default:
		a = append(a, "--appendonly", "no")
	}
	switch {
	case len(s.opts.ACL) > 0:
		a = append(a, "--aclfile", filepath.Join(s.dir, "users.acl"))
	case s.opts.Password != "":
		a = append(a, "--requirepass", s.opts.Password)
	}
	if s.opts.MaxMemory != "" {
		a = append(a, "--maxmemory", s.opts.MaxMemory)
	}
	return append(a, s.opts.Args...)
}

func (s *Server) start() error {
	if t := s.opts.TLS; t != nil {
		for name, b := range map[string][]byte{"tls.crt": t.Cert, "tls.key": t.Key, "ca.crt": t.CA} {
			if err := os.WriteFile(filepath.Join(s.dir, name), b, 0o600); err != nil {
				return fmt.Errorf("write %s: %w", name, err)
			}
		}
	}
	if len(s.opts.ACL) > 0 {
		if err := os.WriteFile(filepath.Join(s.dir, "users.acl"), []byte(strings.Join(s.opts.ACL, "\n")+"\n"), 0o600); err != nil {
			return fmt.Errorf("write ACL file: %w", err)
		}
	}
	cmd := exec.Command(s.bin, s.args()...)
	cmd.Dir = s.dir
	// The server dies with the test process, and signals sent to the test's
	// process group do not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	if err := s.waitReady(exited); err != nil {
		_ = s.Kill()
		return err
	}
	return nil
}

// waitReady polls PING until the server answers or exits.
func (s *Server) waitReady(exited <-chan struct{}) error {
	c := s.Client()
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("redistest: redis-server on port %d exited at start: %s", s.port, s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: redis-server on port %d not ready after %v: %w", s.port, startTimeout, err)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-5):], " | ")
}

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return fmt.Errorf("redistest: redis on port %d is not running", s.port)
	}
	return s.cmd.Process.Signal(sig)
}

// Kill sends SIGKILL and waits for the process to exit. Killing a stopped
// server works. Killing a server that is not running is a no-op.
func (s *Server) Kill() error {
	cmd, exited := s.take()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	return nil
}

// take detaches the running process (nil when none) from the server.
func (s *Server) take() (*exec.Cmd, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	return cmd, exited
}

// Shutdown asks the server to exit cleanly (SIGTERM: with AOF it flushes the
// file) and waits for it.
func (s *Server) Shutdown() error {
	cmd, exited := s.take()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a stopped server cannot handle SIGTERM
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("redistest: shutdown port %d: %w", s.port, err)
	}
	<-exited
	return nil
}

// Stop freezes the server with SIGSTOP: connections stay open, nothing is
// answered.
func (s *Server) Stop() error { return s.signal(syscall.SIGSTOP) }

// Cont resumes a stopped server with SIGCONT.
func (s *Server) Cont() error { return s.signal(syscall.SIGCONT) }

// Restart kills the server if it runs and starts it again on the same port.
// With keepData false the data directory is emptied first, as after losing a
// disk; with keepData true the server reloads what it persisted.
func (s *Server) Restart(keepData bool) error {
	if err := s.Kill(); err != nil {
		return err
	}
	if !keepData {
		if err := s.wipe(); err != nil {
			return err
		}
	}
	return s.start()
}

// wipe removes everything in the directory but the log.
func (s *Server) wipe() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	for _, e := range entries {
		if e.Name() == "redis.log" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
			return fmt.Errorf("redistest: %w", err)
		}
	}
	return nil
}

// Subscribers returns how many connections listen on channel on each
// server (PUBSUB NUMSUB).
func Subscribers(ctx context.Context, servers []*Server, channel string) ([]int64, error) {
	out := make([]int64, len(servers))
	for i, s := range servers {
		c := s.Client()
		n, err := c.PubSubNumSub(ctx, channel).Result()
		_ = c.Close()
		if err != nil {
			return nil, fmt.Errorf("PUBSUB NUMSUB on %s: %w", s.Addr(), err)
		}
		out[i] = n[channel]
	}
	return out, nil
}

// Client returns a new go-redis client for this server, authenticated with
// the server's password (and, with TLS, trusting its CA and presenting its
// client certificate). The caller closes it.
func (s *Server) Client() *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:            s.Addr(),
		Username:        s.opts.Username,
		Password:        s.opts.Password,
		TLSConfig:       s.opts.TLS.ClientConfig(),
		DisableIdentity: true,
		MaxRetries:      -1,
	})
}

// ClientConfig is the tls.Config of a client of a server with t: it trusts
// t.CA and presents t.ClientCert when there is one. It is nil for a nil t.
func (t *TLS) ClientConfig() *tls.Config {
	if t == nil {
		return nil
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(t.CA)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if len(t.ClientCert) > 0 {
		if pair, err := tls.X509KeyPair(t.ClientCert, t.ClientKey); err == nil {
			cfg.Certificates = []tls.Certificate{pair}
		}
	}
	return cfg
}

// Close kills the server. The directory is left for the caller (StartN uses
// the test's temporary directory).
func (s *Server) Close() error { return s.Kill() }

// Proxy is a toxiproxy proxy in front of a server, in this process.
type Proxy struct {
	p *toxiproxy.Proxy
}

// T is what NewProxy needs of a test: testing.TB, or Ginkgo's GinkgoT().
type T interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(f func())
}

// NewProxy starts a proxy in front of addr; it stops with the test.
func NewProxy(tb T, addr string) *Proxy {
	tb.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "proxy-"+addr, "127.0.0.1:0", addr)
	if err := p.Start(); err != nil {
		tb.Fatalf("redistest: start proxy to %s: %v", addr, err)
	}
	tb.Cleanup(p.Stop)
	return &Proxy{p: p}
}

// Addr is the proxy's address.
func (p *Proxy) Addr() string { return p.p.Listen }

// Delay holds every reply for latency from now on (toxiproxy's latency
// toxic on the downstream stream: requests arrive at once, answers late),
// on open connections too; zero removes the delay.
func (p *Proxy) Delay(latency time.Duration) error {
	_ = p.p.Toxics.RemoveToxic(context.Background(), "latency")
	if latency == 0 {
		return nil
	}
	toxic := fmt.Sprintf(`{"name":"latency","type":"latency","stream":"downstream","attributes":{"latency":%d}}`, latency.Milliseconds())
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
		return fmt.Errorf("redistest: delay %s: %w", p.p.Upstream, err)
	}
	return nil
}

// Stall holds every byte in both directions from now on, on open
// connections too, without closing them (toxiproxy's timeout toxic with no
// timeout): what is behind the proxy sees nothing new until Resume.
func (p *Proxy) Stall() error {
	for _, stream := range []string{"upstream", "downstream"} {
		toxic := fmt.Sprintf(`{"name":"stall-%s","type":"timeout","stream":"%s","attributes":{"timeout":0}}`, stream, stream)
		if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			return fmt.Errorf("redistest: stall %s: %w", p.p.Upstream, err)
		}
	}
	return nil
}

// Resume lets the bytes Stall held through.
func (p *Proxy) Resume() {
	for _, stream := range []string{"upstream", "downstream"} {
		_ = p.p.Toxics.RemoveToxic(context.Background(), "stall-"+stream)
	}
}

// LineWaiters counts, for each waiter of a waiting line (pkg/redlock's
// sorted set line, members "<waiter>|<expiry>"), how many of servers list
// it, lapsed or not. A server that does not answer within timeout counts
// for none; the errors come back joined.
func LineWaiters(ctx context.Context, servers []*Server, line string, timeout time.Duration) (map[string]int, error) {
	seen := map[string]int{}
	var errs []error
	for _, s := range servers {
		c := s.Client()
		cctx, cancel := context.WithTimeout(ctx, timeout)
		members, err := c.ZRange(cctx, line, 0, -1).Result()
		cancel()
		_ = c.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("line %s on %s: %w", line, s.Addr(), err))
			continue
		}
		for _, m := range members {
			if i := strings.LastIndex(m, "|"); i >= 0 {
				seen[m[:i]]++
			}
		}
	}
	return seen, errors.Join(errs...)
}
