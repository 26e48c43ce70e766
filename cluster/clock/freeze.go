package clock

import (
	"sync"
	"time"
)

// Freezable wraps a clock so that one node can be frozen: while it is,
// Now keeps telling the time (a stopped process's wall clock runs on), but
// its timers and tickers do not fire; each one that came due fires once at
// Thaw, late, as the loops of a process stopped by SIGSTOP run again when it
// is continued. A pause detector that ticks on this clock then sees the gap.
type Freezable struct {
	base Clock

	mu      sync.Mutex
	frozen  bool
	pending []func() // fires held while frozen
}

// NewFreezable wraps base (nil: Real).
func NewFreezable(base Clock) *Freezable { return &Freezable{base: Or(base)} }

// Freeze holds every timer that comes due until Thaw.
func (c *Freezable) Freeze() {
	c.mu.Lock()
	c.frozen = true
	c.mu.Unlock()
}

// Thaw fires what came due while frozen.
func (c *Freezable) Thaw() {
	c.mu.Lock()
	c.frozen = false
	fire := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, f := range fire {
		f()
	}
}

// Frozen reports whether the clock is frozen.
func (c *Freezable) Frozen() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frozen
}

// hold runs f now, or at Thaw when frozen.
func (c *Freezable) hold(f func()) {
	c.mu.Lock()
	if c.frozen {
		c.pending = append(c.pending, f)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	f()
}

func (c *Freezable) Now() time.Time { return c.base.Now() }

func (c *Freezable) NewTimer(d time.Duration) Timer {
	t := &heldTimer{c: c, ch: make(chan time.Time, 1)}
	t.fire = func() {
		select {
		case t.ch <- c.base.Now():
		default:
		}
	}
	t.start(d, 0)
	return t
}

func (c *Freezable) AfterFunc(d time.Duration, f func()) Timer {
	t := &heldTimer{c: c, fire: f}
	t.start(d, 0)
	return t
}

func (c *Freezable) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	tk := &heldTicker{ch: make(chan time.Time, 1), d: d, c: c}
	tk.schedule()
	return tk
}

// heldTimer is a timer whose fire goes through Freezable.hold. gen tells a
// fire that came due before a Stop or Reset from a current one.
type heldTimer struct {
	c    *Freezable
	t    Timer
	ch   chan time.Time
	fire func()

	mu   sync.Mutex
	gen  uint64
	held bool // came due while frozen, not yet fired
}

func (t *heldTimer) C() <-chan time.Time { return t.ch }

// start arms a base timer for generation g. t.mu is held, or t is new.
func (t *heldTimer) start(d time.Duration, g uint64) {
	t.t = t.c.base.AfterFunc(d, func() { t.due(g) })
}

// due runs when the base timer of generation g fires: the fire happens
// now, or at Thaw, unless the timer was stopped or reset meanwhile.
func (t *heldTimer) due(g uint64) {
	t.mu.Lock()
	if g != t.gen {
		t.mu.Unlock()
		return
	}
	t.held = true
	t.mu.Unlock()
	t.c.hold(func() {
		t.mu.Lock()
		ok := g == t.gen
		t.held = false
		t.mu.Unlock()
		if ok {
			t.fire()
		}
	})
}

// cancel stops the base timer and forgets a fire that came due; it
// reports whether the timer was active. t.mu is held.
func (t *heldTimer) cancel() bool {
	t.gen++
	held := t.held
	t.held = false
	return t.t.Stop() || held
}

func (t *heldTimer) Stop() bool {
	t.mu.Lock()
	active := t.cancel()
	t.mu.Unlock()
	t.drain()
	return active
}

func (t *heldTimer) Reset(d time.Duration) bool {
	t.mu.Lock()
	active := t.cancel()
	t.start(d, t.gen)
	t.mu.Unlock()
	t.drain()
	return active
}

// drain drops a value sent before Stop or Reset, as time.Timer does.
func (t *heldTimer) drain() {
	if t.ch == nil {
		return
	}
	select {
	case <-t.ch:
	default:
	}
}

// heldTicker ticks with a chain of AfterFuncs; while its clock is frozen,
// the ticks that come due collapse into one, delivered at Thaw.
type heldTicker struct {
	ch chan time.Time
	d  time.Duration
	c  *Freezable

	mu      sync.Mutex
	t       Timer
	stopped bool
	held    bool // a tick is waiting for Thaw
}

func (tk *heldTicker) C() <-chan time.Time { return tk.ch }

func (tk *heldTicker) schedule() {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	if tk.stopped {
		return
	}
	tk.t = tk.c.base.AfterFunc(tk.d, tk.tick)
}

func (tk *heldTicker) tick() {
	tk.c.mu.Lock()
	frozen := tk.c.frozen
	if frozen {
		tk.mu.Lock()
		if !tk.held {
			tk.held = true
			tk.c.pending = append(tk.c.pending, tk.thawed)
		}
		tk.mu.Unlock()
	}
	tk.c.mu.Unlock()
	if !frozen {
		tk.send()
		tk.schedule()
	}
}

// thawed delivers the held tick and starts ticking again.
func (tk *heldTicker) thawed() {
	tk.mu.Lock()
	tk.held = false
	tk.mu.Unlock()
	tk.send()
	tk.schedule()
}

func (tk *heldTicker) send() {
	tk.mu.Lock()
	stopped := tk.stopped
	tk.mu.Unlock()
	if stopped {
		return
	}
	select {
	case tk.ch <- tk.c.base.Now():
	default:
	}
}

func (tk *heldTicker) Stop() {
	tk.mu.Lock()
	tk.stopped = true
	t := tk.t
	tk.mu.Unlock()
	if t != nil {
		t.Stop()
	}
}
