package redlock

import (
	"sync/atomic"
	"time"
)

// workerIdle is how long an idle worker waits for the next request before
// it exits.
const workerIdle = 2 * time.Second

// task is one master's request of a round: r.run(i).
type task struct {
	r *round
	i int
}

// workers runs the requests of rounds on goroutines kept for the next ones.
// A fresh goroutine starts with a small stack and grows it through go-redis's
// deep call path on every request (stack copying was about a sixth of the
// client's CPU); a kept one has grown it already. A task never waits for a
// busy worker: it goes to a worker only if one is idle at that moment, and
// to a new goroutine otherwise, so every request still starts at once.
type workers struct {
	tasks chan task     // unbuffered: a send succeeds only to an idle worker
	quit  chan struct{} // closed by Client.Close once every task has ended
	live  atomic.Int32  // workers running, for tests
}

func newWorkers() *workers {
	return &workers{tasks: make(chan task), quit: make(chan struct{})}
}

// run starts t now, on an idle worker or on a new one.
func (w *workers) run(t task) {
	select {
	case w.tasks <- t:
	default:
		w.live.Add(1)
		go w.loop(t)
	}
}

// loop runs t, then further tasks until it has been idle for workerIdle or
// the client is closed.
func (w *workers) loop(t task) {
	defer w.live.Add(-1)
	var idle *time.Timer
	for {
		t.r.run(t.i)
		t = task{} // do not keep the round alive while idle
		if idle == nil {
			idle = time.NewTimer(workerIdle)
		} else {
			idle.Reset(workerIdle)
		}
		select {
		case t = <-w.tasks:
		case <-idle.C:
			return
		case <-w.quit:
			idle.Stop()
			return
		}
	}
}

// stop ends the idle workers; call it once no task can be started any more.
func (w *workers) stop() { close(w.quit) }
