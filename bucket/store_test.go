package bucket

import (
	"fmt"
	"sync"
	"testing"
)

func TestConcurrentApplyExactCount(t *testing.T) {
	const (
		goroutines = 8
		hits       = 2000
	)
	s := NewStore(StoreConfig{Shards: 4, MaxKeys: 64})
	lim := Limit{Requests: goroutines * hits, Unit: hour}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			op := Op{Key: []byte("shared"), Limit: lim, Hits: 1}
			other := Op{Limit: lim, Hits: 1}
			for i := range hits {
				if r := s.Apply(base, &op); r.Over {
					t.Errorf("goroutine %d hit %d over: %+v", g, i, r)
					return
				}
				// Churn other keys, the other entry points, and eviction.
				switch i % 50 {
				case 0:
					other.Key = fmt.Appendf(other.Key[:0], "g%d-%d", g, i)
					s.Apply(base, &other)
				case 1:
					s.Merge(base, []byte("merged"), State{Window: base, Unit: hour, Count: uint64(i)})
				case 2:
					s.Range(base, func([]byte, State) bool { return true })
				case 3:
					s.Sweep(base)
					s.Len()
				}
			}
		}()
	}
	wg.Wait()
	st, ok := s.Get(base, []byte("shared"))
	if !ok || st.Count != goroutines*hits {
		t.Fatalf("shared count = %+v, %v; want %d", st, ok, goroutines*hits)
	}
	r := s.Apply(base, &Op{Key: []byte("shared"), Limit: lim, Hits: 1})
	if !r.Over || r.Count != goroutines*hits+1 {
		t.Fatalf("one more hit = %+v, want over at %d", r, goroutines*hits+1)
	}
}

func TestApplyDoesNotAllocate(t *testing.T) {
	s := NewStore(StoreConfig{MaxKeys: 1000})
	key := []byte("descriptor-key")
	lim := Limit{Requests: 1 << 40, Unit: minute}
	s.Apply(base, &Op{Key: key, Limit: lim, Hits: 1})
	tests := []struct {
		name string
		f    func()
	}{
		{"consume", func() { s.Apply(base, &Op{Key: key, Limit: lim, Hits: 1}) }},
		{"stop on over", func() { s.Apply(base, &Op{Key: key, Limit: lim, Hits: 1, Mode: StopOnOver}) }},
		{"peek", func() { s.Apply(base, &Op{Key: key, Limit: lim, Hits: 1, Mode: Peek}) }},
		{"check", func() { s.Apply(base, &Op{Key: key, Limit: lim}) }},
		{"new window", func() { s.Apply(base+minute, &Op{Key: key, Limit: lim, Hits: 1}) }},
		{"get", func() { s.Get(base, key) }},
		{"merge", func() { s.Merge(base, key, State{Window: base, Unit: minute, Count: 3}) }},
		{"apply state", func() { s.ApplyState(base, &Op{Key: key, Limit: lim, Hits: 1}) }},
		{"apply state peek", func() { s.ApplyState(base, &Op{Key: key, Limit: lim, Hits: 1, Mode: Peek}) }},
	}
	for _, tc := range tests {
		if n := testing.AllocsPerRun(1000, tc.f); n != 0 {
			t.Errorf("%s: %v allocs per run, want 0", tc.name, n)
		}
	}
}

// TestApplyState checks that ApplyState answers as Apply does and reports
// exactly the state it stored, and nothing when it stored nothing.
func TestApplyState(t *testing.T) {
	lim := Limit{Requests: 2, Unit: minute}
	key := []byte("k")
	type step struct {
		now   int64
		op    Op
		wrote bool
		st    State // when wrote
		count uint64
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"first hit creates", []step{
			{base, Op{Key: key, Limit: lim, Hits: 1}, true, State{Window: base - base%minute, Unit: minute, Count: 1}, 1},
		}},
		{"hits accumulate, over still consumed", []step{
			{base, Op{Key: key, Limit: lim, Hits: 2}, true, State{Window: base - base%minute, Unit: minute, Count: 2}, 2},
			{base, Op{Key: key, Limit: lim, Hits: 1}, true, State{Window: base - base%minute, Unit: minute, Count: 3}, 3},
		}},
		{"check, peek and stop-on-over write nothing", []step{
			{base, Op{Key: key, Limit: lim, Hits: 2}, true, State{Window: base - base%minute, Unit: minute, Count: 2}, 2},
			{base, Op{Key: key, Limit: lim}, false, State{}, 2},
			{base, Op{Key: key, Limit: lim, Hits: 1, Mode: Peek}, false, State{}, 3},
			{base, Op{Key: key, Limit: lim, Hits: 1, Mode: StopOnOver}, false, State{}, 3},
		}},
		{"new window restarts", []step{
			{base, Op{Key: key, Limit: lim, Hits: 2}, true, State{Window: base - base%minute, Unit: minute, Count: 2}, 2},
			{base + minute, Op{Key: key, Limit: lim, Hits: 1}, true, State{Window: base - base%minute + minute, Unit: minute, Count: 1}, 1},
		}},
		{"invalid limit", []step{
			{base, Op{Key: key, Limit: Limit{Requests: 2}, Hits: 1}, false, State{}, 0},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, ref := NewStore(StoreConfig{}), NewStore(StoreConfig{})
			for i, st := range tc.steps {
				r, got, wrote := s.ApplyState(st.now, &st.op)
				if want := ref.Apply(st.now, &st.op); r != want {
					t.Errorf("step %d: result %+v, Apply says %+v", i, r, want)
				}
				if wrote != st.wrote || got != st.st {
					t.Errorf("step %d: wrote %v state %+v, want %v %+v", i, wrote, got, st.wrote, st.st)
				}
				if wrote {
					if stored, ok := s.Get(st.now, key); !ok || stored != got {
						t.Errorf("step %d: Get = %+v %v, ApplyState reported %+v", i, stored, ok, got)
					}
				}
				if r.Count != st.count && st.op.Limit.Unit > 0 {
					t.Errorf("step %d: count %d, want %d", i, r.Count, st.count)
				}
			}
		})
	}
}
