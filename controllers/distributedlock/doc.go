// Package distributedlock is the DistributedLock controller: it acquires each
// lock with pkg/redlock across the masters of its RedisMasterSet, commits the
// grant to status with optimistic concurrency, keeps it alive with a
// renewal.Session, and releases it.
//
// Layout, in the manner of cluster-api's machineset package:
//   - controller.go: fetch, the one deferred, conditional status patch, and
//     the reconcile's phases declared in one list (Reconciler.phases:
//     finalizer, session, master set, holder, show, holder node), run by
//     runPhases; deletion has its own path (reconcileDelete);
//   - status.go: status computed from gathered inputs (pure functions);
//   - decide.go: what to do with the holder (pure functions);
//   - end.go: how a grant ends, every way in one rule (decideEnd: when
//     status stops showing it, when its keys may go; keys go before the
//     validity shown only on proof that the holder stopped), carried out
//     by endGrant; docs/design/grant-life.md has the table;
//   - sessions.go: the renewal sessions this manager runs, by lock UID;
//   - writer.go: the status writer, which owns the refresh schedule of
//     held grants' validity (when a refresh is due, when the renewal it
//     shows is asked for) and reads the Sessions' reports
//     (renewal.Reports): renewals and losses. A Session knows nothing of
//     status but the validity its keys must outlive (Session.Shown).
//   - load.go: overload and shedding (pure decisions, then the writer's
//     measuring of them); waiters.go: the grants that wait for room, woken
//     when it appears; order.go: the work queue's order (a new leader's
//     held locks first, the writer's wake-ups ahead of requeues);
//
// Status is the contract pods act on. Two writers patch it, each field
// having one owner at a time:
//
//	field                          owner
//	holder, grantID, fencingToken, the reconciler's deferred patch, with
//	acquiredAt, releasedAt,        optimistic concurrency (resourceVersion)
//	lastHolderPod, queue, key,     against the status the reconcile started
//	conditions, observedGeneration from
//	renewedAt, validUntil, quorum  the reconciler, in the patch that commits
//	                               a grant (and when it hides one); the
//	                               status writer (writer.go) for every
//	                               later refresh, and for the first refresh
//	                               of an adopted grant (the adopting
//	                               reconcile writes nothing: the validity
//	                               shown becomes this manager's to renew): a
//	                               JSON patch whose
//	                               test operations require the object, the
//	                               grant, token and holder, and the validity
//	                               it replaces
//
// A write that conflicts is sent again on the fresh version only while that
// shows the same grant, never moving the validity back; one that would hide
// a grant another writer has renewed since is not sent again (its decision
// rests on a stale view). TestRefreshPatchTouchesOnlyItsFields holds the
// writer to its fields.
//
// Rules the controller keeps so that every quorum that can grant a key
// overlaps the one holding it (issue 18):
//   - a grant lost or lapsed is released on every master once the patch
//     that stops showing it committed and the validity it showed has
//     passed (decideEnd) — its Session ended, an adoption found it lost,
//     or status shows it lapsed (by the drift allowance too, its validity
//     may come from another manager's clock) with no Session here: copies
//     a minority still held, or a late extension refreshed, would keep the
//     key from the next grant, the same holder's included.
//     That guarded release is the only removal of a lost grant's value:
//     values are derived (UID, grant ID), so another manager may renew the
//     same one, and pkg/redlock's failed extensions remove no copies;
//   - every validity write is conditional on the validity it replaces, and
//     never moves it back: a deposed leader woken from a pause cannot move
//     it (case 3); a Session that lapsed while status shows its grant
//     renewed beyond any validity this manager's own writes committed
//     (another manager renews it) is dropped without hiding or releasing
//     the grant, and that reconcile acts on nothing else; an adoption
//     extends the keys for at least the validity status shows, and its
//     reconcile writes nothing: the writer refreshes adopted grants at
//     once, nearest shown validity first within its budget (that write
//     fences off a deposed leader's write decided on the same status), so
//     that a new leader adopting thousands of locks does not wait on a
//     write each;
//   - the pod of the last grant status committed (status.lastHolderPod)
//     is a former holder while it may run, whether or not the pod gate has
//     annotated it yet: nobody else is granted meanwhile, and it is first
//     in line (case 4) — unless it is marked unresponsive (holder
//     liveness, liveness.go): then it keeps everyone waiting and is not
//     granted until status has shown no holder for the ttl and the drift
//     allowance, whichever way its grant ended (markPassable), and waits
//     behind the others after that. The pod gate, for its part, ungates a pod only
//     after its annotation committed and a fresh read of the lock still
//     shows the grant it was annotated for;
//   - a pod is granted only after a fresh read from the API server shows
//     it may still run (podlock.MayHold): the cache may show a pod that
//     finished as running, e.g. after this manager woke from a pause
//     (case 7); the pod gate never annotates a finished pod;
//   - a pod granted by another DistributedLock of the same key that still
//     exists is that lock's holder, never this lock's former holder (it is
//     tracked, and reported relabelled, only by the lock that granted it);
//   - every grant and renewal goes through the client the masters
//     registry (internal/masters) builds from the set's status, never from
//     its spec: the list the RedisMasterSet controller adopted
//     (status.addresses) and, during a membership change, the joint client
//     of it and the previous list (case 2). The registry never builds a
//     client from a view of the set older than the newest change
//     (status.membershipEpoch), and the RedisMasterSet controller ends a
//     change only once this process has used the joint client alone for
//     the change's duration (Registry.JointFor).
package distributedlock
