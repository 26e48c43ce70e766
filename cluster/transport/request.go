package transport

import (
	"bytes"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/clock"
)

// States of a forwarded item.
const (
	fwdPending   uint32 = iota // queued or in flight
	fwdDone                    // a sender wrote res and err
	fwdAbandoned               // the waiter gave up and fell back
)

// fwdRequest is the forwarded part of one Apply call. It is pooled; items
// keep their key buffers across uses.
type fwdRequest struct {
	// pending counts items not yet completed, plus one guard while Apply
	// is adding items. Whoever brings it to zero from a sender signals done.
	pending atomic.Int32
	done    chan struct{} // capacity 1
	// timer bounds the waiter's wait: made once per pooled request on the
	// forwarder's clock, stopped, and Reset for each use.
	timer clock.Timer
	items []*fwdItem // items[:n] are in use
	n     int
	// deadline is when the waiter gives up, Unix ns on the entry node's
	// clock: an owner that reads the batch later must not apply it.
	deadline int64
	// wait is how long the waiter waits, read once with deadline.
	wait time.Duration
	// relayed marks the request's items (see fwdItem.relayed).
	relayed bool
}

func newFwdRequest(c clock.Clock) *fwdRequest {
	t := c.NewTimer(time.Hour)
	t.Stop()
	return &fwdRequest{done: make(chan struct{}, 1), timer: t}
}

// add takes the next item, copies op into it (the key too: a sender may
// read it after Apply returned) and counts it as pending.
func (r *fwdRequest) add(index int, p *peerClient, op *bucket.Op) *fwdItem {
	if r.n == len(r.items) {
		r.items = append(r.items, &fwdItem{req: r})
	}
	it := r.items[r.n]
	r.n++
	it.index = index
	it.deadline = r.deadline
	it.relayed = r.relayed
	it.peer = p
	it.err = nil
	it.res = bucket.Result{}
	it.span, it.traced = nil, false
	it.want, it.slot, it.leased = 0, nil, 0
	it.key = append(it.key[:0], op.Key...)
	it.op = *op
	it.op.Key = it.key
	it.state.Store(fwdPending)
	r.pending.Add(1)
	return it
}

// forwards reports whether an item of r is for key.
func (r *fwdRequest) forwards(key []byte) bool {
	for _, it := range r.items[:r.n] {
		if bytes.Equal(it.key, key) {
			return true
		}
	}
	return false
}

// unadd takes back the last item, which was never queued.
func (r *fwdRequest) unadd() {
	r.n--
	r.pending.Add(-1)
	r.items[r.n].peer = nil
}

// release drops references before r goes back to the pool.
func (r *fwdRequest) release() {
	for _, it := range r.items[:r.n] {
		it.peer = nil
		it.err = nil
		it.span = nil
		it.slot = nil
	}
	r.n = 0
}

// fwdItem is one forwarded op.
type fwdItem struct {
	req   *fwdRequest
	peer  *peerClient
	index int // in the caller's ops
	// deadline is the request's deadline (Unix ns, entry node's clock).
	deadline int64
	// relayed is set for an op a relaying node (it leaves, or has just
	// joined) relays for a peer; a batch holds only relayed items or only
	// others (see peerClient.sendLoop).
	relayed bool
	key     []byte
	op      bucket.Op // op.Key aliases key
	state   atomic.Uint32
	res     bucket.Result // written by a sender before state becomes fwdDone
	err     error         // idem
	// With a tracer, for an op of a sampled decision (trace.go): its
	// forward span, touched by the waiter only, and that span's context,
	// written before the item is queued and read by its sender.
	span   trace.Span
	trace  wireTrace
	traced bool
	// Quota leases (lease.go): now is when the caller's call began (entry
	// clock, Unix ns); want is the quota the op asks its owner to lease
	// (0: none), and slot takes the answer, in the sender; leased is what
	// the owner granted, for the waiter's answer cache.
	now    int64
	want   uint64
	slot   *leaseSlot
	leased uint64
}

// complete hands the owner's answer (or err) to the waiter, unless it gave
// up; it reports whether the waiter was still waiting. The sender must not
// touch it afterwards.
func (it *fwdItem) complete(res bucket.Result, err error) (waited bool) {
	req := it.req
	it.res, it.err = res, err
	if !it.state.CompareAndSwap(fwdPending, fwdDone) {
		return false
	}
	if req.pending.Add(-1) == 0 {
		req.done <- struct{}{} // only one sender reaches zero; capacity 1
	}
	return true
}
