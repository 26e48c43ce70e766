package main

import (
	"sync"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// limitOutcome is what one call told the load tool about its key's window.
type limitOutcome uint8

const (
	limitOK     limitOutcome = iota // allowed
	limitOver                       // refused (the descriptor's status OVER_LIMIT)
	limitFailed                     // no answer (an error or DeadlineExceeded): the server may have counted it
)

// limitAnswer is one call on one key-window: when it was sent and
// answered (any one clock, in nanoseconds), its hits and its outcome.
type limitAnswer struct {
	sent, answered int64
	hits           uint64
	outcome        limitOutcome
}

// limitCount is the limit accounting of a set of key-windows. Budget is
// what an exact limiter would have allowed: per key-window, the answered
// hits up to the limit.
type limitCount struct {
	KeyWindows uint64 // key-windows with at least one answer carrying a limit
	Budget     uint64 // hits: sum of min(limit, answered hits) per key-window
	Early      uint64 // hits refused before their key-window reached its limit
	Over       uint64 // hits allowed beyond the limit
}

func (c *limitCount) add(o limitCount) {
	c.KeyWindows += o.KeyWindows
	c.Budget += o.Budget
	c.Early += o.Early
	c.Over += o.Over
}

// earlyShare is Early as a fraction of Budget (0 without a budget).
func (c limitCount) earlyShare() float64 {
	if c.Budget == 0 {
		return 0
	}
	return float64(c.Early) / float64(c.Budget)
}

// accountWindow counts one key-window of a limit of limit hits, from its
// answers in any order (concurrent calls are answered out of order).
//
// Over is the allowed hits beyond limit. Early is 0 when nothing was
// refused; otherwise it is limit minus the hits allowed before the first
// refusal, at least 0 and at most the hits refused. "Before" means sent
// before the first refusal was answered: a call in flight then may have
// been decided before it, so it counts as allowed first. A call that got
// no answer and was sent before the first refusal counts as allowed too
// (the server may have counted it), so early refusals are a lower bound
// and an exact limiter shows none.
func accountWindow(limit uint64, ans []limitAnswer) limitCount {
	var ok, refused uint64
	first, anyRefused := int64(0), false
	for _, a := range ans {
		switch a.outcome {
		case limitOK:
			ok += a.hits
		case limitOver:
			refused += a.hits
			if !anyRefused || a.answered < first {
				first, anyRefused = a.answered, true
			}
		}
	}
	c := limitCount{KeyWindows: 1, Budget: min(limit, ok+refused)}
	if ok > limit {
		c.Over = ok - limit
	}
	if !anyRefused {
		return c
	}
	var before uint64
	for _, a := range ans {
		if a.outcome != limitOver && a.sent < first {
			before += a.hits
		}
	}
	if before < limit {
		c.Early = min(limit-before, refused)
	}
	return c
}

// unitDuration is the length of a rate limit unit; 0 for UNKNOWN. Months
// and years are taken as 30 and 365 days.
func unitDuration(u pb.RateLimitResponse_RateLimit_Unit) time.Duration {
	switch u {
	case pb.RateLimitResponse_RateLimit_SECOND:
		return time.Second
	case pb.RateLimitResponse_RateLimit_MINUTE:
		return time.Minute
	case pb.RateLimitResponse_RateLimit_HOUR:
		return time.Hour
	case pb.RateLimitResponse_RateLimit_DAY:
		return 24 * time.Hour
	case pb.RateLimitResponse_RateLimit_WEEK:
		return 7 * 24 * time.Hour
	case pb.RateLimitResponse_RateLimit_MONTH:
		return 30 * 24 * time.Hour
	case pb.RateLimitResponse_RateLimit_YEAR:
		return 365 * 24 * time.Hour
	}
	return 0
}

// windowOf names the window a status belongs to by its end, in units since
// the Unix epoch: the answer's time plus duration_until_reset, rounded to
// the nearest window edge (the server rounds the reset up to whole
// seconds). Without duration_until_reset it is the wall-clock window the
// answer fell in.
func windowOf(answered int64, unit time.Duration, st *pb.RateLimitResponse_DescriptorStatus) int64 {
	u := int64(unit)
	if r := st.GetDurationUntilReset(); r != nil {
		return (answered + r.AsDuration().Nanoseconds() + u/2) / u
	}
	return answered/u + 1
}

// limitKeyDesc is one descriptor of one key: descriptor desc of the
// request, with key number key substituted.
type limitKeyDesc struct{ key, desc int }

// limitWindowID is one key-window.
type limitWindowID struct {
	limitKeyDesc
	window int64
}

// limitWindow is what is known of a key-window while a run goes on.
type limitWindow struct {
	limit uint64
	unit  time.Duration
	ans   []limitAnswer
}

// limitTally keeps every answer per key-window for the accounting at the
// end (about 24 bytes per answer). mu guards every field; workers share a
// tally by stripes, as they share workerStats.
type limitTally struct {
	mu      sync.Mutex
	windows map[limitWindowID]*limitWindow
	failed  map[limitKeyDesc][]limitAnswer // calls without an answer, placed in a window at the end
}

func newLimitTally() *limitTally {
	return &limitTally{windows: map[limitWindowID]*limitWindow{}, failed: map[limitKeyDesc][]limitAnswer{}}
}

// record adds one call on key k: its request had hits hits per descriptor
// and descs descriptors; resp is its answer, or nil when err says there was
// none. Statuses without a current limit (no rule, or a server that does
// not say) are not accounted.
func (t *limitTally) record(k, descs int, hits uint64, sent, answered time.Time, resp *pb.RateLimitResponse, failed bool) {
	s, a := sent.UnixNano(), answered.UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	if failed {
		for d := range descs {
			kd := limitKeyDesc{k, d}
			t.failed[kd] = append(t.failed[kd], limitAnswer{sent: s, answered: a, hits: hits, outcome: limitFailed})
		}
		return
	}
	for d, st := range resp.GetStatuses() {
		lim := st.GetCurrentLimit()
		unit := unitDuration(lim.GetUnit())
		if lim == nil || unit == 0 {
			continue
		}
		o := limitOK
		if st.GetCode() == pb.RateLimitResponse_OVER_LIMIT {
			o = limitOver
		}
		id := limitWindowID{limitKeyDesc{k, d}, windowOf(a, unit, st)}
		w := t.windows[id]
		if w == nil {
			w = &limitWindow{limit: uint64(lim.GetRequestsPerUnit()), unit: unit}
			t.windows[id] = w
		}
		w.ans = append(w.ans, limitAnswer{sent: s, answered: a, hits: hits, outcome: o})
	}
}

// countLimits merges tallies and accounts every key-window. A call without an
// answer goes to the wall-clock window it was sent in, when answers on the
// same key-descriptor say what its unit is.
func countLimits(tallies []*limitTally) limitCount {
	windows := map[limitWindowID]*limitWindow{}
	units := map[limitKeyDesc]time.Duration{}
	for _, t := range tallies {
		t.mu.Lock()
		for id, w := range t.windows {
			units[id.limitKeyDesc] = w.unit
			if m := windows[id]; m != nil {
				m.ans = append(m.ans, w.ans...)
			} else {
				windows[id] = &limitWindow{limit: w.limit, unit: w.unit, ans: append([]limitAnswer(nil), w.ans...)}
			}
		}
		t.mu.Unlock()
	}
	for _, t := range tallies {
		t.mu.Lock()
		for kd, fs := range t.failed {
			u := int64(units[kd])
			if u == 0 {
				continue
			}
			for _, f := range fs {
				if w := windows[limitWindowID{kd, f.sent/u + 1}]; w != nil {
					w.ans = append(w.ans, f)
				}
			}
		}
		t.mu.Unlock()
	}
	var c limitCount
	for _, w := range windows {
		c.add(accountWindow(w.limit, w.ans))
	}
	return c
}
