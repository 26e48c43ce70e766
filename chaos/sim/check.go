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
	Extra  func(limit uint64, f Fault) uint64
	Why    string
}

// slack is the allowance for the small losses every membership change may
// cost (see Bound).
func slack(limit uint64) uint64 { return max(3, limit/5) }

// Bounds is the specification, one row per fault.
var Bounds = [numFaults]Bound{
	Join: {Join, 3 * time.Second, func(l uint64, _ Fault) uint64 { return slack(l) },
		"the previous owner's last replication interval at the end of the join relay; keys moved between the other nodes while the ring change spreads"},
	Leave: {Leave, 3 * time.Second, func(l uint64, _ Fault) uint64 { return slack(l) },
		"writes made during the drain's push, merged by maximum at the new owner"},
	Kill: {Kill, 10 * time.Second, func(l uint64, _ Fault) uint64 { return slack(l) },
		"the owner's last replication interval and each entry node's batch in flight; keys moved between survivors until the old owner's handoff"},
	Restart: {Restart, 5 * time.Second, func(l uint64, _ Fault) uint64 { return slack(l) },
		"as a join"},
	Pause: {Pause, 10 * time.Second, func(l uint64, _ Fault) uint64 { return slack(l) + l/2 },
		"ops entry nodes decide on their own counters before the owner is suspect, only for keys they saw below half their limit"},
	Partition: {Partition, 5 * time.Second, func(l uint64, f Fault) uint64 { return l*uint64(max(1, f.Sides-1)) + slack(l) },
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

// Violation is a window allowed past its bound, or a late answer.
type Violation struct {
	What string
	key  string
	at   time.Duration
}

// Violations returns, sorted, every window allowed more than its limit plus
// the extra the faults touching it may cost, and every late answer.
func (c *Checker) Violations() []Violation {
	var out []Violation
	for w, n := range c.allowed {
		k := c.keys[w.key]
		bound, why := k.Limit, []string(nil)
		for _, f := range c.faults {
			b := Bounds[f.Kind]
			if f.At < w.end && f.Until+b.Settle > w.end-k.Unit {
				bound += b.Extra(k.Limit, f)
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
	return out
}

// Calls returns how many answers were recorded.
func (c *Checker) Calls() int { return c.calls }

// Worst returns the largest excess over the limit of any window, in hits,
// and whether a fault touched that window: how close a run came.
func (c *Checker) Worst() (excess uint64, key string) {
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
	for _, w := range ws {
		if n, l := c.allowed[w], c.keys[w.key].Limit; n > l && n-l > excess {
			excess, key = n-l, fmt.Sprintf("%s@%v", w.key, w.end)
		}
	}
	return excess, key
}
