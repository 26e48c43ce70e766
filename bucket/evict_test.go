package bucket

import (
	"fmt"
	"testing"
)

func TestShardCount(t *testing.T) {
	tests := []struct {
		cfg  StoreConfig
		want int
	}{
		{StoreConfig{}, 64},
		{StoreConfig{Shards: -3, MaxKeys: -1}, 64},
		{StoreConfig{Shards: 1}, 1},
		{StoreConfig{Shards: 3}, 4},
		{StoreConfig{Shards: 64}, 64},
		{StoreConfig{Shards: 65}, 128},
		{StoreConfig{Shards: 1 << 30}, 1 << 16},
		{StoreConfig{MaxKeys: 1_000_000}, 64},
		{StoreConfig{MaxKeys: 100}, 4},
		{StoreConfig{MaxKeys: 1}, 1},
		{StoreConfig{Shards: 64, MaxKeys: 10}, 8},
		{StoreConfig{Shards: 4, MaxKeys: 10}, 4},
	}
	for _, tc := range tests {
		if got := shardCount(tc.cfg); got != tc.want {
			t.Errorf("shardCount(%+v) = %d, want %d", tc.cfg, got, tc.want)
		}
		s := NewStore(tc.cfg)
		total := 0
		for i := range s.shards {
			c := s.shards[i].capacity
			if tc.cfg.MaxKeys > 0 && c < 1 {
				t.Errorf("%+v: shard %d capacity %d", tc.cfg, i, c)
			}
			total += c
		}
		if tc.cfg.MaxKeys > 0 && total != tc.cfg.MaxKeys {
			t.Errorf("%+v: capacities sum to %d, want %d", tc.cfg, total, tc.cfg.MaxKeys)
		}
	}
}

func hit(s *Store, now int64, key string, unit int64) Result {
	return s.Apply(now, &Op{Key: []byte(key), Limit: Limit{Requests: 100, Unit: unit}, Hits: 1})
}

func TestEvictPrefersExpired(t *testing.T) {
	s := NewStore(StoreConfig{Shards: 1, MaxKeys: 8})
	for i := range 4 {
		hit(s, base, fmt.Sprintf("short-%d", i), second)
		hit(s, base, fmt.Sprintf("long-%d", i), hour)
	}
	// The long keys are the least recently used, but the short ones expire.
	for i := range 4 {
		hit(s, base+second-1, fmt.Sprintf("long-%d", 3-i), hour)
	}
	hit(s, base+second, "new", hour)
	if exp, live := s.Evictions(); exp != 4 || live != 0 {
		t.Fatalf("Evictions = %d expired, %d live; want 4, 0", exp, live)
	}
	if n := s.Len(); n != 5 {
		t.Fatalf("Len = %d, want 5", n)
	}
	for i := range 4 {
		if _, ok := s.Get(base+second, []byte(fmt.Sprintf("long-%d", i))); !ok {
			t.Errorf("live key long-%d was evicted", i)
		}
	}
}

func TestEvictLeastRecentlyUsed(t *testing.T) {
	// One shard of 8 with 8 samples: the choice is exact LRU.
	s := NewStore(StoreConfig{Shards: 1, MaxKeys: 8})
	for i := range 8 {
		hit(s, base, fmt.Sprintf("k%d", i), hour)
	}
	// Touch everything but k3, in a scrambled order; checks count as use,
	// Peek does not.
	for _, i := range []int{5, 0, 7, 1, 6, 2, 4} {
		s.Apply(base+1, &Op{Key: []byte(fmt.Sprintf("k%d", i)), Limit: Limit{Requests: 100, Unit: hour}})
	}
	s.Apply(base+2, &Op{Key: []byte("k3"), Limit: Limit{Requests: 100, Unit: hour}, Hits: 1, Mode: Peek})

	steps := []struct {
		insert, evicted string
	}{
		{"n0", "k3"},
		{"n1", "k5"},
		{"n2", "k0"},
	}
	for i, st := range steps {
		hit(s, base+3, st.insert, hour)
		if _, ok := s.Get(base+3, []byte(st.evicted)); ok {
			t.Errorf("step %d: inserting %s did not evict %s", i, st.insert, st.evicted)
		}
		if _, live := s.Evictions(); live != uint64(i+1) {
			t.Errorf("step %d: live evictions = %d, want %d", i, live, i+1)
		}
		if n := s.Len(); n != 8 {
			t.Errorf("step %d: Len = %d, want 8", i, n)
		}
	}
}

func TestEvictBoundsLen(t *testing.T) {
	tests := []StoreConfig{
		{MaxKeys: 100},
		{MaxKeys: 7, Shards: 64},
		{MaxKeys: 1000, Shards: 16},
	}
	for _, cfg := range tests {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			s := NewStore(cfg)
			const inserts = 5000
			now := base
			for i := range inserts {
				if i%1000 == 999 {
					now += second // some entries (unit second) expire
				}
				unit := hour
				if i%3 == 0 {
					unit = second
				}
				hit(s, now, fmt.Sprintf("key-%d", i), unit)
				// Merge inserts too.
				s.Merge(now, []byte(fmt.Sprintf("merged-%d", i)), State{Window: base, Unit: hour, Count: 1})
				if i%97 == 0 {
					if n := s.Len(); n > cfg.MaxKeys {
						t.Fatalf("after %d inserts Len = %d > MaxKeys %d", i, n, cfg.MaxKeys)
					}
				}
			}
			n := s.Len()
			if n > cfg.MaxKeys {
				t.Fatalf("Len = %d > MaxKeys %d", n, cfg.MaxKeys)
			}
			exp, live := s.Evictions()
			if int(exp+live)+n != 2*inserts {
				t.Fatalf("evicted %d+%d, kept %d: want them to add up to %d", exp, live, n, 2*inserts)
			}
			if exp == 0 || live == 0 {
				t.Fatalf("Evictions = %d expired, %d live; want both", exp, live)
			}
		})
	}
}

// TestEvictBoundsBytes: with MaxBytes, long keys evict before MaxKeys is
// reached, so the store's memory stays bounded whatever the keys' length;
// Bytes follows inserts, evictions, sweeps and deletes exactly.
func TestEvictBoundsBytes(t *testing.T) {
	const maxBytes = 64 << 10
	s := NewStore(StoreConfig{MaxKeys: 100_000, MaxBytes: maxBytes, Shards: 8})
	long := string(make([]byte, 900))
	now := base
	for i := range 2000 {
		unit := hour
		if i%5 == 0 {
			unit = second
		}
		key := fmt.Sprintf("%s-%d", long, i)
		hit(s, now, key, unit)
		if i%500 == 499 {
			now += second // the unit-second entries expire: sweeps free them
		}
		if b := s.Bytes(); b > maxBytes {
			t.Fatalf("after %d inserts Bytes = %d > MaxBytes %d", i+1, b, maxBytes)
		}
	}
	if n := s.Len(); n > maxBytes/(900+EntryOverhead) {
		t.Fatalf("Len = %d keys of about 900 bytes under a %d-byte bound", n, maxBytes)
	}
	// Bytes is exactly the sum over what is stored (expired entries too).
	var sum int64
	for i := range s.shards {
		for k := range s.shards[i].m {
			sum += entryBytes(len(k))
		}
	}
	if got := s.Bytes(); got != sum {
		t.Fatalf("Bytes = %d, want %d (the sum over the entries)", got, sum)
	}
	s.Sweep(now + hour)
	if got := s.Bytes(); got != 0 || s.Len() != 0 {
		t.Fatalf("after sweeping everything: Bytes = %d, Len = %d; want 0, 0", got, s.Len())
	}
	hit(s, now, "k", hour)
	s.Delete([]byte("k"))
	s.Delete([]byte("k")) // twice: counted once
	if got := s.Bytes(); got != 0 {
		t.Fatalf("after Delete: Bytes = %d, want 0", got)
	}
}

func TestSweep(t *testing.T) {
	s := NewStore(StoreConfig{Shards: 4})
	for i := range 30 {
		unit := []int64{second, minute, hour}[i%3]
		hit(s, base, fmt.Sprintf("k%d", i), unit)
	}
	steps := []struct {
		now           int64
		removed, left int
	}{
		{base + second - 1, 0, 30},
		{base + second, 10, 20},
		{base + second, 0, 20},
		{base + minute + 1, 10, 10},
		{base + 2*hour, 10, 0},
	}
	for i, st := range steps {
		if got := s.Sweep(st.now); got != st.removed {
			t.Errorf("step %d: Sweep(%d) = %d, want %d", i, st.now, got, st.removed)
		}
		if got := s.Len(); got != st.left {
			t.Errorf("step %d: Len = %d, want %d", i, got, st.left)
		}
	}
	if exp, live := s.Evictions(); exp != 0 || live != 0 {
		t.Errorf("Sweep counted as evictions: %d, %d", exp, live)
	}
}

func TestDelete(t *testing.T) {
	s := NewStore(StoreConfig{})
	hit(s, base, "a", minute)
	hit(s, base, "b", minute)
	s.Delete([]byte("a"))
	s.Delete([]byte("missing"))
	if _, ok := s.Get(base, []byte("a")); ok {
		t.Error("a still present after Delete")
	}
	if got := hit(s, base, "a", minute); got.Count != 1 {
		t.Errorf("a restarts at %d after Delete, want 1", got.Count)
	}
	if n := s.Len(); n != 2 {
		t.Errorf("Len = %d, want 2", n)
	}
}
