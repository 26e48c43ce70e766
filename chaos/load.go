package chaos

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// Outcome is what a fail-open Envoy makes of one ShouldRateLimit call.
type Outcome uint8

const (
	// OutcomeOK is an OK answer within the deadline: the request is allowed.
	OutcomeOK Outcome = iota
	// OutcomeOver is an OVER_LIMIT answer within the deadline: refused.
	OutcomeOver
	// OutcomeLate is a call whose deadline passed: Envoy lets the request
	// through (allowed by failure).
	OutcomeLate
	// OutcomeFailed is any other error: Envoy lets the request through too,
	// but a failed call breaks the "no failed call" invariant.
	OutcomeFailed
)

// Call is one ShouldRateLimit call the load driver made.
type Call struct {
	Start   time.Duration // since the load started
	Latency time.Duration
	Node    int   // index into Record.Nodes
	Key     int   // key index: the descriptor value is KeyPrefix + index
	Window  int64 // number of the window the hit belongs to (window end / unit)
	Outcome Outcome
	Code    codes.Code // the gRPC code of a failed call
}

// End is when the call completed, since the load started.
func (c Call) End() time.Duration { return c.Start + c.Latency }

// LoadConfig describes the fleet of Envoys the driver stands for. The zero
// value of each field but Domain, DescriptorKey, Keys and Unit has a default.
type LoadConfig struct {
	Domain        string // RLS domain
	DescriptorKey string // the one descriptor entry's key
	KeyPrefix     string // values are KeyPrefix + index; default "key-"
	// Keys is the number of distinct values hit, uniformly at random, at a
	// time: generation g (see NextKeys) hits indices g*Keys to g*Keys+Keys-1.
	Keys int
	Unit time.Duration // the limit's window, to number the windows of unanswered calls
	// ClockWindows numbers every call's window by the client's clock.
	// Otherwise answered calls take the window end the server reports
	// (duration_until_reset), which only fixed windows report.
	ClockWindows bool
	ConnsPerNode int           // long-lived gRPC connections to each node; default 2
	Workers      int           // concurrent callers; default 8
	Rate         float64       // calls per second over all workers; 0 means as fast as they go
	Deadline     time.Duration // per call, as Envoy's ratelimit filter timeout; default 20 ms
	MaxCalls     int64         // the driver stops after this many calls; default 2,000,000
	MaxDuration  time.Duration // and after this long; default 15 minutes
	Seed         int64         // seeds the key choice of each worker
}

func (c *LoadConfig) validate() error {
	switch {
	case c.Domain == "" || c.DescriptorKey == "":
		return errors.New("chaos: load: Domain and DescriptorKey are required")
	case c.Keys <= 0:
		return fmt.Errorf("chaos: load: Keys must be positive, got %d", c.Keys)
	case c.Unit <= 0:
		return fmt.Errorf("chaos: load: Unit must be positive, got %v", c.Unit)
	case c.Rate < 0:
		return fmt.Errorf("chaos: load: Rate must be >= 0, got %v", c.Rate)
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = "key-"
	}
	if c.ConnsPerNode <= 0 {
		c.ConnsPerNode = 2
	}
	if c.Workers <= 0 {
		c.Workers = 8
	}
	if c.Deadline <= 0 {
		c.Deadline = 20 * time.Millisecond
	}
	if c.MaxCalls <= 0 {
		c.MaxCalls = 2_000_000
	}
	if c.MaxDuration <= 0 {
		c.MaxDuration = 15 * time.Minute
	}
	return nil
}

// target is one node with the long-lived connections the fleet holds to it.
type target struct {
	idx      int
	node     *Node
	clients  []pb.RateLimitServiceClient
	conns    []*grpc.ClientConn
	inflight atomic.Int64
	answered atomic.Int64 // end of the last call answered in time, ns since the load started
}

// Load drives steady RLS load at a changing set of nodes, the way a fleet
// of Envoys does: long-lived connections, a short deadline per call, and
// fail-open accounting. It is bounded in calls and time and stops by
// itself. Its methods are safe for concurrent use.
type Load struct {
	cfg   LoadConfig
	start time.Time

	mu      sync.Mutex
	byNode  map[*Node]*target
	nodes   []string // node IDs by target index
	marks   []Mark
	stopped bool

	targets atomic.Pointer[[]*target]
	rate    atomic.Uint64 // math.Float64bits of calls per second
	calls   atomic.Int64
	gen     atomic.Int64   // the key generation being hit
	ok      []atomic.Int64 // OK answers per key index
	over    []atomic.Int64 // OVER_LIMIT answers per key index

	stop chan struct{}
	wg   sync.WaitGroup
	logs [][]Call // per worker, merged by Stop
}

// Mark names the moment a phase of a scenario began.
type Mark struct {
	Name string
	At   time.Duration // since the load started
}

// maxKeyGenerations bounds NextKeys.
const maxKeyGenerations = 8

// StartLoad dials every target and starts the workers.
func StartLoad(cfg LoadConfig, targets []*Node) (*Load, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	l := &Load{
		cfg:    cfg,
		byNode: map[*Node]*target{},
		ok:     make([]atomic.Int64, cfg.Keys*maxKeyGenerations),
		over:   make([]atomic.Int64, cfg.Keys*maxKeyGenerations),
		stop:   make(chan struct{}),
		logs:   make([][]Call, cfg.Workers),
	}
	l.rate.Store(math.Float64bits(cfg.Rate))
	if err := l.SetTargets(targets); err != nil {
		l.closeConns()
		return nil, err
	}
	l.start = time.Now()
	for w := 0; w < cfg.Workers; w++ {
		l.wg.Add(1)
		go l.worker(w)
	}
	return l, nil
}

// SetTargets makes the fleet send to nodes from now on, dialing any node it
// has no connections to yet. Connections to nodes left out are kept (an
// Envoy keeps its pool), so a node that comes back is reached again.
func (l *Load) SetTargets(nodes []*Node) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ts []*target
	for _, n := range nodes {
		t := l.byNode[n]
		if t == nil {
			t = &target{idx: len(l.nodes), node: n}
			for i := 0; i < l.cfg.ConnsPerNode; i++ {
				conn, cl, err := Dial(n.GRPC)
				if err != nil {
					return fmt.Errorf("chaos: load: dial %s: %w", n.ID, err)
				}
				t.conns = append(t.conns, conn)
				t.clients = append(t.clients, cl)
			}
			connectAll(t.conns, 2*time.Second)
			l.byNode[n] = t
			l.nodes = append(l.nodes, n.ID)
		}
		ts = append(ts, t)
	}
	l.targets.Store(&ts)
	return nil
}

// Drain waits up to timeout until no call to n is in flight, for a caller
// that took n out of the targets and is about to stop it.
func (l *Load) Drain(n *Node, timeout time.Duration) error {
	l.mu.Lock()
	t := l.byNode[n]
	l.mu.Unlock()
	if t == nil {
		return nil
	}
	return poll(timeout, func() (bool, string) {
		c := t.inflight.Load()
		return c == 0, fmt.Sprintf("%d calls to %s still in flight", c, n.ID)
	})
}

// SetRate changes the calls per second over all workers; 0 is unpaced.
func (l *Load) SetRate(r float64) { l.rate.Store(math.Float64bits(max(r, 0))) }

// Now is the time since the load started, on the clock of Call.Start.
func (l *Load) Now() time.Duration { return time.Since(l.start) }

// Mark records that a phase named name begins now.
func (l *Load) Mark(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marks = append(l.marks, Mark{Name: name, At: time.Since(l.start)})
}

// MarkAt records that a phase named name began at at, a moment already
// past (e.g. when a watcher saw the first suspect marking).
func (l *Load) MarkAt(name string, at time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := sort.Search(len(l.marks), func(i int) bool { return l.marks[i].At > at })
	l.marks = append(l.marks, Mark{})
	copy(l.marks[i+1:], l.marks[i:])
	l.marks[i] = Mark{Name: name, At: at}
}

// AnsweredSince reports whether a call to n was answered in time (OK or
// OVER_LIMIT) after at.
func (l *Load) AnsweredSince(n *Node, at time.Duration) bool {
	l.mu.Lock()
	t := l.byNode[n]
	l.mu.Unlock()
	return t != nil && time.Duration(t.answered.Load()) > at
}

// Calls is how many calls were made so far.
func (l *Load) Calls() int64 { return min(l.calls.Load(), l.cfg.MaxCalls) }

// NextKeys moves the load to a fresh generation of Keys values, none of
// them hit before. A scenario takes fresh keys before each fault so that
// the fault strikes counters that are partly used: a counter lost with its
// owner then shows as overshoot once the keys are exhausted. (Exhausted
// keys hide a loss: nodes answer them from the owner's remembered
// OVER_LIMIT until the window ends.)
func (l *Load) NextKeys() error {
	if l.gen.Load()+1 >= maxKeyGenerations {
		return fmt.Errorf("chaos: load: more than %d key generations", maxKeyGenerations)
	}
	l.gen.Add(1)
	return nil
}

// keys is the index range of the current generation.
func (l *Load) keys() (lo, hi int) {
	lo = int(l.gen.Load()) * l.cfg.Keys
	return lo, lo + l.cfg.Keys
}

// WaitUsed waits up to timeout until the current generation's keys have
// been answered OK perKey times each on average.
func (l *Load) WaitUsed(perKey float64, timeout time.Duration) error {
	return poll(timeout, func() (bool, string) {
		lo, hi := l.keys()
		var n int64
		for k := lo; k < hi; k++ {
			n += l.ok[k].Load()
		}
		want := perKey * float64(l.cfg.Keys)
		return float64(n) >= want, fmt.Sprintf("%d of %.0f OK answers on the current keys after %d calls", n, want, l.calls.Load())
	})
}

// WaitExhausted waits up to timeout until every key of the current
// generation has been answered OVER_LIMIT at least once.
func (l *Load) WaitExhausted(timeout time.Duration) error {
	return poll(timeout, func() (bool, string) {
		lo, hi := l.keys()
		left := 0
		for k := lo; k < hi; k++ {
			if l.over[k].Load() == 0 {
				left++
			}
		}
		return left == 0, fmt.Sprintf("%d of %d keys not exhausted after %d calls", left, hi-lo, l.calls.Load())
	})
}

// Stop stops the workers, closes the connections and returns the record.
// Calling it again returns an empty record.
func (l *Load) Stop() *Record {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return &Record{}
	}
	l.stopped = true
	l.mu.Unlock()
	close(l.stop)
	l.wg.Wait()
	l.closeConns()
	l.mu.Lock()
	defer l.mu.Unlock()
	r := &Record{Nodes: append([]string(nil), l.nodes...), Marks: append([]Mark(nil), l.marks...), Duration: time.Since(l.start)}
	for _, lg := range l.logs {
		r.Calls = append(r.Calls, lg...)
	}
	sortCalls(r.Calls)
	return r
}

// sortCalls orders calls by completion.
func sortCalls(calls []Call) {
	sort.SliceStable(calls, func(i, j int) bool { return calls[i].End() < calls[j].End() })
}

func (l *Load) closeConns() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, t := range l.byNode {
		for _, c := range t.conns {
			c.Close()
		}
	}
}

// worker makes calls until Stop, MaxCalls or MaxDuration.
func (l *Load) worker(w int) {
	defer l.wg.Done()
	rnd := rand.New(rand.NewSource(l.cfg.Seed*1000 + int64(w)))
	end := l.start.Add(l.cfg.MaxDuration)
	next := time.Now()
	idle := time.NewTimer(time.Hour)
	defer idle.Stop()
	wait := func(d time.Duration) bool {
		if d <= 0 {
			return true
		}
		idle.Reset(d)
		select {
		case <-l.stop:
			return false
		case <-idle.C:
			return true
		}
	}
	for i := 0; ; i++ {
		select {
		case <-l.stop:
			return
		default:
		}
		now := time.Now()
		if now.After(end) || l.calls.Load() >= l.cfg.MaxCalls {
			return
		}
		// Pacing: each worker takes every Workers-th slot of the schedule;
		// one that fell behind by more than a few slots starts afresh.
		if r := math.Float64frombits(l.rate.Load()); r > 0 {
			interval := time.Duration(float64(time.Second) * float64(l.cfg.Workers) / r)
			next = next.Add(interval)
			if now.Sub(next) > 4*interval {
				next = now
			}
			if !wait(time.Until(next)) {
				return
			}
		} else {
			next = now
		}
		tsp := l.targets.Load()
		if tsp == nil || len(*tsp) == 0 {
			if !wait(5 * time.Millisecond) {
				return
			}
			continue
		}
		ts := *tsp
		t := ts[(w+i)%len(ts)]
		lo, _ := l.keys()
		key := lo + rnd.Intn(l.cfg.Keys)
		if l.calls.Add(1) > l.cfg.MaxCalls { // workers race past the check above
			return
		}
		l.logs[w] = append(l.logs[w], l.call(t, t.clients[(w+i/len(ts))%len(t.clients)], key))
	}
}

// call makes one ShouldRateLimit call and classifies it.
func (l *Load) call(t *target, cl pb.RateLimitServiceClient, key int) Call {
	req := Request(l.cfg.Domain, l.cfg.DescriptorKey, fmt.Sprint(l.cfg.KeyPrefix, key))
	t.inflight.Add(1)
	t0 := time.Now() // before the deadline starts: a late call's latency is at least the deadline
	ctx, cancel := context.WithDeadline(context.Background(), t0.Add(l.cfg.Deadline))
	resp, err := cl.ShouldRateLimit(ctx, req)
	t1 := time.Now()
	cancel()
	t.inflight.Add(-1)
	c := Call{Start: t0.Sub(l.start), Latency: t1.Sub(t0), Node: t.idx, Key: key}
	unit := int64(l.cfg.Unit)
	c.Window = t1.UnixNano()/unit + 1 // the end of the window the client sees
	switch {
	case err != nil:
		c.Code = status.Code(err)
		if c.Code == codes.DeadlineExceeded {
			c.Outcome = OutcomeLate
		} else {
			c.Outcome = OutcomeFailed
		}
	case resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT:
		c.Outcome = OutcomeOver
		l.over[key].Add(1)
	default:
		c.Outcome = OutcomeOK
		l.ok[key].Add(1)
	}
	if err == nil {
		t.answered.Store(int64(c.End()))
	}
	if err == nil && !l.cfg.ClockWindows && len(resp.Statuses) > 0 && resp.Statuses[0].DurationUntilReset != nil {
		// The server's window end, rounded to the nearest window edge.
		e := t1.Add(resp.Statuses[0].DurationUntilReset.AsDuration()).UnixNano()
		c.Window = (e + unit/2) / unit
	}
	return c
}

// connectAll starts connecting every conn and waits up to timeout for all
// to be ready, so the first calls do not pay for the handshake. A conn not
// ready by then keeps connecting in the background.
func connectAll(conns []*grpc.ClientConn, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for _, c := range conns {
		c.Connect()
	}
	for _, c := range conns {
		for s := c.GetState(); s != connectivity.Ready; s = c.GetState() {
			if !c.WaitForStateChange(ctx, s) {
				return
			}
		}
	}
}

// poll calls cond every 50 ms until it holds or timeout passes; the error
// carries cond's last explanation.
func poll(timeout time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: after %v: %s", timeout, why)
		}
		time.Sleep(50 * time.Millisecond) // polling interval of a bounded wait
	}
}
