package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sort"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/ring"
)

// NodeConfig configures a Node: this process's membership, its ring and its
// forwarder. Membership.ID is the node's stable identity.
type NodeConfig struct {
	Membership MembershipConfig
	// Ring tunes placement; the zero value is ring's defaults.
	Ring ring.Config
	// Local is this node's store.
	Local Applier
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
}

// view is one consistent picture of the cluster: the ring and where each of
// its members answers. Immutable once published.
type view struct {
	ring  *ring.Ring
	addrs map[string]string // ID -> gRPC address
	built time.Time
}

// Node is this process's part of a ringlimit cluster: it gossips
// membership, rebuilds the ring off-lock on every change and publishes it
// atomically, and decides each op at its key's owner (Apply). It is safe for
// concurrent use; Close stops it.
type Node struct {
	self    string
	ringCfg ring.Config
	log     *slog.Logger
	fwd     *Forwarder
	m       *Membership
	view    atomic.Pointer[view]

	members  prometheus.Gauge
	rebuilds prometheus.Counter
}

// NewNode starts membership and forwarding. The node answers for every key
// itself until it has joined others.
func NewNode(cfg NodeConfig) (*Node, error) {
	if cfg.Membership.ID == "" {
		return nil, errors.New("cluster: node: empty ID")
	}
	n := &Node{
		self:    cfg.Membership.ID,
		ringCfg: cfg.Ring,
		log:     cfg.Logger,
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_cluster_members", Help: "Alive cluster members this node sees (itself included).",
		}),
		rebuilds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_ring_rebuilds_total", Help: "Times the hash ring was rebuilt after a membership change.",
		}),
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	r, err := ring.New([]string{n.self}, n.ringCfg)
	if err != nil {
		return nil, err
	}
	n.view.Store(&view{ring: r, addrs: map[string]string{n.self: cfg.Membership.GRPCAddr}, built: time.Now()})
	if cfg.Registerer != nil {
		if err := registerAll(cfg.Registerer, n.members, n.rebuilds); err != nil {
			return nil, err
		}
	}
	n.fwd, err = NewForwarder(ForwarderConfig{
		Self:        n.self,
		Local:       cfg.Local,
		Owners:      n,
		Clock:       cfg.Clock,
		DialOptions: cfg.DialOptions,
		MaxBatch:    cfg.MaxBatch,
		Timeout:     cfg.Timeout,
		SuspectFor:  cfg.SuspectFor,
		Registerer:  cfg.Registerer,
		Logger:      cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	mc := cfg.Membership
	if mc.Logger == nil {
		mc.Logger = cfg.Logger
	}
	n.m, err = NewMembership(mc, n.onChange)
	if err != nil {
		n.fwd.Close()
		return nil, err
	}
	return n, nil
}

func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// onChange rebuilds the ring for the alive members and publishes it. It runs
// on the membership's notifier goroutine, one call at a time.
func (n *Node) onChange(alive []Member) {
	ids := make([]string, 0, len(alive))
	addrs := make(map[string]string, len(alive))
	for _, m := range alive {
		ids = append(ids, m.ID)
		addrs[m.ID] = m.GRPCAddr
	}
	r, err := ring.New(ids, n.ringCfg)
	if err != nil {
		n.log.Error("ring rebuild failed; keeping the previous ring", "members", ids, "err", err)
		return
	}
	n.view.Store(&view{ring: r, addrs: addrs, built: time.Now()})
	peers := make(map[string]string, len(addrs))
	for id, a := range addrs {
		if id != n.self {
			peers[id] = a
		}
	}
	n.fwd.SetPeers(peers)
	n.members.Set(float64(len(ids)))
	n.rebuilds.Inc()
	n.log.Info("ring rebuilt", "members", ids)
}

// Owner implements Owners from the current ring snapshot, without locks.
func (n *Node) Owner(key []byte) (id, grpcAddr string, self bool) {
	v := n.view.Load()
	id, ok := v.ring.Owner(key)
	if !ok || id == n.self {
		return n.self, v.addrs[n.self], true
	}
	return id, v.addrs[id], false
}

// Apply decides ops at their owners (see Forwarder.Apply).
func (n *Node) Apply(ctx context.Context, now int64, ops []bucket.Op, results []bucket.Result) {
	n.fwd.Apply(ctx, now, ops, results)
}

// Register registers the peer service on g (the RLS gRPC server).
func (n *Node) Register(g *grpc.Server) { n.fwd.Register(g) }

// Ready reports whether the node has joined its cluster.
func (n *Node) Ready() bool { return n.m.Joined() }

// Membership returns the node's membership.
func (n *Node) Membership() *Membership { return n.m }

// Leave announces a graceful leave to the cluster.
func (n *Node) Leave(timeout time.Duration) error { return n.m.Leave(timeout) }

// Close stops membership and forwarding and joins their goroutines.
func (n *Node) Close() error {
	err := n.m.Close()
	return errors.Join(err, n.fwd.Close())
}

// DebugHandler serves /debug/cluster: this node, every member with its state
// and addresses, and how many ring partitions each owns.
func (n *Node) DebugHandler() http.Handler {
	type member struct {
		Member
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
			if m.State == MemberAlive && v.addrs[m.ID] == m.GRPCAddr {
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
			Self      Member   `json:"self"`
			Joined    bool     `json:"joined"`
			Ring      []string `json:"ring"`
			RingBuilt string   `json:"ring_built"`
			Members   []member `json:"members"`
		}{n.m.Self(), n.m.Joined(), v.ring.Members(), v.built.UTC().Format(time.RFC3339Nano), ms}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(out)
	})
}
