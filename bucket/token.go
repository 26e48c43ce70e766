package bucket

import "math"

// This file holds the token bucket: the generic cell rate algorithm (GCRA).
// It is pure: the store calls it under the shard lock with the stored
// counter and writes back what it returns.
//
// A limit of Requests per Unit with capacity Burst emits one token every
// T = Unit/Requests ns, rounded up to a whole ns (so T is exact when
// Requests divides Unit, and otherwise the rate is lowered by less than one
// ns per token, which only matters above about 10^8 tokens per second). The
// whole state is the theoretical arrival time TAT (Unix ns, kept in
// counter.window): the instant the bucket is full again. At now the bucket
// owes debt = max(TAT, now) - now ns of refill, so ceil(debt/T) tokens are
// in use. An op of n hits is admitted when
//
//	ceil(debt/T) + n <= Burst   (that is, debt + n*T <= Burst*T)
//
// and then moves TAT to max(TAT, now) + n*T. So over any interval [t1, t2]
// at most Burst + (t2-t1)/T hits are admitted. Refused hits move nothing.
//
// A larger TAT never admits more, so two replicas merge by keeping the
// larger TAT. A counter whose TAT has passed is a full bucket, the same as
// no counter; it expires at TAT rounded up to the Unit grid, so that expiry
// instants are as few as a fixed window's and a full store sweeps once per
// instant, not once per key.

// tokenEnd returns when a token counter with theoretical arrival time tat
// expires: tat rounded up to a multiple of unit, saturating.
func tokenEnd(tat, unit int64) int64 {
	start, _ := fixedWindow(tat, unit)
	if start == tat {
		return tat
	}
	return fixedEnd(start, unit)
}

// applyToken decides op at now against the stored counter c (have reports
// whether one exists; it may be stale or for another limit) and returns the
// result, the counter to store and whether to store it. A counter for
// another unit or algorithm counts as a full bucket.
func applyToken(c counter, have bool, now int64, op *Op) (Result, counter, bool) {
	unit, rate := op.Limit.Unit, op.Limit.Requests
	if rate == 0 { // no tokens are ever emitted: every hit is refused
		return Result{Over: op.Hits > 0, Count: op.Hits, ResetAfter: unit}, counter{}, false
	}
	capacity := op.Limit.Capacity()
	t := emission(unit, rate)
	tat := now
	if have && c.algo == TokenBucket && c.unit == unit && c.window > now {
		tat = c.window
	}
	debt := uint64(tat) - uint64(now) // ns until full, exact across the int64 range
	count := addSatU((debt+t-1)/t, op.Hits)
	if debt > math.MaxUint64-t { // (debt+t-1) wrapped
		count = addSatU(debt/t+1, op.Hits)
	}
	cost := mulSatU(op.Hits, t) // ns of refill the hits take
	r := Result{Count: count}
	if count > capacity {
		r.Over = true
		// need more hits fit once the debt is at most slack.
		need := min(max(op.Hits, 1), capacity)
		if slack := mulSatU(capacity-need, t); debt > slack {
			r.ResetAfter = durSat(debt - slack)
		}
	} else {
		r.Remaining = capacity - count
		r.ResetAfter = durSat(addSatU(debt, cost))
	}
	write := op.Hits > 0 && op.Mode != Peek && !r.Over
	return r, counter{window: addSatDur(tat, cost), unit: unit, algo: TokenBucket}, write
}

// emission returns the emission interval T = ceil(unit/rate) ns, >= 1, for
// unit > 0 and rate > 0.
func emission(unit int64, rate uint64) uint64 {
	u := uint64(unit)
	return u/rate + min(u%rate, 1)
}
