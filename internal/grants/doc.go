// Package grants owns the grants one manager holds, by lock UID: the
// renewal.Session that keeps each alive, the validity status shows of each
// (one record, on the Grant: what status shows, the floor its renewals keep
// the keys until, and what this manager's own writes committed), the
// status writer that refreshes that validity a lead before it passes,
// admission of new grants while refreshes leave room, shedding what cannot
// be kept, and, when the manager stops, the last refreshes before the
// Sessions are orphaned for the next leader to adopt.
//
// A Set is built by New from a Config and Callbacks (how it asks the
// controller for a reconcile) and runs as a manager.Runnable. The
// controller holds a grant (Hold), says what status shows once its patch
// committed (Show, ShowAdopted), asks for room (Admit) and drops it when
// the grant ends (Drop); it never writes what the Set owns.
//
// The Set writes only status.renewedAt, validUntil and quorum of a lock,
// by a JSON patch whose tests require the object, the grant (ID, token,
// holder) and the validity it replaces: a stale view cannot move them.
// While it holds grants, the writer sizes the manager's gate for its
// other writes (Config.Gate, internal/writegate) from its limit in flight,
// and whether due refreshes wait for room in it.
// Files: set.go (the API), grant.go, sessions.go, writer.go (the writer:
// what it tracks, its run and handover), schedule.go (when each refresh
// is due, and where it waits), calendar.go (refreshes of grants made
// together spread before their due time), send.go (the send loop and each refresh's
// write and outcome), keep.go (the order refreshes go in when behind), inflight.go
// (writes in flight, and the gate), load.go (the rules of capacity and shedding),
// judge.go (the load loop that applies them), shed.go (grants
// shown Shed in their turn), waiters.go (admission), publish.go (the
// report kubectl redlock status reads). The reasoning:
// docs/design/status-writer.md, docs/design/lock-controller.md and
// docs/design/overload.md.
package grants
