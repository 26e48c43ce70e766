package replication

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/ringlimit/ringlimit/bucket"
)

// Bounds of the replication log.
const (
	// numStripes is how many independently locked buffers record writes.
	numStripes = 16
	// stripeRecs bounds the records one stripe holds between two
	// flushes; stripeBytes bounds their key bytes.
	stripeRecs  = 8192
	stripeBytes = 1 << 20
)

// writeLog collects (key, state) records from the hit path. Writers append to
// one of numStripes buffers picked by the key's hash, under that stripe's
// short lock; the shipper swaps each buffer for an empty one and reads
// it without holding any lock. Key bytes are copied into one growing byte
// slice per buffer, so recording allocates nothing in steady state. A full
// stripe drops the record and counts it: the next write of the same key
// carries its whole state again, so a drop only delays a replica.
type writeLog struct {
	stripes  [numStripes]stripe
	maxRecs  int
	maxBytes int
	dropped  atomic.Uint64
}

// stripe pads one stripe to its own cache lines.
type stripe struct {
	stripeData
	_ [64 - unsafe.Sizeof(stripeData{})%64]byte
}

type stripeData struct {
	mu  sync.Mutex
	buf recBuf
}

// recBuf is a batch of records. keys holds the key bytes of all records
// back to back.
type recBuf struct {
	keys []byte
	recs []logRec
}

// logRec is one recorded write: key = keys[off:off+n].
type logRec struct {
	off, n uint32
	st     bucket.State
}

func newWriteLog() *writeLog {
	return &writeLog{maxRecs: stripeRecs, maxBytes: stripeBytes}
}

// record appends (key, st) to key's stripe, or counts a drop when the
// stripe is full. It copies key.
func (l *writeLog) record(key []byte, st bucket.State) {
	s := &l.stripes[xxhash.Sum64(key)%numStripes]
	s.mu.Lock()
	b := &s.buf
	if len(b.recs) >= l.maxRecs || len(b.keys)+len(key) > l.maxBytes {
		s.mu.Unlock()
		l.dropped.Add(1)
		return
	}
	off := len(b.keys)
	b.keys = append(b.keys, key...)
	b.recs = append(b.recs, logRec{off: uint32(off), n: uint32(len(key)), st: st})
	s.mu.Unlock()
}

// swap exchanges stripe i's buffer with *spare, which must be empty (its
// capacity is kept), and leaves the recorded batch in *spare.
func (l *writeLog) swap(i int, spare *recBuf) {
	s := &l.stripes[i]
	s.mu.Lock()
	s.buf, *spare = *spare, s.buf
	s.mu.Unlock()
}

// key returns the key bytes of r in b.
func (b *recBuf) key(r *logRec) []byte { return b.keys[r.off : r.off+r.n] }

// reset empties b, keeping its capacity.
func (b *recBuf) reset() {
	b.keys = b.keys[:0]
	b.recs = b.recs[:0]
}
