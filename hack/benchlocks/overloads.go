package main

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redlock-operator/redlock-operator/internal/grants"
)

// onset is the start of one overload of the status writer: the API server
// took fewer writes than the held locks need.
type onset struct {
	at time.Time
	// risk is how many kept locks may lapse for it: the refreshes due
	// from the onset until the writer has measured it (two load windows)
	// and one lead later, at the demand then. A drop faster than a lead
	// cannot be met before those are due (docs/design/overload.md).
	risk int
}

// overloads records the onsets of the status writer's overloads, read from
// its gauge every 100 ms until stopped; onsets is read once done closed.
type overloads struct {
	onsets []onset
	stop   chan struct{}
	done   chan struct{}
}

// measureWindow is how long the writer takes to measure a drop: two load
// windows of one second (internal/grants).
const measureWindow = 2 * time.Second

func watchOverloads(reg *prometheus.Registry, ttl time.Duration) *overloads {
	o := &overloads{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(o.done)
		was := false
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-o.stop:
				return
			case <-tick.C:
			}
			now := gaugeValue(reg, "redlock_status_writer_overloaded") == 1
			if now && !was {
				lead := max(grants.StatusLead(ttl), min(ttl/4, time.Duration(gaugeValue(reg, "redlock_status_write_lead_floor_seconds")*float64(time.Second))))
				demand := gaugeValue(reg, "redlock_status_write_demand_per_second")
				o.onsets = append(o.onsets, onset{at: time.Now(), risk: int(math.Ceil(demand * (measureWindow + lead).Seconds()))})
			}
			was = now
		}
	}()
	return o
}

// since stops the watch and returns the onsets whose lapses could fall at
// or after from, and the lapses of kept locks no control can rule out for
// them.
func (o *overloads) since(from time.Time, ttl time.Duration) (n, bound int) {
	close(o.stop)
	<-o.done
	for _, s := range o.onsets {
		if s.at.Add(measureWindow + ttl/4).Before(from) {
			continue
		}
		n, bound = n+1, bound+s.risk
	}
	return n, bound
}
