// Package distributedlock is the DistributedLock controller: it acquires each
// lock with pkg/redlock across the masters of its RedisMasterSet, commits the
// grant to status with optimistic concurrency, keeps it alive with a
// renewal.Session, and ends it through one rule (end.go).
//
// Files:
//   - controller.go: fetch, the reconcile's phases (Reconciler.phases),
//     the one deferred, conditional status patch; deletion
//     (reconcileDelete);
//   - decide.go, status.go: what to do with the holder, and status, as
//     pure functions of what was gathered;
//   - end.go: every way a grant ends, in one rule (decideEnd: when status
//     stops showing it, when its keys may go), carried out by endGrant;
//   - sessions.go: the grants this manager renews, by lock UID;
//   - writer.go, inflight.go, load.go, waiters.go: the status writer,
//     which refreshes held grants' validity within a budget, measures the
//     API server, sheds what it cannot keep and admits new grants when
//     there is room; order.go: the work queue's order;
//   - liveness.go, lease.go, terminating.go, allowed.go: holder liveness,
//     leases and maxHoldDuration, holders being deleted, who may hold.
//
// Status is the contract pods act on. Each field has one writer:
//
//	field                                    writer
//	holder, grantID, fencingToken,           the reconciler's deferred
//	acquiredAt, releasedAt, lastValidUntil,  patch, conditional on the
//	lastHolderPod, endedRequest, queue,      resourceVersion it read
//	key, conditions, observedGeneration
//	renewedAt, validUntil, quorum            that patch when it commits or
//	                                         hides a grant; the status
//	                                         writer for every later refresh
//	                                         (a JSON patch whose tests
//	                                         require the grant and the
//	                                         validity it replaces)
//
// Rules: keys go before the validity shown only on proof that the holder
// stopped; every validity write is conditional on the one it replaces and
// never moves it back; a former holder pod keeps others waiting while it
// may run; a pod is granted only after a fresh read shows it may run; every
// grant goes through the masters registry's client, never the set's spec.
// The reasoning: docs/design/lock-controller.md and
// docs/design/grant-life.md.
package distributedlock
