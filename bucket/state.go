package bucket

// State is the replicable state of one key's counter: what Get reads, Range
// lists and Merge combines. Times are Unix ns UTC.
type State struct {
	// Algorithm is the algorithm that wrote the counter.
	Algorithm Algorithm
	// Window is the start of the window counted in, Unix ns.
	Window int64
	// Unit is the window length in ns (> 0 in a valid state).
	Unit int64
	// Count is the hits counted in Window.
	Count uint64
}

func (st State) counter() counter {
	return counter{window: st.Window, unit: st.Unit, count: st.Count, algo: st.Algorithm}
}

func (c counter) state() State {
	return State{Algorithm: c.algo, Window: c.window, Unit: c.unit, Count: c.count}
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
// no entry or its entry has expired (now >= Window+Unit).
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
// idempotent, and never lowers a stored state. States are ordered by
// (Window, Unit, Algorithm); of two states the later one wins, and of two
// states for the same window the larger Count wins. An expired stored entry
// counts as absent. Merge ignores (returns false for) an st that is invalid
// (Unit <= 0 or an unknown Algorithm), expired at now (now >= Window+Unit),
// or more than one window ahead of now (Window after the start of the
// window following now's: a clock that far ahead is broken). A state for
// the window after now's is kept, and Apply keeps counting in it.
//
// Merge may insert the key, evicting as Apply does when the store is full.
func (s *Store) Merge(now int64, key []byte, st State) bool {
	if !st.Algorithm.known() || st.Unit <= 0 {
		return false
	}
	in := st.counter()
	if now >= in.end() {
		return false
	}
	start, _ := fixedWindow(now, st.Unit)
	if st.Window > fixedEnd(start, st.Unit) {
		return false
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
	switch {
	case now >= cur.end() || in.laterThan(cur):
		e.set(in)
	case cur.laterThan(in) || in.count <= cur.count:
		return false
	default:
		e.count = in.count
	}
	sh.tick++
	e.tick = sh.tick
	sh.noteEnd(in.end())
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
