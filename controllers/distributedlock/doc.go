// Package distributedlock is the DistributedLock controller: it acquires each
// lock with pkg/redlock across the masters of its RedisMasterSet, commits the
// grant to status with optimistic concurrency, keeps it alive with a
// renewal.Session, and ends it through one rule (end.go).
//
// Files:
//   - controller.go: fetch, the reconcile's phases (Reconciler.phases),
//     the scope it gathers (the held grant once: scope.grant); held.go:
//     the held grant against status; acquire.go, delete.go; patch.go: the
//     one deferred, conditional status patch;
//   - decide.go, status.go: what to do with the holder, and status, as
//     pure functions of what was gathered;
//   - end.go: every way a grant ends, a row each in one table (endRules:
//     when status stops showing it, when its keys may go, its Held reason,
//     its event, whether it counts as lost or shed), carried out by
//     endGrant and told by tellEnd;
//     keys.go: the keys of ended grants, and what each lock waits for;
//   - liveness.go, lease.go, terminating.go, allowed.go: holder liveness,
//     leases and maxHoldDuration, holders being deleted, who may hold;
//     pods.go, revisions.go: the pods that take part; order.go, setup.go:
//     the work queue and its watches; wakeups.go: locks whose key another
//     holder has, woken by the masters' release notices; lines.go: each
//     waiting lock's place in its key's waiting line on the masters, a
//     slot's lock's in its semaphore's (first come, first served across
//     clusters).
//
// The grants this manager holds (their Sessions, the validity status
// shows of each, its refreshes, admission and shedding) are a
// grants.Set (internal/grants).
//
// Status is the contract pods act on. Each field has one writer:
//
//	field                                    writer
//	holder, grantID, fencingToken,           the reconciler's deferred
//	acquiredAt, releasedAt, lastValidUntil,  patch, conditional on the
//	lastHolderPod, endedRequest, queue,      resourceVersion it read
//	key, conditions, observedGeneration
//	renewedAt, validUntil, quorum            that patch when it commits or
//	                                         hides a grant; the grants.Set
//	                                         for every later refresh
//	                                         (a JSON patch whose tests
//	                                         require the grant and the
//	                                         validity it replaces)
//
// Rules: keys go before the validity shown only on proof that the holder
// stopped; every validity write is conditional on the one it replaces and
// never moves it back; a former holder pod keeps others waiting while it
// may run; a pod is granted only after a fresh read shows it may run and
// still asks for the lock; a slot's lock grants nothing to the pod its
// semaphore fenced it against (MovingPodAnnotation); every
// grant goes through the masters registry's client, never the set's spec.
// The reasoning: docs/design/lock-controller.md and
// docs/design/grant-life.md.
package distributedlock
