package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/internal/promreg"
	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/cluster/replication"
	"github.com/ringlimit/ringlimit/cluster/transport"
	"github.com/ringlimit/ringlimit/cluster/wire"
	"github.com/ringlimit/ringlimit/ring"
)

// NodeConfig configures a Node: this process's membership, its ring, its
// forwarder and how it keeps counts when nodes come and go.
// Membership.ID is the node's stable identity.
type NodeConfig struct {
	Membership membership.Config
	// Ring tunes placement; the zero value is ring's defaults.
	Ring ring.Config
	// Store is this node's counter store (required).
	Store replication.Store
	// Replicas is how many distinct nodes hold each key: its owner and
	// Replicas-1 replicas, the key's next successors on the ring. 0 means
	// DefaultReplicas; 1 disables replication (handoff and sync still
	// move counters to new owners). At most MaxReplicas.
	Replicas int
	// ReplicateInterval is how often recorded writes are sent to the
	// replicas; 0 means DefaultReplicateInterval.
	ReplicateInterval time.Duration
	// SyncTimeout bounds how long a joining or thawed node waits for each
	// peer's Sync before it becomes ready anyway; 0 means
	// DefaultSyncTimeout.
	SyncTimeout time.Duration
	// JoinRelay is how long a node that has just gone ready (after joining,
	// or re-syncing after a pause) still relays the ops it gets to the
	// keys' owners on the ring without it, as a leaving node does: its
	// peers add it to their rings one by one as its readiness is gossiped,
	// and until all have, ops for its keys reach both it and their previous
	// owners. Relayed there, they are counted on one counter, which the
	// previous owner replicates to this node; after JoinRelay this node
	// decides its keys itself. 0 means DefaultJoinRelay, negative disables
	// it. Without replication (Replicas 1) there is no join relay: the
	// counts it gathered would not reach this node.
	JoinRelay time.Duration
	// PauseThreshold is the gap between two ticks of the pause detector
	// (every PauseThreshold/10) that means this process was frozen; 0
	// means DefaultPauseThreshold, negative disables detection.
	PauseThreshold time.Duration
	// Clock returns Unix nanoseconds; nil means the wall clock. The
	// forwarder, replication and membership (unless Membership.Clock is
	// set) tell the time by it, with the system's timers.
	Clock func() int64
	// DialOptions, Timeout, SuspectFor and MaxBatch are passed to the
	// forwarder (zero: its defaults).
	DialOptions []grpc.DialOption
	Timeout     time.Duration
	SuspectFor  time.Duration
	MaxBatch    int
	// Registerer receives the node's metrics and those of its forwarder and
	// replication, all or none; nil registers nowhere.
	Registerer prometheus.Registerer
	Logger     *slog.Logger

	// monoClock replaces the pause detector's monotonic clock (tests).
	monoClock func() time.Duration
}

// Defaults and bounds of NodeConfig.
const (
	// DefaultReplicas is how many distinct nodes hold each key by default:
	// its owner and one replica.
	DefaultReplicas = 2
	// MaxReplicas bounds NodeConfig.Replicas.
	MaxReplicas = wire.MaxReplicas
	// DefaultReplicateInterval is how often recorded writes are sent to
	// the replicas by default: the most an owner crash can lose.
	DefaultReplicateInterval = replication.DefaultInterval
	// DefaultSyncTimeout bounds one peer's Sync by default.
	DefaultSyncTimeout = 1500 * time.Millisecond
	// DefaultPauseThreshold is the tick gap that means a freeze by default.
	DefaultPauseThreshold = time.Second
	// DefaultJoinRelay covers the gossip of a node's readiness to its peers
	// (well under a second on a LAN) with a margin.
	DefaultJoinRelay = 2 * time.Second
)

// Node is this process's part of a ringlimit cluster: it gossips
// membership, rebuilds the ring off-lock on every change and publishes it
// atomically, decides each op at its key's owner (Apply), replicates every
// write to the key's replicas, hands counters to their new owners when the
// ring changes, and syncs its counters from its peers before it declares
// itself ready (on start and after a freeze). Rings hold only ready members.
// It is safe for concurrent use; Close stops it.
type Node struct {
	self     string
	ringCfg  ring.Config
	replicas int
	clock    func() int64
	log      *slog.Logger
	rec      *replication.Recorder // the forwarder's Local: store, replication log, answer cache
	fwd      *transport.Forwarder
	m        *membership.Membership
	repl     *replication.Replicator
	view     atomic.Pointer[view]
	selfAddr string

	joinRelay      time.Duration // <= 0: none
	pauseThreshold time.Duration
	mono           func() time.Duration
	lastTick       atomic.Int64  // mono at the pause detector's last look, ns
	pauseGen       atomic.Uint64 // pauses detected so far (see resync)

	readyMu sync.Mutex          // serialises changes of readiness and gossiped flags (setReady, endJoinRelay, gossipDraining); before viewMu
	viewMu  sync.Mutex          // serialises rebuilds
	alive   []membership.Member // the membership's last view, under viewMu

	ready    atomic.Bool // synced: a member of its own ring
	draining atomic.Bool
	// refusing makes the peer server refuse Decide and Ping (the node is
	// re-syncing its counters after a freeze): see setServing.
	refusing atomic.Bool
	// relaying is set while the node leaves the cluster, or has just joined
	// it (NodeConfig.JoinRelay): Owner then names the owners its keys move
	// to, or still have (placement), and the peer server relays the batches
	// it receives to them instead of applying them (see policy).
	relaying atomic.Bool
	// joinRelaying is set from going ready until JoinRelay later (see
	// NodeConfig.JoinRelay); joinGen numbers the times it was set, so that
	// the end of an earlier one does not end a later one. Both change
	// under viewMu.
	joinRelaying atomic.Bool
	joinGen      uint64
	joinSettled  map[string]bool // the settled peers when the join relay began
	joinKick     chan uint64     // capacity 1: a join relay began, its joinGen
	joinCut      chan struct{}   // capacity 1: end the join relay now (a member drains)

	handoffKick chan struct{} // capacity 1
	resyncKick  chan struct{} // capacity 1
	ctx         context.Context
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	closeOnce   sync.Once
	closeErr    error

	metrics nodeMetrics
}

// NewNode starts membership, forwarding and replication. The node is not
// ready, and not in its own ring, until it has joined and synced.
func NewNode(cfg NodeConfig) (*Node, error) {
	switch {
	case cfg.Membership.ID == "":
		return nil, errors.New("cluster: node: empty ID")
	case cfg.Store == nil:
		return nil, errors.New("cluster: node: Store is nil")
	case cfg.Replicas < 0 || cfg.Replicas > MaxReplicas:
		return nil, fmt.Errorf("cluster: node: Replicas must be 0 to %d, got %d", MaxReplicas, cfg.Replicas)
	case cfg.ReplicateInterval < 0:
		return nil, fmt.Errorf("cluster: node: ReplicateInterval must be >= 0, got %v", cfg.ReplicateInterval)
	case cfg.SyncTimeout < 0:
		return nil, fmt.Errorf("cluster: node: SyncTimeout must be >= 0, got %v", cfg.SyncTimeout)
	}
	n := &Node{
		self:           cfg.Membership.ID,
		ringCfg:        cfg.Ring,
		replicas:       cmp.Or(cfg.Replicas, DefaultReplicas),
		clock:          cfg.Clock,
		log:            cfg.Logger,
		selfAddr:       cfg.Membership.GRPCAddr,
		joinRelay:      cmp.Or(cfg.JoinRelay, DefaultJoinRelay),
		pauseThreshold: cmp.Or(cfg.PauseThreshold, DefaultPauseThreshold),
		mono:           cfg.monoClock,
		handoffKick:    make(chan struct{}, 1),
		resyncKick:     make(chan struct{}, 1),
		joinKick:       make(chan uint64, 1),
		joinCut:        make(chan struct{}, 1),
		metrics:        newNodeMetrics(),
	}
	if n.replicas == 1 {
		n.joinRelay = 0
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	if n.clock == nil {
		n.clock = func() int64 { return time.Now().UnixNano() }
	}
	if n.mono == nil {
		start := time.Now()
		n.mono = func() time.Duration { return time.Since(start) }
	}
	r, err := ring.New(nil, n.ringCfg)
	if err != nil {
		return nil, err
	}
	n.view.Store(&view{ring: r, targets: r, relayTo: r, addrs: map[string]string{n.self: n.selfAddr}, built: time.Now()})
	var reg *undoRegisterer // takes back every package's metrics if NewNode fails
	if cfg.Registerer != nil {
		reg = &undoRegisterer{reg: cfg.Registerer}
		if err := promreg.RegisterAll(reg, n.metrics.collectors()...); err != nil {
			return nil, fmt.Errorf("cluster: node: register metrics: %w", err)
		}
	}
	n.rec = replication.NewRecorder(cfg.Store, n.replicas > 1)
	n.setServing(false) // until synced
	n.lastTick.Store(int64(n.mono()))
	clk := nodeClock(cfg.Clock)
	n.fwd, err = transport.NewForwarder(transport.ForwarderConfig{
		Self:        n.self,
		Local:       n.rec,
		Owners:      n,
		Policy:      (*policy)(n),
		Clock:       clk,
		DialOptions: cfg.DialOptions,
		MaxBatch:    cfg.MaxBatch,
		Timeout:     cfg.Timeout,
		SuspectFor:  cfg.SuspectFor,
		Registerer:  reg.orNil(),
		Logger:      cfg.Logger,
	})
	if err != nil {
		reg.undo()
		return nil, err
	}
	n.repl, err = replication.New(replication.Config{
		Self:        n.self,
		Replicas:    n.replicas,
		Recorder:    n.rec,
		Clock:       clk,
		Interval:    cfg.ReplicateInterval,
		SyncTimeout: cmp.Or(cfg.SyncTimeout, DefaultSyncTimeout),
		RingConfig:  n.ringCfg,
		Ring:        func() *ring.Ring { return n.view.Load().ring },
		Targets:     func() *ring.Ring { return n.view.Load().targets },
		Conns:       n.fwd,
		DialOptions: n.fwd.DialOptions(),
		Registerer:  reg.orNil(),
		Logger:      n.log,
	})
	if err != nil {
		n.fwd.Close()
		reg.undo()
		return nil, err
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	mc := cfg.Membership
	if mc.Logger == nil {
		mc.Logger = cfg.Logger
	}
	if mc.Clock == nil {
		mc.Clock = clk
	}
	n.m, err = membership.New(mc, n.onChange)
	if err != nil {
		n.cancel()
		n.repl.Close()
		n.fwd.Close()
		reg.undo()
		return nil, err
	}
	n.wg.Add(3)
	go n.handoffLoop()
	go n.lifecycle()
	go n.joinRelayLoop()
	if n.pauseThreshold > 0 {
		n.wg.Add(1)
		go n.pauseLoop()
	}
	return n, nil
}

// Apply decides ops at their owners (see Forwarder.Apply).
func (n *Node) Apply(ctx context.Context, now int64, ops []bucket.Op, results []bucket.Result) {
	n.fwd.Apply(ctx, now, ops, results)
}

// Register registers the peer service on g (the RLS gRPC server): Decide
// and Ping, and the Replicate and Sync RPCs this node serves.
func (n *Node) Register(g *grpc.Server) { transport.Register(g, n.fwd, n.repl) }

// Ready reports whether the node has joined its cluster and synced its
// counters, and is not draining: /healthcheck and gRPC health follow it.
func (n *Node) Ready() bool {
	return n.m.Joined() && n.ready.Load() && !n.draining.Load()
}

// Membership returns the node's membership.
func (n *Node) Membership() *membership.Membership { return n.m }

// Leave announces a graceful leave to the cluster without handing off
// (see Drain).
func (n *Node) Leave(timeout time.Duration) error { return n.m.Leave(timeout) }

// closeFlushTimeout bounds Close's last replication flush.
const closeFlushTimeout = 500 * time.Millisecond

// Close sends the replication writes not yet sent (waiting at most
// closeFlushTimeout), then stops replication, handoff, membership and
// forwarding and joins their goroutines. Idempotent.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		// Ship what was written since Drain's flush: ops that peers sent
		// before they saw this node leave, decided while the gRPC server
		// finished its calls. Bounded: a peer that is gone costs at most
		// closeFlushTimeout.
		ctx, cancel := context.WithTimeout(context.Background(), closeFlushTimeout)
		if err := n.repl.Flush(ctx); err != nil {
			n.log.Warn("cluster: close: replication writes not delivered", "err", err)
		}
		cancel()
		n.cancel()
		n.wg.Wait()
		n.repl.Close()
		err := n.m.Close()
		n.closeErr = errors.Join(err, n.fwd.Close())
	})
	return n.closeErr
}
