package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/wire"
	"github.com/ringlimit/ringlimit/ring"
)

// Defaults and bounds of replication.
const (
	// DefaultReplicas is how many distinct nodes hold each key by default:
	// its owner and one replica.
	DefaultReplicas = 2
	// MaxReplicas bounds NodeConfig.Replicas and SyncRequest.replicas.
	MaxReplicas = wire.MaxReplicas
	// DefaultReplicateInterval is how often recorded writes are sent to
	// the replicas by default: the most an owner crash can lose.
	DefaultReplicateInterval = 5 * time.Millisecond
)

const (
	// replMaxPending bounds the distinct keys waiting for one destination;
	// beyond it new keys are dropped (and counted).
	replMaxPending = 1 << 17
	// replRPCTimeout bounds one Replicate RPC.
	replRPCTimeout = time.Second
	// replRetryMin and replRetryMax bound the backoff before entries that
	// failed to reach a destination are sent again.
	replRetryMin = 50 * time.Millisecond
	replRetryMax = 2 * time.Second
	// replLogEvery rate-limits the log line about dropped entries.
	replLogEvery = 10 * time.Second
)

// errReplNoClient fails a send to a destination the forwarder has no
// connection to (it is not, or no longer, a peer).
var errReplNoClient = errors.New("cluster: replicate: no connection to peer")

// replicator is the goroutine that ships the writes recorded in its log to
// each key's replicas: every interval it takes the log's buffers, groups the
// records by destination (the key's first `replicas` successors on the
// targets ring, minus this node), coalesces them per key to the latest
// state, and sends one Replicate RPC per destination. Each destination has
// at most one send in flight; what accumulates meanwhile, or what a failed
// send gives back, waits in the destination's bounded backlog and is sent
// again with backoff until the destination leaves the ring. A batch the
// destination refuses as invalid (InvalidArgument: a peer of another
// version, say) is dropped instead, since it can never succeed, and the
// send goes on with the other batches. Nothing here
// ever blocks the hit path. close stops and joins every goroutine.
type replicator struct {
	self     string
	replicas int
	log      *replLog
	interval time.Duration
	targets  func() *ring.Ring                 // the ring that places replicas now
	client   func(id string) peerpb.PeerClient // nil: no connection
	m        *replMetrics
	logger   *slog.Logger

	// Owned by the loop goroutine.
	spare     [replStripes]replBuf
	out       map[string]*replOutbox
	dsts      []string
	lastRing  *ring.Ring
	members   map[string]bool
	lastLog   time.Time
	logDrops  [replDropReasons]uint64 // drops since the last log line
	seenDrops uint64                  // log.dropped already accounted

	results  chan replResult
	flushReq chan chan error
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once
}

// replOutbox is what waits for one destination.
type replOutbox struct {
	pending  map[string]bucket.State
	spare    map[string]bucket.State // an empty map to swap in at the next send
	inflight bool
	fails    int
	retryAt  time.Time
	lastErr  error // of the last send, nil after a success
	// sender is the destination's stream and buffers: the loop's while no
	// send is in flight, the send's while one is (it comes back with the
	// result).
	sender *replSender
}

// replResult reports one finished send to the loop. entries is the map
// that was sent: emptied after a success, untouched after a failure.
type replResult struct {
	dest    string
	entries map[string]bucket.State
	sender  *replSender
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
	replDropQueueFull   = iota // the log's stripe was full
	replDropBacklogFull        // the destination's backlog was full
	replDropGone               // the destination left the ring first
	replDropRefused            // the destination refused the batch as invalid
	replDropReasons
)

var replDropNames = [replDropReasons]string{"queue_full", "backlog_full", "gone", "refused"}

// replMetrics are a Node's replication, handoff and sync metrics.
type replMetrics struct {
	sent      prometheus.Counter
	rpcErrors prometheus.Counter
	dropped   *prometheus.CounterVec
	drop      [replDropReasons]prometheus.Counter
	received  prometheus.Counter
	merged    prometheus.Counter
	handoff   *prometheus.CounterVec
	// handoffFailures counts ring-change handoffs that missed a peer.
	handoffFailures prometheus.Counter
	syncs           *prometheus.CounterVec
	syncDur         prometheus.Histogram
	syncMerged      prometheus.Counter
	pauses          prometheus.Counter
	ready           prometheus.Gauge
}

func newReplMetrics() *replMetrics {
	m := &replMetrics{
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_replication_sent_entries_total",
			Help: "Counter states this node's replicas acknowledged (after coalescing per key).",
		}),
		rpcErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_replication_rpc_errors_total",
			Help: "Replicate RPCs to replicas that failed; their entries are retried with backoff.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_replication_dropped_total",
			Help: "Recorded writes that never reached a replica, by reason (queue_full, backlog_full, gone, refused).",
		}, []string{"reason"}),
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_replication_received_entries_total",
			Help: "Counter states received from peers (replication, handoff and sync).",
		}),
		merged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_replication_merged_entries_total",
			Help: "Received counter states that changed this node's counters.",
		}),
		handoffFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_handoff_failures_total",
			Help: "Handoffs after a ring change that did not reach every peer; each is run again with backoff (0.5 s to 30 s) until one succeeds.",
		}),
		handoff: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_handoff_entries_total",
			Help: "Counter states pushed to their new owner and replicas, by cause (ring_change, drain).",
		}, []string{"cause"}),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_syncs_total",
			Help: "Syncs of this node's counters from its peers before it became ready, by result (ok, partial).",
		}, []string{"result"}),
		syncDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ringlimit_sync_duration_seconds",
			Help:    "How long a sync from the peers took.",
			Buckets: prometheus.ExponentialBucketsRange(1e-3, 10, 9),
		}),
		syncMerged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_sync_entries_total",
			Help: "Counter states received by syncs.",
		}),
		pauses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_pauses_detected_total",
			Help: "Times this process found it had been frozen (SIGSTOP, VM pause) and re-synced.",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_node_ready",
			Help: "1 when this node has synced its counters and is a ring member, else 0.",
		}),
	}
	for i, name := range replDropNames {
		m.drop[i] = m.dropped.WithLabelValues(name)
	}
	return m
}

func (m *replMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.sent, m.rpcErrors, m.dropped, m.received, m.merged, m.handoff, m.handoffFailures,
		m.syncs, m.syncDur, m.syncMerged, m.pauses, m.ready}
}

// start launches the loop. The zero-valued fields are filled first.
func (r *replicator) start() {
	r.out = make(map[string]*replOutbox)
	r.results = make(chan replResult)
	r.flushReq = make(chan chan error)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.lastLog = time.Now()
	r.wg.Add(1)
	go r.loop()
}

// close stops the loop and cancels and joins the sends in flight; what is
// still recorded or pending is dropped. Idempotent.
func (r *replicator) close() {
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
func (r *replicator) flush(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case r.flushReq <- done:
	case <-r.ctx.Done():
		return errors.New("cluster: replicate: closed")
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
func (r *replicator) undelivered() error {
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
	return fmt.Errorf("cluster: replicate: %d writes to %d replicas not delivered: %w", writes, dests, last)
}

func (r *replicator) loop() {
	defer r.wg.Done()
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
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
func (r *replicator) drainInflight() {
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
func (r *replicator) cycle(force bool) {
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
		r.m.drop[replDropQueueFull].Add(float64(d - r.seenDrops))
		r.logDrops[replDropQueueFull] += d - r.seenDrops
		r.seenDrops = d
	}
	now := time.Now()
	for d, ob := range r.out {
		switch {
		case ob.inflight:
		case !r.members[d]:
			r.dropCount(replDropGone, len(ob.pending))
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
func (r *replicator) add(d string, key []byte, st bucket.State) {
	ob := r.out[d]
	if ob == nil {
		ob = &replOutbox{pending: make(map[string]bucket.State)}
		r.out[d] = ob
	}
	if cur, ok := ob.pending[string(key)]; ok {
		ob.pending[string(key)] = bucket.MaxState(cur, st)
		return
	}
	if len(ob.pending) >= replMaxPending {
		r.dropCount(replDropBacklogFull, 1)
		return
	}
	ob.pending[string(key)] = st
}

func (r *replicator) dropCount(reason, n int) {
	if n == 0 {
		return
	}
	r.m.drop[reason].Add(float64(n))
	r.logDrops[reason] += uint64(n)
}

// maybeLog reports drops at most once per replLogEvery.
func (r *replicator) maybeLog(now time.Time) {
	if now.Sub(r.lastLog) < replLogEvery {
		return
	}
	var total uint64
	attrs := make([]any, 0, 2*replDropReasons)
	for i, n := range r.logDrops {
		total += n
		if n > 0 {
			attrs = append(attrs, replDropNames[i], n)
		}
	}
	if total == 0 {
		return
	}
	r.lastLog = now
	r.logDrops = [replDropReasons]uint64{}
	r.logger.Warn("cluster: replication dropped writes (replicas may lag until the keys are written again)", attrs...)
}

// launch starts sending d's backlog.
func (r *replicator) launch(d string, ob *replOutbox) {
	entries := ob.pending
	if ob.spare != nil {
		ob.pending, ob.spare = ob.spare, nil
	} else {
		ob.pending = make(map[string]bucket.State)
	}
	if ob.sender == nil {
		ob.sender = &replSender{}
	}
	ob.inflight = true
	r.wg.Add(1)
	go r.send(d, entries, ob.sender)
}

// finished takes a send's result back into its destination's outbox.
func (r *replicator) finished(res replResult) {
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
		if r.logDrops[replDropRefused] == 0 {
			r.logger.Warn("cluster: replica refused replication batches; dropping them", "peer", res.dest, "entries", res.refused, "err", res.refusedErr)
		}
		r.dropCount(replDropRefused, res.refused)
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
	backoff := min(replRetryMax, replRetryMin<<min(ob.fails-1, 10))
	ob.retryAt = time.Now().Add(backoff)
	if ob.fails == 1 || ob.fails%20 == 0 {
		r.logger.Debug("cluster: replicate failed; retrying", "peer", res.dest, "fails", ob.fails, "err", res.err)
	}
	// Newer states recorded meanwhile win over the ones given back. Expired
	// ones are sent again too: the receiver drops them.
	for k, st := range res.entries {
		if cur, ok := ob.pending[k]; ok {
			ob.pending[k] = bucket.MaxState(cur, st)
		} else if len(ob.pending) < replMaxPending {
			ob.pending[k] = st
		} else {
			r.dropCount(replDropBacklogFull, 1)
		}
	}
}

// send ships entries to dest in batches on s and reports to the loop.
func (r *replicator) send(dest string, entries map[string]bucket.State, s *replSender) {
	defer r.wg.Done()
	res := replResult{dest: dest, entries: entries, sender: s}
	c := r.client(dest)
	if c == nil {
		res.err = errReplNoClient
	} else {
		b := &s.batch
		for k, st := range entries {
			replBatchAdd(b, k, st)
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
func (r *replicator) sendBatch(res *replResult, s *replSender, c peerpb.PeerClient) bool {
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

// replSender sends one destination's batches on a ReplicateStream (opened
// on first use, again after it ends or fails, and before it is
// wire.StreamMaxAge old), or with Replicate calls for wire.StreamMaxAge after
// the destination answered Unimplemented. It keeps its batch's buffers from
// send to send. Not safe for concurrent use.
type replSender struct {
	batch      replBatch
	req        peerpb.ReplicateRequest
	resp       peerpb.ReplicateResponse
	stream     wire.Lockstep[peerpb.ReplicateRequest, peerpb.ReplicateResponse]
	client     peerpb.PeerClient // the stream's
	unaryUntil time.Time
}

// send sends s.batch as one request to c (bounded by replRPCTimeout) and
// empties the batch. The stream ends when ctx does.
func (s *replSender) send(ctx context.Context, c peerpb.PeerClient, from string) error {
	b := &s.batch
	n := b.len()
	if time.Now().Before(s.unaryUntil) {
		return b.send(ctx, c, from)
	}
	if s.client != c {
		s.stream.Drop() // a new connection to the destination
		s.client, s.stream.Open = c, c.ReplicateStream
	}
	s.req.From, s.req.Entries = from, b.entries()
	err := s.stream.Exchange(ctx, replRPCTimeout, wire.StreamMaxAge, &s.req, &s.resp)
	s.req.Entries = nil
	if status.Code(err) == codes.Unimplemented {
		// The destination never ran a handler: send the batch as a call.
		s.unaryUntil = time.Now().Add(wire.StreamMaxAge)
		return b.send(ctx, c, from)
	}
	if err == nil && s.resp.GetCode() != uint32(codes.OK) {
		err = status.Error(codes.Code(s.resp.GetCode()), s.resp.GetMessage())
	}
	b.reset()
	if err != nil {
		b.sent = 0
		return fmt.Errorf("cluster: replicate %d entries: %w", n, err)
	}
	b.sent = n
	if s.resp.GetLast() {
		s.stream.Drop()
	}
	return nil
}

// Bounds of one Replicate or Sync message, so that it stays under
// MaxMessageSize (TestPeerMessagesFit).
const (
	replMaxEntries = wire.MaxEntries
	replMaxBytes   = 1 << 20
)

// replBatch builds ReplicateRequests (and Sync chunks) of at most
// replMaxEntries entries and replMaxBytes of keys. It owns copies of the
// keys it is given. Not safe for concurrent use.
type replBatch struct {
	ents  []peerpb.Entry
	ptrs  []*peerpb.Entry
	bytes int
	sent  int // entries acknowledged by the last send
}

// add appends a copy of (key, st).
func (b *replBatch) add(key []byte, st bucket.State) { replBatchAdd(b, key, st) }

// replBatchAdd appends a copy of (key, st) to b, reusing the entry's key
// buffer; key is the outbox's string or a store's bytes.
func replBatchAdd[K string | []byte](b *replBatch, key K, st bucket.State) {
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
func (b *replBatch) grow() {
	n := max(64, 2*cap(b.ents))
	if n > replMaxEntries {
		n = replMaxEntries
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

func (b *replBatch) len() int { return len(b.ents) }

// full reports that the batch should be sent before anything is added.
func (b *replBatch) full() bool {
	return len(b.ents) >= replMaxEntries || b.bytes >= replMaxBytes-wire.MaxKeyLen
}

// entries returns the batch as message entries, valid until the next reset.
func (b *replBatch) entries() []*peerpb.Entry {
	b.ptrs = b.ptrs[:0]
	for i := range b.ents {
		b.ptrs = append(b.ptrs, &b.ents[i])
	}
	return b.ptrs
}

// reset empties the batch, keeping its buffers.
func (b *replBatch) reset() {
	b.ents = b.ents[:0]
	b.bytes = 0
}

// send sends the batch as one Replicate RPC (bounded by replRPCTimeout)
// and empties it.
func (b *replBatch) send(ctx context.Context, c peerpb.PeerClient, from string) error {
	n := b.len()
	ctx, cancel := context.WithTimeout(ctx, replRPCTimeout)
	defer cancel()
	_, err := c.Replicate(ctx, &peerpb.ReplicateRequest{From: from, Entries: b.entries()})
	b.reset()
	if err != nil {
		b.sent = 0
		return fmt.Errorf("cluster: replicate %d entries: %w", n, err)
	}
	b.sent = n
	return nil
}
