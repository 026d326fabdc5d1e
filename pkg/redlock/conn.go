package redlock

import (
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// recentlyUsed is how long after its last read a connection counts as alive
// without a health check.
//
// go-redis checks every pooled connection it hands out with a non-blocking
// MSG_PEEK read (a system call and three allocations per request; a fifth of
// the client's system calls in an acquire+release). A connection that
// answered less than recentlyUsed ago skips it. The check finds connections
// the master closed (a restart, an idle timeout); one closed within
// recentlyUsed of its last answer instead fails its next request, as every
// connection without the check does (go-redis skips it for TLS), with an
// error vote — never a grant: a new incarnation of the master is reached only
// through a new connection, which onConnect checks. A master that restarts
// within recentlyUsed is rare, and its requests in that time would mostly
// fail anyway.
const recentlyUsed = 50 * time.Millisecond

// clock is the monotonic origin of recentConn.lastRead.
var clock = time.Now()

// recentConn is a connection that tells go-redis's pool health check to skip
// the system call while the connection answered recently.
type recentConn struct {
	net.Conn
	sc       syscall.Conn
	lastRead atomic.Int64 // time.Since(clock) at the end of the last read
}

// wrapConn wraps cn when go-redis would health-check it (it exposes its
// file descriptor); other connections are never checked and stay as they are.
func wrapConn(cn net.Conn) net.Conn {
	sc, ok := cn.(syscall.Conn)
	if !ok {
		return cn
	}
	return &recentConn{Conn: cn, sc: sc}
}

// Read reads from the connection and notes when.
func (c *recentConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err == nil {
		c.lastRead.Store(int64(time.Since(clock)))
	}
	return n, err
}

// SyscallConn returns the connection's raw connection, or, while the
// connection answered less than recentlyUsed ago, one whose Read reports
// nothing to read without a system call.
func (c *recentConn) SyscallConn() (syscall.RawConn, error) {
	if last := c.lastRead.Load(); last != 0 && time.Since(clock)-time.Duration(last) < recentlyUsed {
		return skipPeek{c}, nil
	}
	return c.sc.SyscallConn()
}

// skipPeek is the raw connection of a recently used recentConn. go-redis
// reads through it only to peek (the health check, and a probe for pending
// push notifications): Read calls nothing and reports a healthy connection
// with nothing to read. Control and Write use the real one.
type skipPeek struct{ c *recentConn }

// Control runs f on the real raw connection.
func (s skipPeek) Control(f func(fd uintptr)) error {
	rc, err := s.c.sc.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(f)
}

// Read skips the peek.
func (skipPeek) Read(func(fd uintptr) (done bool)) error { return nil }

// Write runs f on the real raw connection.
func (s skipPeek) Write(f func(fd uintptr) (done bool)) error {
	rc, err := s.c.sc.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Write(f)
}
