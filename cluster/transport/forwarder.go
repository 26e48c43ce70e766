// Package transport owns the peer protocol, both sides: the Forwarder
// decides each op at its key's owner (batching them per peer on long-lived
// streams, waiting within the caller's deadline, falling back to a replica
// or to this node's own counter when the owner is suspect or slow), and the
// peer server applies the batches peers send, relays them while its node
// relays, and hands replication and sync to a StateService. Gate admits
// peer calls. It declares what it needs of the node it serves (Applier,
// AnswerCache, Owners, Holders, Policy, StateService) and imports neither
// membership nor replication. Forwarder's methods are safe for concurrent
// use.
package transport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/wire"
)

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
	// DefaultProbeInterval is how often a suspect peer is pinged by
	// default.
	DefaultProbeInterval = 150 * time.Millisecond
	// DefaultProbeTimeout is the deadline of one probe Ping by default.
	DefaultProbeTimeout = 100 * time.Millisecond
)

const (
	// fwdInflight is how many Decide batches may be in flight to one peer:
	// one sender goroutine (and one DecideStream) per slot.
	fwdInflight = 2
	// fwdMinQueue is the least capacity of a peer's queue, which is
	// otherwise fwdInflight batches.
	fwdMinQueue = 4096
	// fwdMaxBatchBytes caps the key bytes of one batch, so that a whole
	// batch stays under MaxMessageSize (TestDecideBatchFits).
	fwdMaxBatchBytes = 1 << 20
	// fwdMaxLinger caps how long a sender holds back a batch that is not
	// full while another batch to the same peer is in flight; it holds it
	// at most a quarter of the peer's recent round trip (see
	// peerClient.linger).
	fwdMaxLinger = 200 * time.Microsecond
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
	// Policy tells the peer server whether to answer and whether to relay
	// (see Policy). Nil means it always answers and never relays.
	Policy Policy
	// Clock is the forwarder's one source of time. The peer server reads
	// it once per received batch (the Unix ns the batch's ops are applied
	// at) and for its streams' ages; the client side times on it its
	// waits, what is left of a caller's deadline, suspicion, probes and its
	// streams' ages. Nil means clock.Real().
	Clock clock.Clock
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
	// ProbeInterval is how often a suspect peer is pinged to find whether
	// it answers again. 0 means DefaultProbeInterval; negative is an error.
	ProbeInterval time.Duration
	// ProbeTimeout is how long one probe Ping may take. 0 means
	// DefaultProbeTimeout; negative is an error.
	ProbeTimeout time.Duration
	// StreamMaxAge is how long this node's peer server keeps a
	// DecideStream or ReplicateStream, on Clock: the first answer it gives
	// once a stream is this old ends the stream, and the batches on one
	// kept 5 s past it are refused (a sender renews its streams before
	// wire.StreamMaxAge by its own clock, whatever this says). 0 means
	// wire.StreamMaxAge; negative means that every answer ends its stream.
	StreamMaxAge time.Duration
	// Registerer receives the forwarder's metrics. Nil means they are not
	// registered anywhere (never the global registry).
	Registerer prometheus.Registerer
	// Logger receives peer state changes. Nil discards them.
	Logger *slog.Logger
	// Tracer, if set, traces the forwarded ops of sampled decisions and
	// the ops peers send here with a trace context (trace.go). Nil turns
	// tracing off at no cost.
	Tracer trace.Tracer
	// LeaseTTL, when > 0, turns quota leases on (lease.go): this node asks
	// the owners of the keys it forwards for leases and decides their hits
	// from them for up to LeaseTTL (never past their window), and grants
	// leases to peers that ask for the keys it owns. 0 or negative: no
	// leases, asked or granted.
	LeaseTTL time.Duration
}

// Forwarder decides ops at their owners. It is the client side of the Peer
// protocol (Apply, SetPeers) and, through Register, its server side.
// Its methods are safe for concurrent use. Close stops it.
type Forwarder struct {
	self          string
	local         Applier
	ac            AnswerCache // local as an AnswerCache, or nil
	owners        Owners
	policy        Policy // nil: always serving, never relaying
	clock         clock.Clock
	dialOpts      []grpc.DialOption
	maxBatch      int
	timeout       time.Duration
	suspectFor    time.Duration
	probeInterval time.Duration
	probeTimeout  time.Duration
	log           *slog.Logger
	tracer        trace.Tracer // nil: tracing off
	m             fwdMetrics
	// streamMaxAge is StreamMaxAge with its default applied (0: every
	// answer ends its stream).
	streamMaxAge time.Duration
	start        time.Time // base of mono, on clock
	reqs         sync.Pool // of *fwdRequest

	// peers is id -> client, replaced whole by SetPeers and read without
	// locks by Apply. Never nil.
	peers atomic.Pointer[map[string]*peerClient]

	// graceUntil is f.mono() until which failures are not held against
	// peers: they were this process's own freeze (see Forgive).
	graceUntil atomic.Int64

	mu     sync.Mutex // serialises SetPeers and Close
	closed bool

	// Quota leases (lease.go); leases is nil when they are off.
	leases     *leaseTable
	leaseTTL   time.Duration
	leasesOff  atomic.Bool   // set by ReturnLeases: ask for no more
	leaseEpoch atomic.Uint64 // see NewLeaseEpoch
	relMu      sync.Mutex
	rel        map[string][]*peerpb.Release // queued releases by owner
	leaseStop  chan struct{}                // closed by Close; nil until started
	leaseWG    sync.WaitGroup
	renewMu    sync.Mutex
	renewQ     []*fwdItem    // background renewals not yet queued
	renewKick  chan struct{} // capacity 1: wakes the lease loop
}

// NewForwarder checks cfg, applies its defaults and registers the metrics.
// It starts no goroutine until SetPeers names a peer.
func NewForwarder(cfg ForwarderConfig) (*Forwarder, error) {
	switch {
	case cfg.Self == "":
		return nil, errors.New("transport: forwarder: Self is empty")
	case cfg.Local == nil:
		return nil, errors.New("transport: forwarder: Local is nil")
	case cfg.Owners == nil:
		return nil, errors.New("transport: forwarder: Owners is nil")
	case cfg.MaxBatch < 0 || cfg.MaxBatch > peerMaxOps:
		return nil, fmt.Errorf("transport: forwarder: MaxBatch must be 0 to %d, got %d", peerMaxOps, cfg.MaxBatch)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("transport: forwarder: Timeout must be >= 0, got %v", cfg.Timeout)
	case cfg.SuspectFor < 0:
		return nil, fmt.Errorf("transport: forwarder: SuspectFor must be >= 0, got %v", cfg.SuspectFor)
	case cfg.ProbeInterval < 0:
		return nil, fmt.Errorf("transport: forwarder: ProbeInterval must be >= 0, got %v", cfg.ProbeInterval)
	case cfg.ProbeTimeout < 0:
		return nil, fmt.Errorf("transport: forwarder: ProbeTimeout must be >= 0, got %v", cfg.ProbeTimeout)
	}
	clk := clock.Or(cfg.Clock)
	f := &Forwarder{
		self:          cfg.Self,
		local:         cfg.Local,
		owners:        cfg.Owners,
		policy:        cfg.Policy,
		clock:         clk,
		maxBatch:      cfg.MaxBatch,
		timeout:       cfg.Timeout,
		suspectFor:    cfg.SuspectFor,
		probeInterval: cmp.Or(cfg.ProbeInterval, DefaultProbeInterval),
		probeTimeout:  cmp.Or(cfg.ProbeTimeout, DefaultProbeTimeout),
		streamMaxAge:  max(0, cmp.Or(cfg.StreamMaxAge, wire.StreamMaxAge)),
		log:           cfg.Logger,
		tracer:        cfg.Tracer,
		// One ns before now, so that mono is never 0 (see mono).
		start: clk.Now().Add(-time.Nanosecond),
		ac:    asAnswerCache(cfg.Local),
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
	f.reqs.New = func() any { return newFwdRequest(f.clock) }
	if cfg.LeaseTTL > 0 {
		f.leases, f.leaseTTL = newLeaseTable(), cfg.LeaseTTL
	}
	f.renewKick = make(chan struct{}, 1)
	f.leaseEpoch.Store(newLeaseEpoch())
	empty := map[string]*peerClient{}
	f.peers.Store(&empty)
	return f, nil
}

// DialOptions returns the options the forwarder dials peers with: its
// defaults, then ForwarderConfig.DialOptions. Another client of the peers
// (a Sync) dials with them too. The slice is the caller's.
func (f *Forwarder) DialOptions() []grpc.DialOption { return slices.Clone(f.dialOpts) }

// Close gives back the unused quota of this node's leases (within
// leaseCloseTimeout), then stops every peer client: it cancels their RPCs,
// joins their goroutines and closes their connections. Ops still queued fall back.
// Apply keeps working after Close, deciding every op locally. Close is
// idempotent. The metrics stay registered.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.mu.Unlock()
	if f.leases != nil {
		ctx, cancel := context.WithTimeout(context.Background(), leaseCloseTimeout)
		f.ReturnLeases(ctx)
		cancel()
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	if f.leaseStop != nil {
		close(f.leaseStop)
	}
	old := *f.peers.Load()
	empty := map[string]*peerClient{}
	f.peers.Store(&empty)
	f.mu.Unlock()
	f.leaseWG.Wait()
	var errs []error
	for _, p := range old {
		if err := p.close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mono returns the time on the forwarder's clock since just before it
// started, in ns (on clock.Real, by its monotonic reading). It is at least
// 1 even on a clock that has not moved since (a test's, or virtual time in
// a synctest bubble), since peerClient.onTime keeps 0 for "never".
func (f *Forwarder) mono() int64 { return int64(f.clock.Now().Sub(f.start)) }
