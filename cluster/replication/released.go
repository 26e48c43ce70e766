package replication

import (
	"sync"

	"github.com/ringlimit/ringlimit/bucket"
)

// releasedBook remembers, per key, the leased hits this node (a key's
// owner) took back in the key's current window. Releases lower only the
// owner's counter; every copy made before them (a replica's, or one a peer
// pushes in a handoff or drain) still counts those hits, and merging keeps
// the larger count, so such a copy coming back would count them again. A
// copy of the same window that is at least as high as the count the owner
// answered with the lease includes it: the book takes the released hits
// off it before it is merged. A lower copy does not include the lease, or
// not all of it, and is merged as it is, which can only count more.
//
// The book is the owner's own: it is not replicated, so when a key changes
// owner within its window, the new owner's copies count the returned hits
// as used again (early refusals, never over-allowance). It keeps one
// window per key and at most releasedMaxKeys keys; a release it cannot
// note is only undone by the next copy that comes back.
type releasedBook struct {
	mu sync.Mutex
	m  map[string]*releasedEntry
}

// releasedEntry is what a key's owner took back in one window.
type releasedEntry struct {
	algo   bucket.Algorithm
	unit   int64
	window int64  // start of the window the hits were counted in
	hits   uint64 // taken back, in all
	// above is the highest count an owner answered with a lease since
	// taken back: a copy at least this high includes every lease noted.
	above uint64
	end   int64 // when the entry stops mattering (bucket.State.End)
}

// releasedMaxKeys bounds the book.
const releasedMaxKeys = 1 << 16

// note records hits of a lease granted with count granted taken back
// from key's counter for window at now.
func (b *releasedBook) note(now int64, key []byte, lim bucket.Limit, window int64, hits, granted uint64) {
	st := bucket.State{Algorithm: lim.Algorithm, Window: window, Unit: lim.Unit}
	end := st.End()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = make(map[string]*releasedEntry)
	}
	e := b.m[string(key)]
	if e == nil || e.algo != lim.Algorithm || e.unit != lim.Unit || e.window != window || now >= e.end {
		if e == nil && len(b.m) >= releasedMaxKeys {
			for k, o := range b.m {
				if now >= o.end {
					delete(b.m, k)
				}
			}
			if len(b.m) >= releasedMaxKeys {
				return
			}
		}
		e = &releasedEntry{algo: lim.Algorithm, unit: lim.Unit, window: window, end: end}
		b.m[string(key)] = e
	}
	e.hits += hits
	e.above = max(e.above, granted)
}

// adjust returns st, a copy of key's counter about to be merged at now,
// without the hits the owner took back from it (see releasedBook).
func (b *releasedBook) adjust(now int64, key []byte, st bucket.State) bucket.State {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.m[string(key)]
	if e == nil || now >= e.end || e.algo != st.Algorithm || e.unit != st.Unit {
		return st
	}
	switch {
	case st.Window == e.window && st.Count >= e.above:
		st.Count -= min(e.hits, st.Count)
	case st.Algorithm == bucket.SlidingWindow && st.Window-e.unit == e.window && st.Prev >= e.above:
		st.Prev -= min(e.hits, st.Prev)
	}
	return st
}
