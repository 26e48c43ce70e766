package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/lifecycle"
	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/transport"
)

// Bounds of the waits for what takes well under a second (quick: joins,
// leaves, metadata, replication) and for failure detection (detect). The
// nodes run in synctest bubbles (simCluster), so these are virtual time:
// a bound costs nothing when the wait succeeds early, and a busy machine
// does not use it up.
const (
	quick  = 15 * time.Second
	detect = 30 * time.Second
)

// nodeTestNode is one in-process Node, on a simulated network in a
// synctest bubble (simCluster).
type nodeTestNode struct {
	id    string
	node  *Node
	store *bucket.Store
	reg   *prometheus.Registry
	logs  *testkit.LogSink
	clock *clock.Freezable  // the node's clock
	dial  []grpc.DialOption // how tests dial it, over the simulated network
	// holdLeave makes a drain stop before it announces the leave, until
	// the node stops (nodeHandOff).
	holdLeave atomic.Bool
	leaveGate chan struct{}
	stop      func() // stops gRPC and closes the node (idempotent)
}

// testConfig is the NodeConfig of a test node: the LAN timing, as in
// production (virtual time makes it no slower), with the test hooks, and
// no leases.
func testConfig(tn *nodeTestNode, mc membership.Config) NodeConfig {
	tn.leaveGate = make(chan struct{})
	return NodeConfig{
		Membership: mc,
		Store:      tn.store,
		Timing:     LAN(),
		Registerer: tn.reg,
		Logger:     slog.New(tn.logs),
		// The tests read the counts each node stores, which a lease
		// raises by its whole quota when it is granted: leases are off
		// here, and on in lease_test.go (tweak LeaseTTL to 0) and in the
		// simulation.
		LeaseTTL: -1,
		hooks: &testHooks{beforeLeave: func() {
			if tn.holdLeave.Load() {
				<-tn.leaveGate
			}
		}},
	}
}

// release lets a held drain go on (see holdLeave).
func (tn *nodeTestNode) release() {
	select {
	case <-tn.leaveGate:
	default:
		close(tn.leaveGate)
	}
}

// runNode starts tn's node with cfg (changed by tweak) and its gRPC server
// on lis, and stops both when the test ends.
func runNode(t *testing.T, tn *nodeTestNode, cfg NodeConfig, lis net.Listener, tweak func(*NodeConfig)) *nodeTestNode {
	t.Helper()
	if tweak != nil {
		tweak(&cfg)
	}
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatalf("NewNode(%s): %v", tn.id, err)
	}
	tn.node = n
	srv := grpc.NewServer(transport.ServerOptions()...)
	n.Register(srv)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = srv.Serve(lis)
	}()
	var once sync.Once
	tn.stop = func() {
		once.Do(func() {
			tn.release()
			srv.Stop()
			wg.Wait()
			if err := n.Close(); err != nil {
				t.Errorf("close %s: %v", tn.id, err)
			}
		})
	}
	t.Cleanup(func() {
		tn.stop()
		if t.Failed() {
			t.Logf("%s log:\n%s", tn.id, tn.logs.Dump())
		}
	})
	return tn
}

// nodeWaitRing waits until every node of on is ready with exactly the IDs
// of want in its ring, and the join relays have ended.
func nodeWaitRing(t *testing.T, on, want []*nodeTestNode) {
	t.Helper()
	var ids []string
	for _, n := range want {
		ids = append(ids, n.id)
	}
	sort.Strings(ids)
	for _, n := range on {
		testkit.WaitFor(t, detect, fmt.Sprintf("%s ready with ring %v, not relaying", n.id, ids), func() bool {
			if st := n.node.Status(); !st.Ready || !slices.Equal(st.Ring, ids) || st.Route.Relay != lifecycle.RelayNone {
				return false
			}
			// ... and sees no member relay: a relaying member is left out
			// of where a node relays to (view.relay).
			for _, m := range n.node.Membership().Alive() {
				if m.Relaying {
					return false
				}
			}
			return true
		})
	}
}

// nodeValidPB is a valid wire op on a day's window (nodeUnit).
func nodeValidPB(key string) *peerpb.Op {
	return &peerpb.Op{Key: []byte(key), Requests: 10, UnitNs: int64(nodeUnit), Hits: 1}
}

// nodeByID returns the node called id.
func nodeByID(nodes []*nodeTestNode, id string) *nodeTestNode {
	for _, n := range nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

// nodeUnit is the window of the limits these tests count under
// (time.Now, the bubble's virtual time, which starts at midnight UTC): a
// day, so that counts taken over the minutes of virtual time a test lasts
// (a crash and its detection, a drain, a join) never straddle a window
// edge.
const nodeUnit = 24 * time.Hour

// nodeDayOp is one consuming hit under a roomy daily limit.
func nodeDayOp(key string) bucket.Op {
	return bucket.Op{Key: []byte(key), Limit: bucket.Limit{Requests: 1 << 40, Unit: int64(nodeUnit)}, Hits: 1}
}

// nodeHit applies hits to key through n, each as its own call.
func nodeHit(t *testing.T, n *nodeTestNode, key string, hits int) bucket.Result {
	t.Helper()
	var res [1]bucket.Result
	for range hits {
		ops := []bucket.Op{nodeDayOp(key)}
		n.node.Apply(context.Background(), time.Now().UnixNano(), ops, res[:])
	}
	return res[0]
}

// nodeCount returns n's stored count for key (0 if none).
func nodeCount(n *nodeTestNode, key string) uint64 {
	st, _ := n.store.Get(time.Now().UnixNano(), []byte(key))
	return st.Count
}

// nodeSuccessors returns key's first r successors on n's ring.
func nodeSuccessors(n *nodeTestNode, key string, r int) []string {
	return n.node.view.Load().ring.Successors([]byte(key), r, nil)
}

// nodeMetric sums every sample of the counter or gauge name in reg.
func nodeMetric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// nodeCounters sums n's counters whose names say where its counts came
// from, for a failing test's report.
func nodeCounters(t *testing.T, n *nodeTestNode) string {
	t.Helper()
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		sum := 0.0
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() // 0 for other kinds
		}
		if sum != 0 {
			fmt.Fprintf(&b, "%s=%v ", strings.TrimPrefix(mf.GetName(), "ringlimit_"), sum)
		}
	}
	return b.String()
}
