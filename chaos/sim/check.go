package sim

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

// FaultKind names a fault the schedule injects.
type FaultKind uint8

// The faults, as docs/consistency.md's table names them.
const (
	Join      FaultKind = iota // a new node (scale out)
	Leave                      // a graceful stop: drain, leave (scale in, rolling update)
	Kill                       // a crash: the process is gone, its address refuses
	Restart                    // a node comes back with the same identity
	Pause                      // SIGSTOP/SIGCONT: frozen, then thawed
	Partition                  // the network splits into sides, then heals
	numFaults
)

var faultNames = [numFaults]string{"join", "leave", "kill", "restart", "pause", "partition"}

func (k FaultKind) String() string {
	if k < numFaults {
		return faultNames[k]
	}
	return "fault?"
}

// Fault is one injected fault: it starts At and its effect ends Until
// (the thaw, the heal; At for the instant ones), both since the start of
// the run.
type Fault struct {
	Kind      FaultKind
	At, Until time.Duration
	Nodes     []string // the nodes it strikes
	Sides     int      // Partition: how many sides
	Peers     int      // the nodes running when it struck: every one is an entry node
	// Relayed lists, sorted, the keys a Join or a Restart moves to the
	// node it starts, which relays their ops to their previous owners
	// while its readiness spreads (the join relay). Moved lists the keys a
	// Join, Restart, Leave or Kill moves between two other nodes (the
	// bounded-load placement), which nothing relays.
	Relayed, Moved []string
}

// Touch is how a fault touches a key.
type Touch uint8

// The touches.
const (
	Other   Touch = iota // any key in a window the fault touches
	Relayed              // in Fault.Relayed
	Moved                // in Fault.Moved
)

// touch returns how f touches key.
func (f *Fault) touch(key string) Touch {
	if _, ok := slices.BinarySearch(f.Relayed, key); ok {
		return Relayed
	}
	if _, ok := slices.BinarySearch(f.Moved, key); ok {
		return Moved
	}
	return Other
}

// Bound is how far past its limit a key may be allowed in a window a fault
// touches, and for how long after the fault's effect ends its windows are
// still touched. This table is the checker's specification: it states
// docs/consistency.md's "What each failure can cost" in numbers. slack is
// max(3, limit/5): the hits one replication interval, one batch in flight or
// one ring change's spread may count twice or lose.
type Bound struct {
	Kind   FaultKind
	Settle time.Duration
	Extra  func(k Key, f Fault, t Touch) uint64
	Why    string
}

// slack is the allowance for the small losses every membership change may
// cost (see Bound).
func slack(limit uint64) uint64 { return max(3, limit/5) }

// spread is what counting a key on two nodes for a second (a ring change
// spreading) may cost: the hits one of them allowed, at most its limit,
// and at most a second's share of it for a longer window.
func spread(k Key) uint64 {
	return k.Limit * uint64(min(k.Unit, time.Second)) / uint64(k.Unit)
}

// movedExtra is what a key moved between two other nodes may cost besides
// slack: counted on both while the ring change spreads.
func movedExtra(k Key, t Touch) uint64 {
	if t == Moved {
		return spread(k)
	}
	return 0
}

// joined is the bound of a Join and of a Restart: a key the new node
// relays may lose the previous owner's last replication interval at the
// switch (5 ms: at the simulation's rates one or two hits); a key moved
// between two other nodes is counted on both while the ring change spreads
// (up to about a second); any other, slack.
func joined(k Key, _ Fault, t Touch) uint64 {
	switch t {
	case Relayed:
		return 2
	case Moved:
		return slack(k.Limit) + spread(k)
	}
	return slack(k.Limit)
}

// Bounds is the specification, one row per fault.
var Bounds = [numFaults]Bound{
	Join: {Join, 3 * time.Second, joined,
		"the keys moved to the new node: the previous owner's last replication interval when the join relay ends (2 hits at the simulation's rates); the keys moved between two other nodes: counted on both while the ring change spreads, up to about a second (slack and a second's share of the limit); any other key: slack"},
	Leave: {Leave, 3 * time.Second, func(k Key, _ Fault, t Touch) uint64 { return slack(k.Limit) + movedExtra(k, t) },
		"writes made during the drain's push, merged by maximum at the new owner (slack); the keys moved between survivors are counted on their old and new owner while the leave spreads, as a join's (slack and a second's share)"},
	Kill: {Kill, 10 * time.Second, func(k Key, f Fault, t Touch) uint64 {
		return slack(k.Limit) + 2*uint64(max(1, f.Peers)-1) + movedExtra(k, t)
	},
		"the owner's last replication interval (slack); each entry node's batch in flight, decided on its own counter (an entry node learns of the crash from the batch that fails, on each of its two senders: 2 hits per entry node); the keys moved between survivors (Moved) until the old owner's handoff, a few hundred milliseconds (a second's share)"},
	Restart: {Restart, 5 * time.Second, joined,
		"as a join"},
	Pause: {Pause, 10 * time.Second, func(k Key, _ Fault, _ Touch) uint64 { return slack(k.Limit) + k.Limit/2 },
		"ops entry nodes decide on their own counters before the owner is suspect, only for keys they saw below half their limit"},
	Partition: {Partition, 5 * time.Second, func(k Key, f Fault, _ Touch) uint64 { return k.Limit*uint64(max(1, f.Sides-1)) + slack(k.Limit) },
		"each side may allow the limit once more until the sides merge"},
}

// Key is a counter the simulated Envoys hit: a fixed window of Limit hits
// per Unit.
type Key struct {
	Name  string
	Limit uint64
	Unit  time.Duration
}

// Checker holds every answer the simulated Envoys got and the faults of
// the run, and finds the windows where a key was allowed more than its
// bound. Not safe for concurrent use.
type Checker struct {
	keys    map[string]Key
	allowed map[window]uint64
	faults  []Fault
	calls   int
	late    []string // calls answered after their deadline
	failed  []string // calls that got no usable answer, and other failures
}

// window is one key's window, named by its end on the unit grid.
type window struct {
	key string
	end time.Duration // since the start of the run
}

// NewChecker returns a checker for keys.
func NewChecker(keys []Key) *Checker {
	c := &Checker{keys: map[string]Key{}, allowed: map[window]uint64{}}
	for _, k := range keys {
		c.keys[k.Name] = k
	}
	return c
}

// Fault records a fault.
func (c *Checker) Fault(f Fault) { c.faults = append(c.faults, f) }

// Answer records one call on key at (since the start of the run), which
// took took against deadline: allowed or not, and the time until its
// window resets as the deciding node said. The window is the one whose end
// on the unit grid is nearest at+resetAfter: the node read its clock up to
// one forwarding latency after at. start is the run's start on the clock
// windows are counted by; it must lie on every unit's grid.
func (c *Checker) Answer(key string, at time.Duration, over bool, resetAfter, took, deadline time.Duration) {
	c.calls++
	if took > deadline {
		c.late = append(c.late, fmt.Sprintf("%s at %v: answered in %v, deadline %v", key, at, took, deadline))
	}
	if over {
		return
	}
	k := c.keys[key]
	end := at + resetAfter
	end = (end + k.Unit/2) / k.Unit * k.Unit
	c.allowed[window{key, end}]++
}

// Fail records a failure that is not a count: a call that found no node
// to send it to, an answer that makes no sense, a cluster that did not
// converge once the faults stopped.
func (c *Checker) Fail(at time.Duration, what string) {
	c.failed = append(c.failed, fmt.Sprintf("at %v: %s", at, what))
}

// Violation is a window allowed past its bound, a late answer or a
// failure (Fail).
type Violation struct {
	What string
	key  string
	at   time.Duration
}

// Violations returns, sorted, every window allowed more than its limit plus
// the extra the faults touching it may cost, then every late answer and
// every failure.
func (c *Checker) Violations() []Violation {
	var out []Violation
	for w, n := range c.allowed {
		k := c.keys[w.key]
		bound, why := k.Limit, []string(nil)
		for _, f := range c.faults {
			b := Bounds[f.Kind]
			if f.At < w.end && f.Until+b.Settle > w.end-k.Unit {
				bound += b.Extra(k, f, f.touch(w.key))
				why = append(why, fmt.Sprintf("%v at %v", f.Kind, f.At))
			}
		}
		if n > bound {
			ctx := "steady state"
			if len(why) > 0 {
				ctx = fmt.Sprint(why)
			}
			out = append(out, Violation{fmt.Sprintf("key %s window ending %v: %d allowed, limit %d, bound %d (%s)", w.key, w.end, n, k.Limit, bound, ctx), w.key, w.end})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].key != out[j].key {
			return out[i].key < out[j].key
		}
		return out[i].at < out[j].at
	})
	for _, l := range c.late {
		out = append(out, Violation{What: "late: " + l})
	}
	for _, f := range c.failed {
		out = append(out, Violation{What: "failed: " + f})
	}
	return out
}

// Calls returns how many answers were recorded.
func (c *Checker) Calls() int { return c.calls }

// Worst returns the largest excess over the limit of any window, in hits,
// and that window ("key@end"): how close a run came.
func (c *Checker) Worst() (excess uint64, key string) {
	for _, w := range c.windows() {
		if n, l := c.allowed[w], c.keys[w.key].Limit; n > l && n-l > excess {
			excess, key = n-l, fmt.Sprintf("%s@%v", w.key, w.end)
		}
	}
	return excess, key
}

// windows returns every window with an allowed hit, by key then end.
func (c *Checker) windows() []window {
	ws := make([]window, 0, len(c.allowed))
	for w := range c.allowed {
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b window) int {
		if a.key != b.key {
			if a.key < b.key {
				return -1
			}
			return 1
		}
		return int(a.end - b.end)
	})
	return ws
}
