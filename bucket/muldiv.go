package bucket

import (
	"math"
	"math/bits"
)

// This file holds the 128-bit arithmetic the sliding window and the token
// bucket scale counts and times with, so that no product overflows.

// mulDivFloor returns floor(a*b/c) for c > 0, saturating at math.MaxUint64.
func mulDivFloor(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return math.MaxUint64
	}
	q, _ := bits.Div64(hi, lo, c)
	return q
}

// mulDivCeil returns ceil(a*b/c) for c > 0, saturating at math.MaxUint64.
func mulDivCeil(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return math.MaxUint64
	}
	q, rem := bits.Div64(hi, lo, c)
	if rem != 0 {
		q = addSatU(q, 1)
	}
	return q
}

// mulSatU returns a*b, saturating at math.MaxUint64.
func mulSatU(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 {
		return math.MaxUint64
	}
	return lo
}

// addSatDur returns a+d for d >= 0 as a time, saturating at math.MaxInt64.
func addSatDur(a int64, d uint64) int64 {
	if d > math.MaxInt64 {
		return math.MaxInt64
	}
	return addSat(a, int64(d))
}

// durSat converts a non-negative duration to int64, saturating.
func durSat(d uint64) int64 {
	return int64(min(d, math.MaxInt64))
}
