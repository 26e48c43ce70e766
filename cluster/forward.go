package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// Applier decides one op against this node's counters. *bucket.Store
// implements it. It must be safe for concurrent use and must not retain op.
type Applier interface {
	Apply(now int64, op *bucket.Op) bucket.Result
}

// Owners maps a key to the node that owns it. Declared here, implemented by
// the ring glue. self reports that this node owns the key; id is the owner's
// node ID and grpcAddr its gRPC address ("" when the ring is empty).
type Owners interface {
	Owner(key []byte) (id, grpcAddr string, self bool)
}

// Holders is optionally implemented by an Owners to name every node that
// holds a key: Holder(key, i) is the i-th distinct one (0 is the owner,
// then its replicas in order), self reports that it is this node, and ok is
// false past the last. When a key's owner is suspect or has no client, the
// forwarder sends the op to the first healthy holder after it (or decides
// it locally when that is this node) instead of deciding it with the entry
// node's own counter, which may start from zero: the replica continues
// from the count it was sent.
type Holders interface {
	Holder(key []byte, i int) (id string, self, ok bool)
}

// Defaults and limits of ForwarderConfig.
const (
	// DefaultMaxBatch is the default number of ops per peer batch.
	DefaultMaxBatch = 256
	// DefaultForwardTimeout is how long a forwarded decision waits for its
	// owner by default: far inside Envoy's 20 ms RLS timeout.
	DefaultForwardTimeout = 10 * time.Millisecond
	// DefaultSuspectFor is how long a failed peer is bypassed by default
	// unless a probe answers sooner.
	DefaultSuspectFor = 2 * time.Second
)

const (
	// fwdInflight is how many Decide batches may be in flight to one peer:
	// one sender goroutine (and one DecideStream) per slot.
	fwdInflight = 2
	// fwdMinQueue is the least capacity of a peer's queue, which is
	// otherwise fwdInflight batches.
	fwdMinQueue = 4096
	// fwdMaxBatchBytes caps the key bytes of one batch, so that a whole
	// batch stays under MaxMessageSize (TestPeerMessagesFit).
	fwdMaxBatchBytes = 1 << 20
	// fwdProbeInterval is how often a suspect peer is pinged.
	fwdProbeInterval = 150 * time.Millisecond
	// fwdProbeTimeout is the deadline of one probe Ping.
	fwdProbeTimeout = 100 * time.Millisecond
)

// ForwarderConfig configures a Forwarder. Zero values take the documented
// defaults; Self, Local and Owners are required.
type ForwarderConfig struct {
	// Self is this node's ID, as Owners reports it.
	Self string
	// Local is this node's store: it decides the keys this node owns, the
	// ops peers send here, and every fallback decision.
	Local Applier
	// Owners maps keys to their owner.
	Owners Owners
	// Clock returns Unix nanoseconds. The server side reads it once per
	// received batch. Nil means the wall clock.
	Clock func() int64
	// DialOptions are used to dial peers. Nil means insecure (plaintext)
	// credentials. Short reconnect backoff (50 ms to 1 s), fixed 4 MiB flow
	// control windows (see peerWindow) and keepalive pings (after 10 s
	// without a read; no answer in 3 s closes the connection) are always
	// set first, so these options may override them. Peers' servers must
	// accept the pings: see ServerOptions.
	DialOptions []grpc.DialOption
	// MaxBatch is the most ops per peer batch: 1 to 4096, 0 means
	// DefaultMaxBatch.
	MaxBatch int
	// Timeout is the longest a forwarded decision waits for its owner
	// before it is decided locally when the caller's context has no
	// deadline; with a deadline the wait lasts until shortly before it
	// (see waitFor). 0 means DefaultForwardTimeout.
	Timeout time.Duration
	// SuspectFor is how long a peer that failed to answer is bypassed,
	// unless a probe answers sooner; a peer whose connection is refused
	// stays bypassed until a probe answers. 0 means DefaultSuspectFor.
	SuspectFor time.Duration
	// Registerer receives the forwarder's metrics. Nil means they are not
	// registered anywhere (never the global registry).
	Registerer prometheus.Registerer
	// Logger receives peer state changes. Nil discards them.
	Logger *slog.Logger
}

// Forwarder decides ops at their owners. It is the client side of the Peer
// protocol (Apply, SetPeers) and, through Register, its server side.
// Its methods are safe for concurrent use. Close stops it.
type Forwarder struct {
	self          string
	local         Applier
	ac            answerCache // local as an answerCache, or nil
	owners        Owners
	clock         func() int64
	dialOpts      []grpc.DialOption
	maxBatch      int
	timeout       time.Duration
	suspectFor    time.Duration
	probeInterval time.Duration
	probeTimeout  time.Duration
	log           *slog.Logger
	m             fwdMetrics
	start         time.Time // monotonic base for suspicion times
	reqs          sync.Pool // of *fwdRequest

	// peers is id -> client, replaced whole by SetPeers and read without
	// locks by Apply. Never nil.
	peers atomic.Pointer[map[string]*peerClient]

	// refusing makes the peer server refuse Decide and Ping (the node is
	// re-syncing its counters after a freeze): see setServing.
	refusing atomic.Bool
	// relaying is set while the node leaves the cluster, or has just joined
	// it (NodeConfig.JoinRelay): its Owners then name the owners its keys
	// move to, or still have (Node.placement), and the peer server relays
	// the batches it receives to them instead of applying them, in batches
	// marked relayed (see peerpb.DecideRequest.Relayed and fwdItem.relayed).
	relaying atomic.Bool
	// marksRelay tells which of the ops the peer server relays to mark
	// relayed (nil: all): a leaving node marks every op, a node that has
	// just joined only those for its own keys (Node.marksRelay).
	marksRelay func(key []byte) bool
	// graceUntil is f.mono() until which failures are not held against
	// peers: they were this process's own freeze (see forgive).
	graceUntil atomic.Int64
	// stalled, if set, is asked before each Decide batch whether this
	// process has just been frozen (a Node's pause detector, checked
	// before its ticker notices); true refuses the batch.
	stalled func() bool
	// streamMaxAge is how long the peer server keeps a DecideStream open,
	// in ns (peerStreamMaxAge; tests shorten it).
	streamMaxAge atomic.Int64

	mu     sync.Mutex // serialises SetPeers and Close
	closed bool
}

// NewForwarder checks cfg, applies its defaults and registers the metrics.
// It starts no goroutine until SetPeers names a peer.
func NewForwarder(cfg ForwarderConfig) (*Forwarder, error) {
	switch {
	case cfg.Self == "":
		return nil, errors.New("cluster: forwarder: Self is empty")
	case cfg.Local == nil:
		return nil, errors.New("cluster: forwarder: Local is nil")
	case cfg.Owners == nil:
		return nil, errors.New("cluster: forwarder: Owners is nil")
	case cfg.MaxBatch < 0 || cfg.MaxBatch > peerMaxOps:
		return nil, fmt.Errorf("cluster: forwarder: MaxBatch must be 0 to %d, got %d", peerMaxOps, cfg.MaxBatch)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("cluster: forwarder: Timeout must be >= 0, got %v", cfg.Timeout)
	case cfg.SuspectFor < 0:
		return nil, fmt.Errorf("cluster: forwarder: SuspectFor must be >= 0, got %v", cfg.SuspectFor)
	}
	f := &Forwarder{
		self:          cfg.Self,
		local:         cfg.Local,
		owners:        cfg.Owners,
		clock:         cfg.Clock,
		maxBatch:      cfg.MaxBatch,
		timeout:       cfg.Timeout,
		suspectFor:    cfg.SuspectFor,
		probeInterval: fwdProbeInterval,
		probeTimeout:  fwdProbeTimeout,
		log:           cfg.Logger,
		start:         time.Now(),
		ac:            asAnswerCache(cfg.Local),
	}
	if f.clock == nil {
		f.clock = func() int64 { return time.Now().UnixNano() }
	}
	if f.maxBatch == 0 {
		f.maxBatch = DefaultMaxBatch
	}
	if f.timeout == 0 {
		f.timeout = DefaultForwardTimeout
	}
	if f.suspectFor == 0 {
		f.suspectFor = DefaultSuspectFor
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	f.dialOpts = []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: time.Second,
	}), grpc.WithInitialWindowSize(peerWindow), grpc.WithInitialConnWindowSize(peerWindow),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                peerKeepaliveTime,
			Timeout:             peerKeepaliveTimeout,
			PermitWithoutStream: true,
		})}
	if cfg.DialOptions == nil {
		f.dialOpts = append(f.dialOpts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		f.dialOpts = append(f.dialOpts, cfg.DialOptions...)
	}
	f.m = newFwdMetrics(f.maxBatch)
	if err := f.m.register(cfg.Registerer); err != nil {
		return nil, err
	}
	f.reqs.New = func() any { return newFwdRequest() }
	f.streamMaxAge.Store(int64(peerStreamMaxAge))
	empty := map[string]*peerClient{}
	f.peers.Store(&empty)
	return f, nil
}

// Apply decides ops, writing results[i] for ops[i]; results must be at
// least as long as ops. now is the entry node's clock (Unix ns), used for
// the ops this node owns and for every fallback.
//
// Ops this node owns are applied directly. The others are queued to their
// owners' batchers and wait together at most the forwarder's Timeout and
// ctx. An op whose owner is unknown or suspect goes to the key's first
// healthy replica when Owners implements Holders (rerouted). An op with no
// reachable holder, or whose owner fails or is too slow, is decided by the
// local store instead (a fallback, counted by reason; from at least the
// owner's last answer when Local is a Node's store) and a failing or slow
// owner becomes suspect. A call whose deadline has passed before anything
// is forwarded is decided locally at once. Apply never fails: a down peer costs
// accuracy, not availability. An op the owner did answer after its waiter
// gave up is counted at both nodes. Ops of one call that go to the same
// owner may travel in different batches (up to fwdInflight are in flight per
// peer), so two ops on the same key may be applied in either order.
func (f *Forwarder) Apply(ctx context.Context, now int64, ops []bucket.Op, results []bucket.Result) {
	f.apply(ctx, now, ops, results, f.waitFor(ctx), false)
}

// apply is Apply with the forwarded ops' wait given; relayed marks them as
// relayed (peerpb.DecideRequest.Relayed), so that their receiver applies
// them even if it relays too.
func (f *Forwarder) apply(ctx context.Context, now int64, ops []bucket.Op, results []bucket.Result, wait time.Duration, relayed bool) {
	results = results[:len(ops)]
	var (
		req   *fwdRequest
		peers map[string]*peerClient
		late  bool // the caller has given up already: forward nothing
	)
	for i := range ops {
		op := &ops[i]
		id, _, self := f.owners.Owner(op.Key)
		if self || id == f.self {
			results[i] = f.local.Apply(now, op)
			continue
		}
		if f.ac != nil {
			if r, over := f.ac.overUntil(now, op); over {
				results[i] = r
				f.m.overLocal.Inc()
				continue
			}
		}
		if peers == nil {
			peers = *f.peers.Load()
		}
		p := peers[id]
		if p == nil || p.suspect.Load() {
			q, toSelf := f.reroute(op.Key, peers)
			switch {
			case toSelf:
				results[i] = f.applyInstead(now, op)
				f.m.rerouted.Inc()
				continue
			case q != nil:
				p = q
				f.m.rerouted.Inc()
			case p == nil:
				f.fallback(now, op, &results[i], f.m.fbUnknown)
				continue
			default:
				f.fallback(now, op, &results[i], f.m.fbSuspect)
				continue
			}
		}
		switch {
		case peerValidateOp(op) != nil:
			// The owner would refuse the whole batch this op lands in: the
			// local store decides it as it would decide its own keys.
			results[i] = f.local.Apply(now, op)
			continue
		}
		if late {
			f.fallback(now, op, &results[i], f.m.fbTimeout)
			continue
		}
		if req == nil {
			if wait <= 0 {
				// No owner can answer in time (a call read late, e.g. by a
				// process thawed after a freeze): decide locally, and do not
				// blame the owner for it.
				late = true
				f.fallback(now, op, &results[i], f.m.fbTimeout)
				continue
			}
			req = f.getRequest()
			req.deadline, req.wait, req.relayed = now+int64(wait), wait, relayed
		}
		it := req.add(i, p, op)
		if ok, closed := p.enqueue(it); !ok {
			req.unadd()
			if closed {
				f.fallback(now, op, &results[i], f.m.fbUnknown)
				continue
			}
			p.markSuspect("queue full", nil)
			f.fallback(now, op, &results[i], f.m.fbError)
		}
	}
	if req != nil {
		f.wait(ctx, now, req, ops, results)
	}
}

// reroute finds where an op goes when its owner is suspect or unknown: the
// first holder after the owner that is this node (toSelf) or a peer that is
// not suspect (p). Both are zero when Owners does not implement Holders or
// no holder qualifies.
func (f *Forwarder) reroute(key []byte, peers map[string]*peerClient) (p *peerClient, toSelf bool) {
	h, ok := f.owners.(Holders)
	if !ok {
		return nil, false
	}
	for i := 1; ; i++ {
		id, self, ok := h.Holder(key, i)
		switch {
		case !ok:
			return nil, false
		case self || id == f.self:
			return nil, true
		}
		if q := peers[id]; q != nil && !q.suspect.Load() {
			return q, false
		}
	}
}

// wait collects the answers of req's forwarded ops, falling back for the
// ops still pending when the timeout or ctx ends the wait.
func (f *Forwarder) wait(ctx context.Context, now int64, req *fwdRequest, ops []bucket.Op, results []bucket.Result) {
	complete := req.pending.Add(-1) == 0 // drop the guard taken by getRequest
	timedOut := false
	if !complete && req.n > 0 {
		req.timer.Reset(req.wait)
		select {
		case <-req.done:
			complete = true
		case <-req.timer.C:
			timedOut = true
		case <-ctx.Done():
		}
		req.timer.Stop()
	}
	forwarded := 0
	ac := f.ac
	var late *peerClient // the last peer noted late: one note per peer per call
	for _, it := range req.items[:req.n] {
		i := it.index
		if !complete && it.state.CompareAndSwap(fwdPending, fwdAbandoned) {
			// ctx ending is the caller giving up, not the peer failing.
			if timedOut && it.peer != late {
				it.peer.noteFailure("timeout", nil)
				late = it.peer
			}
			f.fallback(now, &ops[i], &results[i], f.m.fbTimeout)
			continue
		}
		if it.err != nil {
			// The RPC deadline is Timeout too: its expiry is a timeout.
			c := f.m.fbError
			if status.Code(it.err) == codes.DeadlineExceeded {
				c = f.m.fbTimeout
				if it.peer != late {
					it.peer.noteFailure("timeout", nil)
					late = it.peer
				}
			}
			f.fallback(now, &ops[i], &results[i], c)
			continue
		}
		results[i] = it.res
		if ac != nil {
			ac.remember(now, &ops[i], it.res)
		}
		forwarded++
	}
	if forwarded > 0 {
		f.m.forwarded.Add(float64(forwarded))
	}
	if complete {
		// Every sender is done with req: it can be reused. A request with
		// abandoned items may still be touched by a sender; the GC takes it.
		req.release()
		f.reqs.Put(req)
	}
}

// fwdDeadlineMargin is kept free of the caller's deadline for the local
// fallback and the answer's way back.
const fwdDeadlineMargin = 3 * time.Millisecond

// fwdMaxWait caps how long a forwarded op waits, whatever the deadline;
// it is also how long a Decide exchange (a stream's answer, or a call) may
// take before the sender gives up on it.
const fwdMaxWait = 250 * time.Millisecond

// waitFor is how long forwarded ops may wait for their owner: until the
// caller's deadline less fwdDeadlineMargin (Envoy sends its 20 ms timeout as
// the gRPC deadline, so answers stay inside it), capped at fwdMaxWait; or
// Timeout when the caller set no deadline. A busy owner is then waited for
// as long as the caller allows instead of being counted around, which is
// what keeps counts exact on a loaded machine.
func (f *Forwarder) waitFor(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return f.timeout
	}
	return max(0, min(time.Until(dl)-fwdDeadlineMargin, fwdMaxWait))
}

// fallback decides op locally and counts it under c.
func (f *Forwarder) fallback(now int64, op *bucket.Op, res *bucket.Result, c prometheus.Counter) {
	*res = f.applyInstead(now, op)
	c.Inc()
}

// answerCache is implemented by a Local that remembers what owners
// answered (a Node's): a key decided here instead of at its owner (a
// fallback, or a replica standing in) then continues from at least the
// owner's last answered count rather than from this node's own, which may
// be zero. Without it, an owner answering late under load lets entry nodes
// allow exhausted keys again.
type answerCache interface {
	// remember notes the owner's answer r to op, decided at now.
	remember(now int64, op *bucket.Op, r bucket.Result)
	// applyInstead decides op here, from at least the remembered count.
	applyInstead(now int64, op *bucket.Op) bucket.Result
	// overUntil answers op here when its owner has already said the key
	// is over its limit for the rest of the current window.
	overUntil(now int64, op *bucket.Op) (bucket.Result, bool)
}

// asAnswerCache returns l as an answerCache, or nil when it is not one.
func asAnswerCache(l Applier) answerCache {
	ac, _ := l.(answerCache)
	return ac
}

// applyInstead decides op with the local store for a key another node owns.
func (f *Forwarder) applyInstead(now int64, op *bucket.Op) bucket.Result {
	if f.ac != nil {
		return f.ac.applyInstead(now, op)
	}
	return f.local.Apply(now, op)
}

func (f *Forwarder) getRequest() *fwdRequest {
	r := f.reqs.Get().(*fwdRequest)
	r.n = 0
	r.pending.Store(1) // guard: no sender can complete r while Apply still adds to it
	return r
}

// SetPeers replaces the set of peers: id -> gRPC address of the alive
// members. Entries for this node's own ID are ignored. A new peer gets a
// client (a connection, its senders and a probe); a peer that is gone or
// has moved to another address has its client closed, so a moved peer also
// loses its suspicion. SetPeers after Close does nothing.
func (f *Forwarder) SetPeers(peers map[string]string) { f.setPeers(peers, true) }

// addPeers is SetPeers that only adds clients for the peers that have
// none: a ring about to route to new members calls it first, so that no
// op for their keys finds no client (and is decided here instead).
func (f *Forwarder) addPeers(peers map[string]string) { f.setPeers(peers, false) }

// setPeers is SetPeers; without prune it keeps every client it has.
func (f *Forwarder) setPeers(peers map[string]string, prune bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	old := *f.peers.Load()
	next := make(map[string]*peerClient, len(peers))
	if !prune {
		maps.Copy(next, old)
	}
	for id, addr := range peers {
		if id == f.self || addr == "" {
			continue
		}
		if p := old[id]; p != nil && (p.addr == addr || !prune) {
			next[id] = p
			continue
		}
		p, err := newPeerClient(f, id, addr)
		if err != nil {
			f.log.Error("cluster: cannot create peer client", "peer", id, "addr", addr, "err", err)
			continue
		}
		f.log.Info("cluster: peer added", "peer", id, "addr", addr)
		next[id] = p
	}
	f.peers.Store(&next)
	for id, p := range old {
		if next[id] != p {
			f.log.Info("cluster: peer removed", "peer", id, "addr", p.addr)
			p.close()
		}
	}
}

// Suspects returns the IDs of the peers currently bypassed, sorted.
func (f *Forwarder) Suspects() []string {
	var out []string
	for id, p := range *f.peers.Load() {
		if p.suspect.Load() {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// peerRPC returns the Peer client of peer id, or nil when id is not a
// current peer. The connection belongs to the forwarder: it closes when the
// peer is removed, failing the RPCs in flight on it.
func (f *Forwarder) peerRPC(id string) peerpb.PeerClient {
	if p := (*f.peers.Load())[id]; p != nil {
		return p.client
	}
	return nil
}

// setServing makes the peer server answer (true, the default) or refuse
// Decide and Ping with codes.Unavailable (false): a node re-syncing its
// counters must not decide with stale ones. Entry nodes then fall back and
// hold the node suspect until it answers Ping again.
func (f *Forwarder) setServing(ok bool) { f.refusing.Store(!ok) }

// forgive clears every peer's suspicion and failure count and ignores new
// failures for grace: after this process was frozen, the timeouts it saw
// were its own, not its peers'.
func (f *Forwarder) forgive(grace time.Duration) {
	f.graceUntil.Store(f.mono() + int64(grace))
	for _, p := range *f.peers.Load() {
		p.fails.Store(0)
		p.clearSuspect("this node was paused, not the peer")
	}
}

// serving reports whether the peer server answers Decide and Ping now.
func (f *Forwarder) serving() bool {
	return !f.refusing.Load() && (f.stalled == nil || !f.stalled())
}

// Close stops every peer client: it cancels their RPCs, joins their
// goroutines and closes their connections. Ops still queued fall back.
// Apply keeps working after Close, deciding every op locally. Close is
// idempotent. The metrics stay registered.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	old := *f.peers.Load()
	empty := map[string]*peerClient{}
	f.peers.Store(&empty)
	f.mu.Unlock()
	var errs []error
	for _, p := range old {
		if err := p.close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mono returns the monotonic time since the forwarder started, in ns.
func (f *Forwarder) mono() int64 { return int64(time.Since(f.start)) }

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
	timer   *time.Timer
	items   []*fwdItem // items[:n] are in use
	n       int
	// deadline is when the waiter gives up, Unix ns on the entry node's
	// clock: an owner that reads the batch later must not apply it.
	deadline int64
	// wait is how long the waiter waits, read once with deadline.
	wait time.Duration
	// relayed marks the request's items (see fwdItem.relayed).
	relayed bool
}

func newFwdRequest() *fwdRequest {
	t := time.NewTimer(time.Hour)
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
	it.key = append(it.key[:0], op.Key...)
	it.op = *op
	it.op.Key = it.key
	it.state.Store(fwdPending)
	r.pending.Add(1)
	return it
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

// fwdMetrics are the forwarder's Prometheus metrics. The fallback children
// are curried once so the hot path does no label lookup.
type fwdMetrics struct {
	forwarded   prometheus.Counter
	fallbacks   *prometheus.CounterVec
	fbTimeout   prometheus.Counter
	fbError     prometheus.Counter
	fbSuspect   prometheus.Counter
	fbUnknown   prometheus.Counter
	rpcDuration prometheus.Histogram
	batchSize   prometheus.Histogram
	expired     prometheus.Counter
	refused     prometheus.Counter
	rerouted    prometheus.Counter
	overLocal   prometheus.Counter
	relayed     prometheus.Counter
}

func newFwdMetrics(maxBatch int) fwdMetrics {
	m := fwdMetrics{
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_forwarded_decisions_total",
			Help: "Decisions answered by their owner node over the peer protocol.",
		}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_local_fallbacks_total",
			Help: "Decisions for keys another node owns that this node decided itself, by reason.",
		}, []string{"reason"}),
		rpcDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ringlimit_peer_rpc_duration_seconds",
			Help:    "Duration of Decide round trips to peers (one batch on a DecideStream, or a Decide call), errors included.",
			Buckets: prometheus.ExponentialBucketsRange(50e-6, 50e-3, 11),
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ringlimit_peer_batch_size",
			Help:    "Ops per Decide batch sent to a peer.",
			Buckets: prometheus.ExponentialBuckets(1, 2, bits.Len(uint(maxBatch-1))+1),
		}),
	}
	m.expired = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_peer_expired_ops_total",
		Help: "Ops in Decide batches this node received after their sender's deadline and did not apply.",
	})
	m.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_peer_refused_ops_total",
		Help: "Ops in Decide batches this node refused while it re-synced its counters.",
	})
	m.overLocal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_hot_key_local_answers_total",
		Help: "Over-limit decisions answered by the entry node without a forward, because the key's owner had already answered it over the limit for this window.",
	})
	m.relayed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_relayed_ops_total",
		Help: "Ops this node received while leaving the cluster, or just after joining it, and relayed to the keys' new or previous owners.",
	})
	m.rerouted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_rerouted_decisions_total",
		Help: "Decisions for keys whose owner was suspect or unknown, sent to (or taken by) the key's first healthy replica instead.",
	})
	m.fbTimeout = m.fallbacks.WithLabelValues("timeout")
	m.fbError = m.fallbacks.WithLabelValues("error")
	m.fbSuspect = m.fallbacks.WithLabelValues("suspect")
	m.fbUnknown = m.fallbacks.WithLabelValues("unknown")
	return m
}

// collectors lists every metric.
func (m fwdMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.forwarded, m.fallbacks, m.rpcDuration, m.batchSize, m.expired, m.refused, m.rerouted, m.overLocal, m.relayed}
}

// register registers every metric on r, or none of them.
func (m fwdMetrics) register(r prometheus.Registerer) error {
	if r == nil {
		return nil
	}
	if err := registerAll(r, m.collectors()...); err != nil {
		return fmt.Errorf("cluster: forwarder: register metrics: %w", err)
	}
	return nil
}
