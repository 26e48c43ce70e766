package bucket

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

const (
	ms     = int64(1_000_000)
	second = 1000 * ms
	minute = 60 * second
	hour   = 60 * minute
	// base is a minute-aligned instant (2023-11-14T22:13:00Z).
	base = int64(1_699_999_980) * second
)

// step is one Apply on the table's key with an explicit timestamp.
type step struct {
	name string
	now  int64
	hits uint64
	mode Mode
	want Result
	// stored is the count Get must report afterwards (absent: want no entry).
	stored uint64
	absent bool
}

func runSteps(t *testing.T, s *Store, key string, lim Limit, steps []step) {
	t.Helper()
	for i, st := range steps {
		got := s.Apply(st.now, &Op{Key: []byte(key), Limit: lim, Hits: st.hits, Mode: st.mode})
		if got != st.want {
			t.Fatalf("step %d %q: Apply(now=%d, hits=%d, mode=%d) = %+v, want %+v", i, st.name, st.now, st.hits, st.mode, got, st.want)
		}
		gs, ok := s.Get(st.now, []byte(key))
		switch {
		case st.absent && ok:
			t.Fatalf("step %d %q: Get = %+v, want no live entry", i, st.name, gs)
		case !st.absent && !ok:
			t.Fatalf("step %d %q: Get found no entry, want count %d", i, st.name, st.stored)
		case !st.absent && gs.Count != st.stored:
			t.Fatalf("step %d %q: stored count %d, want %d", i, st.name, gs.Count, st.stored)
		}
	}
}

func TestFixedWindowLimit100(t *testing.T) {
	lim := Limit{Requests: 100, Unit: minute}
	var steps []step
	for i := uint64(1); i <= 100; i++ {
		now := base + int64(i)*ms
		steps = append(steps, step{
			name: fmt.Sprintf("hit %d", i), now: now, hits: 1, stored: i,
			want: Result{Count: i, Remaining: 100 - i, ResetAfter: minute - int64(i)*ms},
		})
	}
	steps = append(steps,
		step{name: "hit 101 over", now: base + 101*ms, hits: 1, stored: 101,
			want: Result{Over: true, Count: 101, ResetAfter: minute - 101*ms}},
		step{name: "hit 102 still counts", now: base + minute - 1, hits: 1, stored: 102,
			want: Result{Over: true, Count: 102, ResetAfter: 1}},
		step{name: "exact boundary starts a new window", now: base + minute, hits: 1, stored: 1,
			want: Result{Count: 1, Remaining: 99, ResetAfter: minute}},
		step{name: "several windows later", now: base + 5*minute + 30*second, hits: 1, stored: 1,
			want: Result{Count: 1, Remaining: 99, ResetAfter: 30 * second}},
	)
	runSteps(t, NewStore(StoreConfig{}), "k", lim, steps)
}

func TestFixedWindowEdges(t *testing.T) {
	tests := []struct {
		name  string
		lim   Limit
		steps []step
	}{
		{"requests 0 blocks every hit", Limit{Requests: 0, Unit: second}, []step{
			{name: "check on missing key", now: base, hits: 0, absent: true,
				want: Result{Count: 0, ResetAfter: second}},
			{name: "first hit", now: base, hits: 1, stored: 1,
				want: Result{Over: true, Count: 1, ResetAfter: second}},
			{name: "new window still blocked", now: base + second, hits: 1, stored: 1,
				want: Result{Over: true, Count: 1, ResetAfter: second}},
		}},
		{"hits 0 checks only", Limit{Requests: 10, Unit: second}, []step{
			{name: "check creates nothing", now: base + 1, absent: true,
				want: Result{Remaining: 10, ResetAfter: second - 1}},
			{name: "add 4", now: base + 2, hits: 4, stored: 4,
				want: Result{Count: 4, Remaining: 6, ResetAfter: second - 2}},
			{name: "check sees 4", now: base + 3, stored: 4,
				want: Result{Count: 4, Remaining: 6, ResetAfter: second - 3}},
			{name: "check in next window sees 0, keeps old entry", now: base + second, absent: true,
				want: Result{Remaining: 10, ResetAfter: second}},
		}},
		{"multi-hit ops crossing the limit", Limit{Requests: 10, Unit: second}, []step{
			{name: "7", now: base, hits: 7, stored: 7, want: Result{Count: 7, Remaining: 3, ResetAfter: second}},
			{name: "3 reaches exactly", now: base, hits: 3, stored: 10, want: Result{Count: 10, Remaining: 0, ResetAfter: second}},
			{name: "5 crosses", now: base, hits: 5, stored: 15, want: Result{Over: true, Count: 15, ResetAfter: second}},
			{name: "1 more", now: base, hits: 1, stored: 16, want: Result{Over: true, Count: 16, ResetAfter: second}},
			{name: "one op over on its own", now: base + second, hits: 11, stored: 11, want: Result{Over: true, Count: 11, ResetAfter: second}},
		}},
		{"stop on over", Limit{Requests: 10, Unit: second}, []step{
			{name: "over on missing key creates nothing", now: base, hits: 11, mode: StopOnOver, absent: true,
				want: Result{Over: true, Count: 11, ResetAfter: second}},
			{name: "8", now: base, hits: 8, mode: StopOnOver, stored: 8, want: Result{Count: 8, Remaining: 2, ResetAfter: second}},
			{name: "5 would make 13", now: base, hits: 5, mode: StopOnOver, stored: 8, want: Result{Over: true, Count: 13, ResetAfter: second}},
			{name: "2 fits", now: base, hits: 2, mode: StopOnOver, stored: 10, want: Result{Count: 10, Remaining: 0, ResetAfter: second}},
			{name: "1 would make 11", now: base, hits: 1, mode: StopOnOver, stored: 10, want: Result{Over: true, Count: 11, ResetAfter: second}},
			{name: "consume still counts", now: base, hits: 1, mode: Consume, stored: 11, want: Result{Over: true, Count: 11, ResetAfter: second}},
		}},
		{"peek", Limit{Requests: 10, Unit: second}, []step{
			{name: "peek on missing key", now: base, hits: 3, mode: Peek, absent: true, want: Result{Count: 3, Remaining: 7, ResetAfter: second}},
			{name: "consume 5", now: base, hits: 5, stored: 5, want: Result{Count: 5, Remaining: 5, ResetAfter: second}},
			{name: "peek 10 is over", now: base, hits: 10, mode: Peek, stored: 5, want: Result{Over: true, Count: 15, ResetAfter: second}},
			{name: "peek next window", now: base + second, hits: 1, mode: Peek, absent: true, want: Result{Count: 1, Remaining: 9, ResetAfter: second}},
		}},
		{"saturation", Limit{Requests: 10, Unit: second}, []step{
			{name: "max hits", now: base, hits: math.MaxUint64, stored: math.MaxUint64,
				want: Result{Over: true, Count: math.MaxUint64, ResetAfter: second}},
			{name: "one more saturates", now: base, hits: 1, stored: math.MaxUint64,
				want: Result{Over: true, Count: math.MaxUint64, ResetAfter: second}},
			{name: "peek max saturates", now: base, hits: math.MaxUint64, mode: Peek, stored: math.MaxUint64,
				want: Result{Over: true, Count: math.MaxUint64, ResetAfter: second}},
		}},
		{"requests max never over", Limit{Requests: math.MaxUint64, Unit: second}, []step{
			{name: "max hits", now: base, hits: math.MaxUint64, stored: math.MaxUint64,
				want: Result{Count: math.MaxUint64, ResetAfter: second}},
			{name: "saturated", now: base, hits: 5, stored: math.MaxUint64,
				want: Result{Count: math.MaxUint64, ResetAfter: second}},
		}},
		{"zero and negative now", Limit{Requests: 5, Unit: second}, []step{
			{name: "now -second-1", now: -second - 1, hits: 1, stored: 1, want: Result{Count: 1, Remaining: 4, ResetAfter: 1}},
			{name: "now -second starts the window before 0", now: -second, hits: 1, stored: 1, want: Result{Count: 1, Remaining: 4, ResetAfter: second}},
			{name: "now -1 is its last instant", now: -1, hits: 1, stored: 2, want: Result{Count: 2, Remaining: 3, ResetAfter: 1}},
			{name: "now 0", now: 0, hits: 1, stored: 1, want: Result{Count: 1, Remaining: 4, ResetAfter: second}},
		}},
		{"extreme now", Limit{Requests: 5, Unit: 7}, []step{
			{name: "min int64", now: math.MinInt64, hits: 1, stored: 1,
				want: Result{Count: 1, Remaining: 4, ResetAfter: 7 - (math.MinInt64%7 + 7)}},
			{name: "max int64", now: math.MaxInt64, hits: 1, absent: true, // its window ends at MaxInt64 (saturated): expired at once
				want: Result{Count: 1, Remaining: 4, ResetAfter: 7 - math.MaxInt64%7}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runSteps(t, NewStore(StoreConfig{}), "k", tc.lim, tc.steps)
		})
	}
}

func TestFixedWindowMath(t *testing.T) {
	tests := []struct {
		now, unit, start, reset int64
	}{
		{0, 10, 0, 10},
		{9, 10, 0, 1},
		{10, 10, 10, 10},
		{-1, 10, -10, 1},
		{-10, 10, -10, 10},
		{-11, 10, -20, 1},
		{math.MaxInt64, 1, math.MaxInt64, 1},
		{math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64},
		{math.MinInt64, math.MaxInt64, math.MinInt64, 1},
		{math.MinInt64, 1, math.MinInt64, 1},
		{math.MinInt64, 3, math.MinInt64, 2}, // floor is below MinInt64: clamped
		{base + 1, minute, base, minute - 1},
	}
	for _, tc := range tests {
		start, reset := fixedWindow(tc.now, tc.unit)
		if start != tc.start || reset != tc.reset {
			t.Errorf("fixedWindow(%d, %d) = %d, %d; want %d, %d", tc.now, tc.unit, start, reset, tc.start, tc.reset)
		}
		if reset <= 0 || reset > tc.unit {
			t.Errorf("fixedWindow(%d, %d): reset %d outside (0, unit]", tc.now, tc.unit, reset)
		}
	}
}

func TestApplyLimitChanges(t *testing.T) {
	s := NewStore(StoreConfig{})
	key := []byte("k")
	s.Apply(base, &Op{Key: key, Limit: Limit{Requests: 10, Unit: minute}, Hits: 5})
	// Same key under another unit restarts rather than mixing windows.
	got := s.Apply(base+second, &Op{Key: key, Limit: Limit{Requests: 10, Unit: hour}, Hits: 1})
	want := Result{Count: 1, Remaining: 9, ResetAfter: hour - (base+second)%hour}
	if got != want {
		t.Fatalf("after unit change: %+v, want %+v", got, want)
	}
	// A different Requests on the same unit keeps the count.
	got = s.Apply(base+second, &Op{Key: key, Limit: Limit{Requests: 1, Unit: hour}, Hits: 1})
	if !got.Over || got.Count != 2 {
		t.Fatalf("after requests change: %+v, want over with count 2", got)
	}
}

func TestApplyInvalidLimit(t *testing.T) {
	s := NewStore(StoreConfig{})
	for _, lim := range []Limit{
		{Requests: 10, Unit: 0},
		{Requests: 10, Unit: -second},
		{Requests: 10, Unit: second, Algorithm: Algorithm(200)},
	} {
		got := s.Apply(base, &Op{Key: []byte("k"), Limit: lim, Hits: 1})
		if got != (Result{Over: true}) {
			t.Errorf("Apply with %+v = %+v, want Result{Over: true}", lim, got)
		}
	}
	if n := s.Len(); n != 0 {
		t.Errorf("Len = %d after invalid limits, want 0", n)
	}
}

func TestLimitValidate(t *testing.T) {
	tests := []struct {
		lim     Limit
		wantErr string
	}{
		{Limit{Requests: 100, Unit: minute}, ""},
		{Limit{Requests: 0, Unit: 1}, ""},
		{Limit{Requests: 1, Unit: 0}, "bucket: invalid limit: unit must be > 0 nanoseconds, got 0"},
		{Limit{Requests: 1, Unit: -5}, "bucket: invalid limit: unit must be > 0 nanoseconds, got -5"},
		{Limit{Requests: 1, Unit: second, Algorithm: 9}, "bucket: invalid limit: unknown algorithm 9"},
	}
	for _, tc := range tests {
		err := tc.lim.Validate()
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("%+v.Validate() = %v, want nil", tc.lim, err)
			}
			continue
		}
		if err == nil || err.Error() != tc.wantErr || !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("%+v.Validate() = %v, want %q wrapping ErrInvalidLimit", tc.lim, err, tc.wantErr)
		}
	}
}

func TestAlgorithmString(t *testing.T) {
	if got := FixedWindow.String(); got != "fixed_window" {
		t.Errorf("FixedWindow.String() = %q", got)
	}
	if got := Algorithm(42).String(); got != "unknown" {
		t.Errorf("Algorithm(42).String() = %q", got)
	}
}

func TestOnWindowGrid(t *testing.T) {
	tests := []struct {
		start, unit int64
		want        bool
	}{
		{0, minute, true},
		{3 * minute, minute, true},
		{-2 * minute, minute, true},
		{minute + 1, minute, false},
		{-1, minute, false},
		{math.MinInt64, minute, true}, // the saturated start before the first window
		{math.MaxInt64, 1, true},
		{5, 0, false},
		{5, -1, false},
	}
	for _, tt := range tests {
		if got := OnWindowGrid(tt.start, tt.unit); got != tt.want {
			t.Errorf("OnWindowGrid(%d, %d) = %v, want %v", tt.start, tt.unit, got, tt.want)
		}
	}
}
