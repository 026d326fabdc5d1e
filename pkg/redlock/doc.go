// Package redlock implements the Redlock distributed lock algorithm on N
// independent Redis masters.
//
// A lock is acquired by sending "SET key value NX PX ttl" to every master at
// once, each request bounded by a short per-node timeout. The lock is held
// when a quorum (N/2+1) of masters granted it and the remaining validity,
//
//	validity = ttl − elapsed − (ttl·0.01 + 2ms)
//
// measured on the monotonic clock from before the first request, is still
// positive. The outcome is returned as soon as it is decided; masters that
// have not answered yet do not delay a decided acquisition.
//
// When an acquisition fails (or its context is cancelled), the value is
// removed again from every master, including the ones that did not answer,
// once each outstanding request has answered or timed out. The clean-up runs
// on a context that the caller's cancellation does not cut short; [Client.Close]
// waits for it.
//
// Release and extension use Lua scripts that compare the stored value with the
// lock's own value (random, or the caller's unique [WithValue]), so a client
// never deletes or prolongs a lock that another client holds, and an
// extension counts only the masters that still held the value. Only after
// an extension a quorum confirmed is the value put back (SET NX) on masters
// that had lost the key — restarted without their data — so that restarting
// every master in turn does not wear a held lock away; a failed extension
// re-creates nothing. An extension whose quorum arrives after its new
// validity fails with [ErrExpired], and one that finds the value gone from a
// quorum fails with [ErrNotHeld]. Neither removes the copies it refreshed:
// a lock's value may be renewed by more than one process at a time (a lock
// restored elsewhere — a new leader adopting a grant while the old one,
// paused, still extends it), and a copy removed under the other would free
// the key while its validity stands. A lost lock's copies expire with its
// TTL; [Lock.Release] removes them at once, and the caller calls it once it
// knows no one else renews the value. For the same reason an extension
// never shortens a copy's remaining TTL: a late extension with a shorter
// TTL does not cut short the copies another process renews.
//
// With [WithFencing], an acquisition also takes a fencing token
// ([Lock.Token]) that is strictly increasing per key across all clients,
// processes and master restarts. Each master keeps a counter per key
// ([FenceKey], no TTL); a granting master's SET takes
// max(counter + 1, master clock in µs) in the same script. The lock's token is
// the largest among the granting masters that answered before the decision,
// and a second round raises the counter to it on a quorum before Acquire
// returns, so any later quorum includes a master that has seen it. A master
// that lost its counter (a restart without persistence, or an eviction)
// counts on from its clock. The guarantee therefore assumes that the
// masters' clocks differ by less than the time a restarted master stays out
// (its restart delay or quarantine window), and that tokens are not taken
// faster than one per microsecond for long stretches. Without WithFencing an
// acquisition is a single round and no counter is read or written.
//
// Masters that restarted recently may have lost their keys. With
// [WithQuarantine], every new connection reads the master's run_id and
// uptime_in_seconds; a master up for less than the quarantine window (its
// uptime counted a second short, as the server counts whole seconds) does not
// vote until the window has passed on the client's clock, and a run_id that
// differs from the one the client saw at that address before (a restart, a
// failover to a long-running replica, a re-pointed name) keeps it out for the
// whole window from then on, whatever its uptime. Set the window
// longer than the longest TTL in use plus the clock drift.
//
// Clients with different windows may share servers (sets of different
// maxLockTTLs, in one cluster or several, naming a server by any address):
// the window that protects a lock is the longest window of any client that
// may have granted it. So every new connection and every [Client.Probe]
// registers the client's window on the master ([WindowKey]), and reads back
// the longest any client registered there; the client quarantines the
// master by that (one learned after the connection counts from the master's
// start, or from when another server was seen at the address), carries it over the master's restart (which, without
// persistence, forgets the key) and registers it on the new run. A
// registration lapses twice its window after the last one (a set deleted
// or given a shorter maxLockTTL stops holding the others back), and windows
// over [MaxWindow] are ignored. What is not covered: a client that first
// registered less than one probe interval before a majority of the servers
// restarted, when the others have not probed since.
//
// The list of masters can change under held locks only through joint
// quorums, as consensus systems change membership ([WithJoint]): while a
// grant made on the previous list alone may still be valid, every
// acquisition, extension and fencing write-back needs a quorum of the
// previous list and a quorum of the new one, so that it shares a master
// holding the first grant with any grant of either kind; masters only in the
// new list do not vote until the caller's instant (they hold no copy of the
// earlier grants and no counter), but get a held lock's value put back by
// each extension, so that a lock held through the change is held on a quorum
// of the new list once the previous one is dropped. Fencing tokens keep
// rising because every joint grant reads the counters of a quorum of the
// previous list and writes its token to a quorum of each, and each
// extension of a lock restored [WithToken] raises the counter to its token
// where it puts the value back. A server under two addresses is a
// duplicate only within one list: renamed by a change, it is one master of
// each (an acquisition's SET NX is granted at one of its addresses only).
// What is not covered: a key neither held nor granted during the change,
// whose last fenced grant was made before it, takes on the new list the
// masters' clock as its floor rather than that grant's counter.
//
// A semaphore admits up to N holders of one key at once
// ([Client.AcquireSemaphore], [Client.AcquireSlot]). Each holder holds one
// of N slots, and each slot is a lock of its own ([SlotKey]: key +
// ":slot:" + i), with its own fencing counter: a fenced resource compares
// (slot, token), keeping the last token it accepted per slot. N is stored
// on the masters under the key itself ([Declaration]): every grant of a
// slot writes it, with a TTL at least that of every slot copy on the
// master, and a master that stores
// another number refuses the slot, so acquisitions that declare another N
// fail with [ErrSlotsConflict] while any slot is held, rather than being
// served at the larger N (a majority that grants a slot under one number
// shares a master with the majority holding a slot under the other). The
// release of a master's last slot copy removes the number, so that a new
// one may be declared at once; an abandoned holder's number expires with
// its copies. Extensions put the number back with the slot on restarted
// masters, like the value, and a slot's copy whose number is gone is not
// extended (semaphores, like fencing counters, need maxmemory-policy
// noeviction). A plain lock of the key finds it taken
// ([ErrKindConflict]), and slots' keys are refused as plain lock keys.
// [Client.FreeSlots] tells, in one round and deciding nothing, which
// slots are free on the masters, for a caller that assigns slots
// itself. When the number shrinks (from 5 to 3), a holder of a slot that no
// longer exists (4) that wakes from a pause meets no later holder of its
// slot: a fenced resource bounds its writers only if it also refuses slots
// at or beyond the current number.
//
// A key is one kind ([Kind]): a plain lock of key K and a semaphore of key K
// exclude each other. A master refuses a plain lock's SET while it stores
// the number of slots of K (a slot of K is held there), and a slot's while
// it holds K, each in the script that would grant it; acquisitions fail
// with [ErrKindConflict] while the other kind holds a quorum, and an
// extension's put back is refused likewise. Two acquisitions of different
// kinds that race land one kind per master, so quorums intersecting, at
// most one kind wins. A copy that sits beside the other kind (put there by
// a client that does not check, such as an older version) is not
// extended: when in doubt, not held.
//
// With [WithReleaseNotices], Release publishes on each master whose copy it
// deleted a notice on [NoticeChannel](key) (a semaphore's slot: of the
// semaphore's key), after that master's answer and apart from it; a
// waiter's [Client.Notices] calls back once a quorum of masters told of
// one release of a watched key, so that a waiter in
// another process tries at once rather than after its retry delay.
// Notices are hints: a lost one costs the waiter its retry delay, and
// exclusion rests on SET NX alone.
//
// Keys that end in ":fence" are refused ([ErrInvalidArgument]): "k:fence"
// is the fencing counter of the lock "k" (see [FenceKey]); so is
// [WindowKey].
//
// Failed operations return an [*Error] with every master's vote, matching
// the sentinels [ErrLockHeld], [ErrQuorumUnavailable], [ErrExpired],
// [ErrNotHeld], [ErrCancelled], [ErrSlotsConflict] and [ErrKindConflict]
// with errors.Is. Invalid arguments return an
// error matching [ErrInvalidArgument] and send nothing; a closed client
// returns [ErrClosed].
//
// The quarantine check reads INFO server, and a master older than Redis 7
// (extensions use PEXPIRE … GT) does not vote, with an error that says so.
// It needs the INFO command: an ACL user without it cannot
// vote while the check is on. Registering the window needs EVAL and access
// to [WindowKey]; a master that refuses it (NOPERM) still votes, by the
// client's own window only, and [MasterStatus].WindowErr says why. With the check on, two addresses that reach the
// same server (same run_id) are detected and neither votes.
//
// The package does not depend on Kubernetes: the operator builds on it, and
// so can any Go program.
package redlock
