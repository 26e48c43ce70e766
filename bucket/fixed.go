package bucket

import "math"

// This file holds the fixed-window arithmetic. It is pure: the store calls
// it under the shard lock with the stored counter and writes back what it
// returns.

// fixedWindow returns the start of the epoch-aligned window of length unit
// (> 0) that contains now, floor(now/unit)*unit, and the time until that
// window ends, unit - now mod unit, which is in (0, unit]. It is defined for
// every int64 now: before the first representable window start it returns
// math.MinInt64 as the start.
func fixedWindow(now, unit int64) (start, resetAfter int64) {
	mod := now % unit
	if mod < 0 {
		mod += unit
	}
	start = now - mod
	if start > now { // wrapped below math.MinInt64
		start = math.MinInt64
	}
	return start, unit - mod
}

// OnWindowGrid reports whether start is where a window of length unit (> 0)
// can start: a multiple of unit, or math.MinInt64 (the start reported for
// times before the first representable window). Fixed and sliding windows
// only ever start there; a state with another start (from a faulty peer)
// matches no window once stored.
func OnWindowGrid(start, unit int64) bool {
	if unit <= 0 {
		return false
	}
	w, _ := fixedWindow(start, unit)
	return w == start
}

// fixedEnd returns when a window of length unit starting at start ends,
// saturating at math.MaxInt64.
func fixedEnd(start, unit int64) int64 {
	return addSat(start, unit)
}

// applyFixed decides op at now against the stored counter c (have reports
// whether one exists; it may be expired or for another limit). It returns
// the result, the counter to store and whether to store it.
//
// The hits count in the current window. A stored counter for an older
// window, another unit or another algorithm restarts at zero. A stored
// counter for exactly the next window (merged from a peer whose clock runs
// ahead) keeps counting in that window, so applying never moves a counter
// backwards after a merge.
func applyFixed(c counter, have bool, now int64, op *Op) (Result, counter, bool) {
	unit := op.Limit.Unit
	start, reset := fixedWindow(now, unit)
	var before uint64
	if have && c.algo == FixedWindow && c.unit == unit {
		switch {
		case c.window == start:
			before = c.count
		case c.window == fixedEnd(start, unit) && c.window > start:
			before = c.count
			start = c.window
			reset = addSat(reset, unit)
		}
	}
	count := addSatU(before, op.Hits)
	r := Result{Count: count, ResetAfter: reset}
	if count > op.Limit.Requests {
		r.Over = true
	} else {
		r.Remaining = op.Limit.Requests - count
	}
	write := op.Hits > 0 && op.Mode != Peek && (op.Mode != StopOnOver || !r.Over)
	return r, counter{window: start, unit: unit, count: count, algo: FixedWindow}, write
}

// addSat returns a+b for b >= 0, saturating at math.MaxInt64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// addSatU returns a+b, saturating at math.MaxUint64.
func addSatU(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}
