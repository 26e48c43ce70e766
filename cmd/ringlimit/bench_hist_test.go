package main

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestHistIndexBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	vals := []uint64{0, 1, 127, 128, 129, 255, 256, 1000, 1 << 20, 123456789, histMax}
	for range 10000 {
		vals = append(vals, r.Uint64N(histMax+1))
	}
	for _, v := range vals {
		i := histIndex(v)
		if i < 0 || i >= histBuckets {
			t.Fatalf("histIndex(%d) = %d, out of [0, %d)", v, i, histBuckets)
		}
		lo, hi := histBounds(i)
		if v < lo || v > hi {
			t.Fatalf("%d in bucket %d = [%d, %d]", v, i, lo, hi)
		}
		if v >= histSub && float64(hi-lo+1)/float64(lo) > 1.0/histSub+1e-12 {
			t.Fatalf("bucket %d = [%d, %d] wider than 1/%d of its value", i, lo, hi, histSub)
		}
	}
	// Buckets tile the range: each starts right after the previous one.
	_, prevHi := histBounds(0)
	for i := 1; i < histBuckets; i++ {
		lo, hi := histBounds(i)
		if lo != prevHi+1 {
			t.Fatalf("bucket %d starts at %d, previous ended at %d", i, lo, prevHi)
		}
		prevHi = hi
	}
}

func TestHistQuantiles(t *testing.T) {
	us := time.Microsecond
	tests := []struct {
		name   string
		values []time.Duration
		q      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one value", []time.Duration{300 * us}, 0.999, 300 * us},
		{"min is q=0", []time.Duration{5 * us, 9 * us, 7 * us}, 0, 5 * us},
		{"max is q=1", []time.Duration{5 * us, 9 * us, 7 * us}, 1, 9 * us},
		{"tiny exact values", []time.Duration{1, 2, 3, 4}, 0.5, 2},
		{"negative counts as 0", []time.Duration{-5, 3}, 0.5, 0},
		{"clamped to histMax", []time.Duration{time.Hour}, 0.5, time.Duration(histMax)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newLatencyHist()
			for _, v := range tc.values {
				h.record(v)
			}
			if got := h.quantile(tc.q); got != tc.want {
				t.Fatalf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
}

// TestHistQuantilesOfARamp checks percentiles of 1..10000 us to within the
// histogram's precision.
func TestHistQuantilesOfARamp(t *testing.T) {
	h := newLatencyHist()
	for i := 1; i <= 10000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, p := range benchPercentiles {
		want := time.Duration(p*100) * time.Microsecond // the ceil(p/100*n)-th value
		got := h.quantile(p / 100)
		if got < want || float64(got-want) > float64(want)/histSub {
			t.Errorf("p%v = %v, want %v (+%.1f%%)", p, got, want, 100.0/histSub)
		}
	}
	if h.fastest() != time.Microsecond || h.slowest() != 10*time.Millisecond {
		t.Errorf("fastest %v slowest %v", h.fastest(), h.slowest())
	}
	if got, want := h.mean(), 5000500*time.Nanosecond; got != want {
		t.Errorf("mean %v, want %v", got, want)
	}
}

func TestHistMerge(t *testing.T) {
	a, b, all := newLatencyHist(), newLatencyHist(), newLatencyHist()
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 5000 {
		d := time.Duration(r.Int64N(int64(50 * time.Millisecond)))
		if i%3 == 0 {
			a.record(d)
		} else {
			b.record(d)
		}
		all.record(d)
	}
	empty := newLatencyHist()
	a.merge(b)
	a.merge(empty)
	if a.count() != all.count() || a.fastest() != all.fastest() || a.slowest() != all.slowest() || a.mean() != all.mean() {
		t.Fatalf("merged n=%d min=%v max=%v mean=%v, want n=%d min=%v max=%v mean=%v",
			a.count(), a.fastest(), a.slowest(), a.mean(), all.count(), all.fastest(), all.slowest(), all.mean())
	}
	for _, p := range benchPercentiles {
		if a.quantile(p/100) != all.quantile(p/100) {
			t.Errorf("p%v: merged %v, single %v", p, a.quantile(p/100), all.quantile(p/100))
		}
	}
}

func TestHistLinear(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name   string
		values []time.Duration
		want   []histBar
	}{
		{"empty", nil, nil},
		{"all equal", []time.Duration{2 * ms, 2 * ms}, []histBar{{2 * ms, 2}}},
		{"two ends and a middle", []time.Duration{0, 5 * ms, 10 * ms},
			[]histBar{{0, 1}, {2500 * time.Microsecond, 0}, {5 * ms, 1}, {7500 * time.Microsecond, 0}, {10 * ms, 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newLatencyHist()
			for _, v := range tc.values {
				h.record(v)
			}
			got := h.linear(5)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("line %d: got %v, want %v (all %v)", i, got[i], tc.want[i], got)
				}
			}
		})
	}
	// Counts always add up to n.
	h := newLatencyHist()
	r := rand.New(rand.NewPCG(5, 6))
	for range 20000 {
		h.record(time.Duration(r.ExpFloat64() * float64(ms)))
	}
	var sum uint64
	for _, b := range h.linear(histLines) {
		sum += b.Count
	}
	if sum != h.count() {
		t.Fatalf("histogram lines hold %d values, want %d", sum, h.count())
	}
}

// The 99.9th percentile of n values where exactly 0.1% are slow is the
// fast value: 99.9/100 is 0.9990000000000001 in floating point, and the
// rank must not round up past the 99.9% of fast calls.
func TestHistP999OfRoundCounts(t *testing.T) {
	for _, n := range []int{1000, 10_000, 100_000} {
		h := newLatencyHist()
		for i := range n {
			if i%1000 == 999 {
				h.record(time.Second)
			} else {
				h.record(time.Millisecond)
			}
		}
		if got := h.quantile(99.9 / 100); got > 2*time.Millisecond {
			t.Errorf("n=%d: p99.9 = %v, want about 1ms (0.1%% of the calls took 1s)", n, got)
		}
	}
}
