package replication

import (
	"github.com/ringlimit/ringlimit/bucket"
)

// Recorder is the store a node's forwarder applies ops to (a
// transport.Applier): every op it applies (for keys this node owns, for
// batches peers send here, and for fallbacks) goes to the store, and every
// write is recorded in log for the key's replicas, which a Replicator
// sends. A nil log records nothing (replication is off).
//
// It is also the forwarder's transport.AnswerCache: shadow keeps the
// owners' recent answers for fixed-window keys that have used at least half
// their limit, and a key decided here instead of at its owner first merges
// that answer into the store. shadow is bounded and never replicated,
// handed off or synced. A Recorder is safe for concurrent use.
type Recorder struct {
	store    Store
	log      *writeLog
	shadow   *bucket.Store // nil: remember nothing
	released releasedBook  // leased hits taken back (Release)
}

// shadowMaxKeys and shadowMaxBytes bound the answers a Recorder remembers:
// their number, and their memory as bucket.StoreConfig.MaxBytes counts it
// (keys of up to 4 KiB would otherwise take about 270 MiB).
const (
	shadowMaxKeys  = 1 << 16
	shadowMaxBytes = 16 << 20
)

// NewRecorder returns a Recorder applying ops to store. With record, it
// keeps a log of the writes for a Replicator with Replicas > 1 to send.
func NewRecorder(store Store, record bool) *Recorder {
	r := &Recorder{store: store, shadow: bucket.NewStore(bucket.StoreConfig{MaxKeys: shadowMaxKeys, MaxBytes: shadowMaxBytes})}
	if record {
		r.log = newWriteLog()
	}
	return r
}

// Remember implements transport.AnswerCache. Answers far below their
// limit are not kept: a fallback from a lower count cannot allow such a key
// past it.
func (s *Recorder) Remember(now int64, op *bucket.Op, r bucket.Result) {
	if s.shadow == nil || (!r.Over && r.Remaining > r.Count) || op.Limit.Unit <= 0 ||
		op.Limit.Algorithm != bucket.FixedWindow {
		return // an answer's meaning is only this simple for fixed windows
	}
	count := r.Count
	if op.Mode == bucket.Peek || (op.Mode == bucket.StopOnOver && r.Over) {
		count -= min(count, op.Hits) // the owner did not store these hits
	}
	// The owner's window ends ResetAfter from now, give or take the
	// latency and clock skew; windows end on multiples of the unit.
	unit := op.Limit.Unit
	end := now + r.ResetAfter
	end -= end % unit
	if r := (now + r.ResetAfter) % unit; r >= unit/2 {
		end += unit
	}
	s.shadow.Merge(now, op.Key, bucket.State{Algorithm: op.Limit.Algorithm, Window: end - unit, Unit: unit, Count: count})
}

// OverUntil implements transport.AnswerCache: a fixed-window key whose
// owner last answered a count over op's limit stays over until that window
// ends, so it is answered here without a forward (the owner is the one that said
// so: every entry node that asks learns the same). The answer reports the
// hits as if counted; the owner does not see them, which only lowers the
// count it reports beyond the limit.
func (s *Recorder) OverUntil(now int64, op *bucket.Op) (bucket.Result, bool) {
	if s.shadow == nil || op.Limit.Algorithm != bucket.FixedWindow {
		return bucket.Result{}, false
	}
	st, ok := s.shadow.Get(now, op.Key)
	if !ok || st.Algorithm != bucket.FixedWindow || st.Unit != op.Limit.Unit || st.Count <= op.Limit.Requests {
		return bucket.Result{}, false
	}
	end := st.Window + st.Unit
	if end <= now {
		return bucket.Result{}, false
	}
	return bucket.Result{Over: true, Count: st.Count + min(op.Hits, ^uint64(0)-st.Count), ResetAfter: end - now}, true
}

// Adopt merges the remembered answers for the keys owns reports into the
// store, recording what it raised for the replicas. A node that becomes a
// key's owner because the owner left its ring (dead, or cut off by a
// partition) and that holds no replica of the key would otherwise start it
// from zero: with this it continues from the last count the owner gave it.
// Merging keeps the larger count, so a key it holds already is unharmed.
func (s *Recorder) Adopt(now int64, owns func(key []byte) bool) {
	if s.shadow == nil {
		return
	}
	s.shadow.Range(now, func(key []byte, st bucket.State) bool {
		if owns(key) && s.fits(now, key, st) && s.store.Merge(now, key, st) && s.log != nil {
			s.log.record(key, st)
		}
		return true
	})
}

// fits reports whether a remembered state may be merged into key's
// counter: not when the store holds a live counter for key with another
// unit or algorithm (a reload changed the limit, or a request-level
// override shares the descriptor), which a merge would replace.
func (s *Recorder) fits(now int64, key []byte, st bucket.State) bool {
	cur, ok := s.store.Get(now, key)
	return !ok || (cur.Unit == st.Unit && cur.Algorithm == st.Algorithm)
}

// ApplyInstead implements transport.AnswerCache.
func (s *Recorder) ApplyInstead(now int64, op *bucket.Op) bucket.Result {
	if s.shadow != nil {
		if st, ok := s.shadow.Get(now, op.Key); ok && s.fits(now, op.Key, st) {
			s.store.Merge(now, op.Key, st)
		}
	}
	return s.Apply(now, op)
}

// Release implements transport.Releaser: unused leased quota goes back to
// the store (bucket.Store.Release). It is not recorded: the replicas keep
// the count that included the lease, which only refuses earlier should they
// take over. granted is the count the owner answered with the lease: the
// book keeps copies that come back (Merge) from counting the hits again.
func (s *Recorder) Release(now int64, key []byte, lim bucket.Limit, window int64, hits, granted uint64) bool {
	if !s.store.Release(now, key, lim, window, hits) {
		return false
	}
	s.released.note(now, key, lim, window, hits, granted)
	return true
}

// Merge merges a peer's copy of key's counter into the store (see
// bucket.Store.Merge), less the leased hits this node took back from it
// since the copy was made (releasedBook).
func (s *Recorder) Merge(now int64, key []byte, st bucket.State) bool {
	return s.store.Merge(now, key, s.released.adjust(now, key, st))
}

// Apply implements transport.Applier. It allocates nothing once the log's
// buffers have grown to their steady-state size.
func (s *Recorder) Apply(now int64, op *bucket.Op) bucket.Result {
	r, st, wrote := s.store.ApplyState(now, op)
	if wrote && s.log != nil {
		s.log.record(op.Key, st)
	}
	return r
}
