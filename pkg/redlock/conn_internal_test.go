package redlock

import (
	"net"
	"testing"
	"time"
)

func TestRecentConnSkipsPeekOnlyWhileRecent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		s, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = s.Write([]byte("+OK\r\n"))
		time.Sleep(time.Second)
		_ = s.Close()
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	cn, ok := wrapConn(raw).(*recentConn)
	if !ok {
		t.Fatalf("a TCP connection is not wrapped")
	}
	if rc, _ := cn.SyscallConn(); isSkip(rc) {
		t.Fatal("never read: the health check must run")
	}
	buf := make([]byte, 5)
	if _, err := cn.Read(buf); err != nil {
		t.Fatal(err)
	}
	if rc, _ := cn.SyscallConn(); !isSkip(rc) {
		t.Fatal("just read: the health check should be skipped")
	}
	time.Sleep(recentlyUsed + 10*time.Millisecond)
	if rc, _ := cn.SyscallConn(); isSkip(rc) {
		t.Fatal("idle for longer than recentlyUsed: the health check must run")
	}

	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	if got := wrapConn(p); got != p {
		t.Fatal("a connection without a file descriptor is wrapped")
	}
}

func isSkip(rc any) bool {
	_, ok := rc.(skipPeek)
	return ok
}
