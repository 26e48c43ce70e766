package bucket

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

func TestTokenBucketSteps(t *testing.T) {
	// 10 per second: one token every 100 ms; a bucket of 5.
	lim := Limit{Algorithm: TokenBucket, Requests: 10, Unit: second, Burst: 5}
	tb := func(tat int64) State { return State{Algorithm: TokenBucket, Unit: second, TAT: tat} }
	steps := []algoStep{
		{name: "the whole burst at once", now: base, hits: 5, stored: tb(base + 500*ms),
			want: Result{Count: 5, ResetAfter: 500 * ms}},
		{name: "empty: the next token in 100 ms", now: base, hits: 1, stored: tb(base + 500*ms),
			want: Result{Over: true, Count: 6, ResetAfter: 100 * ms}},
		{name: "one token back", now: base + 100*ms, hits: 1, stored: tb(base + 600*ms),
			want: Result{Count: 5, ResetAfter: 500 * ms}},
		{name: "peek: empty again", now: base + 100*ms, hits: 1, mode: Peek, stored: tb(base + 600*ms),
			want: Result{Over: true, Count: 6, ResetAfter: 100 * ms}},
		{name: "check half way to a token: 2.5 back, 2 usable", now: base + 350*ms, stored: tb(base + 600*ms),
			want: Result{Count: 3, Remaining: 2, ResetAfter: 250 * ms}},
		{name: "3 do not fit yet, in 50 ms they do", now: base + 350*ms, hits: 3, stored: tb(base + 600*ms),
			want: Result{Over: true, Count: 6, ResetAfter: 50 * ms}},
		{name: "consume does not take refused tokens", now: base + 400*ms, hits: 3, stored: tb(base + 900*ms),
			want: Result{Count: 5, ResetAfter: 500 * ms}},
		{name: "more than the burst waits for a full bucket", now: base + 400*ms, hits: 9, stored: tb(base + 900*ms),
			want: Result{Over: true, Count: 14, ResetAfter: 500 * ms}},
		{name: "long idle: full again", now: base + 5*second, hits: 1, stored: tb(base + 5100*ms),
			want: Result{Count: 1, Remaining: 4, ResetAfter: 100 * ms}},
		{name: "more than the burst on a nearly full bucket: the burst fits in 100 ms", now: base + 5*second, hits: 6, mode: StopOnOver, stored: tb(base + 5100*ms),
			want: Result{Over: true, Count: 7, ResetAfter: 100 * ms}},
		{name: "full bucket: nothing to wait for; the state lingers to the unit grid", now: base + 5100*ms, stored: tb(base + 5100*ms),
			want: Result{Remaining: 5}},
		{name: "expired at the next second", now: base + 6*second,
			want: Result{Remaining: 5}},
	}
	runAlgoSteps(t, NewStore(StoreConfig{}), lim, steps)
}

func TestTokenBucketEdges(t *testing.T) {
	tests := []struct {
		name  string
		lim   Limit
		steps []algoStep
	}{
		{"burst defaults to requests", Limit{Algorithm: TokenBucket, Requests: 2, Unit: minute}, []algoStep{
			{name: "2", now: base, hits: 2, stored: State{Algorithm: TokenBucket, Unit: minute, TAT: base + minute},
				want: Result{Count: 2, ResetAfter: minute}},
			{name: "3rd in 30 s", now: base + 10*second, hits: 1, stored: State{Algorithm: TokenBucket, Unit: minute, TAT: base + minute},
				want: Result{Over: true, Count: 3, ResetAfter: 20 * second}},
		}},
		{"a rate that does not divide the unit rounds T up", Limit{Algorithm: TokenBucket, Requests: 3, Unit: second}, []algoStep{
			{name: "3", now: base, hits: 3, stored: State{Algorithm: TokenBucket, Unit: second, TAT: base + 3*333_333_334},
				want: Result{Count: 3, ResetAfter: 3 * 333_333_334}},
			{name: "one T later", now: base + 333_333_334, hits: 1, stored: State{Algorithm: TokenBucket, Unit: second, TAT: base + 4*333_333_334},
				want: Result{Count: 3, ResetAfter: 3 * 333_333_334}},
			{name: "1 ns short of the next", now: base + 2*333_333_334 - 1, hits: 1, stored: State{Algorithm: TokenBucket, Unit: second, TAT: base + 4*333_333_334},
				want: Result{Over: true, Count: 4, ResetAfter: 1}},
		}},
		{"burst below the rate smooths", Limit{Algorithm: TokenBucket, Requests: 100, Unit: second, Burst: 1}, []algoStep{
			{name: "1", now: base, hits: 1, stored: State{Algorithm: TokenBucket, Unit: second, TAT: base + 10*ms},
				want: Result{Count: 1, ResetAfter: 10 * ms}},
			{name: "then one per 10 ms", now: base + 9*ms, hits: 1, stored: State{Algorithm: TokenBucket, Unit: second, TAT: base + 10*ms},
				want: Result{Over: true, Count: 2, ResetAfter: ms}},
		}},
		{"more than a token per ns", Limit{Algorithm: TokenBucket, Requests: 4e9, Unit: second, Burst: 2}, []algoStep{
			// T rounds up to 1 ns: at most 1e9 per second get through
			{name: "2", now: base, hits: 2, stored: State{Algorithm: TokenBucket, Unit: second, TAT: base + 2},
				want: Result{Count: 2, ResetAfter: 2}},
			{name: "1 ns later, 1 more", now: base + 1, hits: 2, stored: State{Algorithm: TokenBucket, Unit: second, TAT: base + 2},
				want: Result{Over: true, Count: 3, ResetAfter: 1}},
		}},
		{"another unit is a new bucket", Limit{Algorithm: TokenBucket, Requests: 1, Unit: hour}, []algoStep{
			{name: "1", now: base, hits: 1, stored: State{Algorithm: TokenBucket, Unit: hour, TAT: base + hour},
				want: Result{Count: 1, ResetAfter: hour}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(StoreConfig{})
			if tc.name == "another unit is a new bucket" {
				s.Apply(base, &Op{Key: []byte("k"), Limit: Limit{Algorithm: TokenBucket, Requests: 1, Unit: minute}, Hits: 1})
			}
			runAlgoSteps(t, s, tc.lim, tc.steps)
		})
	}
}

func TestTokenBucketMaxState(t *testing.T) {
	tb := func(tat, unit int64) State { return State{Algorithm: TokenBucket, Unit: unit, TAT: tat} }
	tests := []struct {
		name string
		a, b State
		want State
	}{
		{"later TAT wins", tb(base+second, minute), tb(base+2*second, minute), tb(base+2*second, minute)},
		{"equal", tb(base, minute), tb(base, minute), tb(base, minute)},
		{"larger unit wins", tb(base+hour, minute), tb(base, hour), tb(base, hour)},
		{"token bucket beats sliding window", State{Algorithm: SlidingWindow, Window: base, Unit: minute, Count: 9}, tb(base, minute), tb(base, minute)},
		{"unused fields are zeroed", State{Algorithm: TokenBucket, Window: 5, Count: 7, Prev: 1, Unit: minute, TAT: base}, tb(base, minute), tb(base, minute)},
	}
	for _, tc := range tests {
		if got := MaxState(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: MaxState(%+v, %+v) = %+v, want %+v", tc.name, tc.a, tc.b, got, tc.want)
		}
		if got := MaxState(tc.b, tc.a); got != tc.want {
			t.Errorf("%s: MaxState(%+v, %+v) = %+v, want %+v", tc.name, tc.b, tc.a, got, tc.want)
		}
	}

	// Merge: a passed TAT is a full bucket, the same as nothing; a TAT
	// ahead of now is kept.
	s := NewStore(StoreConfig{})
	key := []byte("k")
	if s.Merge(base+2*minute, key, tb(base+minute, minute)) {
		t.Error("Merge of an expired TAT = true")
	}
	if !s.Merge(base, key, tb(base+hour-second, minute)) {
		t.Error("Merge of a TAT an hour ahead = false")
	}
	r := s.Apply(base, &Op{Key: key, Limit: Limit{Algorithm: TokenBucket, Requests: 60, Unit: minute, Burst: 3600}, Hits: 1})
	if r.Over || r.Remaining != 0 {
		t.Errorf("after merging a TAT an hour ahead with a burst of an hour: %+v, want the last token", r)
	}
}

// tokenModel is the naive simulation: a real-valued token count refilled
// continuously at rate per unit up to burst, kept exactly as a fraction.
type tokenModel struct {
	rate, burst uint64
	unit        int64
	tokens      *big.Rat
	last        int64
}

func newTokenModel(lim Limit, now int64) *tokenModel {
	return &tokenModel{rate: lim.Requests, burst: lim.Capacity(), unit: lim.Unit,
		tokens: new(big.Rat).SetInt64(int64(lim.Capacity())), last: now}
}

// refill returns the tokens at now (now >= last), without storing them.
func (m *tokenModel) refill(now int64) *big.Rat {
	add := new(big.Rat).SetFrac(big.NewInt((now-m.last)*int64(m.rate)), big.NewInt(m.unit))
	tk := new(big.Rat).Add(m.tokens, add)
	if b := new(big.Rat).SetInt64(int64(m.burst)); tk.Cmp(b) > 0 {
		tk = b
	}
	return tk
}

// apply decides op as the model does, and the time in ns until need tokens
// are there (the value ResetAfter promises).
func (m *tokenModel) apply(now int64, op Op) Result {
	tk := m.refill(now)
	floor := new(big.Int).Quo(tk.Num(), tk.Denom()).Uint64()
	count := m.burst - floor + op.Hits
	r := Result{Count: count}
	// wait returns the ns until tk reaches n tokens.
	wait := func(n uint64) int64 {
		missing := new(big.Rat).Sub(new(big.Rat).SetInt64(int64(n)), tk)
		if missing.Sign() <= 0 {
			return 0
		}
		ns := new(big.Rat).Mul(missing, new(big.Rat).SetFrac(big.NewInt(m.unit), big.NewInt(int64(m.rate))))
		q, rem := new(big.Int).QuoRem(ns.Num(), ns.Denom(), new(big.Int))
		if rem.Sign() != 0 {
			q.Add(q, big.NewInt(1))
		}
		return q.Int64()
	}
	if count > m.burst {
		r.Over = true
		r.ResetAfter = wait(min(max(op.Hits, 1), m.burst))
		return r
	}
	r.Remaining = m.burst - count
	left := new(big.Rat).Sub(tk, new(big.Rat).SetInt64(int64(op.Hits)))
	if op.Hits > 0 && op.Mode != Peek {
		m.tokens, m.last = left, now
	}
	saved := m.tokens
	m.tokens, tk = left, left
	r.ResetAfter = wait(m.burst)
	m.tokens = saved
	return r
}

// TestTokenBucketAgainstModel is the property test of the token bucket
// against a naive per-request simulation on seeded random timelines: every
// answer equals the exact token-counting model's when T is a whole number
// of ns (otherwise T is rounded up and the histories drift apart), and for
// every rate the admitted hits over any interval [t1, t2]
// are at most burst + rate*(t2-t1)/unit.
func TestTokenBucketAgainstModel(t *testing.T) {
	type limCase struct {
		lim   Limit
		exact bool // T = Unit/Requests is whole: compare every answer with the model
	}
	cases := []limCase{
		{Limit{Algorithm: TokenBucket, Requests: 10, Unit: second}, true},
		{Limit{Algorithm: TokenBucket, Requests: 10, Unit: second, Burst: 30}, true},
		{Limit{Algorithm: TokenBucket, Requests: 100, Unit: second, Burst: 1}, true},
		{Limit{Algorithm: TokenBucket, Requests: 60, Unit: minute, Burst: 7}, true},
		{Limit{Algorithm: TokenBucket, Requests: 3, Unit: second}, false},
		{Limit{Algorithm: TokenBucket, Requests: 7, Unit: second, Burst: 20}, false},
	}
	for ci, lc := range cases {
		r := rand.New(rand.NewPCG(uint64(ci), 17))
		lim := lc.lim
		s := NewStore(StoreConfig{})
		now := base + r.Int64N(second)
		m := newTokenModel(lim, now)
		type admit struct {
			at   int64
			hits uint64
		}
		var log []admit
		period := lim.Unit / int64(lim.Requests)
		for i := range 3000 {
			// Gaps around the emission interval, with idle stretches.
			now += r.Int64N(2 * period)
			if r.IntN(50) == 0 {
				now += r.Int64N(5 * lim.Unit)
			}
			op := Op{Key: []byte("k"), Limit: lim, Hits: uint64(r.IntN(4)), Mode: Mode(r.IntN(3))}
			if r.IntN(4) > 0 {
				op.Hits, op.Mode = 1, Consume
			}
			got := s.Apply(now, &op)
			want := m.apply(now, op)
			if lc.exact && got != want {
				t.Fatalf("case %d op %d at base%+d %+v: got %+v, model %+v", ci, i, now-base, op, got, want)
			}
			if !got.Over && op.Hits > 0 && op.Mode != Peek {
				log = append(log, admit{now, op.Hits})
			}
		}
		// Any interval [log[i].at, log[j].at] holds at most burst +
		// rate*dt/unit hits: (n - burst)*unit <= rate*dt, in int64 (the
		// timeline is short enough not to overflow).
		for i := range log {
			n := int64(0)
			for j := i; j < len(log); j++ {
				n += int64(log[j].hits)
				dt := log[j].at - log[i].at
				if (n-int64(lim.Capacity()))*lim.Unit > int64(lim.Requests)*dt {
					t.Fatalf("case %d: %d hits admitted in [base%+d, base%+d], more than burst %d + rate*interval",
						ci, n, log[i].at-base, log[j].at-base, lim.Capacity())
				}
			}
		}
		if len(log) < 500 {
			t.Fatalf("case %d: only %d admitted ops: the timeline does not exercise the bucket", ci, len(log))
		}
	}
}

// TestTokenBucketExtremeTimes: debt and TAT stay exact or saturate across
// the whole int64 range.
func TestTokenBucketExtremeTimes(t *testing.T) {
	lim := Limit{Algorithm: TokenBucket, Requests: 1, Unit: math.MaxInt64}
	s := NewStore(StoreConfig{})
	key := []byte("k")
	r := s.Apply(math.MinInt64, &Op{Key: key, Limit: lim, Hits: 1})
	if r.Over || r.ResetAfter != math.MaxInt64 {
		t.Fatalf("first hit: %+v", r)
	}
	r = s.Apply(math.MinInt64, &Op{Key: key, Limit: lim, Hits: 1})
	if !r.Over || r.Count != 2 {
		t.Fatalf("second hit: %+v", r)
	}
}
