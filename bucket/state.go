package bucket

// State is the replicable state of one key's counter: what Get reads, Range
// lists and Merge combines. Times are Unix ns UTC. Fields an algorithm does
// not use are zero in states this package returns and ignored in states it
// is given.
type State struct {
	// Algorithm is the algorithm that wrote the counter.
	Algorithm Algorithm
	// Window is the start of the window counted in, Unix ns (FixedWindow,
	// SlidingWindow).
	Window int64
	// Unit is the limit's Unit in ns (> 0 in a valid state).
	Unit int64
	// Count is the hits counted in Window (FixedWindow, SlidingWindow).
	Count uint64
	// Prev is the hits counted in the window before Window (SlidingWindow).
	// A sliding window's Count and Prev are at most math.MaxUint32.
	Prev uint64
	// TAT is the theoretical arrival time, Unix ns: the instant the bucket
	// is full again (TokenBucket).
	TAT int64
}

func (st State) counter() counter {
	switch st.Algorithm {
	case SlidingWindow:
		return counter{window: st.Window, unit: st.Unit, count: st.Count, prev: st.Prev, algo: st.Algorithm}
	case TokenBucket:
		return counter{window: st.TAT, unit: st.Unit, algo: st.Algorithm}
	}
	return counter{window: st.Window, unit: st.Unit, count: st.Count, algo: st.Algorithm}
}

func (c counter) state() State {
	switch c.algo {
	case SlidingWindow:
		return State{Algorithm: c.algo, Window: c.window, Unit: c.unit, Count: c.count, Prev: c.prev}
	case TokenBucket:
		return State{Algorithm: c.algo, Unit: c.unit, TAT: c.window}
	}
	return State{Algorithm: c.algo, Window: c.window, Unit: c.unit, Count: c.count}
}

// End returns when st stops mattering, Unix ns: Store.Get and Store.Merge
// treat it as expired at any now >= End. That is the end of its window for
// FixedWindow, of the window after it for SlidingWindow, and TAT rounded up
// to a multiple of Unit for TokenBucket; math.MinInt64 for an unknown
// Algorithm.
func (st State) End() int64 {
	return st.counter().end()
}

// laterThan orders states of one key: by Window, then Unit, then Algorithm.
// Merge keeps the later of two states and the larger count of equal ones.
func (c counter) laterThan(o counter) bool {
	if c.window != o.window {
		return c.window > o.window
	}
	if c.unit != o.unit {
		return c.unit > o.unit
	}
	return c.algo > o.algo
}

// Get returns key's state at now (Unix ns). It reports false if the key has
// no entry or its entry has expired: now >= Window+Unit for FixedWindow,
// Window+2*Unit for SlidingWindow, TAT rounded up to a multiple of Unit for
// TokenBucket.
func (s *Store) Get(now int64, key []byte) (State, bool) {
	sh := s.shardFor(key)
	sh.mu.Lock()
	e := sh.m[string(key)]
	var c counter
	if e != nil {
		c = e.counter()
	}
	sh.mu.Unlock()
	if e == nil || now >= c.end() {
		return State{}, false
	}
	return c.state(), true
}

// Merge combines st, received from a peer, into key's entry at now (Unix ns)
// and reports whether the stored state changed.
//
// Contract: for a fixed now, merging is commutative, associative and
// idempotent, and never lowers a stored state: the stored state becomes
// MaxState(stored, st). For FixedWindow states, of two states the later
// (Window, Unit) wins, and of two states for the same window the larger
// Count wins; MaxState says how the other algorithms combine. An expired
// stored entry counts as absent. Merge ignores (returns false for) an st
// that is invalid (Unit <= 0, an unknown Algorithm, or a SlidingWindow
// Count or Prev above math.MaxUint32), expired at now (see Get), or, for
// the windowed algorithms, more than one window ahead of now (Window after
// the start of the window following now's: a clock that far ahead is
// broken). A state for the window after now's is kept, and Apply keeps
// counting in it. A TokenBucket state is never refused for being ahead: its
// TAT may legitimately be up to Burst*Unit/Requests after now, a bound the
// state does not carry.
//
// Merge may insert the key, evicting as Apply does when the store is full.
func (s *Store) Merge(now int64, key []byte, st State) bool {
	if !st.Algorithm.known() || st.Unit <= 0 || !slidingCountsFit(st) {
		return false
	}
	in := st.counter()
	if now >= in.end() {
		return false
	}
	if st.Algorithm != TokenBucket {
		start, _ := fixedWindow(now, st.Unit)
		if st.Window > fixedEnd(start, st.Unit) {
			return false
		}
	}
	sh := s.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[string(key)]
	if e == nil {
		s.insertLocked(sh, now, key, in)
		return true
	}
	cur := e.counter()
	next := in
	if now < cur.end() {
		next = join(cur, in)
	}
	if next == cur {
		return false
	}
	e.set(next)
	sh.tick++
	e.tick = sh.tick
	sh.noteEnd(next.end())
	sh.changes++
	return true
}

// Range calls fn for each entry live at now (Unix ns), shard by shard, until
// fn returns false. It copies a shard's live entries under the shard's lock
// and calls fn without holding any lock, so fn may call the store; entries
// changed after their shard was copied may be reported as they were. key is
// a copy that is valid only during the call to fn.
func (s *Store) Range(now int64, fn func(key []byte, st State) bool) {
	type item struct {
		key string
		c   counter
	}
	var (
		items []item
		buf   []byte
	)
	for i := range s.shards {
		sh := &s.shards[i]
		items = items[:0]
		sh.mu.Lock()
		for k, e := range sh.m {
			if c := e.counter(); now < c.end() {
				items = append(items, item{k, c})
			}
		}
		sh.mu.Unlock()
		for _, it := range items {
			buf = append(buf[:0], it.key...)
			if !fn(buf, it.c.state()) {
				return
			}
		}
	}
}

// MaxState returns the state Merge keeps of two states of one key, ignoring
// expiry. It is commutative, associative and idempotent, so a replicator
// may coalesce the states it holds for a key in any order before it sends
// them, and for one algorithm and unit it never admits more than either
// input would.
//
// States of different algorithms (seen only while a rule's algorithm
// changes): the higher Algorithm wins. FixedWindow: the later (Window,
// Unit) wins; for the same window, the larger Count. SlidingWindow: the
// larger Unit wins; with equal units the later Window wins, equal windows
// take the larger Count and the larger Prev, and a state exactly one window
// earlier raises the winner's Prev to its Count. TokenBucket: the larger
// Unit wins; with equal units the later TAT. The result has the unused
// fields of its algorithm zeroed.
func MaxState(a, b State) State {
	return join(a.counter(), b.counter()).state()
}
