package redlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxBulkLen is Redis's default proto-max-bulk-len: the largest key or value
// a master accepts.
const maxBulkLen = 512 << 20

// Client acquires, extends and releases locks on a fixed set of independent
// Redis masters. It is safe for concurrent use. Close it to wait for
// background clean-up and to close the connections.
type Client struct {
	cfg    config
	nodes  []*node
	quorum int // of the list given to New
	// lists are the lists of masters (indices into nodes) each voting
	// operation needs a quorum of: the one given to New, and during a
	// membership change (WithJoint) the previous one.
	lists []list

	mu     sync.RWMutex // guards closed against bg.Add after Close
	closed bool
	bg     sync.WaitGroup // node requests and clean-ups still running

	workers *workers // goroutines that run the rounds' requests

	releases releases // this client's releases still running, per key

	closeOnce sync.Once
	closeErr  error
}

// node is one Redis master and what this client knows about its restarts.
type node struct {
	addr  string
	rdb   *redis.Client
	cfg   *config
	peers *[]*node // every node of the client, for duplicate detection

	mu               sync.Mutex
	runID            string
	quarantinedUntil time.Time
	// since is when the server at this address may have begun to lose
	// keys (its estimated start, or when another server was seen there):
	// a longer window learned later quarantines it from then (learn).
	since time.Time
	// uptime is the uptime the server reported on the newest connection.
	uptime time.Duration
	// carried is the longest quarantine window another client registered
	// on the server at this address (see registerWindow), kept over the
	// server's restarts until carriedUntil (this client's clock).
	carried      time.Duration
	carriedUntil time.Time
	// windowErr is why the window could not be registered (an ACL without
	// access to WindowKey); the client then quarantines by its own window.
	windowErr   error
	duplicateOf string // another node of a list of this one's with the same run_id
	// lists has bit g set when the node is in the client's list g (see
	// inList): a
	// server under two addresses votes twice only within one list (a
	// server renamed by a membership change is one master of each list).
	lists uint8

	batch batcher // the lock requests to this master
}

// MasterStatus is a snapshot of what the client knows about one master.
type MasterStatus struct {
	// Addr is the master's address.
	Addr string
	// RunID is the run_id reported on the newest connection ("" before the
	// first connection, or when the quarantine check is off).
	RunID string
	// QuarantinedUntil is when the master votes again; zero or in the past
	// when it votes now.
	QuarantinedUntil time.Time
	// Window is the longest quarantine window known for the master: this
	// client's own, or a longer one another client registered on it (zero
	// when the quarantine check is off). WindowUntil is when a longer one
	// lapses unless registered again (zero for the client's own).
	Window      time.Duration
	WindowUntil time.Time
	// WindowErr is why the window could not be registered on the master
	// (an ACL without access to WindowKey): the client quarantines it by
	// its own window only.
	WindowErr error
}

// New returns a Client for the given master addresses ("host:port"). The
// masters must be independent (no replication between them) and each address
// must appear once. New does not connect; connections are made on first use.
func New(addrs []string, opts ...Option) (*Client, error) {
	cfg := defaultConfig()
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("redlock: new: %w: option %d is nil", ErrInvalidArgument, i)
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("redlock: new: %w: %w", ErrInvalidArgument, err)
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("redlock: new: %w: no masters", ErrInvalidArgument)
	}
	c := &Client{cfg: cfg, quorum: len(addrs)/2 + 1, workers: newWorkers()}
	index := make(map[string]int, len(addrs)+len(cfg.previous))
	current, err := c.addList(addrs, index, 0)
	if err != nil {
		return nil, err
	}
	c.lists = []list{current}
	if cfg.previous != nil {
		previous, err := c.addList(cfg.previous, index, 1)
		if err != nil {
			return nil, fmt.Errorf("%w (previous list)", err)
		}
		if slices.ContainsFunc(c.nodes, func(n *node) bool { return !n.inList(0) || !n.inList(1) }) {
			c.lists = append(c.lists, previous)
			// Masters only in the new list have no copy of what was
			// granted before: they do not vote yet.
			for _, n := range c.nodes {
				if !n.inList(1) {
					n.quarantinedUntil = cfg.newVoteAfter
				}
			}
		}
	}
	return c, nil
}

// list is one list of masters and its quorum.
type list struct {
	members []int // indices into Client.nodes
	quorum  int
}

// addList adds the masters of addrs not yet in index (address → node) to the
// client's nodes, marks them as members of list g and returns the list.
func (c *Client) addList(addrs []string, index map[string]int, g int) (list, error) {
	l := list{quorum: len(addrs)/2 + 1}
	seen := make(map[string]bool, len(addrs))
	for _, addr := range addrs {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return list{}, fmt.Errorf("redlock: new: %w: master address %q: %w", ErrInvalidArgument, addr, err)
		}
		if seen[addr] {
			return list{}, fmt.Errorf("redlock: new: %w: master %q listed twice (it would vote twice)", ErrInvalidArgument, addr)
		}
		seen[addr] = true
		i, ok := index[addr]
		if !ok {
			i = len(c.nodes)
			index[addr] = i
			c.nodes = append(c.nodes, newNode(addr, &c.cfg, &c.nodes))
		}
		c.nodes[i].lists |= 1 << g
		l.members = append(l.members, i)
	}
	return l, nil
}

// tallies counts votes (one per node) per list.
func (c *Client) tallies(votes []Vote) []Tally {
	ts := make([]Tally, len(c.lists))
	for g, l := range c.lists {
		for _, i := range l.members {
			ts[g] = tallyAdd(ts[g], votes[i].Outcome)
		}
	}
	return ts
}

// everyList reports whether f holds for the tally of every list; anyList
// whether it holds for one.
func (c *Client) everyList(ts []Tally, f func(t Tally, size, quorum int) bool) bool {
	for g, l := range c.lists {
		if !f(ts[g], len(l.members), l.quorum) {
			return false
		}
	}
	return true
}

func (c *Client) anyList(ts []Tally, f func(t Tally, size, quorum int) bool) bool {
	return !c.everyList(ts, func(t Tally, size, quorum int) bool { return !f(t, size, quorum) })
}

// granted reports whether a quorum of every list granted.
func (c *Client) granted(ts []Tally) bool {
	return c.everyList(ts, func(t Tally, _, quorum int) bool { return t.Granted >= quorum })
}

// unreachable reports whether the masters that gave no usable answer leave
// some list short of a quorum.
func (c *Client) unreachable(ts []Tally) bool {
	return c.anyList(ts, func(t Tally, size, quorum int) bool { return size-t.unavailable() < quorum })
}

// Joint reports whether the client is one of a membership change (WithJoint).
func (c *Client) Joint() bool { return len(c.lists) > 1 }

func newNode(addr string, cfg *config, peers *[]*node) *node {
	n := &node{addr: addr, cfg: cfg, peers: peers, carried: cfg.knownWindow, carriedUntil: cfg.knownUntil}
	opt := &redis.Options{
		Addr:            addr,
		Username:        cfg.username,
		Password:        cfg.password,
		TLSConfig:       cfg.tlsConfig,
		PoolSize:        cfg.poolSize,
		DisableIdentity: true,
	}
	if cfg.redisOptions != nil {
		cfg.redisOptions(opt)
	}
	// Per-node timeouts come from the request context; a retry inside
	// go-redis (of a command or of a dial) would spend the timeout on one
	// master and could hide a restart.
	opt.ContextTimeoutEnabled = true
	opt.MaxRetries = -1
	opt.DialerRetries = 1
	// go-redis dials in the background on its own context: bound it too.
	opt.DialTimeout = MaxNodeTimeout
	if cfg.nodeTimeout > 0 {
		opt.DialTimeout = cfg.nodeTimeout
	}
	opt.OnConnect = n.onConnect
	// Connections that answered recently skip go-redis's health check
	// (see recentConn).
	dial := opt.Dialer
	if dial == nil {
		dial = redis.NewDialer(opt)
	}
	opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		cn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wrapConn(cn), nil
	}
	n.rdb = redis.NewClient(opt)
	return n
}

// Quorum returns how many masters of the list given to New must grant a
// lock: N/2+1. A joint client (WithJoint) needs as many of the previous
// list too.
func (c *Client) Quorum() int { return c.quorum }

// Masters returns what the client currently knows about each master, in the
// order given to New.
func (c *Client) Masters() []MasterStatus {
	out := make([]MasterStatus, len(c.nodes))
	for i, n := range c.nodes {
		n.mu.Lock()
		out[i] = MasterStatus{Addr: n.addr, RunID: n.runID, QuarantinedUntil: n.quarantinedUntil, Window: n.windowLocked(c.cfg.now()), WindowErr: n.windowErr}
		if out[i].Window > n.cfg.quarantine {
			out[i].WindowUntil = n.carriedUntil
		}
		n.mu.Unlock()
	}
	return out
}

// Close waits for outstanding requests and clean-ups (each bounded by the
// per-node timeout), then closes every connection. Operations after Close
// fail with ErrClosed.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		c.bg.Wait()
		c.workers.stop()
		var errs []error
		for _, n := range c.nodes {
			if err := n.rdb.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close %s: %w", n.addr, err))
			}
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// onConnect runs on every new connection to the master. A restart always
// breaks the connections, so every restart is seen here: with a quarantine
// window set, it reads run_id and uptime, registers on the master the
// largest window this client knows for it and learns any larger one other
// clients registered there (see registerWindow), and quarantines a master
// that came up less than that window ago, or that is another server than
// before.
func (n *node) onConnect(ctx context.Context, cn *redis.Conn) error {
	if n.cfg.quarantine <= 0 {
		return nil
	}
	info, err := cn.Info(ctx, "server").Result()
	if err != nil {
		// Fail closed: a master whose uptime cannot be read does not vote.
		return fmt.Errorf("quarantine check on %s: %w", n.addr, err)
	}
	runID, uptime, err := parseServerInfo(info)
	if err != nil {
		return fmt.Errorf("quarantine check on %s: %w", n.addr, err)
	}
	if err := n.registerWindow(ctx, cn); err != nil {
		return fmt.Errorf("quarantine check on %s: %w", n.addr, err)
	}
	n.apply(runID, uptime)
	// Two addresses of one server in one list would let it vote twice
	// there: mark both.
	for _, p := range *n.peers {
		if p != n && p.lists&n.lists != 0 && p.currentRunID() == runID {
			n.markDuplicate(p.addr)
			p.markDuplicate(n.addr)
		}
	}
	return nil
}

// inList reports whether the node is a master of the client's list g.
func (n *node) inList(g int) bool { return n.lists&(1<<g) != 0 }

func (n *node) markDuplicate(of string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.duplicateOf = of
}

// duplicate returns the address of another node found to be the same
// server, or "".
func (n *node) duplicate() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.duplicateOf
}

// apply records what a new connection found: the master's incarnation, how
// long it has been up, and the largest quarantine window known for it. A
// master up for less than that window does not vote until the window has
// passed on this client's clock. A run_id other than the one this client saw
// before means another server answers at the address (a restart, a failover
// to a replica, a re-pointed name): it lacks the keys the previous one held,
// however long it has been up, so it sits out the full window from now. The
// first connection to an address has no earlier run_id to compare with and
// is judged by its uptime alone.
func (n *node) apply(runID string, uptime time.Duration) {
	now := n.cfg.now()
	n.mu.Lock()
	window := n.windowLocked(now)
	changed := n.runID != "" && n.runID != runID
	n.runID, n.uptime = runID, uptime
	// uptime_in_seconds is the difference of two whole-second clocks: it
	// may overstate the time up by almost a second.
	switch since := now.Add(-max(uptime-time.Second, 0)); {
	case changed:
		n.since = now
	case since.After(n.since):
		n.since = since
	}
	event := n.quarantineLocked(now, window, changed)
	n.mu.Unlock()
	if event != nil {
		n.cfg.observer.ObserveQuarantine(*event)
	}
}

// quarantineLocked keeps the master out until window has passed since
// n.since, and returns the event to report when that newly quarantines it
// or another server answers (changed). n.mu must be held.
func (n *node) quarantineLocked(now time.Time, window time.Duration, changed bool) *QuarantineEvent {
	until := n.since.Add(window)
	if !changed && !until.After(now) {
		return nil
	}
	var event *QuarantineEvent
	if changed || !now.Before(n.quarantinedUntil) {
		event = &QuarantineEvent{Addr: n.addr, RunID: n.runID, Uptime: n.uptime}
	}
	if until.After(n.quarantinedUntil) {
		n.quarantinedUntil = until
	}
	if event != nil {
		event.Until = n.quarantinedUntil
	}
	return event
}

func (n *node) currentRunID() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.runID
}

// quarantined reports whether the master must not vote now, and until when.
func (n *node) quarantined() (bool, time.Time) {
	now := n.cfg.now()
	n.mu.Lock()
	defer n.mu.Unlock()
	return now.Before(n.quarantinedUntil), n.quarantinedUntil
}

// parseServerInfo extracts run_id and uptime_in_seconds from INFO server.
func parseServerInfo(info string) (runID string, uptime time.Duration, err error) {
	var haveUptime bool
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "redis_version":
			// Extensions use PEXPIRE … GT (Redis 7): an older server
			// would fail every one of them.
			if major, _, _ := strings.Cut(v, "."); len(major) == 1 && major < "7" {
				return "", 0, fmt.Errorf("redis_version %s: Redis 7 or later is needed", v)
			}
		case "run_id":
			runID = v
		case "uptime_in_seconds":
			s, perr := strconv.ParseInt(v, 10, 64)
			if perr != nil || s < 0 {
				return "", 0, fmt.Errorf("bad uptime_in_seconds %q", v)
			}
			uptime, haveUptime = time.Duration(s)*time.Second, true
		}
	}
	if runID == "" || !haveUptime {
		return "", 0, errors.New("INFO server lacks run_id or uptime_in_seconds")
	}
	return runID, uptime, nil
}

// nodeTimeout is the per-node timeout for an operation with this TTL.
func (c *Client) nodeTimeout(ttl time.Duration) time.Duration {
	if c.cfg.nodeTimeout > 0 {
		return c.cfg.nodeTimeout
	}
	return min(max(ttl/100, MinNodeTimeout), MaxNodeTimeout)
}

// Drift is the clock drift allowance subtracted from every validity with
// this TTL: ttl·0.01 + 2ms. A master that forgot its keys must stay out for
// longer than the longest TTL plus its drift.
func Drift(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*driftFactor) + driftConst
}

// checkWindow refuses a TTL that the quarantine window does not cover: a
// master that restarted and lost the lock's key could vote again while the
// lock is still valid.
func (c *Client) checkWindow(op Op, ttl time.Duration) error {
	if w := c.cfg.quarantine; w > 0 && ttl+Drift(ttl) > w {
		return invalidf(op, "ttl %v plus drift %v exceeds the quarantine window %v: a restarted master could grant a lock it forgot", ttl, Drift(ttl), w)
	}
	return nil
}

// ValidateKey reports whether Acquire may take key: nil, or an
// ErrInvalidArgument error that says why not (Redis's limits, and the keys
// the package reserves; see validateKey). Nothing is sent.
func ValidateKey(key string) error { return validateKey(OpAcquire, key) }

// ValidateSlot reports whether AcquireSlot may take s, as ValidateKey.
func ValidateSlot(s Slot) error { return validateSlot(OpAcquire, s) }

// validateKey checks a lock's (or a semaphore's) key against Redis's
// limits and the keys the package reserves: WindowKey, fencing counters
// ("<key>:fence"), semaphores' slots ("<key>:slot:<i>", taken through
// AcquireSlot and restored WithSlot only) and waiting lines
// ("<key>:line").
func validateKey(op Op, key string) error {
	if err := validateStoredKey(op, key); err != nil {
		return err
	}
	if sem, i, ok := parseSlotKey(key); ok {
		return invalidf(op, "key %q is slot %d of the semaphore %q: take it with AcquireSlot or AcquireSemaphore, restore it WithSlot", key, i, sem)
	}
	return nil
}

// validateStoredKey checks any key the package writes a value under.
func validateStoredKey(op Op, key string) error {
	if key == "" {
		return invalidf(op, "empty key")
	}
	if len(key) > maxBulkLen {
		return invalidf(op, "key of %d bytes exceeds Redis's limit of %d", len(key), maxBulkLen)
	}
	if key == WindowKey {
		return invalidf(op, "key %q is reserved for the masters' quarantine window", key)
	}
	if strings.HasSuffix(key, fenceSuffix) {
		return invalidf(op, "key %q ends in %q, reserved for fencing counters: it would be the counter of the lock %q", key, fenceSuffix, strings.TrimSuffix(key, fenceSuffix))
	}
	if strings.HasSuffix(key, lineSuffix) {
		return invalidf(op, "key %q ends in %q, reserved for waiting lines: it would be the line of the lock %q", key, lineSuffix, strings.TrimSuffix(key, lineSuffix))
	}
	return nil
}

// validateValue checks a lock value against Redis's limits and the
// semaphores' declarations.
func validateValue(op Op, value string) error {
	if value == "" {
		return invalidf(op, "empty value")
	}
	if isDeclaration(value) {
		return invalidf(op, "value %q starts with %q, reserved for the semaphores' declarations", value, declarationPrefix)
	}
	if len(value) > maxBulkLen {
		return invalidf(op, "value of %d bytes exceeds Redis's limit of %d", len(value), maxBulkLen)
	}
	return nil
}

// validateTTL checks a TTL: whole milliseconds are sent, and the drift
// allowance must leave some validity.
func validateTTL(op Op, ttl time.Duration) error {
	if ttl <= 0 {
		return invalidf(op, "ttl %v must be positive", ttl)
	}
	if ttl%time.Millisecond != 0 {
		return invalidf(op, "ttl %v is not a whole number of milliseconds", ttl)
	}
	if ttl <= Drift(ttl) {
		return invalidf(op, "ttl %v leaves no validity after the drift allowance %v", ttl, Drift(ttl))
	}
	return nil
}
