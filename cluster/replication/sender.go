package replication

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/wire"
)

// send ships entries to dest in batches on s and reports to the loop.
func (r *shipper) send(dest string, entries map[string]bucket.State, s *streamSender) {
	defer r.wg.Done()
	res := sendResult{dest: dest, entries: entries, sender: s}
	c := r.conns.Client(dest)
	if c == nil {
		res.err = errNoClient
	} else {
		b := &s.batch
		for k, st := range entries {
			batchAdd(b, k, st)
			if b.full() && !r.sendBatch(&res, s, c) {
				break
			}
		}
		if res.err == nil && b.len() > 0 {
			r.sendBatch(&res, s, c)
		}
	}
	select {
	case r.results <- res:
	case <-r.ctx.Done():
	}
}

// sendBatch sends s's batch to c and accounts for it in res. A batch
// refused as invalid is counted in res.refused and the send goes on: it can
// never succeed and must not hold back the rest. Any other error ends the
// send (res.err); sendBatch reports whether to go on.
func (r *shipper) sendBatch(res *sendResult, s *streamSender, c peerpb.PeerClient) bool {
	n := s.batch.len()
	err := s.send(r.ctx, c, r.self)
	switch {
	case err == nil:
		res.sent += s.batch.sent
		return true
	case status.Code(err) == codes.InvalidArgument:
		res.refused += n
		res.refusedErr = err
		return true
	}
	res.err = err
	return false
}

// streamSender sends one destination's batches on a ReplicateStream (opened
// on first use, again after it ends or fails, and before it is
// wire.StreamMaxAge old), or with Replicate calls for wire.StreamMaxAge after
// the destination answered Unimplemented. It keeps its batch's buffers from
// send to send. Not safe for concurrent use.
type streamSender struct {
	batch      entryBatch
	req        peerpb.ReplicateRequest
	resp       peerpb.ReplicateResponse
	stream     wire.Lockstep[peerpb.ReplicateRequest, peerpb.ReplicateResponse]
	client     peerpb.PeerClient // the stream's
	clock      clock.Clock
	unaryUntil time.Time // on clock
}

// newStreamSender returns a sender whose stream ages and call fallback are
// timed on c.
func newStreamSender(c clock.Clock) *streamSender {
	s := &streamSender{clock: c}
	s.stream.Clock = c
	return s
}

// send sends s.batch as one request to c (bounded by rpcTimeout) and
// empties the batch. The stream ends when ctx does.
func (s *streamSender) send(ctx context.Context, c peerpb.PeerClient, from string) error {
	b := &s.batch
	n := b.len()
	if s.clock.Now().Before(s.unaryUntil) {
		return b.send(ctx, c, from)
	}
	if s.client != c {
		s.stream.Drop() // a new connection to the destination
		s.client, s.stream.Open = c, c.ReplicateStream
	}
	s.req.From, s.req.Entries = from, b.entries()
	err := s.stream.Exchange(ctx, rpcTimeout, wire.StreamMaxAge, &s.req, &s.resp)
	s.req.Entries = nil
	if status.Code(err) == codes.Unimplemented {
		// The destination never ran a handler: send the batch as a call.
		s.unaryUntil = s.clock.Now().Add(wire.StreamMaxAge)
		return b.send(ctx, c, from)
	}
	if err == nil && s.resp.GetCode() != uint32(codes.OK) {
		err = status.Error(codes.Code(s.resp.GetCode()), s.resp.GetMessage())
	}
	b.reset()
	if err != nil {
		b.sent = 0
		return fmt.Errorf("replication: replicate %d entries: %w", n, err)
	}
	b.sent = n
	if s.resp.GetLast() {
		s.stream.Drop()
	}
	return nil
}

// maxBatchBytes bounds the key bytes of one Replicate request or Sync
// chunk, so that it stays under wire.MaxMessageSize with wire.MaxEntries
// entries (TestReplicateBatchFits).
const maxBatchBytes = 1 << 20

// entryBatch builds ReplicateRequests (and Sync chunks) of at most
// wire.MaxEntries entries and maxBatchBytes of keys. It owns copies of the
// keys it is given. Not safe for concurrent use.
type entryBatch struct {
	ents  []peerpb.Entry
	ptrs  []*peerpb.Entry
	bytes int
	sent  int // entries acknowledged by the last send
}

// add appends a copy of (key, st).
func (b *entryBatch) add(key []byte, st bucket.State) { batchAdd(b, key, st) }

// batchAdd appends a copy of (key, st) to b, reusing the entry's key
// buffer; key is the outbox's string or a store's bytes.
func batchAdd[K string | []byte](b *entryBatch, key K, st bucket.State) {
	if len(b.ents) == cap(b.ents) {
		b.grow()
	}
	b.ents = b.ents[:len(b.ents)+1]
	e := &b.ents[len(b.ents)-1]
	e.Key = append(e.Key[:0], key...)
	e.Algorithm = uint32(st.Algorithm)
	e.WindowNs = st.Window
	e.UnitNs = st.Unit
	e.Count = st.Count
	e.Prev = st.Prev
	e.TatNs = st.TAT
	b.bytes += len(key)
}

// grow reallocates ents; ptrs are rebuilt by entries.
func (b *entryBatch) grow() {
	n := max(64, 2*cap(b.ents))
	if n > wire.MaxEntries {
		n = wire.MaxEntries
	}
	next := make([]peerpb.Entry, len(b.ents), n)
	for i := range b.ents {
		next[i].Key = b.ents[i].Key
		next[i].Algorithm = b.ents[i].Algorithm
		next[i].WindowNs = b.ents[i].WindowNs
		next[i].UnitNs = b.ents[i].UnitNs
		next[i].Count = b.ents[i].Count
		next[i].Prev = b.ents[i].Prev
		next[i].TatNs = b.ents[i].TatNs
	}
	b.ents = next
}

func (b *entryBatch) len() int { return len(b.ents) }

// full reports that the batch should be sent before anything is added.
func (b *entryBatch) full() bool {
	return len(b.ents) >= wire.MaxEntries || b.bytes >= maxBatchBytes-wire.MaxKeyLen
}

// entries returns the batch as message entries, valid until the next reset.
func (b *entryBatch) entries() []*peerpb.Entry {
	b.ptrs = b.ptrs[:0]
	for i := range b.ents {
		b.ptrs = append(b.ptrs, &b.ents[i])
	}
	return b.ptrs
}

// reset empties the batch, keeping its buffers.
func (b *entryBatch) reset() {
	b.ents = b.ents[:0]
	b.bytes = 0
}

// send sends the batch as one Replicate RPC (bounded by rpcTimeout)
// and empties it.
func (b *entryBatch) send(ctx context.Context, c peerpb.PeerClient, from string) error {
	n := b.len()
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	_, err := c.Replicate(ctx, &peerpb.ReplicateRequest{From: from, Entries: b.entries()})
	b.reset()
	if err != nil {
		b.sent = 0
		return fmt.Errorf("replication: replicate %d entries: %w", n, err)
	}
	b.sent = n
	return nil
}
