package sim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/bucket"
)

// Options configure one run.
type Options struct {
	Seed     uint64
	Nodes    int // initial cluster size; 0: drawn from the seed
	MaxNodes int // most hosts joins may bring the cluster to; 0: 50
	Break    Break
	// LogLevel is the level of the nodes' logs kept in Result.Log.
	LogLevel slog.Level
	// ConvergeLimit bounds the wait for every node to agree on the ring
	// after the heal; 0 means 90 s.
	ConvergeLimit time.Duration
	// Trace names keys whose every answer Result.Trace lists.
	Trace []string
}

// Result is what one run found.
type Result struct {
	Schedule   *Schedule
	Violations []Violation
	Calls      int // answers checked (one per descriptor)
	Worst      uint64
	WorstKey   string
	// Formed is how long the initial cluster took to converge; Converged
	// how long after the last fault's last step every live node was ready
	// and routed by the ring of the live nodes (-1: never).
	Formed, Converged time.Duration
	// Answers digests every answer in call order; Windows digests the hits
	// allowed per key and window. Equal digests mean a run replayed
	// exactly (Answers) or counted alike (Windows).
	Answers, Windows string
	// Leases is what the nodes' metrics say of quota leases, read once
	// every node has stopped.
	Leases LeaseStats
	Log    string // the nodes' and the simulation's logs
	Trace  string // the answers for Options.Trace's keys

	answers []uint64          // per call: entry node, over and count of each descriptor
	windows map[window]uint64 // hits allowed per key and window
}

// Diff compares two runs of one seed: how many calls got another answer
// (another entry node, or another count or verdict for a descriptor), when
// the first of them was made, and how many windows allowed another number
// of hits.
func (r *Result) Diff(o *Result) (calls int, first time.Duration, windows int) {
	first = -1
	for i := range min(len(r.answers), len(o.answers)) {
		if r.answers[i] != o.answers[i] {
			if calls == 0 {
				first = r.Schedule.Calls[i].At
			}
			calls++
		}
	}
	for w, n := range r.windows {
		if o.windows[w] != n {
			windows++
		}
	}
	for w := range o.windows {
		if _, ok := r.windows[w]; !ok {
			windows++
		}
	}
	return calls, first, windows
}

// Run runs the simulation for opts.Seed. It must run inside a
// testing/synctest bubble, which it leaves with nothing running.
func Run(opts Options) (*Result, error) {
	s := NewSchedule(opts.Seed, opts.Nodes, opts.MaxNodes)
	// Windows are counted on the Unix grid: start on it (a bubble starts
	// at midnight, on every unit's grid already).
	if off := time.Duration(time.Now().UnixNano() % int64(10*time.Second)); off != 0 {
		time.Sleep(10*time.Second - off)
	}
	logs := &syncBuffer{}
	start := time.Now()
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{
		Level: opts.LogLevel,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Duration("t", time.Since(start))
			}
			return a
		},
	}))
	c, err := newCluster(s, log, opts.Break)
	if err != nil {
		return nil, err
	}
	r := &runner{s: s, c: c, log: log, faults: slices.Clone(s.Faults), limit: opts.ConvergeLimit, trace: opts.Trace}
	if r.limit == 0 {
		r.limit = 90 * time.Second
	}
	err = r.run()
	c.close()
	if err != nil {
		return nil, err
	}
	leases, err := c.leases()
	if err != nil {
		return nil, err
	}
	if opts.Break == BreakLease && leases.Granted > 0 && leases.Uncounted == 0 {
		// leakyStore no longer sees the grants: the break breaks nothing.
		return nil, fmt.Errorf("sim: seed %d: %d leases granted, none of them left uncounted by the lease break", opts.Seed, leases.Granted)
	}
	res := r.result(logs.String())
	res.Leases = leases
	return res, nil
}

// record is one call's answer.
type record struct {
	entry   int // host index of the entry node; -1: none reachable
	took    time.Duration
	results [2]bucket.Result
}

// runner drives one run: it applies the schedule's steps, issues its calls
// and polls for convergence after the heal, all from one goroutine, in
// time order; each call runs in its own goroutine, started in schedule
// order.
type runner struct {
	s      *Schedule
	c      *simCluster
	log    *slog.Logger
	faults []Fault // the schedule's, with Until as it happened
	limit  time.Duration
	trace  []string

	mu      sync.Mutex // guards faults once drains run in the background
	records []record
	calls   sync.WaitGroup
	fails   []failure

	formed, converged time.Duration
	joining           map[int]int // host -> fault whose Until is its readiness
}

type failure struct {
	at   time.Duration
	what string
}

func (r *runner) failf(format string, args ...any) {
	r.fails = append(r.fails, failure{r.c.since(), fmt.Sprintf(format, args...)})
}

func (r *runner) run() error {
	s, c := r.s, r.c
	r.records = make([]record, len(s.Calls))
	r.joining = map[int]int{}
	for i := range s.Initial {
		if err := c.startNode(i); err != nil {
			return err
		}
	}
	// The cluster forms; the load starts at LoadStart whatever happens.
	r.formed = -1
	for c.since() < s.LoadStart {
		if ok, _ := c.converged(); ok {
			r.formed = c.since()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r.formed < 0 {
		_, why := c.converged()
		r.failf("the initial %d nodes did not converge by %v: %s", s.Initial, s.LoadStart, why)
	}

	// Convergence is polled from the last fault's last step on.
	r.converged = -1
	lastFault := s.LoadStart
	for _, st := range s.Steps {
		if st.Act != HealAll {
			lastFault = max(lastFault, st.At)
		}
	}
	var (
		steps, calls = s.Steps, s.Calls
		nextPoll     = lastFault
		reach        []*member
	)
	for len(steps) > 0 || len(calls) > 0 || nextPoll >= 0 {
		// The next event: a step, a call or a poll; steps first on ties.
		at, kind := time.Duration(1<<62), 0
		if len(steps) > 0 {
			at, kind = steps[0].At, 1
		}
		if len(calls) > 0 && calls[0].At < at {
			at, kind = calls[0].At, 2
		}
		if nextPoll >= 0 && nextPoll < at {
			at, kind = nextPoll, 3
		}
		if d := at - c.since(); d > 0 {
			time.Sleep(d)
		}
		r.observe()
		switch kind {
		case 1:
			if err := r.step(steps[0]); err != nil {
				return err
			}
			steps = steps[1:]
		case 2:
			reach = c.reachable(reach[:0])
			r.call(len(s.Calls)-len(calls), calls[0], reach)
			calls = calls[1:]
		case 3:
			ok, why := c.converged()
			switch {
			case ok:
				r.converged = c.since() - lastFault
				r.log.Info("sim: converged", "after_last_fault", r.converged)
				nextPoll = -1
			case c.since() > s.HealAt+r.limit:
				r.failf("not converged %v after the heal: %s", r.limit, why)
				nextPoll = -1
			default:
				nextPoll += 50 * time.Millisecond
			}
		}
	}
	r.calls.Wait()
	c.stops.Wait()
	r.observe()
	if r.converged >= 0 {
		// Still one ring once the load has ended.
		if ok, why := c.converged(); !ok {
			r.failf("converged %v after the last fault, then apart again: %s", r.converged, why)
		}
	}
	return nil
}

// observe notes when starting nodes first report ready: a join's or a
// restart's effect lasts until then.
func (r *runner) observe() {
	for h, fi := range r.joining {
		if m := r.c.members[h]; m.live && m.node.ready() {
			r.mu.Lock()
			r.faults[fi].Until = r.c.since()
			r.mu.Unlock()
			r.log.Info("sim: ready", "node", m.id, "after", r.c.since()-r.faults[fi].At)
			delete(r.joining, h)
		}
	}
}

func (r *runner) step(st Step) error {
	c := r.c
	var node string
	if st.Act != Split && st.Act != Heal && st.Act != HealAll {
		node = c.members[st.Node].id
	}
	r.log.Info("sim: step", "act", st.Act.String(), "node", node, "sides", st.Sides)
	switch st.Act {
	case Start:
		if err := c.startNode(st.Node); err != nil {
			return err
		}
		r.joining[st.Node] = st.Fault
	case Drain:
		fi := st.Fault
		c.drain(st.Node, func(at time.Duration) {
			r.mu.Lock()
			r.faults[fi].Until = at
			r.mu.Unlock()
		})
	case Crash:
		delete(r.joining, st.Node)
		return c.crash(st.Node)
	case Freeze:
		return c.freeze(st.Node)
	case Thaw:
		return c.thaw(st.Node)
	case Split:
		return c.split(st.Sides)
	case Heal:
		c.net.Heal()
	case HealAll:
		return c.healAll()
	}
	return nil
}

// call issues call i to a node Envoys may reach: one of reach, chosen by
// the call's Pick.
func (r *runner) call(i int, cl Call, reach []*member) {
	if len(reach) == 0 {
		r.records[i].entry = -1
		r.failf("call %d: no node is ready to take it", i)
		return
	}
	m := reach[int(cl.Pick%uint32(len(reach)))]
	n := m.node
	ops := make([]bucket.Op, 0, 2)
	for _, k := range cl.Keys {
		if k < 0 {
			continue
		}
		key := r.s.Keys[k]
		ops = append(ops, bucket.Op{Key: []byte(key.Name), Hits: 1,
			Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Requests: key.Limit, Unit: int64(key.Unit)}})
	}
	rec := &r.records[i]
	rec.entry = m.idx
	r.calls.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), Deadline)
		defer cancel()
		t0 := time.Now()
		n.apply(ctx, n.now(), ops, rec.results[:len(ops)])
		rec.took = time.Since(t0)
	})
}

// result checks every answer and digests the run.
func (r *runner) result(logs string) *Result {
	s := r.s
	ck := NewChecker(s.Keys)
	for _, f := range r.faults {
		ck.Fault(f)
	}
	ans := sha256.New()
	var buf [8]byte
	put := func(v int64) {
		binary.LittleEndian.PutUint64(buf[:], uint64(v))
		ans.Write(buf[:])
	}
	answers := make([]uint64, len(s.Calls))
	for i, cl := range s.Calls {
		rec := &r.records[i]
		put(int64(rec.entry))
		a := uint64(rec.entry + 1)
		for j := range 2 {
			a = a<<24 | rec.results[j].Count&0x7fffff
			if rec.results[j].Over {
				a |= 1 << 23
			}
		}
		answers[i] = a
		if rec.entry < 0 {
			continue
		}
		put(int64(rec.took))
		for j, k := range cl.Keys {
			if k < 0 {
				continue
			}
			key, res := s.Keys[k], rec.results[j]
			put(int64(res.Count))
			put(res.ResetAfter)
			if !res.Over && (res.ResetAfter <= 0 || res.ResetAfter > 2*int64(key.Unit)) {
				ck.Fail(cl.At, fmt.Sprintf("key %s: allowed with a reset after %v, unit %v", key.Name, time.Duration(res.ResetAfter), key.Unit))
			}
			ck.Answer(key.Name, cl.At, res.Over, time.Duration(res.ResetAfter), rec.took, Deadline)
		}
	}
	var trace strings.Builder
	for i, cl := range s.Calls {
		rec := &r.records[i]
		for j, k := range cl.Keys {
			if k < 0 || rec.entry < 0 || !slices.Contains(r.trace, s.Keys[k].Name) {
				continue
			}
			res := rec.results[j]
			fmt.Fprintf(&trace, "%v %s call %d via %s: over=%v count=%d reset=%v took=%v\n", cl.At, s.Keys[k].Name, i,
				NodeID(rec.entry), res.Over, res.Count, time.Duration(res.ResetAfter), rec.took)
		}
	}
	for _, f := range r.fails {
		ck.Fail(f.at, f.what)
	}
	win := sha256.New()
	for _, w := range ck.windows() {
		fmt.Fprintf(win, "%s %d %d\n", w.key, w.end, ck.allowed[w])
	}
	worst, worstKey := ck.Worst()
	return &Result{
		Schedule:   s,
		Violations: ck.Violations(),
		Calls:      ck.Calls(),
		Worst:      worst,
		WorstKey:   worstKey,
		Formed:     r.formed,
		Converged:  r.converged,
		Answers:    fmt.Sprintf("%x", ans.Sum(nil)[:8]),
		Windows:    fmt.Sprintf("%x", win.Sum(nil)[:8]),
		Log:        logs,
		Trace:      trace.String(),
		answers:    answers,
		windows:    ck.allowed,
	}
}

// syncBuffer is a bytes.Buffer for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}
