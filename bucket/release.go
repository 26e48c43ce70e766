package bucket

// Release takes back n hits that were counted under lim in the window
// starting at window (Unix ns), and reports whether the counter changed.
// It serves quota leases: an owner counts a lease as used when it grants
// it, and the unused part comes back here.
//
// Only the windowed algorithms are released. The stored counter must be
// for lim's algorithm and unit: a fixed window gives the hits back while it
// still counts in window; a sliding window gives them back from cur while
// it counts in window and from prev while it counts in the window after.
// Anything else (another window, an expired or missing counter, a token
// bucket) changes nothing, so the hits stay counted: a release never lowers
// a counter below what its window saw. A release larger than the count
// takes the count to zero. Release creates no entry and is never
// replicated: replicas keep the higher count they were sent, which only
// refuses earlier.
func (s *Store) Release(now int64, key []byte, lim Limit, window int64, n uint64) bool {
	if n == 0 || lim.Unit <= 0 || (lim.Algorithm != FixedWindow && lim.Algorithm != SlidingWindow) {
		return false
	}
	sh := s.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[string(key)]
	if e == nil {
		return false
	}
	c := e.counter()
	if c.algo != lim.Algorithm || c.unit != lim.Unit || now >= c.end() {
		return false
	}
	switch {
	case c.window == window:
		c.count -= min(c.count, n)
	case c.algo == SlidingWindow && nextWindow(window, c.window, c.unit):
		c.prev -= min(c.prev, n)
	default:
		return false
	}
	e.set(c)
	sh.changes++
	return true
}
