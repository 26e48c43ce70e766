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
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/cluster/internal/promreg"
	"github.com/ringlimit/ringlimit/cluster/lifecycle"
	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/cluster/replication"
	"github.com/ringlimit/ringlimit/cluster/transport"
	"github.com/ringlimit/ringlimit/cluster/wire"
	"github.com/ringlimit/ringlimit/ring"
)

// NodeConfig configures a Node: this process's membership, its ring, how
// it forwards and how it keeps counts when nodes come and go.
// Membership.ID is the node's stable identity.
type NodeConfig struct {
	// Membership configures gossip. Its Preset is Timing.Gossip's when
	// empty.
	Membership membership.Config
	// Ring tunes placement; the zero value is ring's defaults.
	Ring ring.Config
	// Store is this node's counter store (required).
	Store replication.Store
	// Replicas is how many distinct nodes hold each key: its owner and
	// Replicas-1 replicas, the key's next successors on the ring. 0 means
	// DefaultReplicas; 1 disables replication (handoff and sync still
	// move counters to new owners) and with it the join relay. At most
	// MaxReplicas.
	Replicas int
	// Timing is how fast the node notices and reacts; the zero value is
	// LAN().
	Timing Timing
	// Clock is the node's one source of time: every time read and every
	// timer of the node and its packages; nil means clock.Real().
	Clock clock.Clock
	// Restore, if set, loads the counters this node saved on disk into
	// Store (merging them by the usual maximum rule). The node calls it
	// once, at start, and syncs from its peers only after it returned: the
	// two merge, and the node is never ready before both. An error is
	// logged; the node goes on with what it has.
	Restore func(ctx context.Context) error
	// DialOptions dial the peers (nil: plaintext); MaxBatch bounds the ops
	// of one peer batch (0: transport.DefaultMaxBatch).
	DialOptions []grpc.DialOption
	MaxBatch    int
	// Registerer receives the node's metrics and those of its forwarder and
	// replication, all or none; nil registers nowhere.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Tracer, if set, traces forwarded decisions across the peers (see
	// transport.ForwarderConfig.Tracer); nil turns tracing off.
	Tracer trace.Tracer
	// LeaseTTL is how long quota leases last at most (see
	// transport.ForwarderConfig.LeaseTTL): 0 means DefaultLeaseTTL,
	// negative turns leases off.
	LeaseTTL time.Duration

	// hooks are test hooks (nil in production).
	hooks *testHooks
}

// testHooks let a test hold the node at a point of its life.
type testHooks struct {
	beforeLeave func() // called by the drain before it announces the leave
	afterPull   func() // called by a sync once it has pulled
}

// Defaults and bounds of NodeConfig.
const (
	// DefaultReplicas is how many distinct nodes hold each key by default:
	// its owner and one replica.
	DefaultReplicas = 2
	// MaxReplicas bounds NodeConfig.Replicas.
	MaxReplicas = wire.MaxReplicas
	// DefaultLeaseTTL is how long a quota lease lasts at most by default
	// (never past its window).
	DefaultLeaseTTL = 30 * time.Second
)

// Node is this process's part of a ringlimit cluster. It wires its packages
// together: membership (who is alive, and their gossiped flags), the
// lifecycle (its state machine, stepped by one goroutine, which decides
// where ops go), transport (deciding each op at its key's owner) and
// replication (copies, handoff, sync). It is safe for concurrent use;
// Close stops it.
type Node struct {
	self     string
	selfAddr string
	ringCfg  ring.Config
	replicas int
	timing   Timing
	clock    clock.Clock
	start    time.Time // clock reading at NewNode: the pause detector's base
	log      *slog.Logger
	hooks    testHooks
	restore  func(context.Context) error
	rec      *replication.Recorder // the forwarder's Local: store, replication log, answer cache
	fwd      *transport.Forwarder
	m        *membership.Membership
	repl     *replication.Replicator
	view     atomic.Pointer[view]

	events       chan event    // to the lifecycle loop
	announceKick chan struct{} // capacity 1: gossip wantFlags
	wantFlags    atomic.Pointer[membership.Flags]
	handoffKick  chan struct{} // capacity 1

	// Pauses: the detector counts them (pauses) and kicks the loop; the
	// node refuses Decide until the loop has stepped the last one
	// (pausesSeen), so that no batch is answered from counters a freeze
	// made stale, whatever the loop was about to publish.
	pauses     atomic.Uint64
	pausesSeen atomic.Uint64
	pauseKick  chan struct{} // capacity 1
	lastTick   atomic.Int64  // clock since start at the detector's last look, ns

	mu       sync.Mutex
	drain    *drainState // set by the first Drain
	conflict error       // why the node refused to serve
	fatal    chan error  // capacity 1: Fatal

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	metrics nodeMetrics
}

// NewNode starts membership, forwarding, replication and the lifecycle.
// The node is not ready, and not in its own ring, until it has joined and
// synced.
func NewNode(cfg NodeConfig) (*Node, error) {
	switch {
	case cfg.Membership.ID == "":
		return nil, errors.New("cluster: node: empty ID")
	case cfg.Store == nil:
		return nil, errors.New("cluster: node: Store is nil")
	case cfg.Replicas < 0 || cfg.Replicas > MaxReplicas:
		return nil, fmt.Errorf("cluster: node: Replicas must be 0 to %d, got %d", MaxReplicas, cfg.Replicas)
	}
	timing, err := cfg.Timing.withDefaults()
	if err != nil {
		return nil, err
	}
	n := &Node{
		self:         cfg.Membership.ID,
		selfAddr:     cfg.Membership.GRPCAddr,
		ringCfg:      cfg.Ring,
		replicas:     cmp.Or(cfg.Replicas, DefaultReplicas),
		timing:       timing,
		clock:        clock.Or(cfg.Clock),
		log:          cfg.Logger,
		restore:      cfg.Restore,
		events:       make(chan event, 64),
		announceKick: make(chan struct{}, 1),
		handoffKick:  make(chan struct{}, 1),
		pauseKick:    make(chan struct{}, 1),
		fatal:        make(chan error, 1),
		metrics:      newNodeMetrics(),
	}
	if cfg.hooks != nil {
		n.hooks = *cfg.hooks
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	n.start = n.clock.Now()
	empty, err := ring.New(nil, n.ringCfg)
	if err != nil {
		return nil, err
	}
	n.view.Store(&view{ring: empty, targets: empty, relay: empty, behind: empty, addrs: map[string]string{n.self: n.selfAddr}, built: n.start})
	var reg *undoRegisterer // takes back every package's metrics if NewNode fails
	if cfg.Registerer != nil {
		reg = &undoRegisterer{reg: cfg.Registerer}
		if err := promreg.RegisterAll(reg, n.metrics.collectors()...); err != nil {
			return nil, fmt.Errorf("cluster: node: register metrics: %w", err)
		}
	}
	n.rec = replication.NewRecorder(cfg.Store, n.replicas > 1)
	n.fwd, err = transport.NewForwarder(transport.ForwarderConfig{
		Self:        n.self,
		Local:       n.rec,
		Owners:      n,
		Policy:      (*policy)(n),
		Clock:       n.clock,
		DialOptions: cfg.DialOptions,
		MaxBatch:    cfg.MaxBatch,
		Timeout:     timing.ForwardTimeout,
		SuspectFor:  timing.SuspectFor,
		Registerer:  reg.orNil(),
		Logger:      cfg.Logger,
		Tracer:      cfg.Tracer,
		LeaseTTL:    cmp.Or(cfg.LeaseTTL, DefaultLeaseTTL),
	})
	if err != nil {
		reg.undo()
		return nil, err
	}
	n.repl, err = replication.New(replication.Config{
		Self:        n.self,
		Replicas:    n.replicas,
		Recorder:    n.rec,
		Clock:       n.clock,
		Interval:    timing.ReplicateInterval,
		SyncTimeout: timing.SyncTimeout,
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
	mc.Logger = cmp.Or(mc.Logger, cfg.Logger)
	mc.Preset = cmp.Or(mc.Preset, timing.Gossip)
	if mc.Clock == nil {
		mc.Clock = n.clock
	}
	n.m, err = membership.New(mc, n.onChange)
	if err != nil {
		n.cancel()
		n.repl.Close()
		n.fwd.Close()
		reg.undo()
		return nil, err
	}
	relay := timing.JoinRelay
	if relay < 0 {
		relay = 0
	}
	st, first := lifecycle.New(lifecycle.Config{Self: n.self, JoinRelay: relay, Replicated: n.replicas > 1, Load: n.restore != nil}, n.start)
	n.wg.Add(4)
	go n.run(st, first)
	go n.announcer()
	go n.awaitJoin()
	go n.handoffLoop()
	if timing.PauseThreshold > 0 {
		n.wg.Add(1)
		go n.pauseLoop()
	}
	return n, nil
}

// Apply decides ops at their owners (see transport.Forwarder.Apply).
func (n *Node) Apply(ctx context.Context, now int64, ops []bucket.Op, results []bucket.Result) {
	n.fwd.Apply(ctx, now, ops, results)
}

// Register registers the peer service on g (the RLS gRPC server): Decide
// and Ping, and the Replicate and Sync RPCs this node serves.
func (n *Node) Register(g *grpc.Server) { transport.Register(g, n.fwd, n.repl) }

// Ready reports whether the node has joined its cluster, synced its
// counters and is a member of its own ring, and is not draining:
// /healthcheck and gRPC health follow it.
func (n *Node) Ready() bool {
	v := n.view.Load()
	return v.route.InRing && (v.phase == lifecycle.Relaying || v.phase == lifecycle.Serving)
}

// Membership returns the node's membership.
func (n *Node) Membership() *membership.Membership { return n.m }

// Fatal delivers the error that stops this node from serving for good:
// another live process holds its identity (--node-name). The node has
// left the cluster by then; the process should exit non-zero.
func (n *Node) Fatal() <-chan error { return n.fatal }

// closeFlushTimeout bounds Close's last replication flush.
const closeFlushTimeout = 500 * time.Millisecond

// Close sends the replication writes not yet sent (waiting at most
// closeFlushTimeout), then stops the lifecycle, replication, handoff,
// membership and forwarding and joins their goroutines. Idempotent.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		// Ship what was written since the drain's flush: ops that peers
		// sent before they saw this node leave, decided while the gRPC
		// server finished its calls. Bounded: a peer that is gone costs at
		// most closeFlushTimeout.
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
