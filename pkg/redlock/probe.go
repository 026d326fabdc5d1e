package redlock

import (
	"context"
	"sync"
	"time"
)

// ProbeResult is one master's answer to Probe.
type ProbeResult struct {
	// Addr is the master's address.
	Addr string
	// Err is why the master did not answer (nil when it did).
	Err error
	// RunID and Uptime come from INFO server.
	RunID  string
	Uptime time.Duration
	// QuarantinedUntil is when a recently restarted master votes again;
	// zero or past when it votes now.
	QuarantinedUntil time.Time
	// Latency of the answer.
	Latency time.Duration
}

// Serving reports whether the master answered and may vote now.
func (p ProbeResult) Serving(now time.Time) bool {
	return p.Err == nil && !now.Before(p.QuarantinedUntil)
}

// Probe asks every master for INFO server concurrently, each bounded by the
// node timeout (MaxNodeTimeout without WithNodeTimeout), over the same
// connections locks use, so that a restart found by the probe quarantines
// the master for locks too. With the quarantine check on, it also registers
// this client's window on every master again and learns the longest any
// client registered (see WindowKey): a client learns a longer window within
// one probe of its registration, on connections it made long before.
func (c *Client) Probe(ctx context.Context) ([]ProbeResult, error) {
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		return nil, ErrClosed
	}
	c.bg.Add(len(c.nodes))
	c.mu.RUnlock()
	timeout := c.cfg.nodeTimeout
	if timeout == 0 {
		timeout = MaxNodeTimeout
	}
	out := make([]ProbeResult, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() {
			defer c.bg.Done()
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			t0 := time.Now()
			info, err := n.rdb.Info(nctx, "server").Result()
			r := ProbeResult{Addr: n.addr, Err: err, Latency: time.Since(t0)}
			if err == nil {
				r.RunID, r.Uptime, r.Err = parseServerInfo(info)
			}
			if r.Err == nil && c.cfg.quarantine > 0 {
				// Learn a window another client registered since this
				// client connected, and quarantine by it.
				if r.Err = n.registerWindow(nctx, n.rdb); r.Err == nil {
					n.apply(r.RunID, r.Uptime)
				}
			}
			_, r.QuarantinedUntil = n.quarantined()
			out[i] = r
		})
	}
	wg.Wait()
	return out, nil
}
