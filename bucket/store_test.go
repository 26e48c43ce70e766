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
	}
	for _, tc := range tests {
		if n := testing.AllocsPerRun(1000, tc.f); n != 0 {
			t.Errorf("%s: %v allocs per run, want 0", tc.name, n)
		}
	}
}
