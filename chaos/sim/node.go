package sim

// This file is the only one that knows cluster.Node's API: how a node is
// built on a simulated host, stopped (drained, or killed) and read. When
// that API changes, this is the one place to adapt.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/cluster/replication"
	"github.com/ringlimit/ringlimit/cluster/simnet"
	"github.com/ringlimit/ringlimit/cluster/transport"
)

// The ports every simulated node binds on its host.
const (
	gossipPort = 7946
	grpcPort   = 8081
)

// Drain budgets, as cmd/ringlimit's defaults: --shutdown-timeout, and how
// long the gRPC server's graceful stop may take after the drain.
const (
	shutdownTimeout = 15 * time.Second
	stopGrace       = 2 * time.Second
)

// Break names a deliberate defect the simulation can build its nodes with,
// to show that the checker catches it.
type Break string

// The breaks.
const (
	NoBreak          Break = ""
	BreakRelay       Break = "relay"       // no join relay (NodeConfig.JoinRelay < 0)
	BreakReplication Break = "replication" // replication never ships on its own (an hour's interval)
	BreakLease       Break = "lease"       // owners grant leases without counting them (leakyStore)
)

// leakyStore is the store of a node built with BreakLease: it answers a
// StopOnOver op as if it added the hits but changes nothing, so that the
// node, as a key's owner, grants leases (applied as StopOnOver ops, see
// transport's Forwarder.grant) without counting or replicating their
// quota. The simulation's calls are all Consume ops: in it, the StopOnOver
// ops are the lease grants. Dropped counts the grants it did not count.
type leakyStore struct {
	*bucket.Store
	dropped *atomic.Uint64
}

func (s leakyStore) ApplyState(now int64, op *bucket.Op) (bucket.Result, bucket.State, bool) {
	if op.Mode != bucket.StopOnOver {
		return s.Store.ApplyState(now, op)
	}
	peek := *op
	peek.Mode = bucket.Peek
	r, _, _ := s.Store.ApplyState(now, &peek)
	if !r.Over {
		s.dropped.Add(1)
	}
	return r, bucket.State{}, false
}

// nodeSpec is what a simulated node is built from.
type nodeSpec struct {
	ID     string
	Host   *simnet.Host
	Join   []string // gossip addresses to join
	Clock  *clock.Freezable
	Logger *slog.Logger
	Break  Break
	// Dropped counts the lease grants a BreakLease store did not count.
	Dropped *atomic.Uint64
}

// simNode is one ringlimit process on a simulated host: its cluster.Node
// and the gRPC server that serves its peer protocol.
type simNode struct {
	id     string
	clk    *clock.Freezable
	node   *cluster.Node
	gs     *grpc.Server
	served chan struct{}        // closed when gs.Serve returns
	reg    *prometheus.Registry // the node's metrics
}

// startNode starts a node on s.Host: membership on its gossip port, the
// peer protocol on its gRPC port. It does not wait for the node to join.
func startNode(s nodeSpec) (*simNode, error) {
	ip := s.Host.IP()
	tr, err := s.Host.Transport(gossipPort)
	if err != nil {
		return nil, err
	}
	lis, err := s.Host.Listen(grpcPort)
	if err != nil {
		tr.Shutdown()
		return nil, err
	}
	clk := s.Clock
	reg := prometheus.NewRegistry()
	var store replication.Store = bucket.NewStore(bucket.StoreConfig{})
	if s.Break == BreakLease {
		store = leakyStore{bucket.NewStore(bucket.StoreConfig{}), s.Dropped}
	}
	cfg := cluster.NodeConfig{
		Membership: membership.Config{
			ID:        s.ID,
			GRPCAddr:  net.JoinHostPort(ip, strconv.Itoa(grpcPort)),
			Transport: tr,
			Join:      s.Join,
			Logger:    s.Logger,
		},
		Store:  store,
		Timing: cluster.LAN(),
		// Frozen with its host, the clock holds the node's timers, and its
		// pause detector sees the gap at the thaw.
		Clock: clk,
		DialOptions: []grpc.DialOption{
			grpc.WithContextDialer(s.Host.Dial),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
		},
		Logger:     s.Logger,
		Registerer: reg,
	}
	switch s.Break {
	case BreakRelay:
		cfg.Timing.JoinRelay = -1
	case BreakReplication:
		cfg.Timing.ReplicateInterval = time.Hour
	}
	n, err := cluster.NewNode(cfg)
	if err != nil {
		lis.Close()
		tr.Shutdown()
		return nil, fmt.Errorf("sim: start %s: %w", s.ID, err)
	}
	gs := grpc.NewServer(transport.ServerOptions()...)
	n.Register(gs)
	sn := &simNode{id: s.ID, clk: clk, node: n, gs: gs, served: make(chan struct{}), reg: reg}
	go func() {
		defer close(sn.served)
		gs.Serve(lis)
	}()
	return sn, nil
}

// now reads the node's clock, in Unix nanoseconds, as its RLS service
// does once per request.
func (n *simNode) now() int64 { return n.clk.Now().UnixNano() }

// apply decides ops on this node as its RLS service would.
func (n *simNode) apply(ctx context.Context, now int64, ops []bucket.Op, results []bucket.Result) {
	n.node.Apply(ctx, now, ops, results)
}

// ready reports what the node's /healthcheck says: Envoys (through
// Kubernetes' readiness) send it calls only while it is true.
func (n *simNode) ready() bool { return n.node.Ready() }

// drain stops the node as SIGTERM does (cmd/ringlimit's serve): drain
// within shutdownTimeout, then a graceful stop of the gRPC server for at
// most stopGrace, then Close. It returns the drain's error.
func (n *simNode) drain() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := n.node.Drain(ctx)
	stopped := make(chan struct{})
	go func() {
		n.gs.GracefulStop()
		close(stopped)
	}()
	grace := time.NewTimer(stopGrace)
	defer grace.Stop()
	select {
	case <-stopped:
	case <-grace.C:
		n.gs.Stop()
		<-stopped
	case <-ctx.Done():
		n.gs.Stop()
		<-stopped
	}
	n.node.Close()
	<-n.served
	return err
}

// stop ends the node's goroutines without a drain: after its host crashed
// (a kill), or at the end of a run.
func (n *simNode) stop() {
	n.gs.Stop()
	n.node.Close()
	<-n.served
}

// nodeStatus is what the simulation reads of a node.
type nodeStatus struct {
	Ready bool     // what /healthcheck says (joined, synced, not draining)
	Ring  []string // the IDs of the ring it routes by, sorted
}

// status reads the node's readiness and ring.
func (n *simNode) status() (nodeStatus, error) {
	st := n.node.Status()
	return nodeStatus{Ready: st.Ready, Ring: st.Ring}, nil
}

// LeaseStats is what the nodes' metrics say of quota leases, summed over
// every node process of a run, stopped ones included.
type LeaseStats struct {
	// Used is the hits entry nodes decided from a lease
	// (ringlimit_leased_hits_total{event="used"}): in the simulation, one
	// per answer.
	Used uint64
	// Granted, Returned and Expired count leases at their entry nodes
	// (ringlimit_leases_total): granted, and ended with unused quota the
	// owner took back or that stayed counted as used.
	Granted, Returned, Expired uint64
	// Uncounted is the lease grants BreakLease owners did not count.
	Uncounted uint64
}

// leases adds what the node's metrics say of leases to st. It may be
// called once the node has stopped.
func (n *simNode) leases(st *LeaseStats) error {
	mfs, err := n.reg.Gather()
	if err != nil {
		return fmt.Errorf("sim: read %s's metrics: %w", n.id, err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var event string
			for _, l := range m.GetLabel() {
				if l.GetName() == "event" {
					event = l.GetValue()
				}
			}
			v := uint64(m.GetCounter().GetValue())
			switch mf.GetName() + "/" + event {
			case "ringlimit_leased_hits_total/used":
				st.Used += v
			case "ringlimit_leases_total/granted":
				st.Granted += v
			case "ringlimit_leases_total/returned":
				st.Returned += v
			case "ringlimit_leases_total/expired":
				st.Expired += v
			}
		}
	}
	return nil
}
