package chaos

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"time"
)

// Record is every call a Load made, ordered by completion, with the phase
// marks of the scenario that drove it. It is read-only once returned.
type Record struct {
	Nodes    []string // node IDs; Call.Node indexes it
	Calls    []Call
	Marks    []Mark
	Duration time.Duration
}

// Stats summarises a set of calls.
type Stats struct {
	Calls, OK, Over, Late, Failed int
	P50, P99, Max                 time.Duration // latency of answered calls
}

// Span selects the calls that completed in [from, to) on a node keep
// accepts (nil keeps every node).
func (r *Record) Span(from, to time.Duration, keep func(node string) bool) []Call {
	lo := sort.Search(len(r.Calls), func(i int) bool { return r.Calls[i].End() >= from })
	hi := sort.Search(len(r.Calls), func(i int) bool { return r.Calls[i].End() >= to })
	if keep == nil {
		return r.Calls[lo:hi]
	}
	var out []Call
	for _, c := range r.Calls[lo:hi] {
		if keep(r.Nodes[c.Node]) {
			out = append(out, c)
		}
	}
	return out
}

// Phase returns the span of the phase named name: from its mark to the
// next mark, or to the end of the record.
func (r *Record) Phase(name string) (from, to time.Duration, ok bool) {
	for i, m := range r.Marks {
		if m.Name == name {
			to = r.Duration + time.Hour
			if i+1 < len(r.Marks) {
				to = r.Marks[i+1].At
			}
			return m.At, to, true
		}
	}
	return 0, 0, false
}

// Summarise counts outcomes and latency percentiles of calls. Percentiles
// cover every call, late ones at their full latency (the deadline).
func Summarise(calls []Call) Stats {
	var s Stats
	lat := make([]time.Duration, 0, len(calls))
	for _, c := range calls {
		s.Calls++
		switch c.Outcome {
		case OutcomeOK:
			s.OK++
		case OutcomeOver:
			s.Over++
		case OutcomeLate:
			s.Late++
		case OutcomeFailed:
			s.Failed++
		}
		lat = append(lat, c.Latency)
	}
	if len(lat) > 0 {
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
		s.P50, s.P99, s.Max = q(0.50), q(0.99), lat[len(lat)-1]
	}
	return s
}

// KeyWindow is the tally of one key in one window.
type KeyWindow struct {
	Key    int
	Window int64
	OK     int // allowed by the service
	Over   int // refused
	Open   int // let through by failure (late or failed calls)
	// Short is how many hits short of the limit (OK + Open) the key was
	// when it was first refused; 0 if it never was, or was not short.
	Short int
}

// Counts is the per key per window accounting of a record against a limit.
type Counts struct {
	Limit   int
	Windows []KeyWindow
	// Extra[i] is how many OK answers of phase i (Record.Marks order, plus a
	// last entry for calls before the first mark) came after their key had
	// already been allowed Limit times in that window: the overshoot.
	Extra map[string]int
	// Early is the sum over key-windows of how many hits short of the limit
	// the first OVER_LIMIT answer came: the OK answers and the calls that
	// failed open (which may have been counted) completed before it fell
	// short of Limit by that much. Hits double-counted, or counts rolled
	// forward, show here. Calls in flight together may add one or two.
	Early int
}

// Budget is Limit times the number of key-windows that were hit.
func (c Counts) Budget() int { return c.Limit * len(c.Windows) }

// Allowed is the number of OK answers.
func (c Counts) Allowed() int {
	n := 0
	for _, w := range c.Windows {
		n += w.OK
	}
	return n
}

// TotalExtra is the overshoot over every phase.
func (c Counts) TotalExtra() int {
	n := 0
	for _, e := range c.Extra {
		n += e
	}
	return n
}

// MaxExtra is the largest overshoot of one key in one window.
func (c Counts) MaxExtra() int {
	m := 0
	for _, w := range c.Windows {
		m = max(m, w.OK-c.Limit)
	}
	return m
}

// Tally accounts every call of r against limit, attributing overshoot to
// the phase in which the extra OK answer completed.
func (r *Record) Tally(limit int) Counts {
	type kw struct {
		key int
		win int64
	}
	idx := map[kw]int{}
	c := Counts{Limit: limit, Extra: map[string]int{}}
	phase := func(end time.Duration) string {
		name := ""
		for _, m := range r.Marks {
			if m.At <= end {
				name = m.Name
			}
		}
		return name
	}
	for _, call := range r.Calls {
		k := kw{call.Key, call.Window}
		i, ok := idx[k]
		if !ok {
			i = len(c.Windows)
			idx[k] = i
			c.Windows = append(c.Windows, KeyWindow{Key: call.Key, Window: call.Window})
		}
		w := &c.Windows[i]
		switch call.Outcome {
		case OutcomeOK:
			w.OK++
			if w.OK > limit {
				c.Extra[phase(call.End())]++
			}
		case OutcomeOver:
			if w.Over == 0 && w.OK+w.Open < limit {
				w.Short = limit - w.OK - w.Open
				c.Early += w.Short
			}
			w.Over++
		default:
			w.Open++
		}
	}
	return c
}

// PerKeyExtra is the overshoot of each key-window within [from, to): OK
// answers there beyond what the key had left when the span began.
func (r *Record) PerKeyExtra(limit int, from, to time.Duration) map[[2]int64]int {
	seen := map[[2]int64]int{}
	out := map[[2]int64]int{}
	for _, c := range r.Calls {
		if c.Outcome != OutcomeOK || c.End() >= to {
			continue
		}
		k := [2]int64{int64(c.Key), c.Window}
		seen[k]++
		if c.End() >= from && seen[k] > limit {
			out[k]++
		}
	}
	return out
}

// WriteCSV writes one line per call (start and latency in microseconds,
// node ID, key, window, outcome, gRPC code) and one per mark, for a look
// at a scenario's timeline outside the report.
func (r *Record) WriteCSV(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintln(bw, "start_us,latency_us,node,key,window,outcome,code")
	names := [...]string{"ok", "over", "late", "failed"}
	for _, m := range r.Marks {
		fmt.Fprintf(bw, "%d,0,,,,mark:%s,\n", m.At.Microseconds(), m.Name)
	}
	for _, c := range r.Calls {
		fmt.Fprintf(bw, "%d,%d,%s,%d,%d,%s,%s\n", c.Start.Microseconds(), c.Latency.Microseconds(), r.Nodes[c.Node], c.Key, c.Window, names[c.Outcome], c.Code)
	}
	return bw.Flush()
}
