package bucket

import "math"

// evictSamples is how many entries a full shard looks at to pick the least
// recently used one. Go randomises where map iteration starts.
const evictSamples = 8

// Sweep removes every entry expired at now (Unix ns) and returns how many it
// removed. It locks one shard at a time, for a scan of that shard.
func (s *Store) Sweep(now int64) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.sweepLocked(now)
		sh.mu.Unlock()
	}
	return n
}

// sweepLocked removes sh's expired entries, makes minEnd exact and returns
// how many it removed. sh.mu is held.
func (sh *shard) sweepLocked(now int64) int {
	n := 0
	minEnd := int64(math.MaxInt64)
	for k, e := range sh.m {
		end := e.counter().end()
		if now >= end {
			delete(sh.m, k)
			sh.bytes -= entryBytes(len(k))
			n++
			continue
		}
		minEnd = min(minEnd, end)
	}
	sh.minEnd = minEnd
	return n
}

// makeRoomLocked frees at least one slot in the full shard sh (one entry's
// bytes, for a shard over its byte share). It sweeps
// expired entries if any may exist; otherwise it evicts the least recently
// used of a sample and returns the evicted entry for reuse. sh.mu is held.
//
// Windows are aligned to the epoch, so expiry times are few and a sweep
// runs at most once per expiry instant while the shard stays full.
func (s *Store) makeRoomLocked(sh *shard, now int64) *entry {
	if now >= sh.minEnd {
		if n := sh.sweepLocked(now); n > 0 {
			s.evictedExpired.Add(uint64(n))
			return nil
		}
	}
	var (
		victimKey string
		victim    *entry
		seen      int
	)
	for k, e := range sh.m {
		if victim == nil || int32(e.tick-victim.tick) < 0 {
			victimKey, victim = k, e
		}
		if seen++; seen == evictSamples {
			break
		}
	}
	if victim == nil { // capacity >= 1, so a full shard is not empty
		return nil
	}
	delete(sh.m, victimKey)
	sh.bytes -= entryBytes(len(victimKey))
	s.evictedLive.Add(1)
	return victim
}
