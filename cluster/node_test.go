package cluster

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/cluster/simnet"
)

func TestNodeConfigErrors(t *testing.T) {
	store := bucket.NewStore(bucket.StoreConfig{})
	mc := membership.Config{ID: "a", GRPCAddr: "127.0.0.1:1", BindAddr: "127.0.0.1:0", Preset: "local"}
	tests := []struct {
		name string
		cfg  NodeConfig
	}{
		{"no id", NodeConfig{Store: store}},
		{"no store", NodeConfig{Membership: mc}},
		{"replicas negative", NodeConfig{Membership: mc, Store: store, Replicas: -1}},
		{"replicas too many", NodeConfig{Membership: mc, Store: store, Replicas: MaxReplicas + 1}},
		{"negative interval", NodeConfig{Membership: mc, Store: store, Timing: Timing{ReplicateInterval: -time.Second}}},
		{"negative sync timeout", NodeConfig{Membership: mc, Store: store, Timing: Timing{SyncTimeout: -time.Second}}},
		{"unknown gossip profile", NodeConfig{Membership: mc, Store: store, Timing: Timing{Gossip: "wan"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if n, err := NewNode(tc.cfg); err == nil {
				n.Close()
				t.Fatal("NewNode succeeded")
			}
		})
	}
}

// A NewNode that fails once its metrics are registered (here: in
// membership.New) leaves the registry as it found it, so a retry succeeds.
func TestNodeFailedStartUnregisters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		host, err := sim.net.Host("10.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		transport := func(port int) *simnet.Transport {
			tr, err := host.Transport(port)
			if err != nil {
				t.Fatal(err)
			}
			return tr
		}
		reg := prometheus.NewRegistry()
		store := bucket.NewStore(bucket.StoreConfig{})
		mc := membership.Config{ID: "a", GRPCAddr: "10.0.0.1:8081", Transport: transport(simGossipPort), Preset: "no-such-preset"}
		if n, err := NewNode(NodeConfig{Membership: mc, Store: store, Registerer: reg}); err == nil {
			n.Close()
			t.Fatal("NewNode with an unknown preset succeeded")
		}
		if mfs, err := reg.Gather(); err != nil || len(mfs) != 0 {
			t.Fatalf("after a failed NewNode the registry holds %d families (err %v), want 0", len(mfs), err)
		}
		mc.Preset = "local"
		mc.Transport = transport(simGossipPort + 1)
		n, err := NewNode(NodeConfig{Membership: mc, Store: store, Registerer: reg})
		if err != nil {
			t.Fatalf("NewNode on the same registry after a failure: %v", err)
		}
		n.Close()
	})
}

// A lone node (no peers to sync from) is ready at once and decides every
// key itself.
func TestNodeAloneIsReady(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		a := sim.start("a", nil, nil)
		nodeWaitRing(t, []*nodeTestNode{a}, []*nodeTestNode{a})
		if r := nodeHit(t, a, "k", 3); r.Count != 3 {
			t.Fatalf("count %d after 3 hits, want 3", r.Count)
		}
	})
}

// A ring never routes to a member before the forwarder has a client for
// it: an op for such a member's key would be decided by the entry node,
// and its owner would never count it.
func TestNodeRingNotAheadOfPeers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		a := sim.start("a", nil, nil)
		nodeWaitRing(t, []*nodeTestNode{a}, []*nodeTestNode{a})
		var (
			stop   = make(chan struct{})
			done   = make(chan struct{})
			missed []string
		)
		go func() { // stopped and joined below
			defer close(done)
			for {
				// A burst of samples, yielding to whatever else runs at
				// this instant, then a step of virtual time (which passes
				// only while every goroutine of the bubble waits).
				for range 20 {
					members := a.node.view.Load().ring.Members()
					for _, id := range members {
						if id != "a" && a.node.fwd.Client(id) == nil && len(missed) < 10 {
							missed = append(missed, fmt.Sprintf("%s in ring %v without a client", id, members))
						}
					}
					runtime.Gosched()
				}
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		nodes := []*nodeTestNode{a, sim.start("b", []string{"a"}, nil), sim.start("c", []string{"a"}, nil)}
		nodeWaitRing(t, nodes, nodes)
		close(stop)
		<-done
		for _, m := range missed {
			t.Error(m)
		}
	})
}

// Deciding a key this node owns through the Node (ring lookup, store,
// replication record) and looking up its holders allocate nothing.
func TestNodeApplyZeroAllocs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		a := sim.start("a", nil, nil)
		nodeWaitRing(t, []*nodeTestNode{a}, []*nodeTestNode{a})
		ops := []bucket.Op{nodeDayOp("alloc-key")}
		res := make([]bucket.Result, 1)
		ctx := context.Background()
		now := time.Now().UnixNano()
		for range 2 * 8192 { // grow the replication log's buffers (8192 records a stripe)
			a.node.Apply(ctx, now, ops, res)
		}
		if n := testing.AllocsPerRun(1000, func() { a.node.Apply(ctx, now, ops, res) }); n != 0 {
			t.Errorf("Apply: %v allocs, want 0", n)
		}
		if n := testing.AllocsPerRun(1000, func() { a.node.Holder(ops[0].Key, 0) }); n != 0 {
			t.Errorf("Holder: %v allocs, want 0", n)
		}
	})
}
