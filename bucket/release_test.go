package bucket

import (
	"testing"
	"time"
)

func TestReleaseGivesBackCountedHits(t *testing.T) {
	unit := int64(time.Second)
	now := 10 * unit
	for _, algo := range []Algorithm{FixedWindow, SlidingWindow} {
		t.Run(algo.String(), func(t *testing.T) {
			s := NewStore(StoreConfig{})
			lim := Limit{Algorithm: algo, Requests: 10, Unit: unit}
			key := []byte("k")
			s.Apply(now, &Op{Key: key, Limit: lim, Hits: 8})
			if !s.Release(now+1, key, lim, now, 5) {
				t.Fatal("release in the same window changed nothing")
			}
			if r := s.Apply(now+2, &Op{Key: key, Limit: lim, Hits: 7}); r.Over || r.Count != 10 {
				t.Fatalf("after releasing 5 of 8, 7 more: %+v, want count 10 and not over", r)
			}
			// Releasing more than the count stops at zero.
			if !s.Release(now+3, key, lim, now, 100) {
				t.Fatal("release changed nothing")
			}
			if st, _ := s.Get(now+3, key); st.Count != 0 {
				t.Fatalf("count %d after releasing more than it, want 0", st.Count)
			}
		})
	}
}

func TestReleaseKeepsOtherWindowsAndLimits(t *testing.T) {
	unit := int64(time.Second)
	now := 10 * unit
	key := []byte("k")
	fixed := Limit{Requests: 10, Unit: unit}
	s := NewStore(StoreConfig{})
	s.Apply(now, &Op{Key: key, Limit: fixed, Hits: 6})
	for _, tt := range []struct {
		name   string
		now    int64
		lim    Limit
		window int64
	}{
		{"the window before", now, fixed, now - unit},
		{"the window ended", now + unit, fixed, now},
		{"another unit", now, Limit{Requests: 10, Unit: 2 * unit}, now},
		{"another algorithm", now, Limit{Algorithm: SlidingWindow, Requests: 10, Unit: unit}, now},
		{"a token bucket", now, Limit{Algorithm: TokenBucket, Requests: 10, Unit: unit}, now},
	} {
		if s.Release(tt.now, key, tt.lim, tt.window, 3) {
			t.Errorf("%s: release changed the counter", tt.name)
		}
	}
	if s.Release(now, []byte("missing"), fixed, now, 1) {
		t.Error("release of a missing key changed something")
	}
	if st, _ := s.Get(now, key); st.Count != 6 {
		t.Fatalf("count %d, want 6 untouched", st.Count)
	}
}

func TestReleaseSlidingFromPrev(t *testing.T) {
	unit := int64(time.Second)
	now := 10 * unit
	key := []byte("k")
	lim := Limit{Algorithm: SlidingWindow, Requests: 10, Unit: unit}
	s := NewStore(StoreConfig{})
	s.Apply(now, &Op{Key: key, Limit: lim, Hits: 10})
	next := now + unit
	s.Apply(next, &Op{Key: key, Limit: lim, Hits: 0, Mode: Peek})
	// Move the counter into the next window, so the leased window is prev.
	s.Apply(next+unit/2, &Op{Key: key, Limit: lim, Hits: 1, Mode: StopOnOver})
	before, _ := s.Get(next+unit/2, key)
	if !s.Release(next+unit/2, key, lim, now, 4) {
		t.Fatal("release from prev changed nothing")
	}
	after, _ := s.Get(next+unit/2, key)
	if after.Prev != before.Prev-4 || after.Count != before.Count {
		t.Fatalf("before %+v after %+v: want prev lowered by 4, count kept", before, after)
	}
}
