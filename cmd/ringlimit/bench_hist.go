package main

import (
	"math"
	"math/bits"
	"time"
)

// latencyHist is a log-linear histogram of durations in nanoseconds, in the
// manner of HdrHistogram: every power of two is split into histSub equal
// buckets, so a value is known to within 1/histSub (< 0.8%) of itself.
// Values of 0..histSub-1 ns are exact; values above histMax are clamped to
// it. Exact minimum, maximum and sum are kept beside the buckets.
//
// The zero value is not ready: use newLatencyHist. It is not safe for
// concurrent use; each bench worker owns one and they are merged at the end.
type latencyHist struct {
	counts []uint64
	n      uint64
	sum    uint64 // ns; overflows only after ~584 years of summed latency
	min    uint64
	max    uint64
}

const (
	histSubBits = 7
	histSub     = 1 << histSubBits
	histMaxBit  = 40                // 2^40 ns ~ 18 minutes
	histMax     = 1<<histMaxBit - 1 // largest value kept as itself
	histBuckets = (histMaxBit - histSubBits + 1) << histSubBits
)

func newLatencyHist() *latencyHist {
	return &latencyHist{counts: make([]uint64, histBuckets), min: math.MaxUint64}
}

// histIndex is the bucket of v (ns), v <= histMax.
func histIndex(v uint64) int {
	if v < histSub {
		return int(v)
	}
	shift := bits.Len64(v) - 1 - histSubBits
	return shift<<histSubBits + int(v>>shift)
}

// histBounds is the smallest and largest value that fall in bucket i.
func histBounds(i int) (lo, hi uint64) {
	if i < histSub {
		return uint64(i), uint64(i)
	}
	shift := i>>histSubBits - 1
	mant := uint64(i - shift<<histSubBits)
	return mant << shift, (mant+1)<<shift - 1
}

// record adds one duration; negative durations count as 0.
func (h *latencyHist) record(d time.Duration) {
	v := uint64(max(d, 0))
	if v > histMax {
		v = histMax
	}
	h.counts[histIndex(v)]++
	h.n++
	h.sum += v
	h.min = min(h.min, v)
	h.max = max(h.max, v)
}

// merge adds every value of o to h.
func (h *latencyHist) merge(o *latencyHist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

func (h *latencyHist) count() uint64 { return h.n }

// fastest, slowest and mean are exact; they are 0 for an empty histogram.
func (h *latencyHist) fastest() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.min)
}

func (h *latencyHist) slowest() time.Duration { return time.Duration(h.max) }

func (h *latencyHist) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / h.n)
}

// quantile returns the value at or below which a fraction q (0..1) of the
// recorded values lie: the upper bound of the bucket holding the
// ceil(q*n)-th smallest value, clamped to the exact extremes (the first and
// last values are exact). An empty histogram returns 0.
func (h *latencyHist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	// q*n is rounded to 1e-9 first: 99.9/100 is 0.9990000000000001 in
	// floating point, and the ceiling would otherwise take one rank more
	// (the 1000th of 1000 values as the 99.9th percentile).
	rank := uint64(math.Ceil(math.Round(q*float64(h.n)*1e9) / 1e9))
	switch rank = min(max(rank, 1), h.n); rank {
	case 1:
		return time.Duration(h.min)
	case h.n:
		return time.Duration(h.max)
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			_, hi := histBounds(i)
			return time.Duration(min(max(hi, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}

// histBar is one line of the response-time histogram: how many values are
// at or below Mark and above the previous line's mark.
type histBar struct {
	Mark  time.Duration
	Count uint64
}

// linear spreads the recorded values over `lines` equal-width ranges from
// fastest to slowest, as hey prints them: a line counts the values above
// the previous line's mark and at or below its own; the first line's mark is
// the fastest value. Each value is placed by its bucket's midpoint, clamped
// to the exact extremes (the fastest value's bucket goes to the first line),
// so a count is exact to within one bucket's width (< 0.8%).
func (h *latencyHist) linear(lines int) []histBar {
	if h.n == 0 || lines < 1 {
		return nil
	}
	lo, hi := h.min, h.max
	if lo == hi || lines == 1 {
		return []histBar{{Mark: time.Duration(hi), Count: h.n}}
	}
	steps := uint64(lines - 1)
	out := make([]histBar, lines)
	for j := range out {
		out[j].Mark = time.Duration(lo + (hi-lo)*uint64(j)/steps)
	}
	width := float64(hi-lo) / float64(steps)
	for i, c := range h.counts {
		if c == 0 {
			continue
		}
		blo, bhi := histBounds(i)
		mid := min(max(blo/2+bhi/2, lo), hi)
		if blo <= lo {
			mid = lo // the fastest value's bucket: its values sit at the fastest mark
		}
		j := int(math.Ceil(float64(mid-lo) / width))
		out[min(j, lines-1)].Count += c
	}
	return out
}
