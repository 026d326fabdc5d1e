package gate

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// MemberPort is base plus the ordinal in the environment variable env (none
// when env is empty).
func MemberPort(base int, env string) (int, error) {
	if env == "" {
		return base, nil
	}
	v := os.Getenv(env)
	ord, err := strconv.Atoi(v)
	if err != nil || ord < 0 {
		return 0, fmt.Errorf("ordinal %s=%q: not a non-negative number", env, v)
	}
	return base + ord, nil
}

// Probe reports whether Redis at addr accepts a connection and answers (any
// reply, an authentication error included: the process serves). With
// useTLS it connects over TLS: the certificate is not verified, since the
// probe asks a process in its own pod whether it serves, and trusts it with
// nothing.
func Probe(addr string, timeout time.Duration, useTLS bool) error {
	var c net.Conn
	var err error
	if useTLS {
		d := &net.Dialer{Timeout: timeout}
		c, err = tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // a liveness probe of the local process; nothing is sent but PING
	} else {
		c, err = net.DialTimeout("tcp", addr, timeout)
	}
	if err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	if !strings.HasPrefix(line, "+") && !strings.HasPrefix(line, "-") {
		return fmt.Errorf("probe %s: unexpected reply %q", addr, line)
	}
	return nil
}

// Voting reports whether the current Redis run has been up for at least
// delay — the quarantine clients apply to a restarted master — according to
// the gate's record in stateDir, measured on the boot clock (on the wall
// clock for a record of an older gate).
func Voting(stateDir string, delay time.Duration, now Instant) error {
	st, err := LoadState(stateDir)
	if err != nil {
		return err
	}
	if st == nil || !st.EndedAt.IsZero() {
		return errors.New("redis is not running")
	}
	up := now.Wall.Sub(st.StartedAt)
	if st.BootID != "" && st.BootID == now.BootID {
		up = now.Boot - st.StartedBoot
	}
	if up < delay {
		return fmt.Errorf("redis up for %v: clients do not count it before %v", up.Round(time.Second), delay)
	}
	return nil
}
