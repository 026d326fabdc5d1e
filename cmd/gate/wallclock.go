//go:build !gateclocktest

package main

import "time"

// wallClock is the gate's wall clock: the real one. A build with the tag
// gateclocktest shifts it instead (see wallclock_test_hook.go).
func wallClock() func() time.Time { return time.Now }
