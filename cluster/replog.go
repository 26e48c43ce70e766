package cluster

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/ringlimit/ringlimit/bucket"
)

// Store is what a Node needs of its counter store. *bucket.Store implements
// it. It must be safe for concurrent use.
type Store interface {
	// ApplyState decides op at now and reports the state it wrote, if any
	// (see bucket.Store.ApplyState). It must not retain op.
	ApplyState(now int64, op *bucket.Op) (bucket.Result, bucket.State, bool)
	// Merge combines a peer's state for key into the store (see
	// bucket.Store.Merge). It must not retain key.
	Merge(now int64, key []byte, st bucket.State) bool
	// Range calls fn for every entry live at now until fn returns false;
	// key is valid only during the call.
	Range(now int64, fn func(key []byte, st bucket.State) bool)
	// Get returns key's live state at now, if any (see bucket.Store.Get).
	Get(now int64, key []byte) (bucket.State, bool)
}

// recordingStore is the Applier a Node gives its forwarder: every op it
// applies (for keys this node owns, for batches peers send here, and for
// fallbacks) goes to the store, and every write is recorded in log for the
// key's replicas. A nil log records nothing (replication is off).
//
// It is also the forwarder's transport.AnswerCache: shadow keeps the owners' recent
// answers for fixed-window keys that have used at least half their limit,
// and a key
// decided here instead of at its owner first merges that answer into the
// store. shadow is bounded and never replicated, handed off or synced.
type recordingStore struct {
	store  Store
	log    *replLog
	shadow *bucket.Store // nil: remember nothing
}

// shadowMaxKeys and shadowMaxBytes bound the answers a Node remembers:
// their number, and their memory as bucket.StoreConfig.MaxBytes counts it
// (keys of up to 4 KiB would otherwise take about 270 MiB).
const (
	shadowMaxKeys  = 1 << 16
	shadowMaxBytes = 16 << 20
)

// Remember implements transport.AnswerCache. Answers far below their limit are not
// kept: a fallback from a lower count cannot allow such a key past it.
func (s recordingStore) Remember(now int64, op *bucket.Op, r bucket.Result) {
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

// OverUntil implements transport.AnswerCache: a fixed-window key whose owner last
// answered a count over op's limit stays over until that window ends, so
// it is answered here without a forward (the owner is the one that said
// so: every entry node that asks learns the same). The answer reports the
// hits as if counted; the owner does not see them, which only lowers the
// count it reports beyond the limit.
func (s recordingStore) OverUntil(now int64, op *bucket.Op) (bucket.Result, bool) {
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

// adopt merges the remembered answers for the keys owns reports into the
// store, recording what it raised for the replicas. A node that becomes a
// key's owner because the owner left its ring (dead, or cut off by a
// partition) and that holds no replica of the key would otherwise start it
// from zero: with this it continues from the last count the owner gave it.
// Merging keeps the larger count, so a key it holds already is unharmed.
func (s recordingStore) adopt(now int64, owns func(key []byte) bool) {
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
func (s recordingStore) fits(now int64, key []byte, st bucket.State) bool {
	cur, ok := s.store.Get(now, key)
	return !ok || (cur.Unit == st.Unit && cur.Algorithm == st.Algorithm)
}

// ApplyInstead implements transport.AnswerCache.
func (s recordingStore) ApplyInstead(now int64, op *bucket.Op) bucket.Result {
	if s.shadow != nil {
		if st, ok := s.shadow.Get(now, op.Key); ok && s.fits(now, op.Key, st) {
			s.store.Merge(now, op.Key, st)
		}
	}
	return s.Apply(now, op)
}

// Apply implements transport.Applier. It allocates nothing once the log's buffers
// have grown to their steady-state size.
func (s recordingStore) Apply(now int64, op *bucket.Op) bucket.Result {
	r, st, wrote := s.store.ApplyState(now, op)
	if wrote && s.log != nil {
		s.log.record(op.Key, st)
	}
	return r
}

// Bounds of the replication log.
const (
	// replStripes is how many independently locked buffers record writes.
	replStripes = 16
	// replStripeRecs bounds the records one stripe holds between two
	// flushes; replStripeBytes bounds their key bytes.
	replStripeRecs  = 8192
	replStripeBytes = 1 << 20
)

// replLog collects (key, state) records from the hit path. Writers append to
// one of replStripes buffers picked by the key's hash, under that stripe's
// short lock; the replicator swaps each buffer for an empty one and reads
// it without holding any lock. Key bytes are copied into one growing byte
// slice per buffer, so recording allocates nothing in steady state. A full
// stripe drops the record and counts it: the next write of the same key
// carries its whole state again, so a drop only delays a replica.
type replLog struct {
	stripes  [replStripes]replStripe
	maxRecs  int
	maxBytes int
	dropped  atomic.Uint64
}

// replStripe pads one stripe to its own cache lines.
type replStripe struct {
	replStripeData
	_ [64 - unsafe.Sizeof(replStripeData{})%64]byte
}

type replStripeData struct {
	mu  sync.Mutex
	buf replBuf
}

// replBuf is a batch of records. keys holds the key bytes of all records
// back to back.
type replBuf struct {
	keys []byte
	recs []replRec
}

// replRec is one recorded write: key = keys[off:off+n].
type replRec struct {
	off, n uint32
	st     bucket.State
}

func newReplLog() *replLog {
	return &replLog{maxRecs: replStripeRecs, maxBytes: replStripeBytes}
}

// record appends (key, st) to key's stripe, or counts a drop when the
// stripe is full. It copies key.
func (l *replLog) record(key []byte, st bucket.State) {
	s := &l.stripes[xxhash.Sum64(key)%replStripes]
	s.mu.Lock()
	b := &s.buf
	if len(b.recs) >= l.maxRecs || len(b.keys)+len(key) > l.maxBytes {
		s.mu.Unlock()
		l.dropped.Add(1)
		return
	}
	off := len(b.keys)
	b.keys = append(b.keys, key...)
	b.recs = append(b.recs, replRec{off: uint32(off), n: uint32(len(key)), st: st})
	s.mu.Unlock()
}

// swap exchanges stripe i's buffer with *spare, which must be empty (its
// capacity is kept), and leaves the recorded batch in *spare.
func (l *replLog) swap(i int, spare *replBuf) {
	s := &l.stripes[i]
	s.mu.Lock()
	s.buf, *spare = *spare, s.buf
	s.mu.Unlock()
}

// key returns the key bytes of r in b.
func (b *replBuf) key(r *replRec) []byte { return b.keys[r.off : r.off+r.n] }

// reset empties b, keeping its capacity.
func (b *replBuf) reset() {
	b.keys = b.keys[:0]
	b.recs = b.recs[:0]
}
