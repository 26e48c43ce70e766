package bucket

import (
	"fmt"
	"runtime"
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
			names := make([][]byte, keys)
			for i := range names {
				names[i] = fmt.Appendf(nil, "domain\x00remote_address\x0010.%d.%d.%d", i>>16, (i>>8)&255, i&255)
				s.Apply(base, &Op{Key: names[i], Limit: lim, Hits: 1})
			}
			var seed atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := seed.Add(7919) // each goroutine walks the keys from its own place
				op := Op{Limit: lim, Hits: 1}
				for pb.Next() {
					i = i*6364136223846793005 + 1442695040888963407
					op.Key = names[(i>>40)%uint64(keys)]
					s.Apply(base, &op)
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
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
