package simnet

import (
	"sync"
	"time"
)

// deadline is one of a connection's deadlines: a channel that is closed
// once the deadline has passed. Waiters select on wait() beside their other
// channels; setting a new deadline reuses the channel unless it has already
// been closed, so a waiter sees a deadline moved while it waits.
type deadline struct {
	mu    sync.Mutex
	gen   uint64 // bumped by set: a stale timer closes nothing
	timer *time.Timer
	done  chan struct{}
}

func newDeadline() *deadline { return &deadline{done: make(chan struct{})} }

// set makes t the deadline; the zero time means none.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gen++
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	if isClosed(d.done) {
		d.done = make(chan struct{})
	}
	if t.IsZero() {
		return
	}
	dur := time.Until(t)
	if dur <= 0 {
		close(d.done)
		return
	}
	gen := d.gen
	d.timer = time.AfterFunc(dur, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.gen == gen {
			close(d.done)
		}
	})
}

// wait returns a channel closed once the current deadline has passed.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.done
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
