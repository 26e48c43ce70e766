package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/bucket"
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
	// Clock returns Unix nanoseconds; nil means the wall clock.
	Clock func() int64
	// DialOptions, Timeout, SuspectFor and MaxBatch are passed to the
	// forwarder (zero: its defaults).
	DialOptions []grpc.DialOption
	Timeout     time.Duration
	SuspectFor  time.Duration
	MaxBatch    int
	// Registerer receives the cluster metrics; nil registers nowhere.
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

// view is one consistent picture of the cluster: the ring and where each of
// its members answers. Immutable once published.
type view struct {
	ring *ring.Ring
	// targets places the replicas of this node's writes: ring, or ring
	// without this node while it drains.
	targets *ring.Ring
	// relayTo places the ops this node relays (Node.relaying). For a
	// draining node it is targets. For a node in its join relay it is the
	// ring of the peers that were settled when the relay began
	// (Node.joinSettled) and still are (neither relaying nor draining), so
	// that two joining nodes send a key to the same previous owner, which
	// does not change while the relay lasts; ring if there are none. When
	// this node does not relay it is ring.
	relayTo *ring.Ring
	addrs   map[string]string // ID -> gRPC address
	built   time.Time
}

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
		if err := registerAll(reg, n.metrics.collectors()...); err != nil {
			return nil, fmt.Errorf("cluster: node: register metrics: %w", err)
		}
	}
	n.rec = replication.NewRecorder(cfg.Store, n.replicas > 1)
	n.setServing(false) // until synced
	n.lastTick.Store(int64(n.mono()))
	n.fwd, err = transport.NewForwarder(transport.ForwarderConfig{
		Self:        n.self,
		Local:       n.rec,
		Owners:      n,
		Policy:      (*policy)(n),
		Clock:       n.clock,
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
		Clock:       n.clock,
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

// onChange records the membership's view and rebuilds the ring. It runs on
// the membership's notifier goroutine, one call at a time.
func (n *Node) onChange(alive []membership.Member) {
	n.viewMu.Lock()
	defer n.viewMu.Unlock()
	n.alive = alive
	n.rebuildLocked()
}

// rebuild rebuilds the ring from the last membership view, after this
// node's own readiness changed.
func (n *Node) rebuild() {
	n.viewMu.Lock()
	defer n.viewMu.Unlock()
	n.rebuildLocked()
}

// rebuildLocked builds the ring of the ready alive members (this node when
// it is ready, per its own flag, which is ahead of its gossip) and publishes
// it; a changed ring wakes the handoff. n.viewMu is held.
func (n *Node) rebuildLocked() {
	var ids, others, settled []string
	draining, joinRelaying := n.draining.Load(), n.joinRelaying.Load()
	someDraining := false
	addrs := map[string]string{n.self: n.selfAddr}
	for _, m := range n.alive {
		switch {
		case m.ID == n.self:
			if n.ready.Load() {
				ids = append(ids, m.ID)
			}
		case m.Ready:
			ids = append(ids, m.ID)
			others = append(others, m.ID)
			if joinRelaying && settledPeer(m) && n.joinSettled[m.ID] {
				settled = append(settled, m.ID)
			}
			if m.Draining {
				someDraining = true
			}
			addrs[m.ID] = m.GRPCAddr
		}
	}
	r, err := ring.New(ids, n.ringCfg)
	if err != nil {
		n.log.Error("ring rebuild failed; keeping the previous ring", "members", ids, "err", err)
		return
	}
	targets, relayTo := r, r
	if draining && len(others) != len(ids) {
		if targets, err = ring.New(others, n.ringCfg); err != nil {
			n.log.Error("ring rebuild failed; keeping the previous ring", "members", others, "err", err)
			return
		}
		relayTo = targets
	}
	if !draining && joinRelaying && len(settled) > 0 && len(settled) != len(ids) {
		if relayTo, err = ring.New(settled, n.ringCfg); err != nil {
			n.log.Error("ring rebuild failed; keeping the previous ring", "members", settled, "err", err)
			return
		}
	}
	changed := !ringSameMembers(n.view.Load().ring, r)
	if changed {
		// Before the ring is published: no op decides a newly owned key
		// from a count below what its last owner told this node.
		n.rec.Adopt(n.clock(), func(key []byte) bool {
			id, ok := r.Owner(key)
			return ok && id == n.self
		})
	}
	peers := make(map[string]string, len(others))
	for _, id := range others {
		peers[id] = addrs[id]
	}
	// New members get their clients before the ring routes to them (an op
	// for a key whose owner has no client is decided here, and the owner
	// never counts it); members gone lose theirs only after it stops.
	n.fwd.AddPeers(peers)
	n.view.Store(&view{ring: r, targets: targets, relayTo: relayTo, addrs: addrs, built: time.Now()})
	if joinRelaying && someDraining {
		// A draining node relays to the joining ones: the join relay
		// ends, so that a key is not sent from each to the other.
		select {
		case n.joinCut <- struct{}{}:
		default:
		}
	}
	n.fwd.SetPeers(peers)
	n.metrics.members.Set(float64(len(ids)))
	if changed {
		n.metrics.rebuilds.Inc()
		n.log.Info("ring rebuilt", "members", ids)
		select {
		case n.handoffKick <- struct{}{}:
		default:
		}
	}
}

// placement is the ring key's decisions follow in v: the ring, or while
// this node relays (Node.relaying) the ring of the members that take
// its keys over (it leaves: every key) or still hold them (it has just
// joined: the keys it owns on the ring; the others are decided where the
// ring places them, as the other nodes do).
func (n *Node) placement(v *view, key []byte) *ring.Ring {
	if !n.relaying.Load() {
		return v.ring
	}
	if !n.draining.Load() {
		if id, ok := v.ring.Owner(key); !ok || id != n.self {
			return v.ring
		}
	}
	return v.relayTo
}

// Owner implements Owners from the current ring snapshot, without locks.
func (n *Node) Owner(key []byte) (id, grpcAddr string, self bool) {
	v := n.view.Load()
	id, ok := n.placement(v, key).Owner(key)
	if !ok || id == n.self {
		return n.self, v.addrs[n.self], true
	}
	return id, v.addrs[id], false
}

// Holder implements Holders from the current ring snapshot: the i-th of
// the key's first Replicas distinct successors. It takes no lock and does
// not allocate.
func (n *Node) Holder(key []byte, i int) (id string, self, ok bool) {
	if i < 0 || i >= n.replicas {
		return "", false, false
	}
	var buf [MaxReplicas]string
	s := n.placement(n.view.Load(), key).Successors(key, i+1, buf[:0])
	if len(s) <= i {
		return "", false, false
	}
	return s[i], s[i] == n.self, true
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

// DebugHandler serves /debug/cluster: this node, every member with its state
// and addresses, and how many ring partitions each owns.
func (n *Node) DebugHandler() http.Handler {
	type member struct {
		membership.Member
		Partitions int  `json:"partitions"`
		Suspect    bool `json:"suspect,omitempty"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := n.view.Load()
		parts := v.ring.Partitions()
		suspects := map[string]bool{}
		for _, id := range n.fwd.Suspects() {
			suspects[id] = true
		}
		var ms []member
		for _, m := range n.m.All() {
			p := 0
			if m.State == membership.MemberAlive && v.addrs[m.ID] == m.GRPCAddr {
				p = parts[m.ID]
			}
			ms = append(ms, member{Member: m, Partitions: p, Suspect: suspects[m.ID]})
		}
		sort.Slice(ms, func(i, j int) bool {
			if ms[i].ID != ms[j].ID {
				return ms[i].ID < ms[j].ID
			}
			return ms[i].Started > ms[j].Started
		})
		out := struct {
			Self      membership.Member `json:"self"`
			Joined    bool              `json:"joined"`
			Ready     bool              `json:"ready"`
			Draining  bool              `json:"draining,omitempty"`
			Relaying  bool              `json:"relaying,omitempty"`
			Replicas  int               `json:"replicas"`
			Ring      []string          `json:"ring"`
			RingBuilt string            `json:"ring_built"`
			Members   []member          `json:"members"`
		}{n.m.Self(), n.m.Joined(), n.ready.Load(), n.draining.Load(), n.relaying.Load(), n.replicas, v.ring.Members(), v.built.UTC().Format(time.RFC3339Nano), ms}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(out)
	})
}
