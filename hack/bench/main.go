// Command bench compares pkg/redlock with github.com/go-redsync/redsync/v4 on
// the same five real redis-server masters in one run, next to the floor a
// quorum lock can approach: SET NX + Lua release on a single master. It prints
// a Markdown table with the ratios.
//
// It lives in its own module so that redsync never enters the main module's
// dependencies. Run it with `make bench` (`BENCH_FLAGS=-hog` runs a
// CPU-burning process on every core beside it). A failed operation is
// counted, per implementation, and reported next to its latency; it never
// aborts the run: on a loaded machine every implementation times out now
// and then.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/redlock-operator/redlock-operator/internal/harness/hog"
	"github.com/redlock-operator/redlock-operator/internal/harness/redistest"
	"github.com/redlock-operator/redlock-operator/pkg/redlock"
)

var (
	latencyOps  = flag.Int("latency-ops", 10000, "sequential acquire+release pairs per latency round")
	workers     = flag.Int("workers", 64, "goroutines in the throughput measurement")
	duration    = flag.Duration("duration", 2*time.Second, "length of each throughput round")
	stoppedOps  = flag.Int("stopped-ops", 200, "acquisitions per round with two masters stopped")
	slowOps     = flag.Int("slow-ops", 6, "acquisitions per round for contenders that wait for stopped masters")
	rounds      = flag.Int("rounds", 5, "interleaved rounds; the table shows the median")
	ttl         = flag.Duration("ttl", 10*time.Second, "lock TTL")
	mastersFlag = flag.Int("masters", 5, "number of masters")
	hogFlag     = flag.Bool("hog", false, "run a CPU-burning process on every core beside the benchmark")
)

// contender is one lock implementation under test.
type contender struct {
	name string
	// acquire takes key; release undoes it.
	acquire func(ctx context.Context, key string) (release func(context.Context) error, err error)
	// slow marks contenders that wait for stopped masters: fewer operations.
	slowWhenStopped bool
}

type result struct {
	p50, p99   time.Duration
	opsPerSec  float64
	stoppedP50 time.Duration
	// errors: failed acquire+release pairs of the latency and throughput
	// measurements, out of ops attempted.
	errors, ops int64
}

func main() {
	hog.IfAsked()
	flag.Parse()
	redis.SetLogger(quiet{})
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func run() error {
	dir, err := os.MkdirTemp("", "redlock-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	servers := make([]*redistest.Server, 0, *mastersFlag)
	defer func() {
		for _, s := range servers {
			_ = s.Cont()
			_ = s.Close()
		}
	}()
	for i := range *mastersFlag {
		s, err := redistest.Start(filepath.Join(dir, fmt.Sprint(i)), redistest.Options{})
		if err != nil {
			return err
		}
		servers = append(servers, s)
	}
	addrs := redistest.Addrs(servers)

	contenders, closeAll, err := build(addrs)
	if err != nil {
		return err
	}
	defer closeAll()
	if *hogFlag {
		stop, err := hog.Start()
		if err != nil {
			return err
		}
		defer stop()
	}

	results := map[string][]result{}
	for r := range *rounds {
		lat, latErrs, err := measureLatency(contenders)
		if err != nil {
			return fmt.Errorf("round %d: %w", r+1, err)
		}
		for _, c := range contenders {
			ops, tpOps, tpErrs := measureThroughput(c)
			results[c.name] = append(results[c.name], result{
				p50: percentile(lat[c.name], 0.50), p99: percentile(lat[c.name], 0.99), opsPerSec: ops,
				errors: latErrs[c.name] + tpErrs, ops: int64(*latencyOps) + tpOps,
			})
		}
	}
	// Two of the masters stop answering (SIGSTOP). The floor's master is the
	// last one, which keeps running.
	for _, s := range servers[:2] {
		if err := s.Stop(); err != nil {
			return err
		}
	}
	for r := range *rounds {
		for _, c := range contenders {
			p50, err := measureStopped(c)
			if err != nil {
				return fmt.Errorf("stopped round %d, %s: %w", r+1, c.name, err)
			}
			results[c.name][r].stoppedP50 = p50
		}
	}
	for _, s := range servers[:2] {
		_ = s.Cont()
	}
	printTable(contenders, results)
	return nil
}

func build(addrs []string) ([]contender, func(), error) {
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	ours, err := redlock.New(addrs, redlock.WithTries(1))
	if err != nil {
		return nil, closeAll, err
	}
	closers = append(closers, func() { _ = ours.Close() })

	// redsync's go-redis clients get ContextTimeoutEnabled so that its own
	// timeoutFactor bounds each node; without it a stopped master would hold
	// every acquisition for go-redis's 3s read timeout.
	var pools []rsredis.Pool
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true, DisableIdentity: true})
		closers = append(closers, func() { _ = c.Close() })
		pools = append(pools, rsgoredis.NewPool(c))
	}
	rs := redsync.New(pools...)

	floorClient := redis.NewClient(&redis.Options{Addr: addrs[len(addrs)-1], ContextTimeoutEnabled: true, DisableIdentity: true})
	closers = append(closers, func() { _ = floorClient.Close() })
	release := redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

	// The fan-out floor: the same SET NX PX to every master at once,
	// waiting for a quorum, then the Lua release the same way — no Redlock
	// bookkeeping at all. It shows what five masters on this machine cost by
	// themselves.
	var fan []*redis.Client
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true, DisableIdentity: true})
		closers = append(closers, func() { _ = c.Close() })
		fan = append(fan, c)
	}
	quorum := len(fan)/2 + 1
	fanout := func(ctx context.Context, do func(context.Context, *redis.Client) bool) bool {
		res := make(chan bool, len(fan))
		for _, c := range fan {
			go func() { res <- do(ctx, c) }()
		}
		ok := 0
		for range fan {
			if <-res {
				ok++
			}
			if ok >= quorum {
				return true
			}
		}
		return false
	}

	lockTTL := *ttl
	return []contender{
		{
			name: "redlock-operator",
			acquire: func(ctx context.Context, key string) (func(context.Context) error, error) {
				l, err := ours.Acquire(ctx, key, lockTTL)
				if err != nil {
					return nil, err
				}
				return l.Release, nil
			},
		},
		{
			name:            "redsync (defaults)",
			slowWhenStopped: true,
			acquire: func(ctx context.Context, key string) (func(context.Context) error, error) {
				m := rs.NewMutex(key, redsync.WithExpiry(lockTTL))
				if err := m.LockContext(ctx); err != nil {
					return nil, err
				}
				return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
			},
		},
		{
			name: "redsync (WithFailFast)",
			acquire: func(ctx context.Context, key string) (func(context.Context) error, error) {
				m := rs.NewMutex(key, redsync.WithExpiry(lockTTL), redsync.WithFailFast(true))
				if err := m.LockContext(ctx); err != nil {
					return nil, err
				}
				return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
			},
		},
		{
			name: "fan-out floor: 5 masters, quorum, no bookkeeping",
			acquire: func(ctx context.Context, key string) (func(context.Context) error, error) {
				// A fresh key per operation: this floor does not order its
				// own release before the next SET of the key.
				key = newKey(key)
				val := fmt.Sprint(time.Now().UnixNano())
				if !fanout(ctx, func(ctx context.Context, c *redis.Client) bool {
					ok, err := c.SetNX(ctx, key, val, lockTTL).Result()
					return err == nil && ok
				}) {
					return nil, errors.New("no quorum")
				}
				return func(ctx context.Context) error {
					fanout(ctx, func(ctx context.Context, c *redis.Client) bool {
						return release.Run(ctx, c, []string{key}, val).Err() == nil
					})
					return nil
				}, nil
			},
		},
		{
			name: "floor: 1 master SET NX + Lua",
			acquire: func(ctx context.Context, key string) (func(context.Context) error, error) {
				val := fmt.Sprint(time.Now().UnixNano())
				ok, err := floorClient.SetNX(ctx, key, val, lockTTL).Result()
				if err != nil {
					return nil, err
				}
				if !ok {
					return nil, errors.New("held")
				}
				return func(ctx context.Context) error { return release.Run(ctx, floorClient, []string{key}, val).Err() }, nil
			},
		},
	}, closeAll, nil
}

var keySeq atomic.Int64

func newKey(prefix string) string { return fmt.Sprintf("%s-%d", prefix, keySeq.Add(1)) }

// measureLatency times sequential acquire+release pairs, one contender
// after another op by op (the first contender rotating), so that every
// contender meets the same moments of a noisy machine. A pair that fails is
// counted in errs, not timed; it is an error only when a contender has no
// pair left to time.
func measureLatency(contenders []contender) (lat map[string][]time.Duration, errs map[string]int64, err error) {
	ctx := context.Background()
	lat = make(map[string][]time.Duration, len(contenders))
	errs = make(map[string]int64, len(contenders))
	for _, c := range contenders {
		// Warm up connections.
		for range 50 {
			if rel, err := c.acquire(ctx, newKey("warm")); err == nil {
				_ = rel(ctx)
			}
		}
		lat[c.name] = make([]time.Duration, 0, *latencyOps)
	}
	for i := range *latencyOps {
		for j := range contenders {
			c := contenders[(i+j)%len(contenders)]
			t0 := time.Now()
			if err := pair(ctx, c, newKey("lat")); err != nil {
				errs[c.name]++
				continue
			}
			lat[c.name] = append(lat[c.name], time.Since(t0))
		}
	}
	for _, c := range contenders {
		if len(lat[c.name]) == 0 {
			return nil, nil, fmt.Errorf("%s: all %d acquire+release pairs failed", c.name, *latencyOps)
		}
	}
	return lat, errs, nil
}

// pair acquires key with c and releases it.
func pair(ctx context.Context, c contender, key string) error {
	rel, err := c.acquire(ctx, key)
	if err != nil {
		return err
	}
	return rel(ctx)
}

// measureThroughput runs acquire+release pairs from many goroutines, each
// on its own key, for the configured duration and returns the pairs that
// succeeded per second, the pairs attempted, and those that failed (a
// failed pair may leave its key held until the TTL: that goroutine moves on
// to a new key).
func measureThroughput(c contender) (perSecond float64, attempted, failed int64) {
	ctx := context.Background()
	var ops, errs atomic.Int64
	deadline := time.Now().Add(*duration)
	var wg sync.WaitGroup
	for w := range *workers {
		wg.Go(func() {
			key := fmt.Sprintf("tp-%s-%d", c.name, w)
			for time.Now().Before(deadline) {
				if err := pair(ctx, c, key); err != nil {
					errs.Add(1)
					key = newKey(fmt.Sprintf("tp-%s-%d", c.name, w))
					continue
				}
				ops.Add(1)
			}
		})
	}
	start := time.Now()
	wg.Wait()
	return float64(ops.Load()) / time.Since(start).Seconds(), ops.Load() + errs.Load(), errs.Load()
}

func measureStopped(c contender) (time.Duration, error) {
	ctx := context.Background()
	n := *stoppedOps
	if c.slowWhenStopped {
		n = *slowOps
	}
	lat := make([]time.Duration, 0, n)
	var last error
	for range n {
		t0 := time.Now()
		if _, err := c.acquire(ctx, newKey("stopped")); err != nil { // not released: expires with the TTL
			last = err
			continue
		}
		lat = append(lat, time.Since(t0))
	}
	if len(lat) == 0 {
		return 0, fmt.Errorf("all %d acquisitions failed: %w", n, last)
	}
	return percentile(lat, 0.50), nil
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

func median[T int64 | float64 | time.Duration](xs []T) T {
	s := slices.Clone(xs)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func printTable(contenders []contender, results map[string][]result) {
	type row struct {
		name              string
		p50, p99, stopped time.Duration
		ops               float64
		errors, attempted int64
	}
	rows := make([]row, 0, len(contenders))
	for _, c := range contenders {
		rs := results[c.name]
		var p50, p99, st []time.Duration
		var ops []float64
		var errs, attempted int64
		for _, r := range rs {
			p50, p99, st, ops = append(p50, r.p50), append(p99, r.p99), append(st, r.stoppedP50), append(ops, r.opsPerSec)
			errs, attempted = errs+r.errors, attempted+r.ops
		}
		rows = append(rows, row{c.name, median(p50), median(p99), median(st), median(ops), errs, attempted})
	}
	fmt.Printf("\n%d masters, ttl %v, median of %d rounds%s; latency = acquire+release, one client, %d ops per implementation interleaved op by op; throughput = %d goroutines on distinct keys for %v; stopped = acquire p50 with 2 of %d masters SIGSTOPped; errors = failed acquire+release pairs of the latency and throughput measurements, all rounds\n\n",
		*mastersFlag, *ttl, *rounds, hog.Describe(*hogFlag), *latencyOps, *workers, *duration, *mastersFlag)
	fmt.Println("| implementation | latency p50 | latency p99 | throughput (ops/s) | errors (of pairs) | stopped: acquire p50 |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| %s | %v | %v | %.0f | %d (%.3f%% of %d) | %v |\n", r.name, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.ops,
			r.errors, 100*float64(r.errors)/float64(max(r.attempted, 1)), r.attempted, r.stopped.Round(time.Microsecond))
	}
	ours, rsDef, rsFF, fanFloor, floor := rows[0], rows[1], rows[2], rows[3], rows[4]
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	fmt.Println()
	fmt.Println("| ratio | p50 latency | p99 latency | throughput | stopped acquire p50 | target |")
	fmt.Println("|---|---:|---:|---:|---:|---|")
	fmt.Printf("| redsync (defaults) / redlock-operator | %.2f | %.2f | %.2f | %.1f | ≥ 1.0 healthy; ≥ 10 stopped |\n",
		ratio(rsDef.p50, ours.p50), ratio(rsDef.p99, ours.p99), ours.ops/rsDef.ops, ratio(rsDef.stopped, ours.stopped))
	fmt.Printf("| redsync (WithFailFast) / redlock-operator | %.2f | %.2f | %.2f | %.2f | ≥ 1.0 |\n",
		ratio(rsFF.p50, ours.p50), ratio(rsFF.p99, ours.p99), ours.ops/rsFF.ops, ratio(rsFF.stopped, ours.stopped))
	fmt.Printf("| redlock-operator / floor | %.2f | %.2f | %.2f | %.2f | ≤ 1.5 |\n",
		ratio(ours.p50, floor.p50), ratio(ours.p99, floor.p99), floor.ops/ours.ops, ratio(ours.stopped, floor.stopped))
	fmt.Printf("| redlock-operator / fan-out floor | %.2f | %.2f | %.2f | n/a | (what Redlock adds over bare fan-out) |\n",
		ratio(ours.p50, fanFloor.p50), ratio(ours.p99, fanFloor.p99), fanFloor.ops/ours.ops)
	fmt.Printf("| fan-out floor / floor | %.2f | %.2f | %.2f | n/a | (what five masters cost on this machine) |\n",
		ratio(fanFloor.p50, floor.p50), ratio(fanFloor.p99, floor.p99), floor.ops/fanFloor.ops)
	fmt.Println("\nratios are oriented so that > 1 means redlock-operator is faster (first two rows) or slower than the floor (last row).")
}
