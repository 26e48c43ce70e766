package bucket

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

func BenchmarkApply(b *testing.B) {
	s := NewStore(StoreConfig{})
	op := Op{Key: []byte("domain\x00remote_address\x0010.0.0.1"), Limit: Limit{Requests: 1 << 62, Unit: minute}, Hits: 1}
	s.Apply(base, &op)
	b.ReportAllocs()
	for b.Loop() {
		s.Apply(base, &op)
	}
}

// BenchmarkApplyParallel updates keys from every core at once, drawing
// each op's key at random from a working set: 1,024 keys (the clients active
// in one window on one node, cache-resident: this measures the store and its
// locks) and 65,536 keys (a table larger than the CPU's private caches: this
// adds the memory latency of a map lookup, a few cache misses per op).
// decisions/s is the whole machine's; divide by -cpu for one core.
func BenchmarkApplyParallel(b *testing.B) {
	for _, keys := range []int{1 << 10, 1 << 16} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			s := NewStore(StoreConfig{})
			lim := Limit{Requests: 1 << 62, Unit: minute}
			names := benchKeys(keys)
			for _, k := range names {
				s.Apply(base, &Op{Key: k, Limit: lim, Hits: 1})
			}
			b.ReportAllocs()
			b.ResetTimer()
			benchRandomKeys(b, names, func(k []byte, op *Op) {
				op.Key, op.Limit, op.Hits = k, lim, 1
				s.Apply(base, op)
			})
		})
	}
}

// BenchmarkParallelCeiling is what this machine allows a parallel store:
// the same keys drawn the same way as BenchmarkApplyParallel, each a bare
// counter with its own mutex, found in a map that is never written (no
// store can look up for less, or write fewer cache lines). Apply's
// decisions/s divided by this one's, in one run, is how much of the
// machine's parallel capacity the store's sharding, eviction bookkeeping
// and algorithms cost. On a machine whose cores pass cache lines slowly
// (most VMs), this ceiling, not the store, bounds decisions/s per core.
func BenchmarkParallelCeiling(b *testing.B) {
	type counter struct {
		mu sync.Mutex
		n  uint64
	}
	for _, keys := range []int{1 << 10, 1 << 16} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			names := benchKeys(keys)
			m := make(map[string]*counter, keys)
			for _, k := range names {
				m[string(k)] = new(counter)
			}
			b.ReportAllocs()
			b.ResetTimer()
			benchRandomKeys(b, names, func(k []byte, _ *Op) {
				c := m[string(k)]
				c.mu.Lock()
				c.n++
				c.mu.Unlock()
			})
		})
	}
}

// benchKeys returns n distinct keys shaped like the seed's descriptors.
func benchKeys(n int) [][]byte {
	names := make([][]byte, n)
	for i := range names {
		names[i] = fmt.Appendf(nil, "domain\x00remote_address\x0010.%d.%d.%d", i>>16, (i>>8)&255, i&255)
	}
	return names
}

// benchRandomKeys runs do in parallel on keys drawn at random from names,
// each goroutine from its own place in one pseudo-random sequence, and
// reports decisions/s for the whole machine.
func benchRandomKeys(b *testing.B, names [][]byte, do func(key []byte, op *Op)) {
	var seed atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		i := seed.Add(7919)
		var op Op
		for pb.Next() {
			i = i*6364136223846793005 + 1442695040888963407
			do(names[(i>>40)%uint64(len(names))], &op)
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

// BenchmarkMemory loads 1,000,000 live keys of 16 bytes and reports the heap
// they take per key, key bytes included.
func BenchmarkMemory(b *testing.B) {
	const n = 1_000_000
	lim := Limit{Requests: 100, Unit: hour}
	var perKey float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s := NewStore(StoreConfig{})
		op := Op{Limit: lim, Hits: 1}
		buf := make([]byte, 0, 16)
		for i := range n {
			buf = fmt.Appendf(buf[:0], "key-%012d", i) // 16 bytes
			op.Key = buf
			s.Apply(base, &op)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if s.Len() != n {
			b.Fatalf("Len = %d", s.Len())
		}
		perKey = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(s)
	}
	b.ReportMetric(perKey, "B/key")
}

func BenchmarkApplyState(b *testing.B) {
	s := NewStore(StoreConfig{})
	op := Op{Key: []byte("domain\x00remote_address\x0010.0.0.1"), Limit: Limit{Requests: 1 << 62, Unit: minute}, Hits: 1}
	s.ApplyState(base, &op)
	b.ReportAllocs()
	for b.Loop() {
		s.ApplyState(base, &op)
	}
}
