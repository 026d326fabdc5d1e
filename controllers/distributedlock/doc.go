// Package distributedlock is the DistributedLock controller: it acquires each
// lock with pkg/redlock across the masters of its RedisMasterSet, commits the
// grant to status with optimistic concurrency, keeps it alive with a
// renewal.Session, and releases it.
//
// Layout, in the manner of cluster-api's machineset package:
//   - controller.go: fetch, finalizer, the phases of a reconcile and the one
//     deferred, conditional status patch;
//   - status.go: status computed from gathered inputs (pure functions);
//   - decide.go: what to do with the holder (pure functions);
//   - sessions.go: the renewal sessions this manager runs, by lock UID.
//
// Status is the contract pods act on. The holder, token, grant ID and
// validity are only ever written by the reconciler's single status patch,
// with optimistic concurrency against the status the reconcile started
// from; when that fails the reconcile gives up (and gives back a grant it
// made) instead of writing from a stale view.
//
// Rules the controller keeps so that every quorum that can grant a key
// overlaps the one holding it (issue 18):
//   - a lost grant (its Session ended) is released on every master once
//     status stopped showing it: copies a minority still held would keep
//     the key from the next grant, the same holder's included;
//   - a pod granted by another DistributedLock of the same key that still
//     exists is that lock's holder, never this lock's former holder (it is
//     tracked, and reported relabelled, only by the lock that granted it).
package distributedlock
