package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/ring"
)

const (
	// maxPending bounds the distinct keys waiting for one destination;
	// beyond it new keys are dropped (and counted).
	maxPending = 1 << 17
	// rpcTimeout bounds one Replicate RPC.
	rpcTimeout = time.Second
	// retryMin and retryMax bound the backoff before entries that
	// failed to reach a destination are sent again. retryMax stays far
	// below the join relay (2 s): a peer killed and restarted within
	// failure detection is never dropped from the ring, so the backoff
	// its dead process earned is still running when the new one relays,
	// and the copies it is owed must reach it before its relay ends.
	retryMin = 50 * time.Millisecond
	retryMax = 250 * time.Millisecond
	// logEvery rate-limits the log line about dropped entries.
	logEvery = 10 * time.Second
)

// errNoClient fails a send to a destination the forwarder has no
// connection to (it is not, or no longer, a peer).
var errNoClient = errors.New("replication: no connection to peer")

// shipper is the goroutine that ships the writes recorded in its log to
// each key's replicas: every interval it takes the log's buffers, groups the
// records by destination (the key's first `replicas` successors on the
// targets ring, minus this node), coalesces them per key to the latest
// state, and sends one Replicate RPC per destination. Each destination has
// at most one send in flight; what accumulates meanwhile, or what a failed
// send gives back, waits in the destination's bounded backlog and is sent
// again with backoff until the destination leaves the ring. A batch the
// destination refuses as invalid (InvalidArgument: a peer of another
// version, say) is dropped instead, since it can never succeed, and the
// send goes on with the other batches. Nothing here ever blocks the hit
// path. close stops and joins every goroutine.
type shipper struct {
	self     string
	replicas int
	log      *writeLog
	clock    clock.Clock // nil: clock.Real()
	interval time.Duration
	targets  func() *ring.Ring // the ring that places replicas now
	conns    Conns
	m        *metrics
	logger   *slog.Logger

	// Owned by the loop goroutine.
	spare     [numStripes]recBuf
	out       map[string]*outbox
	dsts      []string
	lastRing  *ring.Ring
	members   map[string]bool
	lastLog   time.Time
	logDrops  [dropReasons]uint64 // drops since the last log line
	seenDrops uint64              // log.dropped already accounted

	results  chan sendResult
	flushReq chan chan error
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once
}

// outbox is what waits for one destination.
type outbox struct {
	pending  map[string]bucket.State
	spare    map[string]bucket.State // an empty map to swap in at the next send
	inflight bool
	fails    int
	retryAt  time.Time
	lastErr  error // of the last send, nil after a success
	// sender is the destination's stream and buffers: the loop's while no
	// send is in flight, the send's while one is (it comes back with the
	// result).
	sender *streamSender
}

// sendResult reports one finished send to the loop. entries is the map
// that was sent: emptied after a success, untouched after a failure.
type sendResult struct {
	dest    string
	entries map[string]bucket.State
	sender  *streamSender
	sent    int
	err     error
	// refused counts the entries of batches the destination refused as
	// invalid (refusedErr says why): dropped, since sent again they would
	// be refused again; the send went on with the other batches.
	refused    int
	refusedErr error
}

// Reasons a recorded write is dropped before it reaches a replica.
const (
	dropQueueFull   = iota // the log's stripe was full
	dropBacklogFull        // the destination's backlog was full
	dropGone               // the destination left the ring first
	dropRefused            // the destination refused the batch as invalid
	dropReasons
)

var dropNames = [dropReasons]string{"queue_full", "backlog_full", "gone", "refused"}

// start launches the loop. The zero-valued fields are filled first.
func (r *shipper) start() {
	r.out = make(map[string]*outbox)
	r.results = make(chan sendResult)
	r.flushReq = make(chan chan error)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.clock = clock.Or(r.clock)
	r.lastLog = r.clock.Now()
	r.wg.Add(1)
	go r.loop()
}

// close stops the loop and cancels and joins the sends in flight; what is
// still recorded or pending is dropped. Idempotent.
func (r *shipper) close() {
	r.once.Do(func() {
		r.cancel()
		r.wg.Wait()
		for _, ob := range r.out {
			if ob.sender != nil {
				ob.sender.stream.Drop()
			}
		}
	})
}

// flush sends everything recorded so far to every destination at once,
// ignoring backoff, and waits until those sends finished or ctx ended. It
// returns an error when a send failed and its writes are still waiting
// (they are retried as usual).
func (r *shipper) flush(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case r.flushReq <- done:
	case <-r.ctx.Done():
		return errors.New("replication: closed")
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// undelivered reports the writes waiting in backlogs after a failed send,
// or nil.
func (r *shipper) undelivered() error {
	var (
		writes, dests int
		last          error
	)
	for _, ob := range r.out {
		if len(ob.pending) > 0 && ob.lastErr != nil {
			writes += len(ob.pending)
			dests++
			last = ob.lastErr
		}
	}
	if dests == 0 {
		return nil
	}
	return fmt.Errorf("replication: %d writes to %d replicas not delivered: %w", writes, dests, last)
}

func (r *shipper) loop() {
	defer r.wg.Done()
	t := r.clock.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C():
			r.cycle(false)
		case res := <-r.results:
			r.finished(res)
		case done := <-r.flushReq:
			r.cycle(true)
			r.drainInflight()
			done <- r.undelivered()
		}
	}
}

// drainInflight handles results until no send is in flight.
func (r *shipper) drainInflight() {
	for {
		busy := false
		for _, ob := range r.out {
			busy = busy || ob.inflight
		}
		if !busy {
			return
		}
		select {
		case res := <-r.results:
			r.finished(res)
		case <-r.ctx.Done():
			return
		}
	}
}

// cycle moves the recorded writes into the destinations' backlogs and
// starts a send for every idle destination with something to send (force:
// even one waiting out a backoff).
func (r *shipper) cycle(force bool) {
	rg := r.targets()
	if rg != r.lastRing {
		r.lastRing = rg
		r.members = make(map[string]bool, rg.Len())
		for _, id := range rg.Members() {
			r.members[id] = true
		}
	}
	for i := range r.spare {
		b := &r.spare[i]
		r.log.swap(i, b)
		for j := range b.recs {
			rec := &b.recs[j]
			key := b.key(rec)
			r.dsts = rg.Successors(key, r.replicas, r.dsts[:0])
			for _, d := range r.dsts {
				if d != r.self {
					r.add(d, key, rec.st)
				}
			}
		}
		b.reset()
	}
	if d := r.log.dropped.Load(); d != r.seenDrops {
		r.m.drop[dropQueueFull].Add(float64(d - r.seenDrops))
		r.logDrops[dropQueueFull] += d - r.seenDrops
		r.seenDrops = d
	}
	now := r.clock.Now()
	for d, ob := range r.out {
		switch {
		case ob.inflight:
		case !r.members[d]:
			r.dropCount(dropGone, len(ob.pending))
			if ob.sender != nil {
				ob.sender.stream.Drop()
			}
			delete(r.out, d)
		case len(ob.pending) > 0 && (force || !now.Before(ob.retryAt)):
			r.launch(d, ob)
		}
	}
	r.maybeLog(now)
}

// add coalesces (key, st) into d's backlog.
func (r *shipper) add(d string, key []byte, st bucket.State) {
	ob := r.out[d]
	if ob == nil {
		ob = &outbox{pending: make(map[string]bucket.State)}
		r.out[d] = ob
	}
	if cur, ok := ob.pending[string(key)]; ok {
		ob.pending[string(key)] = bucket.MaxState(cur, st)
		return
	}
	if len(ob.pending) >= maxPending {
		r.dropCount(dropBacklogFull, 1)
		return
	}
	ob.pending[string(key)] = st
}

func (r *shipper) dropCount(reason, n int) {
	if n == 0 {
		return
	}
	r.m.drop[reason].Add(float64(n))
	r.logDrops[reason] += uint64(n)
}

// maybeLog reports drops at most once per logEvery.
func (r *shipper) maybeLog(now time.Time) {
	if now.Sub(r.lastLog) < logEvery {
		return
	}
	var total uint64
	attrs := make([]any, 0, 2*dropReasons)
	for i, n := range r.logDrops {
		total += n
		if n > 0 {
			attrs = append(attrs, dropNames[i], n)
		}
	}
	if total == 0 {
		return
	}
	r.lastLog = now
	r.logDrops = [dropReasons]uint64{}
	r.logger.Warn("replication: replication dropped writes (replicas may lag until the keys are written again)", attrs...)
}

// launch starts sending d's backlog.
func (r *shipper) launch(d string, ob *outbox) {
	entries := ob.pending
	if ob.spare != nil {
		ob.pending, ob.spare = ob.spare, nil
	} else {
		ob.pending = make(map[string]bucket.State)
	}
	if ob.sender == nil {
		ob.sender = newStreamSender(r.clock)
	}
	ob.inflight = true
	r.wg.Add(1)
	go r.send(d, entries, ob.sender)
}

// finished takes a send's result back into its destination's outbox.
func (r *shipper) finished(res sendResult) {
	ob := r.out[res.dest]
	if ob == nil { // not reached: outboxes in flight are never deleted
		return
	}
	ob.inflight = false
	ob.sender = res.sender
	ob.lastErr = res.err
	if res.refused > 0 {
		// Our own states are always valid, so this is a peer that
		// validates differently (another version).
		if r.logDrops[dropRefused] == 0 {
			r.logger.Warn("replication: replica refused replication batches; dropping them", "peer", res.dest, "entries", res.refused, "err", res.refusedErr)
		}
		r.dropCount(dropRefused, res.refused)
	}
	if res.err == nil {
		ob.fails = 0
		r.m.sent.Add(float64(res.sent))
		clear(res.entries)
		ob.spare = res.entries
		return
	}
	r.m.rpcErrors.Inc()
	ob.fails++
	backoff := min(retryMax, retryMin<<min(ob.fails-1, 10))
	ob.retryAt = r.clock.Now().Add(backoff)
	if ob.fails == 1 || ob.fails%20 == 0 {
		r.logger.Debug("replication: replicate failed; retrying", "peer", res.dest, "fails", ob.fails, "err", res.err)
	}
	// Newer states recorded meanwhile win over the ones given back. Expired
	// ones are sent again too: the receiver drops them.
	for k, st := range res.entries {
		if cur, ok := ob.pending[k]; ok {
			ob.pending[k] = bucket.MaxState(cur, st)
		} else if len(ob.pending) < maxPending {
			ob.pending[k] = st
		} else {
			r.dropCount(dropBacklogFull, 1)
		}
	}
}
