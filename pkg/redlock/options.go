package redlock

import (
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults used when the corresponding option is not given.
const (
	// DefaultTries is how many acquisition attempts Acquire makes.
	DefaultTries = 32
	// DefaultRetryDelayMin and DefaultRetryDelayMax bound the random delay
	// between two acquisition attempts.
	DefaultRetryDelayMin = 50 * time.Millisecond
	DefaultRetryDelayMax = 250 * time.Millisecond
	// MinNodeTimeout and MaxNodeTimeout clamp the per-node timeout derived
	// from the TTL (ttl/100) when WithNodeTimeout is not given. The timeout
	// covers connection set-up too (dial, handshake, AUTH and the INFO of the
	// quarantine check) and the scheduling delays of a busy client host: at
	// 20ms a loaded 2-core machine turned answering masters into timed-out
	// "no" votes for TTLs around a second. 50ms still leaves 95% of a 1s TTL,
	// and only an undecided round waits for it (answers decide at once).
	MinNodeTimeout = 50 * time.Millisecond
	MaxNodeTimeout = 200 * time.Millisecond

	// driftFactor and driftConst make up the clock drift allowance
	// ttl·driftFactor + driftConst subtracted from every validity.
	driftFactor = 0.01
	driftConst  = 2 * time.Millisecond
)

// Option configures a Client. Options return an error for invalid values,
// which New reports.
type Option func(*config) error

type config struct {
	nodeTimeout   time.Duration // 0: derived from each operation's TTL
	tries         int
	retryMin      time.Duration
	retryMax      time.Duration
	quarantine    time.Duration
	knownWindow   time.Duration // see WithKnownWindow
	knownUntil    time.Time
	previous      []string  // see WithJoint
	newVoteAfter  time.Time // when masters only in the new list vote
	maxExtensions int       // 0: unlimited
	// releaseNotices: Release publishes a notice (WithReleaseNotices).
	releaseNotices bool
	observer       Observer
	username       string
	password       string
	tlsConfig      *tls.Config
	poolSize       int
	redisOptions   func(*redis.Options)
	now            func() time.Time

	// beforeFenceWriteBack, when set (by tests), runs between the two
	// rounds of a fenced acquisition, to inject faults there.
	beforeFenceWriteBack func()
}

func defaultConfig() config {
	return config{
		tries:    DefaultTries,
		retryMin: DefaultRetryDelayMin,
		retryMax: DefaultRetryDelayMax,
		observer: nopObserver{},
		now:      time.Now,
	}
}

// WithNodeTimeout bounds each request to a single master, connection set-up
// included. Keep it small relative to the TTL: a master that does not answer
// within it counts as a "no" vote. Without this option the timeout is ttl/100
// clamped to [MinNodeTimeout, MaxNodeTimeout].
func WithNodeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("node timeout %v: must be positive", d)
		}
		c.nodeTimeout = d
		return nil
	}
}

// WithTries sets how many acquisition attempts Acquire makes before it gives
// up (at least 1; 1 means no retry).
func WithTries(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("tries %d: must be at least 1", n)
		}
		c.tries = n
		return nil
	}
}

// WithRetryDelay sets the bounds of the random delay between two acquisition
// attempts. The jitter desynchronises clients that contend for one key.
func WithRetryDelay(minDelay, maxDelay time.Duration) Option {
	return func(c *config) error {
		if minDelay < 0 || maxDelay < minDelay {
			return fmt.Errorf("retry delay [%v, %v]: need 0 <= min <= max", minDelay, maxDelay)
		}
		c.retryMin, c.retryMax = minDelay, maxDelay
		return nil
	}
}

// WithQuarantine sets the quarantine window for restarted masters: a master
// whose uptime is shorter than the window when a new connection to it is
// made does not vote until the window has passed, measured on this client's
// clock; a master whose run_id differs from the one this client saw at that
// address before (another server answers there) does not vote for the whole
// window from then on, whatever its uptime. It must exceed the longest TTL plus the drift allowance: Acquire
// refuses a longer TTL. Zero (the default) turns the check off.
func WithQuarantine(window time.Duration) Option {
	return func(c *config) error {
		if window < 0 {
			return fmt.Errorf("quarantine window %v: must not be negative", window)
		}
		c.quarantine = window
		return nil
	}
}

// WithJoint makes the client one of a membership change, joint as in
// consensus systems: the addresses given to New are the new list, previous
// the list grants were made on until now, and every voting operation
// (acquire, extend, the fencing write-back) needs a quorum of each list.
// Releases go to the masters of both lists. Any grant made on previous
// alone, and any grant this client makes, then share a master of previous
// holding the first; any grant this client makes and any made later on the
// new list alone share a master of the new list. Masters only in the new
// list hold no copy of the locks granted before and no fencing counter:
// they do not vote before newVoteAfter, but get the value put back (see
// Lock.Extend) like a restarted master, so that a lock held through the
// change is held on the new list when the change ends.
//
// The caller keeps the joint client until every grant made on previous
// alone has passed its validity (the longest TTL plus its drift after the
// last such grant could be made) and newVoteAfter has passed, and only then
// uses a client of the new list alone. Two changes at once (a joint client
// whose previous list is itself mid-change) are not supported: finish one
// first.
func WithJoint(previous []string, newVoteAfter time.Time) Option {
	return func(c *config) error {
		if len(previous) == 0 {
			return errors.New("joint: no previous masters")
		}
		c.previous = slices.Clone(previous)
		c.newVoteAfter = newVoteAfter
		return nil
	}
}

// WithKnownWindow starts the client carrying a quarantine window longer
// than its own that another client registered on the masters, until until
// (a window learned before the client was built, e.g. kept in a
// RedisMasterSet's status across an operator restart). It has effect only
// with WithQuarantine.
func WithKnownWindow(window time.Duration, until time.Time) Option {
	return func(c *config) error {
		if window < 0 || window > MaxWindow {
			return fmt.Errorf("known window %v: must be in [0, %v]", window, MaxWindow)
		}
		c.knownWindow, c.knownUntil = window, until
		return nil
	}
}

// WithMaxExtensions bounds how often one acquisition may be extended (the
// Redlock liveness rule). Zero (the default) means no bound.
func WithMaxExtensions(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("max extensions %d: must not be negative", n)
		}
		c.maxExtensions = n
		return nil
	}
}

// WithObserver receives an event for every operation attempt and every
// quarantine decision, for metrics and logs.
func WithObserver(o Observer) Option {
	return func(c *config) error {
		if o == nil {
			return errors.New("observer: must not be nil")
		}
		c.observer = o
		return nil
	}
}

// WithAuth sets the credentials used on every master (ACL user name may be
// empty for the default user).
func WithAuth(username, password string) Option {
	return func(c *config) error {
		c.username, c.password = username, password
		return nil
	}
}

// WithTLS connects to every master over TLS.
func WithTLS(cfg *tls.Config) Option {
	return func(c *config) error {
		if cfg == nil {
			return errors.New("tls config: must not be nil")
		}
		c.tlsConfig = cfg
		return nil
	}
}

// WithPoolSize sets the connection pool size per master.
func WithPoolSize(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("pool size %d: must be at least 1", n)
		}
		c.poolSize = n
		return nil
	}
}

// WithRedisOptions lets the caller adjust the go-redis options of every
// master after this package has filled them in. Fields this package relies on
// are set again afterwards: ContextTimeoutEnabled, MaxRetries, DialerRetries,
// DialTimeout and OnConnect (a caller's OnConnect is replaced).
func WithRedisOptions(fn func(*redis.Options)) Option {
	return func(c *config) error {
		if fn == nil {
			return errors.New("redis options func: must not be nil")
		}
		c.redisOptions = fn
		return nil
	}
}
