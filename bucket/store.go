package bucket

import (
	"math"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

const (
	// defaultShards is the shard count of a zero StoreConfig.
	defaultShards = 64
	// maxShards bounds StoreConfig.Shards.
	maxShards = 1 << 16
	// minKeysPerShard is the smallest per-shard capacity the default shard
	// count is reduced to keep, so that eviction has entries to choose from.
	minKeysPerShard = 16
)

// StoreConfig configures a Store. The zero value works: 64 shards and no
// bound on the number of keys.
type StoreConfig struct {
	// Shards is the number of independently locked partitions. It is
	// rounded up to a power of two (at most 65536). Zero or negative picks
	// 64, fewer when MaxKeys is small (so each shard holds at least 16
	// keys). It is never more than MaxKeys when MaxKeys > 0.
	Shards int
	// MaxKeys bounds the number of entries, expired or not. Zero or
	// negative means unbounded. The bound is split evenly between shards,
	// and a shard that is full evicts before it inserts (see Store), so the
	// store may evict before it holds MaxKeys entries in total.
	MaxKeys int
	// MaxBytes bounds the approximate memory of the entries: each one
	// costs len(key) + EntryOverhead bytes. Zero or negative means
	// unbounded. Like MaxKeys it is split evenly between shards, and a
	// shard over its share evicts before it inserts. It keeps long keys
	// (up to kilobytes each) from taking gigabytes below MaxKeys.
	MaxBytes int64
}

// EntryOverhead is what an entry costs besides its key bytes, for
// StoreConfig.MaxBytes: the entry, its map slot and the key's string
// header (BenchmarkMemory measures about 88 bytes).
const EntryOverhead = 100

// entryBytes is what an entry for a key of n bytes counts against MaxBytes.
func entryBytes(n int) int64 { return int64(n) + EntryOverhead }

// counter is the algorithm state of one key. Its layout is shared by all
// algorithms; an algorithm that needs more state adds a field here.
type counter struct {
	// window is the start of the window counted in, Unix ns.
	window int64
	// unit is the window length in ns (> 0).
	unit int64
	// count is the hits counted in window.
	count uint64
	// prev is, for SlidingWindow, the hits counted in the window before
	// window; 0 for the other algorithms. A sliding count and prev are at
	// most math.MaxUint32 (see entry).
	prev uint64
	// algo is the algorithm that wrote the counter.
	algo Algorithm
}

// entry is a stored counter plus bookkeeping. It is 32 bytes. A
// SlidingWindow keeps count in the low and prev in the high 32 bits of
// count: both only ever count admitted hits, so neither exceeds the
// limit's Requests, which is at most math.MaxUint32 for a sliding window.
type entry struct {
	window int64
	unit   int64
	count  uint64
	// tick is the shard's access tick at the last access, for approximate
	// LRU eviction. It wraps; compare with int32(a-b).
	tick uint32
	algo Algorithm
}

func (e *entry) counter() counter {
	if e.algo == SlidingWindow {
		return counter{window: e.window, unit: e.unit, count: e.count & math.MaxUint32, prev: e.count >> 32, algo: e.algo}
	}
	return counter{window: e.window, unit: e.unit, count: e.count, algo: e.algo}
}

func (e *entry) set(c counter) {
	e.window, e.unit, e.count, e.algo = c.window, c.unit, c.count, c.algo
	if c.algo == SlidingWindow {
		e.count = min(c.count, math.MaxUint32) | min(c.prev, math.MaxUint32)<<32
	}
}

// end returns when the counter expires, Unix ns: the end of its window
// (FixedWindow), of the window after it (SlidingWindow), or when the bucket
// is full again rounded up to the unit grid (TokenBucket).
func (c counter) end() int64 {
	switch c.algo {
	case FixedWindow:
		return fixedEnd(c.window, c.unit)
	case SlidingWindow:
		return slidingEnd(c.window, c.unit)
	case TokenBucket:
		return tokenEnd(c.window, c.unit)
	}
	return math.MinInt64 // unknown algorithm: always expired
}

// shardData is one partition of the store. All fields are guarded by mu.
type shardData struct {
	mu sync.Mutex
	m  map[string]*entry
	// tick counts accesses, for LRU order.
	tick uint32
	// capacity is the most entries the shard holds; 0 is unbounded.
	capacity int
	// bytes is the sum of entryBytes over the entries; byteCap bounds it,
	// 0 is unbounded.
	bytes, byteCap int64
	// minEnd is a lower bound of the entries' end times: no entry is
	// expired before it. Sweeping makes it exact again.
	minEnd int64
	// changes counts the writes that changed or inserted an entry (see
	// Store.Changes).
	changes uint64
}

// shard pads shardData to its own cache lines.
type shard struct {
	shardData
	_ [64 - unsafe.Sizeof(shardData{})%64]byte
}

// Store is a sharded in-memory map from key to counter. It is safe for
// concurrent use. Every method takes a short lock on one shard at a time;
// Apply takes exactly one. Time is always the caller's now, Unix ns UTC.
//
// An entry expires when its counter stops mattering (see Get): at the end
// of its window for FixedWindow. Expired entries stay in memory
// (and in Len) until Sweep removes them, Apply or Merge reuses them, or an
// insert into a full shard evicts them. When MaxKeys > 0, inserting a key
// into a full shard first removes every expired entry of that shard, and if
// none was expired evicts an approximately least recently used live entry
// (the oldest access of a small sample).
type Store struct {
	shards []shard
	mask   uint64

	evictedExpired atomic.Uint64
	evictedLive    atomic.Uint64
}

// NewStore returns an empty store configured by cfg.
func NewStore(cfg StoreConfig) *Store {
	n := shardCount(cfg)
	s := &Store{shards: make([]shard, n), mask: uint64(n - 1)}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.m = make(map[string]*entry)
		sh.minEnd = math.MaxInt64
		if cfg.MaxKeys > 0 {
			sh.capacity = cfg.MaxKeys / n
			if i < cfg.MaxKeys%n {
				sh.capacity++
			}
		}
		if cfg.MaxBytes > 0 {
			sh.byteCap = max(cfg.MaxBytes/int64(n), 1)
		}
	}
	return s
}

// fullLocked reports whether sh must make room before it takes a key of n
// bytes. sh.mu is held.
func (sh *shard) fullLocked(n int) bool {
	if len(sh.m) == 0 {
		return false // a key bigger than the whole share still goes in
	}
	return (sh.capacity > 0 && len(sh.m) >= sh.capacity) ||
		(sh.byteCap > 0 && sh.bytes+entryBytes(n) > sh.byteCap)
}

// shardCount resolves cfg to a power-of-two shard count in [1, maxShards].
func shardCount(cfg StoreConfig) int {
	n := cfg.Shards
	if n <= 0 {
		n = defaultShards
		for cfg.MaxKeys > 0 && n > 1 && cfg.MaxKeys/n < minKeysPerShard {
			n /= 2
		}
	}
	n = min(n, maxShards)
	p := 1
	for p < n {
		p <<= 1
	}
	for cfg.MaxKeys > 0 && p > cfg.MaxKeys {
		p >>= 1
	}
	return p
}

func (s *Store) shardFor(key []byte) *shard {
	return &s.shards[xxhash.Sum64(key)&s.mask]
}

// Apply decides op at now (Unix ns UTC) and updates the key's counter
// according to op.Mode; see Op, Mode and Result for the semantics. It never
// panics and, for a key that already has an entry, does not allocate.
//
// Apply does not retain op or op.Key. It creates an entry only when it adds
// hits: never for Hits == 0, Peek, or a StopOnOver op that is over the limit.
// An op whose Limit fails Validate touches nothing and returns
// Result{Over: true}. An unknown Mode behaves as Consume.
func (s *Store) Apply(now int64, op *Op) Result {
	r, _ := s.apply(now, op, nil)
	return r
}

// ApplyState is Apply that also reports what it stored: wrote is true when
// the op changed the key's counter, and st is then the counter's state right
// after the op (what Get would return). When wrote is false st is the zero
// State. A replicating caller records (op.Key, st) for the key's replicas
// without reading the store again. Like Apply it does not allocate for a key
// that already has an entry, and it does not retain op.
func (s *Store) ApplyState(now int64, op *Op) (r Result, st State, wrote bool) {
	r, wrote = s.apply(now, op, &st)
	return r, st, wrote
}

// apply is Apply; when st is not nil and the op wrote, it also sets *st to
// the stored state (Apply does not pay for building it).
func (s *Store) apply(now int64, op *Op, st *State) (r Result, wrote bool) {
	if !op.Limit.Algorithm.known() || op.Limit.Unit <= 0 {
		return Result{Over: true}, false
	}
	sh := s.shardFor(op.Key)
	sh.mu.Lock()
	e := sh.m[string(op.Key)]
	var cur counter
	if e != nil {
		cur = e.counter()
	}
	var next counter
	switch op.Limit.Algorithm {
	case FixedWindow:
		r, next, wrote = applyFixed(cur, e != nil, now, op)
	case SlidingWindow:
		r, next, wrote = applySliding(cur, e != nil, now, op)
	case TokenBucket:
		r, next, wrote = applyToken(cur, e != nil, now, op)
	}
	switch {
	case wrote && e != nil:
		sh.tick++
		e.tick = sh.tick
		e.set(next)
		sh.noteEnd(next.end())
		sh.changes++
	case wrote:
		s.insertLocked(sh, now, op.Key, next)
	case e != nil && op.Mode != Peek:
		sh.tick++
		e.tick = sh.tick
	}
	sh.mu.Unlock()
	if wrote && st != nil {
		*st = next.state()
	}
	return r, wrote
}

// Delete removes key's entry, if any.
func (s *Store) Delete(key []byte) {
	sh := s.shardFor(key)
	sh.mu.Lock()
	if _, ok := sh.m[string(key)]; ok {
		delete(sh.m, string(key))
		sh.bytes -= entryBytes(len(key))
	}
	sh.mu.Unlock()
}

// Len returns the number of entries, including expired ones not yet
// removed.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Bytes returns the approximate memory of the entries, as MaxBytes counts
// it: the sum of len(key) + EntryOverhead, expired entries not yet removed
// included.
func (s *Store) Bytes() int64 {
	var n int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.bytes
		sh.mu.Unlock()
	}
	return n
}

// Changes returns how many times Apply and Merge have changed or inserted
// an entry since NewStore. Removals (Sweep, Delete, eviction) are not
// counted. A caller that saves the store periodically may skip a save when
// Changes has not moved since the last one.
func (s *Store) Changes() uint64 {
	var n uint64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.changes
		sh.mu.Unlock()
	}
	return n
}

// Evictions returns how many entries inserts into full shards have removed
// since NewStore: expired entries swept to make room, and live entries
// evicted because nothing was expired. Removals by Sweep and Delete are not
// counted.
func (s *Store) Evictions() (expired, live uint64) {
	return s.evictedExpired.Load(), s.evictedLive.Load()
}

// noteEnd keeps minEnd a lower bound after an entry got end. sh.mu is held.
func (sh *shard) noteEnd(end int64) {
	if end < sh.minEnd {
		sh.minEnd = end
	}
}

// insertLocked adds key, which is not in sh, with counter c, evicting first
// if the shard is full. sh.mu is held. This is the only place that copies a
// key.
func (s *Store) insertLocked(sh *shard, now int64, key []byte, c counter) {
	var e *entry
	for sh.fullLocked(len(key)) {
		if ev := s.makeRoomLocked(sh, now); ev != nil {
			e = ev
		}
	}
	sh.bytes += entryBytes(len(key))
	if e == nil {
		e = new(entry)
	}
	sh.tick++
	*e = entry{tick: sh.tick}
	e.set(c)
	sh.m[string(key)] = e
	sh.noteEnd(c.end())
	sh.changes++
}
