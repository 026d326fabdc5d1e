//go:build gateclocktest

package main

import (
	"os"
	"time"
)

// ClockOffsetEnv shifts the wall clock of a gate built with the tag
// gateclocktest (pkg/gate's process tests), standing in for a node whose
// clock is off or stepped: Go reads the clock through the vDSO, so
// libfaketime cannot do this from outside. Released binaries are built
// without the tag and read the real clock.
const ClockOffsetEnv = "GATE_TEST_WALL_CLOCK_OFFSET"

func wallClock() func() time.Time {
	off, err := time.ParseDuration(os.Getenv(ClockOffsetEnv))
	if err != nil {
		return time.Now
	}
	// Round(0) drops the monotonic reading: the shifted time is a wall-clock
	// reading only, as another node's would be.
	return func() time.Time { return time.Now().Round(0).Add(off) }
}
