package bucket

import "math"

// This file holds the sliding-window arithmetic: a weighted two-window
// counter. It is pure: the store calls it under the shard lock with the
// stored counter and writes back what it returns.
//
// A sliding counter is the count of now's epoch-aligned window (cur, in
// counter.count) and of the window just before it (prev, in counter.prev).
// At now, elapsed ns into the window, the usage is estimated as
//
//	ceil(prev * (Unit-elapsed) / Unit) + cur
//
// which assumes the previous window's hits were spread evenly over it. An
// exact sliding log counts the previous window's hits that fell in its last
// Unit-elapsed ns instead; the estimate is off by how unevenly they fell
// (docs/algorithms.md states the bound and measures it).
//
// A sliding counter stops mattering at the end of the window after its
// own, when its cur no longer weighs on anything: that is its expiry.

// slidingEnd returns when a sliding counter for the window starting at
// start expires: start + 2*unit, saturating at math.MaxInt64.
func slidingEnd(start, unit int64) int64 {
	return addSat(addSat(start, unit), unit)
}

// nextWindow reports whether b is the window right after a (b == a+unit),
// without overflowing.
func nextWindow(a, b, unit int64) bool {
	return b > a && uint64(b)-uint64(a) == uint64(unit)
}

// applySliding decides op at now against the stored counter c (have reports
// whether one exists; it may be stale or for another limit) and returns the
// result, the counter to store and whether to store it.
//
// The stored counts are aligned to now's window first: a counter for the
// window before now's contributes its cur as prev, an older one or one for
// another unit or algorithm nothing. A counter for exactly the next window
// (merged from a peer whose clock runs ahead) keeps counting in that window
// with its prev at full weight, so applying never moves a counter backwards
// after a merge. Refused hits are never counted, whatever op.Mode.
func applySliding(c counter, have bool, now int64, op *Op) (Result, counter, bool) {
	unit, limit := op.Limit.Unit, op.Limit.Requests
	if limit > math.MaxUint32 { // fails Validate: the store keeps 32-bit counts
		return Result{Over: true}, counter{}, false
	}
	start, toEnd := fixedWindow(now, unit)
	var cur, prev uint64
	lead := int64(0) // how far the counted window starts after now
	if have && c.algo == SlidingWindow && c.unit == unit {
		switch {
		case c.window == start:
			cur, prev = c.count, c.prev
		case nextWindow(c.window, start, unit):
			prev = c.count
		case nextWindow(start, c.window, unit):
			cur, prev = c.count, c.prev
			lead, toEnd = toEnd, unit
			start = c.window
		}
	}
	// toEnd is in (0, unit]: the weight of prev, in ns of overlap.
	weighted := mulDivCeil(prev, uint64(toEnd), uint64(unit))
	count := addSatU(addSatU(weighted, cur), op.Hits)
	after := addSatU(cur, op.Hits)
	r := Result{Count: count}
	if count > limit {
		r.Over = true
		r.ResetAfter = addSat(lead, slidingRetry(cur, prev, unit, toEnd, limit, op.Hits))
	} else {
		r.Remaining = limit - count
		switch {
		case after > 0: // cur weighs until the end of the next window
			r.ResetAfter = addSat(addSat(lead, toEnd), unit)
		case weighted > 0: // prev weighs until the end of this one
			r.ResetAfter = addSat(lead, toEnd)
		}
	}
	write := op.Hits > 0 && op.Mode != Peek && !r.Over
	return r, counter{window: start, unit: unit, count: after, prev: prev, algo: SlidingWindow}, write
}

// slidingRetry returns how long after now an op of min(max(hits,1), limit)
// hits would be admitted if nothing more were counted: cur and prev are the
// counts of now's window and the one before, toEnd (in (0, unit]) the time
// until now's window ends. For limit 0, nothing is ever admitted and it
// returns toEnd, as a fixed window would.
func slidingRetry(cur, prev uint64, unit, toEnd int64, limit, hits uint64) int64 {
	if limit == 0 {
		return toEnd
	}
	need := min(max(hits, 1), limit)
	u := uint64(unit)
	// In this window, at toEnd' ns before its end, the op fits when
	// ceil(prev*toEnd'/unit) + cur + need <= limit, that is when
	// prev*toEnd' <= room*unit.
	if cur <= limit-need {
		room := limit - need - cur
		if prev == 0 {
			return 0
		}
		if w := mulDivFloor(room, u, prev); w > 0 {
			return int64(uint64(toEnd) - min(w, uint64(toEnd)))
		}
	}
	// In the next window cur becomes prev and the new cur is 0: the op
	// fits elapsed ns into it when ceil(cur*(unit-elapsed)/unit) + need <=
	// limit.
	room := limit - need
	var elapsed uint64
	if cur > 0 {
		elapsed = u - min(mulDivFloor(room, u, cur), u)
	}
	return addSat(toEnd, int64(elapsed))
}

// slidingCountsFit reports whether st, if a sliding window state, has
// counts the store can keep: at most math.MaxUint32 each.
func slidingCountsFit(st State) bool {
	return st.Algorithm != SlidingWindow || max(st.Count, st.Prev) <= math.MaxUint32
}

// joinSliding combines two sliding counters of one key with the same unit
// into the least counter that counts at least as much as each in every
// window: the later window wins, equal windows take the larger of each
// count, and a counter one window earlier than the winner still raises the
// winner's prev to its cur. Reading a counter as a map from window to
// count, limited to its window and the one before, this is the pointwise
// maximum, limited again to the latest window and the one before it: so it
// is commutative, associative and idempotent, and an estimate made from the
// result is never lower than one made from either input.
func joinSliding(a, b counter) counter {
	if a.window < b.window {
		a, b = b, a
	}
	switch {
	case a.window == b.window:
		a.count = max(a.count, b.count)
		a.prev = max(a.prev, b.prev)
	case nextWindow(b.window, a.window, a.unit):
		a.prev = max(a.prev, b.count)
	}
	return a
}
