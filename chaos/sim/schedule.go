package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/ring"
)

// Action is one thing the schedule does to the cluster at an instant.
type Action uint8

// The actions.
const (
	Start   Action = iota // a node process starts on its host: a join, or a restart with the same identity
	Drain                 // SIGTERM: drain, leave, stop
	Crash                 // SIGKILL: the host's process is gone, its address refuses
	Freeze                // SIGSTOP
	Thaw                  // SIGCONT
	Split                 // the network splits into Sides
	Heal                  // the network is whole again
	HealAll               // the end of the faults: heal and thaw whatever is left
)

var actionNames = [...]string{"start", "drain", "crash", "freeze", "thaw", "split", "heal", "heal-all"}

func (a Action) String() string { return actionNames[a] }

// Step is one action of the schedule.
type Step struct {
	At    time.Duration // since the start of the run
	Act   Action
	Node  int     // host index, for node actions
	Sides [][]int // Split: host indexes per side; hosts not named form one more side
	Fault int     // the index in Schedule.Faults of the fault it begins or ends; -1: none
}

// Call is one simulated Envoy call: one or two descriptors, each one hit
// on a key, to a node that Pick chooses among those Envoys may reach at At.
type Call struct {
	At   time.Duration
	Keys [2]int16 // indexes into Schedule.Keys; Keys[1] is -1 for one descriptor
	Pick uint32   // the entry node: Pick mod the number of reachable nodes
}

// Schedule is everything a run does, drawn from its seed alone: the
// network, the cluster, the keys, the faults and every call.
type Schedule struct {
	Seed    uint64
	Initial int // nodes started at 0
	Hosts   int // hosts the run uses: the initial nodes, then one per join

	// The network (simnet.Config).
	LatencyMin, LatencyMax, StreamLatency time.Duration
	Loss                                  float64

	Keys   []Key
	Loads  []Segment // what the calls offer each key
	Faults []Fault   // as the Checker records them; Until as planned
	Steps  []Step    // in time order
	Calls  []Call    // in time order

	LoadStart time.Duration // the first call
	HealAt    time.Duration // the last fault ends; the convergence check starts
	LoadEnd   time.Duration // no call at or after it
	Episodes  []string      // what each fault episode does, for people
}

// Segment offers Hits hits on key Key spread evenly over [From, To).
type Segment struct {
	Key      int
	From, To time.Duration
	Hits     int
}

// Deadline is the deadline of every simulated Envoy call: Envoy's default
// rate limit service timeout.
const Deadline = 20 * time.Millisecond

// Load is how much each key is offered, as a multiple of its limit: enough
// that windows run out.
const Load = 1.5

// Times of a run.
const (
	loadStart  = 10 * time.Second // after the cluster formed
	faultStart = 20 * time.Second
	quiet      = 5 * time.Second  // between the last fault's end and the heal
	afterHeal  = 20 * time.Second // calls after the heal, in steady state
	// relayWindow is the join relay's length (cluster.DefaultJoinRelay):
	// the second change of a pair comes within it.
	relayWindow = 2 * time.Second
)

// NodeID names host index i's node.
func NodeID(i int) string { return fmt.Sprintf("node-%d", i+1) }

// HostIP is host index i's address.
func HostIP(i int) string { return fmt.Sprintf("10.0.%d.%d", i/250, i%250+1) }

// NewSchedule draws a schedule from seed. nodes fixes the initial cluster
// size (0: drawn, 3 to 50); maxNodes caps the hosts joins may add (0: 50).
// Separate streams draw the network, the keys, the faults and the calls,
// so that a change to one leaves the others as they were.
func NewSchedule(seed uint64, nodes, maxNodes int) *Schedule {
	stream := func(i uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x51a7e0000+i)) }
	rNet, rKeys, rFaults, rLoad := stream(1), stream(2), stream(3), stream(4)
	s := &Schedule{Seed: seed}
	if maxNodes <= 0 {
		maxNodes = 50
	}
	s.Initial = nodes
	if s.Initial <= 0 {
		switch p := rFaults.Float64(); {
		case p < 0.45:
			s.Initial = 3 + rFaults.IntN(3) // 3-5
		case p < 0.85:
			s.Initial = 6 + rFaults.IntN(5) // 6-10
		case p < 0.97:
			s.Initial = 11 + rFaults.IntN(10) // 11-20
		default:
			s.Initial = 21 + rFaults.IntN(30) // 21-50
		}
	}
	s.Initial = max(3, min(s.Initial, maxNodes))
	s.Hosts = s.Initial

	s.LatencyMin = time.Duration(100+rNet.IntN(400)) * time.Microsecond
	s.LatencyMax = s.LatencyMin + time.Duration(500+rNet.IntN(3000))*time.Microsecond
	s.StreamLatency = time.Duration(200+rNet.IntN(800)) * time.Microsecond
	if rNet.IntN(2) == 0 {
		s.Loss = rNet.Float64() * 0.02
	}

	// Half the keys count per second with small limits, half per ten
	// seconds; the faults add fresh keys of their own.
	n1, n10 := 6+rKeys.IntN(4), 6+rKeys.IntN(4)
	for i := range n1 {
		s.Keys = append(s.Keys, Key{Name: fmt.Sprintf("s%02d", i), Limit: uint64(10 + rKeys.IntN(31)), Unit: time.Second})
	}
	for i := range n10 {
		s.Keys = append(s.Keys, Key{Name: fmt.Sprintf("t%02d", i), Limit: uint64(30 + rKeys.IntN(271)), Unit: 10 * time.Second})
	}
	base := len(s.Keys)

	g := &faultGen{s: s, r: rFaults, rk: rKeys, maxHosts: max(maxNodes, s.Initial), rings: map[string]*ring.Ring{}}
	for i := range s.Initial {
		g.live = append(g.live, i)
	}
	// Every membership change makes each node rebuild its ring, which costs
	// more the more nodes there are: large clusters get fewer faults.
	episodes := 3 + rFaults.IntN(4)
	if s.Initial > 20 {
		episodes = 2 + rFaults.IntN(2)
	}
	t := faultStart
	for range episodes {
		t = g.episode(g.aligned(t))
		t += time.Duration(1000+rFaults.IntN(3000)) * time.Millisecond
	}
	s.HealAt = t + quiet
	s.Steps = append(s.Steps, Step{At: s.HealAt, Act: HealAll, Fault: -1})
	slices.SortStableFunc(s.Steps, func(a, b Step) int { return int(a.At - b.At) })
	s.LoadStart, s.LoadEnd = loadStart, s.HealAt+afterHeal
	for i, k := range s.Keys[:base] {
		s.Loads = append(s.Loads, Segment{Key: i, From: s.LoadStart, To: s.LoadEnd,
			Hits: int(Load * float64(k.Limit) * float64(s.LoadEnd-s.LoadStart) / float64(k.Unit))})
	}
	slices.SortStableFunc(s.Loads, func(a, b Segment) int { return a.Key - b.Key })
	g.moves()

	s.Calls = drawCalls(rLoad, s.Loads, s.LoadEnd)
	return s
}

// drawCalls spreads each segment's hits over its span, one call per hit
// at jittered intervals (none at or after end); about one call in six
// carries a second key's hit, the next one due within 5 ms, instead of its
// own call.
func drawCalls(r *rand.Rand, loads []Segment, end time.Duration) []Call {
	var calls []Call
	for _, l := range loads {
		if l.Hits <= 0 {
			continue
		}
		gap := float64(l.To-l.From) / float64(l.Hits)
		for i := range l.Hits {
			at := l.From + time.Duration(gap*(float64(i)+r.Float64()))
			if at < end {
				calls = append(calls, Call{At: at.Truncate(time.Microsecond), Keys: [2]int16{int16(l.Key), -1}})
			}
		}
	}
	slices.SortStableFunc(calls, func(a, b Call) int { return int(a.At - b.At) })
	out := calls[:0]
	for i := 0; i < len(calls); i++ {
		c := calls[i]
		if i+1 < len(calls) && r.IntN(6) == 0 {
			if n := calls[i+1]; n.Keys[0] != c.Keys[0] && n.At-c.At < 5*time.Millisecond {
				c.Keys[1] = n.Keys[0]
				i++
			}
		}
		c.Pick = r.Uint32()
		out = append(out, c)
	}
	return out
}

// faultGen draws fault episodes, keeping track of which hosts run a node.
type faultGen struct {
	s        *Schedule
	r        *rand.Rand
	rk       *rand.Rand // the fresh keys' limits
	maxHosts int
	live     []int // hosts whose node runs and serves
	down     []int // hosts whose node was killed and not restarted
	rings    map[string]*ring.Ring
	changes  []change
	fresh    int // fresh key names drawn so far
}

// change is a membership change whose moved keys (Fault.Relayed,
// Fault.Moved) are computed once every key is known.
type change struct {
	fault, host   int
	before, after []int // the nodes running before and after it
}

// ring returns the ring of hosts, as every node builds it once the cluster
// has converged.
func (g *faultGen) ring(hosts []int) *ring.Ring {
	ids := g.ids(hosts...)
	slices.Sort(ids)
	name := strings.Join(ids, ",")
	if r := g.rings[name]; r != nil {
		return r
	}
	r, err := ring.New(ids, ring.Config{})
	if err != nil {
		panic(err) // ids are distinct and not empty
	}
	g.rings[name] = r
	return r
}

// freshKeys adds n keys of ten-second windows that host h owns on the ring
// of hosts, and returns their indexes.
func (g *faultGen) freshKeys(n int, h int, hosts []int) []int {
	r := g.ring(hosts)
	var out []int
	for len(out) < n {
		g.fresh++
		name := fmt.Sprintf("f%03d", g.fresh)
		if id, _ := r.Owner([]byte(name)); id != NodeID(h) {
			continue
		}
		g.s.Keys = append(g.s.Keys, Key{Name: name, Limit: uint64(40 + g.rk.IntN(61)), Unit: 10 * time.Second})
		out = append(out, len(g.s.Keys)-1)
	}
	return out
}

// offer adds a segment of hits on key k, as a fraction of its limit.
func (g *faultGen) offer(k int, from, to time.Duration, fraction float64) {
	g.s.Loads = append(g.s.Loads, Segment{Key: k, From: from, To: to, Hits: int(fraction * float64(g.s.Keys[k].Limit))})
}

// burst gives a Start at t fresh keys that the starting host h owns once it
// is in the ring: used to 30% of their limit over the 3 s before, then
// offered 1.2 times their limit from 20 to 420 ms after t (the node is
// ready after about 25 ms; its readiness takes one to a few gossip rounds
// of 200 ms to reach every peer, and meanwhile it relays their ops), then
// 50% more by the end of the next window. Counted on one node at a time
// they get their limit exactly; counted on two, most of what the smaller
// one took more.
func (g *faultGen) burst(t time.Duration, h int) {
	for _, k := range g.freshKeys(4, h, append(slices.Clone(g.live), h)) {
		g.offer(k, t-3*time.Second, t, 0.3)
		g.offer(k, t+20*time.Millisecond, t+420*time.Millisecond, 1.2)
		g.offer(k, t+420*time.Millisecond, t+10*time.Second, 0.5)
	}
}

// primed gives a fault at t fresh keys that host h owns before it: used
// to 90% of their limit over the 1.5 s before (after the ring changes of
// earlier faults, whose handoffs copy counts without replication), then
// offered their limit again over the 5 s after, so that a fault that loses
// their count lets most of a limit more through.
func (g *faultGen) primed(t time.Duration, h int) {
	for _, k := range g.freshKeys(3, h, g.live) {
		g.offer(k, t-1500*time.Millisecond, t, 0.9)
		g.offer(k, t, t+5*time.Second, 1.0)
	}
}

// moves fills in Fault.Relayed and Fault.Moved for every membership
// change: the keys a starting node owns on the ring with it, whose ops it
// relays to their previous owners while its readiness spreads, and the
// keys whose owner changes between two other nodes.
func (g *faultGen) moves() {
	for _, c := range g.changes {
		before, after := g.ring(c.before), g.ring(c.after)
		f := &g.s.Faults[c.fault]
		id := NodeID(c.host)
		for _, k := range g.s.Keys {
			was, _ := before.Owner([]byte(k.Name))
			is, _ := after.Owner([]byte(k.Name))
			switch {
			case is == was:
			case is == id && f.Kind != Leave && f.Kind != Kill:
				f.Relayed = append(f.Relayed, k.Name)
			case is != id && was != id:
				f.Moved = append(f.Moved, k.Name)
			}
		}
		slices.Sort(f.Relayed)
		slices.Sort(f.Moved)
	}
}

// changed notes a membership change of host h for moves; call it before
// g.live changes.
func (g *faultGen) changed(fault, h int, join bool) {
	before, after := slices.Clone(g.live), remove(g.live, h)
	if join {
		before, after = remove(g.live, h), append(slices.Clone(g.live), h)
	}
	g.changes = append(g.changes, change{fault, h, before, after})
}

// aligned returns the first instant at or after t that lies 4.35 to 6.65 s
// into a ten-second window and 0.35 to 0.65 s into a second: the keys then
// have used about 50-100% of their limit (at Load times the limit) and few
// have run out, so that a fault that loses or doubles counts shows.
func (g *faultGen) aligned(t time.Duration) time.Duration {
	off := time.Duration(4+g.r.IntN(3))*time.Second + 350*time.Millisecond + time.Duration(g.r.IntN(300))*time.Millisecond
	const ten = 10 * time.Second
	k := (t - off + ten - 1) / ten
	return k*ten + off
}

func (g *faultGen) dur(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(g.r.Int64N(int64(hi-lo)+1)).Truncate(time.Millisecond)
}

func (g *faultGen) pick(from []int) int { return from[g.r.IntN(len(from))] }

func remove(s []int, v int) []int {
	return slices.DeleteFunc(slices.Clone(s), func(x int) bool { return x == v })
}

func (g *faultGen) ids(hosts ...int) []string {
	var out []string
	for _, h := range hosts {
		out = append(out, NodeID(h))
	}
	return out
}

// fault adds a fault to the schedule and returns its index. Call it
// before the fault changes g.live: Peers counts the nodes running then.
func (g *faultGen) fault(f Fault) int {
	f.Peers = len(g.live)
	g.s.Faults = append(g.s.Faults, f)
	return len(g.s.Faults) - 1
}

func (g *faultGen) step(st Step) { g.s.Steps = append(g.s.Steps, st) }

// join starts a new host's node at t.
func (g *faultGen) join(t time.Duration) int {
	h := g.s.Hosts
	g.s.Hosts++
	g.burst(t, h)
	fi := g.fault(Fault{Kind: Join, At: t, Until: t, Nodes: g.ids(h)})
	g.step(Step{At: t, Act: Start, Node: h, Fault: fi})
	g.changed(fi, h, true)
	g.live = append(g.live, h)
	return h
}

// leave drains a live node other than not at t.
func (g *faultGen) leave(t time.Duration, not int) int {
	h := g.pick(remove(g.live, not))
	fi := g.fault(Fault{Kind: Leave, At: t, Until: t, Nodes: g.ids(h)})
	g.changed(fi, h, false)
	g.live = remove(g.live, h)
	g.step(Step{At: t, Act: Drain, Node: h, Fault: fi})
	return h
}

// kill crashes a live node other than not at t and, unless restart is 0,
// restarts it restart later. It returns the last instant it acts.
func (g *faultGen) kill(t, restart time.Duration, not int) (int, time.Duration) {
	h := g.pick(remove(g.live, not))
	g.primed(t, h)
	fi := g.fault(Fault{Kind: Kill, At: t, Until: t, Nodes: g.ids(h)})
	g.changed(fi, h, false)
	g.live = remove(g.live, h)
	g.step(Step{At: t, Act: Crash, Node: h, Fault: fi})
	if restart == 0 {
		g.down = append(g.down, h)
		return h, t
	}
	g.restart(t+restart, h)
	return h, t + restart
}

func (g *faultGen) restart(t time.Duration, h int) {
	g.down = remove(g.down, h)
	g.burst(t, h)
	fi := g.fault(Fault{Kind: Restart, At: t, Until: t, Nodes: g.ids(h)})
	g.step(Step{At: t, Act: Start, Node: h, Fault: fi})
	g.changed(fi, h, true)
	g.live = append(g.live, h)
}

// episode draws one fault episode starting at t and returns when its
// effects should have settled.
func (g *faultGen) episode(t time.Duration) time.Duration {
	canJoin := g.s.Hosts < g.maxHosts
	canLose := len(g.live) >= 3
	type choice struct {
		w  int
		ok bool
		do func() time.Duration
	}
	var desc string
	choices := []choice{
		{2, canJoin, func() time.Duration {
			h := g.join(t)
			desc = fmt.Sprintf("join %s", NodeID(h))
			return t + 4*time.Second
		}},
		{4, canJoin && canLose, func() time.Duration {
			// Two membership changes inside one join relay.
			h := g.join(t)
			t2 := t + g.dur(300*time.Millisecond, relayWindow+200*time.Millisecond)
			end := t2
			switch g.r.IntN(3) {
			case 0:
				if g.s.Hosts < g.maxHosts {
					h2 := g.join(t2)
					desc = fmt.Sprintf("join %s, join %s %v later", NodeID(h), NodeID(h2), t2-t)
					break
				}
				fallthrough
			case 1:
				h2 := g.leave(t2, h)
				desc = fmt.Sprintf("join %s, drain %s %v later", NodeID(h), NodeID(h2), t2-t)
			default:
				var h2 int
				restart := g.maybe(0.6, 2*time.Second, 15*time.Second)
				h2, end = g.kill(t2, restart, h)
				desc = fmt.Sprintf("join %s, kill %s %v later%s", NodeID(h), NodeID(h2), t2-t, restartDesc(restart))
			}
			return end + 5*time.Second
		}},
		{2, canLose, func() time.Duration {
			h := g.leave(t, -1)
			desc = fmt.Sprintf("drain %s", NodeID(h))
			return t + 5*time.Second
		}},
		{1, len(g.live) >= 4, func() time.Duration {
			h := g.leave(t, -1)
			t2 := t + g.dur(0, time.Second)
			h2 := g.leave(t2, -1)
			desc = fmt.Sprintf("drain %s, drain %s %v later", NodeID(h), NodeID(h2), t2-t)
			return t2 + 6*time.Second
		}},
		{3, canLose, func() time.Duration {
			restart := g.maybe(0.7, time.Second, 20*time.Second)
			h, end := g.kill(t, restart, -1)
			desc = fmt.Sprintf("kill %s%s", NodeID(h), restartDesc(restart))
			if restart == 0 {
				return end + 12*time.Second // failure detection, then handoff
			}
			return end + 5*time.Second
		}},
		{4, len(g.down) > 0, func() time.Duration {
			h := g.pick(g.down)
			g.restart(t, h)
			desc = fmt.Sprintf("restart %s", NodeID(h))
			return t + 4*time.Second
		}},
		{2, len(g.live) >= 2, func() time.Duration {
			h := g.pick(g.live)
			g.primed(t, h)
			thaw := t + g.dur(200*time.Millisecond, 15*time.Second)
			fi := g.fault(Fault{Kind: Pause, At: t, Until: thaw, Nodes: g.ids(h)})
			g.step(Step{At: t, Act: Freeze, Node: h, Fault: fi})
			g.step(Step{At: thaw, Act: Thaw, Node: h, Fault: fi})
			desc = fmt.Sprintf("pause %s for %v", NodeID(h), thaw-t)
			return thaw + 5*time.Second
		}},
		{2, len(g.live) >= 2, func() time.Duration {
			sides := 2
			if len(g.live) >= 3 && g.r.IntN(5) == 0 {
				sides = 3
			}
			hosts := slices.Clone(g.live)
			g.r.Shuffle(len(hosts), func(i, j int) { hosts[i], hosts[j] = hosts[j], hosts[i] })
			// Cut points: each side gets at least one node.
			cuts := []int{0}
			for i := 1; i < sides; i++ {
				lo := cuts[i-1] + 1
				hi := len(hosts) - (sides - i)
				cuts = append(cuts, lo+g.r.IntN(hi-lo+1))
			}
			cuts = append(cuts, len(hosts))
			var groups [][]int
			var names []string
			for i := range sides {
				side := slices.Clone(hosts[cuts[i]:cuts[i+1]])
				slices.Sort(side)
				groups = append(groups, side)
				names = append(names, strings.Join(g.ids(side...), ","))
			}
			heal := t + g.dur(time.Second, 25*time.Second)
			fi := g.fault(Fault{Kind: Partition, At: t, Until: heal, Nodes: g.ids(hosts...), Sides: sides})
			g.step(Step{At: t, Act: Split, Sides: groups, Fault: fi})
			g.step(Step{At: heal, Act: Heal, Fault: fi})
			desc = fmt.Sprintf("partition {%s} for %v", strings.Join(names, "} {"), heal-t)
			return heal + 5*time.Second
		}},
	}
	total := 0
	for _, c := range choices {
		if c.ok {
			total += c.w
		}
	}
	x := g.r.IntN(total)
	for _, c := range choices {
		if !c.ok {
			continue
		}
		if x < c.w {
			keys := len(g.s.Keys)
			end := c.do()
			if n := len(g.s.Keys) - keys; n > 0 {
				desc += fmt.Sprintf(" [keys %s-%s]", g.s.Keys[keys].Name, g.s.Keys[len(g.s.Keys)-1].Name)
			}
			g.s.Episodes = append(g.s.Episodes, fmt.Sprintf("%9v  %s", t.Round(time.Millisecond), desc))
			return end
		}
		x -= c.w
	}
	panic("unreachable")
}

// maybe returns, with probability p, a duration drawn from [lo, hi]; else 0.
func (g *faultGen) maybe(p float64, lo, hi time.Duration) time.Duration {
	if g.r.Float64() >= p {
		return 0
	}
	return g.dur(lo, hi)
}

func restartDesc(d time.Duration) string {
	if d == 0 {
		return " (for good)"
	}
	return fmt.Sprintf(", restarted %v later", d)
}

// String describes the schedule for people: its shape and the faults.
func (s *Schedule) String() string {
	var b strings.Builder
	calls2 := 0
	for _, c := range s.Calls {
		if c.Keys[1] >= 0 {
			calls2++
		}
	}
	fmt.Fprintf(&b, "seed %d: %d nodes (%d hosts), network latency %v-%v, streams %v, loss %.2f%%\n",
		s.Seed, s.Initial, s.Hosts, s.LatencyMin, s.LatencyMax, s.StreamLatency, s.Loss*100)
	fmt.Fprintf(&b, "  %d keys:", len(s.Keys))
	for _, k := range s.Keys {
		fmt.Fprintf(&b, " %s=%d/%v", k.Name, k.Limit, k.Unit)
	}
	fmt.Fprintf(&b, "\n  %d calls (%d with two descriptors) from %v to %v, deadline %v\n", len(s.Calls), calls2, s.LoadStart, s.LoadEnd, Deadline)
	for _, e := range s.Episodes {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	fmt.Fprintf(&b, "  %9v  heal everything; the convergence check starts", s.HealAt)
	return b.String()
}
