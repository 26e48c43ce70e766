package ring

import "sync/atomic"

// Table publishes the current Ring. Readers call Load with no lock; a writer
// builds a new Ring with New off any lock and Stores it. The zero Table is
// ready to use and holds the empty ring. A Table must not be copied after
// first use.
type Table struct {
	cur   atomic.Pointer[Ring]
	empty Ring // returned while nothing (or nil) is stored
}

// Load returns the current Ring, never nil; it is the empty ring until a
// non-nil Ring is stored. Safe for concurrent use; it takes no lock.
func (t *Table) Load() *Ring {
	if r := t.cur.Load(); r != nil {
		return r
	}
	return &t.empty
}

// Store publishes r as the current Ring; Store(nil) publishes the empty
// ring. Safe for concurrent use.
func (t *Table) Store(r *Ring) {
	t.cur.Store(r)
}
