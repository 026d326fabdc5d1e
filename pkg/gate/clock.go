package gate

import (
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Instant is a moment as the gate records it: on the wall clock, for people
// and for records an older gate wrote, and on the node's boot clock
// (CLOCK_BOOTTIME), which every process of the node shares, which no clock
// step or NTP slew moves, and which counts time suspended. The gate measures
// the time since a recorded moment on the boot clock, and sleeps on Go's
// monotonic timers (which stop while the node is suspended: a longer wait,
// never a shorter one); a boot-clock reading means something only within
// the boot named by BootID.
type Instant struct {
	Wall   time.Time
	Boot   time.Duration
	BootID string
}

// Clock tells the gate the time.
type Clock struct {
	// Wall is the wall clock (time.Now when nil). Only logs and records use
	// it: the gate's waits do not depend on it.
	Wall func() time.Time
}

// Now reads both clocks.
func (c Clock) Now() (Instant, error) {
	wall := time.Now
	if c.Wall != nil {
		wall = c.Wall
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return Instant{}, fmt.Errorf("read the boot clock: %w", err)
	}
	id, err := bootID()
	if err != nil {
		return Instant{}, err
	}
	return Instant{Wall: wall(), Boot: time.Duration(ts.Nano()), BootID: id}, nil
}

// bootID names the node's current boot: boot-clock readings of two boots do
// not compare.
func bootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read the boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
