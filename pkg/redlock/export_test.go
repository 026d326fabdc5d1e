package redlock

import "time"

// SetNoticePing shortens how long w's listening connections may be
// silent before a ping, for tests of a connection that stops answering.
func SetNoticePing(w *Notices, d time.Duration) { w.ping.Store(int64(d)) }
