package bucket

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// This file is the conformance suite: the same contract checked against
// every algorithm. Algorithm-specific step tables and property tests are in
// fixed_test.go, sliding_test.go and token_test.go.

// algoCase describes one algorithm to the suite.
type algoCase struct {
	algo Algorithm
	// countsRefused: Consume counts hits it refuses (FixedWindow only).
	countsRefused bool
	// tight: ResetAfter is exact, not just sufficient: one ns earlier the
	// promised op is not admitted (or the capacity not all back).
	tight bool
	// randState returns a valid state of the algorithm for unit, live at
	// now and of the kind Apply can write at or around now. With ahead, it
	// may be one a peer whose clock runs a window ahead would write.
	randState func(r *rand.Rand, now, unit int64, ahead bool) State
}

func algoCases() []algoCase {
	return []algoCase{
		{algo: FixedWindow, countsRefused: true, randState: func(r *rand.Rand, now, unit int64, ahead bool) State {
			w, _ := fixedWindow(now, unit)
			if ahead && r.IntN(2) == 0 {
				w += unit
			}
			return State{Algorithm: FixedWindow, Window: w, Unit: unit, Count: uint64(r.IntN(30))}
		}},
		{algo: SlidingWindow, tight: true, randState: func(r *rand.Rand, now, unit int64, ahead bool) State {
			w, _ := fixedWindow(now, unit)
			switch {
			case ahead && r.IntN(3) == 0:
				w += unit
			case r.IntN(2) == 0:
				w -= unit
			}
			return State{Algorithm: SlidingWindow, Window: w, Unit: unit, Count: uint64(r.IntN(30)), Prev: uint64(r.IntN(30))}
		}},
		{algo: TokenBucket, tight: true, randState: func(r *rand.Rand, now, unit int64, _ bool) State {
			return State{Algorithm: TokenBucket, Unit: unit, TAT: now + 1 + r.Int64N(3*unit)}
		}},
	}
}

// forEachAlgo runs f as a subtest per algorithm.
func forEachAlgo(t *testing.T, f func(t *testing.T, ac algoCase)) {
	t.Helper()
	for _, ac := range algoCases() {
		t.Run(ac.algo.String(), func(t *testing.T) { f(t, ac) })
	}
}

// lim returns a limit of the algorithm; Burst stays 0 (= Requests).
func (ac algoCase) lim(requests uint64, unit int64) Limit {
	return Limit{Algorithm: ac.algo, Requests: requests, Unit: unit}
}

// checkResult checks the invariants every Result has.
func checkResult(t *testing.T, where string, lim Limit, r Result) {
	t.Helper()
	c := lim.Capacity()
	switch {
	case r.Over != (r.Count > c):
		t.Fatalf("%s: Over=%v but Count %d, capacity %d", where, r.Over, r.Count, c)
	case !r.Over && r.Remaining != c-r.Count:
		t.Fatalf("%s: Remaining %d, want capacity %d - Count %d", where, r.Remaining, c, r.Count)
	case r.Over && r.Remaining != 0:
		t.Fatalf("%s: Over with Remaining %d", where, r.Remaining)
	case r.ResetAfter < 0:
		t.Fatalf("%s: ResetAfter %d < 0", where, r.ResetAfter)
	}
}

// TestConformanceCapacityAtOneInstant: at one instant a fresh key admits
// exactly its capacity one hit at a time, Remaining counting down, and
// nothing more.
func TestConformanceCapacityAtOneInstant(t *testing.T) {
	forEachAlgo(t, func(t *testing.T, ac algoCase) {
		for _, lim := range []Limit{ac.lim(1, second), ac.lim(7, minute), ac.lim(100, hour),
			{Algorithm: ac.algo, Requests: 10, Burst: 3, Unit: second}} {
			s := NewStore(StoreConfig{})
			now := base + 17*ms
			c := lim.Capacity()
			for i := uint64(1); i <= c; i++ {
				r := s.Apply(now, &Op{Key: []byte("k"), Limit: lim, Hits: 1})
				checkResult(t, fmt.Sprintf("%+v hit %d", lim, i), lim, r)
				if r.Over || r.Remaining != c-i {
					t.Fatalf("%+v hit %d: %+v, want admitted with %d remaining", lim, i, r, c-i)
				}
			}
			for i := range 3 {
				r := s.Apply(now, &Op{Key: []byte("k"), Limit: lim, Hits: 1, Mode: Mode(i)})
				checkResult(t, "over", lim, r)
				if !r.Over || r.ResetAfter <= 0 {
					t.Fatalf("%+v hit %d mode %d: %+v, want over with a positive ResetAfter", lim, c+1, i, r)
				}
			}
		}
	})
}

// twin applies the same ops to two stores, so that one can be probed with
// an op while the other keeps the state from before it.
type twin struct{ a, b *Store }

func newTwin() twin { return twin{NewStore(StoreConfig{}), NewStore(StoreConfig{})} }

func (tw twin) apply(now int64, op Op) Result {
	tw.b.Apply(now, &op)
	return tw.a.Apply(now, &op)
}

// TestConformanceModes: a check (Hits 0) and a Peek change nothing and
// create nothing; a Peek answers what the same Consume would; StopOnOver
// adds nothing when over; Consume adds refused hits only for FixedWindow.
func TestConformanceModes(t *testing.T) {
	forEachAlgo(t, func(t *testing.T, ac algoCase) {
		r := rand.New(rand.NewPCG(11, uint64(ac.algo)))
		key := []byte("k")
		for iter := range 300 {
			lim := ac.lim(uint64(r.IntN(12)), second)
			if ac.algo == TokenBucket && r.IntN(2) == 0 {
				lim.Burst = uint64(1 + r.IntN(20))
			}
			tw := newTwin()
			now := base + r.Int64N(second)
			for range r.IntN(6) {
				tw.apply(now, Op{Key: key, Limit: lim, Hits: uint64(r.IntN(4))})
				now += r.Int64N(300 * ms)
			}
			before, had := tw.a.Get(now, key)
			n := tw.a.Len()
			hits := uint64(r.IntN(8))

			check := tw.a.Apply(now, &Op{Key: key, Limit: lim})
			checkResult(t, "check", lim, check)
			peek := tw.a.Apply(now, &Op{Key: key, Limit: lim, Hits: hits, Mode: Peek})
			checkResult(t, "peek", lim, peek)
			if after, ok := tw.a.Get(now, key); ok != had || after != before || tw.a.Len() != n {
				t.Fatalf("iter %d: check/peek changed %+v,%v to %+v,%v", iter, before, had, after, ok)
			}
			if hits == 0 && peek != check {
				t.Fatalf("iter %d: peek 0 = %+v, check = %+v", iter, peek, check)
			}

			stop := tw.a.Apply(now, &Op{Key: key, Limit: lim, Hits: hits, Mode: StopOnOver})
			consume := tw.b.Apply(now, &Op{Key: key, Limit: lim, Hits: hits})
			if stop != peek || consume != peek {
				t.Fatalf("iter %d: peek %+v, stop-on-over %+v, consume %+v: want all equal", iter, peek, stop, consume)
			}
			afterStop, okStop := tw.a.Get(now, key)
			afterConsume, okConsume := tw.b.Get(now, key)
			if peek.Over {
				if okStop != had || afterStop != before {
					t.Fatalf("iter %d: stop-on-over when over changed %+v to %+v", iter, before, afterStop)
				}
				if !ac.countsRefused && (okConsume != had || afterConsume != before) {
					t.Fatalf("iter %d: consume when over changed %+v to %+v", iter, before, afterConsume)
				}
			}
			if (hits > 0 && !peek.Over) || (hits > 0 && ac.countsRefused) {
				if !okConsume || afterConsume == before {
					t.Fatalf("iter %d: consume of %d (%+v) stored nothing new: %+v", iter, hits, peek, afterConsume)
				}
			}
			// What was stored is what a check now reports.
			if again := tw.b.Apply(now, &Op{Key: key, Limit: lim, Hits: hits, Mode: Peek}); hits > 0 && !peek.Over &&
				again.Count != addSatU(consume.Count, hits) {
				t.Fatalf("iter %d: after consume %+v a peek of %d counts %d", iter, consume, hits, again.Count)
			}
		}
	})
}

// TestConformanceRequestsZero: a limit of 0 refuses every hit.
func TestConformanceRequestsZero(t *testing.T) {
	forEachAlgo(t, func(t *testing.T, ac algoCase) {
		for _, lim := range []Limit{ac.lim(0, second), {Algorithm: ac.algo, Unit: second, Burst: 5}} {
			s := NewStore(StoreConfig{})
			for i, now := range []int64{base, base + 1, base + second, base + hour} {
				for _, mode := range []Mode{Consume, StopOnOver, Peek} {
					r := s.Apply(now, &Op{Key: []byte("k"), Limit: lim, Hits: 1, Mode: mode})
					checkResult(t, "zero", lim, r)
					if !r.Over || r.Remaining != 0 || r.ResetAfter <= 0 {
						t.Fatalf("step %d mode %d: %+v, want over with ResetAfter > 0", i, mode, r)
					}
				}
				r := s.Apply(now, &Op{Key: []byte("k"), Limit: lim})
				if (r.Over && !ac.countsRefused) || r.Remaining != 0 {
					t.Fatalf("step %d check: %+v, want not over, nothing remaining", i, r)
				}
			}
		}
	})
}

// TestConformanceSaturation: huge hits, limits and units saturate instead
// of wrapping.
func TestConformanceSaturation(t *testing.T) {
	forEachAlgo(t, func(t *testing.T, ac algoCase) {
		for _, unit := range []int64{1, second, math.MaxInt64} {
			s := NewStore(StoreConfig{})
			key := []byte("k")
			lim := ac.lim(10, unit)
			for _, now := range []int64{base, math.MaxInt64 - 1, math.MinInt64 + 1} {
				for _, mode := range []Mode{Consume, StopOnOver, Peek} {
					r := s.Apply(now, &Op{Key: key, Limit: lim, Hits: math.MaxUint64, Mode: mode})
					checkResult(t, "max hits", lim, r)
					if !r.Over || r.Count != math.MaxUint64 {
						t.Fatalf("unit %d now %d mode %d: %+v, want over at MaxUint64", unit, now, mode, r)
					}
				}
				r := s.Apply(now, &Op{Key: key, Limit: lim, Hits: 3})
				checkResult(t, "after", lim, r)
			}
			big := ac.lim(math.MaxUint64, unit)
			if ac.algo == SlidingWindow {
				big.Requests = math.MaxUint32
			}
			for range 3 {
				r := s.Apply(base, &Op{Key: []byte("big"), Limit: big, Hits: math.MaxUint64 / 2})
				checkResult(t, "requests max", big, r)
			}
		}
	})
}

// TestConformanceNoAllocs: Apply, Get and Merge on an existing key
// allocate nothing, whatever the algorithm and mode.
func TestConformanceNoAllocs(t *testing.T) {
	forEachAlgo(t, func(t *testing.T, ac algoCase) {
		s := NewStore(StoreConfig{})
		key := []byte("domain\x00k\x00v")
		lim := ac.lim(1<<40, minute)
		now := base
		s.Apply(now, &Op{Key: key, Limit: lim, Hits: 1})
		st, _ := s.Get(now, key)
		tests := []struct {
			name string
			f    func()
		}{
			{"consume", func() { now++; s.Apply(now, &Op{Key: key, Limit: lim, Hits: 1}) }},
			{"peek", func() { s.Apply(now, &Op{Key: key, Limit: lim, Hits: 1, Mode: Peek}) }},
			{"stop on over", func() { s.Apply(now, &Op{Key: key, Limit: lim, Hits: 1, Mode: StopOnOver}) }},
			{"check", func() { s.Apply(now, &Op{Key: key, Limit: lim}) }},
			{"over", func() { s.Apply(now, &Op{Key: key, Limit: ac.lim(0, minute), Hits: 1}) }},
			{"apply state", func() { s.ApplyState(now, &Op{Key: key, Limit: lim, Hits: 1}) }},
			{"get", func() { s.Get(now, key) }},
			{"merge", func() { s.Merge(now, key, st) }},
			{"max state", func() { MaxState(st, st) }},
		}
		for _, tc := range tests {
			if n := testing.AllocsPerRun(500, tc.f); n != 0 {
				t.Errorf("%s: %v allocs per run, want 0", tc.name, n)
			}
		}
	})
}

// TestConformanceRandomOps runs random ops at random times and checks, for
// every result: the Result invariants; that ApplyState reports what Get
// then reads; and that ResetAfter keeps its promise. When Over, after
// ResetAfter an op of min(max(hits,1), capacity) hits is admitted; when not
// over, after ResetAfter the whole capacity is. For the tight algorithms,
// one ns earlier it is not.
func TestConformanceRandomOps(t *testing.T) {
	forEachAlgo(t, func(t *testing.T, ac algoCase) {
		r := rand.New(rand.NewPCG(5, uint64(ac.algo)))
		key := []byte("k")
		for iter := range 3000 {
			unit := []int64{7, second, minute}[r.IntN(3)]
			lim := ac.lim(uint64(r.IntN(15)), unit)
			if ac.algo == TokenBucket && r.IntN(3) == 0 {
				lim.Burst = uint64(1 + r.IntN(25))
			}
			s := NewStore(StoreConfig{})
			now := base + r.Int64N(unit)
			for range r.IntN(8) {
				op := Op{Key: key, Limit: lim, Hits: uint64(r.IntN(5)), Mode: Mode(r.IntN(3))}
				res, st, wrote := s.ApplyState(now, &op)
				checkResult(t, fmt.Sprintf("iter %d", iter), lim, res)
				if got, ok := s.Get(now, key); wrote && (!ok || got != st) {
					t.Fatalf("iter %d: ApplyState stored %+v, Get reads %+v,%v", iter, st, got, ok)
				}
				now += r.Int64N(unit/2 + 1)
			}
			hits := uint64(r.IntN(6))
			res := s.Apply(now, &Op{Key: key, Limit: lim, Hits: hits, Mode: StopOnOver})
			checkResult(t, fmt.Sprintf("iter %d final", iter), lim, res)
			capacity := lim.Capacity()
			if capacity == 0 {
				continue
			}
			probe := capacity // not over: the whole capacity comes back
			if res.Over {
				probe = min(max(hits, 1), capacity)
			}
			peek := func(at int64) Result {
				return s.Apply(at, &Op{Key: key, Limit: lim, Hits: probe, Mode: Peek})
			}
			if p := peek(now + res.ResetAfter); p.Over {
				t.Fatalf("iter %d: %+v for %d hits at %d, but %d hits after ResetAfter: %+v", iter, res, hits, now, probe, p)
			}
			if ac.tight && res.ResetAfter > 0 {
				if p := peek(now + res.ResetAfter - 1); !p.Over && (res.Over || p.Count > 0) {
					t.Fatalf("iter %d: %+v at %d: %d hits already fit 1ns before ResetAfter: %+v", iter, res, now, probe, p)
				}
			}
		}
	})
}

// TestConformanceMerge checks Merge and MaxState on random states of each
// algorithm: commutative, associative and idempotent; Merge keeps exactly
// MaxState of the live inputs; and the merged state never admits more than
// either input (a Peek on it counts at least as much as on each).
func TestConformanceMerge(t *testing.T) {
	forEachAlgo(t, func(t *testing.T, ac algoCase) {
		r := rand.New(rand.NewPCG(3, uint64(ac.algo)))
		key := []byte("k")
		for iter := range 2000 {
			unit := []int64{second, 2 * second}[r.IntN(2)]
			now := base + r.Int64N(3*second)
			states := make([]State, 1+r.IntN(5))
			for i := range states {
				// Mostly one unit; sometimes another, sometimes another algorithm.
				u := unit
				if r.IntN(6) == 0 {
					u = 3 * second
				}
				states[i] = ac.randState(r, now, u, true)
				if r.IntN(8) == 0 {
					other := algoCases()[r.IntN(3)]
					states[i] = other.randState(r, now, u, true)
				}
			}

			// MaxState is a semilattice join.
			for _, a := range states {
				if MaxState(a, a) != a.counter().state() {
					t.Fatalf("iter %d: MaxState(a, a) = %+v, want %+v", iter, MaxState(a, a), a)
				}
				for _, b := range states {
					if MaxState(a, b) != MaxState(b, a) {
						t.Fatalf("iter %d: MaxState not commutative on %+v, %+v", iter, a, b)
					}
					for _, c := range states {
						if MaxState(MaxState(a, b), c) != MaxState(a, MaxState(b, c)) {
							t.Fatalf("iter %d: MaxState not associative on %+v, %+v, %+v", iter, a, b, c)
						}
					}
				}
			}

			// Merge keeps MaxState of the live inputs, in any order.
			var want State
			var wantOK bool
			for _, st := range states {
				if !mergeable(now, st) {
					continue
				}
				if !wantOK {
					want, wantOK = st.counter().state(), true
				} else {
					want = MaxState(want, st)
				}
			}
			for pass := range 3 {
				s := NewStore(StoreConfig{})
				for _, i := range r.Perm(len(states)) {
					s.Merge(now, key, states[i])
				}
				if pass == 2 { // idempotent
					for _, st := range states {
						if s.Merge(now, key, st) {
							t.Fatalf("iter %d: merging %+v again changed the state", iter, st)
						}
					}
				}
				got, ok := s.Get(now, key)
				if got != want || ok != wantOK {
					t.Fatalf("iter %d pass %d: merged %+v,%v, want %+v,%v (inputs %+v)", iter, pass, got, ok, want, wantOK, states)
				}
			}

			// Never admits more than either input, for one algorithm and
			// unit, when neither comes from a clock running ahead (such a
			// state has moved on to the next window; fixed_test.go and
			// sliding_test.go show what Apply does with it).
			a, b := ac.randState(r, now, unit, false), ac.randState(r, now, unit, false)
			lim := ac.lim(uint64(r.IntN(40)), unit)
			peekOn := func(sts ...State) Result {
				s := NewStore(StoreConfig{})
				for _, st := range sts {
					s.Merge(now, key, st)
				}
				return s.Apply(now, &Op{Key: key, Limit: lim, Hits: 1, Mode: Peek})
			}
			ra, rb, rm := peekOn(a), peekOn(b), peekOn(a, b)
			if rm.Count < ra.Count || rm.Count < rb.Count || (!rm.Over && (ra.Over || rb.Over)) {
				t.Fatalf("iter %d: merged %+v admits more than %+v (%+v) or %+v (%+v): %+v", iter, MaxState(a, b), a, ra, b, rb, rm)
			}
		}
	})
}

// mergeable is Merge's documented filter: a valid state, live at now, and
// for the windowed algorithms at most one window ahead of now's.
func mergeable(now int64, st State) bool {
	if !st.Algorithm.known() || st.Unit <= 0 || now >= st.counter().end() {
		return false
	}
	start, _ := fixedWindow(now, st.Unit)
	return st.Algorithm == TokenBucket || st.Window <= start+st.Unit
}

// algoStep is one Apply with an explicit timestamp, the Result it must give
// and the State Get must read afterwards (the zero State: no live entry).
type algoStep struct {
	name   string
	now    int64
	hits   uint64
	mode   Mode
	want   Result
	stored State
}

// runAlgoSteps applies steps in order to one key of a fresh store.
func runAlgoSteps(t *testing.T, s *Store, lim Limit, steps []algoStep) {
	t.Helper()
	key := []byte("k")
	for i, st := range steps {
		got := s.Apply(st.now, &Op{Key: key, Limit: lim, Hits: st.hits, Mode: st.mode})
		if got != st.want {
			t.Fatalf("step %d %q: Apply(now=base%+d, hits=%d, mode=%d) =\n  %+v, want\n  %+v", i, st.name, st.now-base, st.hits, st.mode, got, st.want)
		}
		checkResult(t, st.name, lim, got)
		gs, ok := s.Get(st.now, key)
		if st.stored == (State{}) {
			if ok {
				t.Fatalf("step %d %q: Get = %+v, want no live entry", i, st.name, gs)
			}
			continue
		}
		if !ok || gs != st.stored {
			t.Fatalf("step %d %q: Get = %+v,%v, want %+v", i, st.name, gs, ok, st.stored)
		}
	}
}

func TestAlgorithmNames(t *testing.T) {
	for _, ac := range algoCases() {
		got, ok := ParseAlgorithm(ac.algo.String())
		if !ok || got != ac.algo {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", ac.algo.String(), got, ok)
		}
		if err := ac.lim(1, second).Validate(); err != nil {
			t.Errorf("%v: Validate = %v", ac.algo, err)
		}
	}
	for _, s := range []string{"", "unknown", "Token_Bucket", "fixed"} {
		if a, ok := ParseAlgorithm(s); ok {
			t.Errorf("ParseAlgorithm(%q) = %v, true", s, a)
		}
	}
	caps := []struct {
		lim  Limit
		want uint64
	}{
		{Limit{Requests: 10, Burst: 99}, 10},
		{Limit{Algorithm: SlidingWindow, Requests: 10, Burst: 99}, 10},
		{Limit{Algorithm: TokenBucket, Requests: 10}, 10},
		{Limit{Algorithm: TokenBucket, Requests: 10, Burst: 99}, 99},
		{Limit{Algorithm: TokenBucket, Burst: 99}, 0},
	}
	for _, c := range caps {
		if got := c.lim.Capacity(); got != c.want {
			t.Errorf("%+v.Capacity() = %d, want %d", c.lim, got, c.want)
		}
	}
}

func BenchmarkApplyAlgorithm(b *testing.B) {
	for _, ac := range algoCases() {
		b.Run(ac.algo.String(), func(b *testing.B) {
			s := NewStore(StoreConfig{})
			op := Op{Key: []byte("domain\x00remote_address\x0010.0.0.1"), Limit: ac.lim(1<<62, minute), Hits: 1}
			now := base
			s.Apply(now, &op)
			b.ReportAllocs()
			for b.Loop() {
				now += 1000
				s.Apply(now, &op)
			}
		})
	}
}
