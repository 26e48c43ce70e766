// Package clock is the one source of time of a ringlimit node: the current
// time and the timers of every loop the node runs (forwarding waits,
// probes, replication, handoff retries, the lifecycle's timers, the pause
// detector). A node takes one Clock at construction; Real is the system
// clock. Tests and the simulation run the real clock inside a
// testing/synctest bubble (virtual time), and may wrap it in a Freezable
// clock to stop one node's timers, as a SIGSTOP stops a process.
//
// Clocks and their timers are safe for concurrent use.
package clock

import "time"

// Clock tells the time and makes timers.
type Clock interface {
	// Now returns the current time, with a monotonic reading.
	Now() time.Time
	// NewTimer returns a timer that sends the time on its channel once,
	// after d.
	NewTimer(d time.Duration) Timer
	// NewTicker returns a ticker that sends the time on its channel every
	// d (d > 0), dropping ticks a slow reader misses.
	NewTicker(d time.Duration) Ticker
	// AfterFunc calls f in its own goroutine after d. Its timer's C is
	// nil.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a time.Timer made by a Clock.
type Timer interface {
	// C is the channel the time is sent on (nil for AfterFunc).
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it did.
	Stop() bool
	// Reset makes the timer fire after d; it reports whether the timer
	// was active. As with time.Timer (Go 1.23 and later), no stale value
	// is received after Stop or Reset returns.
	Reset(d time.Duration) bool
}

// Ticker is a time.Ticker made by a Clock.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Real returns the system clock.
func Real() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

func (realClock) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time        { return t.t.C }
func (t realTimer) Stop() bool                 { return t.t.Stop() }
func (t realTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }

// Or returns c, or Real when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return Real()
	}
	return c
}
