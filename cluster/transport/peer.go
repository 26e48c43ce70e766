package transport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/wire"
)

// errPeerClosed completes the ops still queued to a peer client that closed.
var errPeerClosed = errors.New("transport: peer client closed")

// peerClient is the client side of one peer: a connection, a queue of
// forwarded ops, fwdInflight sender goroutines that drain the queue into
// Decide batches (each on its own DecideStream), and a probe goroutine
// (suspect.go). close stops and joins
// them all.
type peerClient struct {
	f      *Forwarder
	id     string
	addr   string
	conn   *grpc.ClientConn
	client peerpb.PeerClient

	queue chan *fwdItem
	ctx   context.Context // cancelled by close: ends in-flight RPCs
	stop  context.CancelFunc
	done  chan struct{} // closed by close
	wg    sync.WaitGroup

	// back (capacity 1) wakes a sender that holds back its batch: a batch
	// to the peer came back, or the queue holds a full batch (see sendLoop).
	back     chan struct{}
	inflight atomic.Int32 // batches in a round trip to the peer
	rtt      atomic.Int64 // smoothed Decide round trip, ns on f.clock (0: none yet)

	unaryUntil   atomic.Int64 // f.mono() until which Decide calls replace DecideStream (the peer has none)
	suspect      atomic.Bool
	fails        atomic.Int32  // failures since the last answer
	onTime       atomic.Int64  // f.mono() when p last answered a waiter in time (0: never)
	suspectSince atomic.Int64  // f.mono() when suspect was set
	wake         chan struct{} // capacity 1: wakes the probe
	gone         atomic.Bool   // set when close begins
	closeOnce    sync.Once
	closeErr     error
}

func newPeerClient(f *Forwarder, id, addr string) (*peerClient, error) {
	conn, err := grpc.NewClient(addr, f.dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("transport: dial peer %s at %s: %w", id, addr, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &peerClient{
		f:      f,
		id:     id,
		addr:   addr,
		conn:   conn,
		client: peerpb.NewPeerClient(conn),
		queue:  make(chan *fwdItem, max(f.maxBatch*fwdInflight, fwdMinQueue)),
		back:   make(chan struct{}, 1),
		ctx:    ctx,
		stop:   stop,
		done:   make(chan struct{}),
		wake:   make(chan struct{}, 1),
	}
	conn.Connect() // be ready before the first forwarded op
	p.wg.Add(fwdInflight + 1)
	for range fwdInflight {
		go p.sendLoop()
	}
	go p.probeLoop()
	return p, nil
}

// holds reports whether leases this peer granted may be used: it is not
// suspect and its client is not closed (it left this node's peers).
func (p *peerClient) holds() bool { return !p.suspect.Load() && !p.gone.Load() }

// enqueue queues it without blocking. ok is false when the queue is full or
// the client is closed (closed is then true).
func (p *peerClient) enqueue(it *fwdItem) (ok, closed bool) {
	select {
	case <-p.done:
		return false, true
	default:
	}
	select {
	case p.queue <- it:
		if len(p.queue) >= p.f.maxBatch {
			p.wakeLinger() // a full batch waits: no reason to hold it back
		}
		return true, false
	default:
		return false, false
	}
}

// wakeLinger ends the wait of a sender that holds back its batch, if one
// does. A wake-up no sender waits for is dropped by the next sender before
// it waits.
func (p *peerClient) wakeLinger() {
	select {
	case p.back <- struct{}{}:
	default:
	}
}

// linger returns how long a sender may hold back a batch that is not full
// while another batch to the peer is in flight: a quarter of the smoothed
// round trip, at most fwdMaxLinger; 0 before any round trip was timed.
func (p *peerClient) linger() time.Duration {
	return min(time.Duration(p.rtt.Load())/4, fwdMaxLinger)
}

// noteRTT adds one round trip of d to the smoothed round trip (weight 1/8).
// The two senders' updates may interleave; the estimate only sizes a
// linger.
func (p *peerClient) noteRTT(d time.Duration) {
	old := p.rtt.Load()
	if old == 0 {
		p.rtt.Store(max(int64(d), 0))
		return
	}
	p.rtt.Store(old + (int64(d)-old)/8)
}

// close stops the client: it cancels in-flight RPCs, joins the goroutines,
// fails the ops still queued and closes the connection. Idempotent.
func (p *peerClient) close() error {
	p.closeOnce.Do(func() {
		p.gone.Store(true)
		close(p.done)
		p.stop()
		p.wg.Wait()
		p.failQueued()
		p.closeErr = p.conn.Close()
	})
	return p.closeErr
}

// failQueued completes every queued item with errPeerClosed. An item queued
// after this (a race with close) waits for its request's timeout.
func (p *peerClient) failQueued() {
	for {
		select {
		case it := <-p.queue:
			p.f.leaseAnswered(it, nil)
			it.complete(bucket.Result{}, errPeerClosed)
		default:
			return
		}
	}
}

// peerSendBuf is one sender's reusable request and its stream.
type peerSendBuf struct {
	batch []*fwdItem
	req   peerpb.DecideRequest
	ops   []peerpb.Op // backing store of req.Ops
	ptrs  []*peerpb.Op

	stream wire.Lockstep[peerpb.DecideRequest, peerpb.DecideResponse]
	resp   peerpb.DecideResponse
}

// roundTrip sends b.req and returns the owner's answer: on the sender's
// DecideStream (opened on first use, again after it ends or fails, and
// before it is wire.StreamMaxAge old, so the owner's admission checks run
// again), or with a Decide call when the owner does not serve DecideStream
// (then for wire.StreamMaxAge, after which the stream is tried again). The
// answer is good until the next roundTrip. A refusal the owner reports
// in-band is returned as the status error Decide would have returned. The
// whole exchange, opening the stream included, waits at most
// max(Timeout, fwdMaxWait); a stream that does not answer in that time is
// ended.
func (p *peerClient) roundTrip(b *peerSendBuf) (*peerpb.DecideResponse, error) {
	limit := max(p.f.timeout, fwdMaxWait)
	if p.f.mono() < p.unaryUntil.Load() {
		ctx, cancel := context.WithTimeout(p.ctx, limit)
		defer cancel()
		return p.client.Decide(ctx, &b.req)
	}
	err := b.stream.Exchange(p.ctx, limit, wire.StreamMaxAge, &b.req, &b.resp)
	if status.Code(err) == codes.Unimplemented {
		// The owner never ran a handler: send the batch again as a call.
		now := p.f.mono()
		if prev := p.unaryUntil.Swap(now + int64(wire.StreamMaxAge)); prev <= now {
			p.f.log.Info("transport: peer has no DecideStream; using Decide calls", "peer", p.id, "addr", p.addr)
		}
		return p.roundTrip(b)
	}
	if err != nil {
		return nil, err
	}
	if b.resp.GetLast() {
		b.stream.Drop()
	}
	if c := codes.Code(b.resp.GetCode()); c != codes.OK {
		return nil, status.Error(c, b.resp.GetMessage())
	}
	return &b.resp, nil
}

// sendLoop takes whatever is queued, up to MaxBatch ops and
// fwdMaxBatchBytes of keys, and sends it as one Decide batch. When no other
// batch to the peer is in flight, it sends at once, never waiting for more
// ops. When one is and the batch is not full, it holds the batch back to
// collect more, until the batch in flight comes back, the queue holds a
// full batch, or a quarter of the peer's smoothed round trip (at most
// fwdMaxLinger) has passed, whichever is first; it then takes what was
// queued meanwhile and sends. So a lone op goes out at once, and an op that
// arrives while a batch is in flight waits at most fwdMaxLinger more.
func (p *peerClient) sendLoop() {
	defer p.wg.Done()
	maxOps := p.f.maxBatch
	b := &peerSendBuf{
		batch: make([]*fwdItem, 0, maxOps),
		ops:   make([]peerpb.Op, maxOps),
		ptrs:  make([]*peerpb.Op, 0, maxOps),
	}
	b.req.From = p.f.self
	b.stream.Open, b.stream.Clock = p.client.DecideStream, p.f.clock
	defer b.stream.Drop()
	// timer bounds a linger: made once, stopped, and Reset for each.
	timer := p.f.clock.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var carry *fwdItem // taken from the queue but did not fit the last batch
	for {
		first := carry
		if first == nil {
			select {
			case first = <-p.queue:
			case <-p.done:
				return
			}
		}
		b.batch = append(b.batch[:0], first)
		size := len(first.key)
		carry, size = p.fill(b, size)
		if carry == nil && len(b.batch) < maxOps && p.holdBack(timer) {
			carry, _ = p.fill(b, size)
		}
		p.decide(b)
		clear(b.batch)
	}
}

// holdBack waits, when another batch to the peer is in flight, until that
// batch comes back, the queue holds a full batch, linger has passed (on
// timer) or the client closes, and reports whether it waited. It does not
// wait before any round trip was timed.
func (p *peerClient) holdBack(timer clock.Timer) bool {
	d := p.linger()
	if d <= 0 || p.inflight.Load() == 0 {
		return false
	}
	// A wake-up left from before (a batch that came back, or a full
	// queue, while no sender waited) must not end this wait.
	select {
	case <-p.back:
	default:
	}
	if p.inflight.Load() == 0 {
		return false // it came back meanwhile
	}
	timer.Reset(d)
	select {
	case <-p.back:
	case <-timer.C():
	case <-p.done:
	}
	timer.Stop()
	return true
}

// fill adds to b.batch, whose key bytes are size, the ops queued now, up to
// MaxBatch ops and fwdMaxBatchBytes; it never waits. It returns the op it
// took that did not fit (nil if none) and the batch's key bytes.
func (p *peerClient) fill(b *peerSendBuf, size int) (carry *fwdItem, _ int) {
	relayed := b.batch[0].relayed
	for len(b.batch) < p.f.maxBatch {
		select {
		case it := <-p.queue:
			// A batch is relayed or not as a whole: an op of the other
			// kind waits for the next batch.
			if size+len(it.key) > fwdMaxBatchBytes || it.relayed != relayed {
				return it, size
			}
			size += len(it.key)
			b.batch = append(b.batch, it)
		default:
			return nil, size
		}
	}
	return nil, size
}

// decide sends b.batch as one Decide batch and completes its items.
func (p *peerClient) decide(b *peerSendBuf) {
	live := b.batch[:0]
	b.ptrs = b.ptrs[:0]
	b.req.DeadlineNs = 0
	b.req.Relayed = len(b.batch) > 0 && b.batch[0].relayed
	for _, it := range b.batch {
		if it.state.Load() == fwdAbandoned {
			p.f.leaseAnswered(it, nil)
			continue // its waiter has decided it already: do not count it twice
		}
		o := &b.ops[len(live)]
		o.Key = it.op.Key
		o.Algorithm = uint32(it.op.Limit.Algorithm)
		o.Requests = it.op.Limit.Requests
		o.UnitNs = it.op.Limit.Unit
		o.Hits = it.op.Hits
		o.Mode = uint32(it.op.Mode)
		o.Burst = it.op.Limit.Burst
		o.Lease = it.want
		o.Trace = nil
		if it.traced {
			o.Trace = it.trace[:]
		}
		b.ptrs = append(b.ptrs, o)
		live = append(live, it)
		if b.req.DeadlineNs == 0 || it.deadline < b.req.DeadlineNs {
			// The earliest waiter: no op is applied after its waiter gave up.
			b.req.DeadlineNs = it.deadline
		}
	}
	if len(live) == 0 {
		return
	}
	b.req.Ops = b.ptrs
	start := p.f.clock.Now()
	p.inflight.Add(1)
	resp, err := p.roundTrip(b)
	p.inflight.Add(-1)
	p.wakeLinger() // the other sender may send its batch now
	took := p.f.clock.Now().Sub(start)
	p.noteRTT(took)
	p.f.m.rpcDuration.Observe(took.Seconds())
	p.f.m.batchSize.Observe(float64(len(live)))
	for i := range b.ops[:len(live)] {
		b.ops[i].Key, b.ops[i].Trace = nil, nil // do not pin the items' buffers
	}
	if err == nil && len(resp.GetResults()) != len(live) {
		err = fmt.Errorf("transport: peer %s answered %d results for %d ops", p.id, len(resp.GetResults()), len(live))
	}
	if err != nil {
		// A refused batch means a protocol mismatch, not a down peer; a
		// closing client is not the peer's fault either.
		// A missed deadline was already noted by the waiters, as a timeout.
		switch status.Code(err) {
		case codes.InvalidArgument, codes.DeadlineExceeded:
		default:
			if p.ctx.Err() == nil {
				p.noteFailure("error", err)
			}
		}
		for _, it := range live {
			p.f.leaseAnswered(it, nil)
			it.complete(bucket.Result{}, err)
		}
		return
	}
	inTime := false
	for i, it := range live {
		r := resp.Results[i]
		if it.slot != nil {
			it.leased = r.GetLeased()
			p.f.leaseAnswered(it, r)
		}
		inTime = it.complete(bucket.Result{
			Over:       r.GetOver(),
			Count:      r.GetCount(),
			Remaining:  r.GetRemaining(),
			ResetAfter: r.GetResetAfterNs(),
		}, nil) || inTime
	}
	if inTime {
		// Only an answer someone still waited for clears the failures and
		// counts as in time: a peer whose every answer comes after its
		// callers gave up is as good as down for them.
		p.fails.Store(0)
		p.onTime.Store(p.f.mono())
	}
}
