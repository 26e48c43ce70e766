package cluster

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// The pause detector (driven by an injected monotonic clock) makes the node
// refuse Decide, leave the rings, pull the newer counts its peers hold and
// become ready again.
func TestNodePauseResyncs(t *testing.T) {
	t.Parallel()
	fast := func(c *NodeConfig) { c.PauseThreshold = 200 * time.Millisecond }
	nodes := nodeCluster(t, []string{"a", "b"}, fast)
	a, b := nodes[0], nodes[1]
	nodeHit(t, a, "paused-key", 5)
	testkit.WaitFor(t, quick, "replication", func() bool { return nodeCount(a, "paused-key") == 5 && nodeCount(b, "paused-key") == 5 })
	// While a "was frozen", b counted on: its copy is ahead.
	now := time.Now().UnixNano()
	stB, _ := b.store.Get(now, []byte("paused-key"))
	stB.Count = 40
	b.store.Merge(now, []byte("paused-key"), stB)

	a.mono.Add(int64(10 * time.Second)) // the next tick sees a 10 s gap
	testkit.WaitFor(t, quick, "a to notice the pause and re-sync", func() bool {
		return nodeMetric(t, a.reg, "ringlimit_pauses_detected_total") == 1 &&
			nodeMetric(t, a.reg, "ringlimit_syncs_total") == 2
	})
	nodeWaitRing(t, nodes, nodes)
	if got := nodeCount(a, "paused-key"); got != 40 {
		t.Fatalf("a holds %d after its re-sync, want b's 40", got)
	}
	if r := nodeHit(t, a, "paused-key", 1); r.Count != 41 {
		t.Errorf("next hit counts %d, want 41", r.Count)
	}
}

// A Decide batch read right after a thaw, before the pause detector's
// ticker has run, is refused too (the batch checks the gap itself), and
// the node re-syncs once.
func TestNodeDecideRightAfterThawRefused(t *testing.T) {
	t.Parallel()
	slowTicker := func(c *NodeConfig) { c.PauseThreshold = time.Hour } // ticks every 6 min
	a := nodeStart(t, "a", nil, slowTicker)
	nodeWaitRing(t, []*nodeTestNode{a}, []*nodeTestNode{a})
	client := replDial(t, a)
	req := &peerpb.DecideRequest{Ops: []*peerpb.Op{nodeValidPB("thaw")}}
	if _, err := client.Decide(context.Background(), req); err != nil {
		t.Fatalf("Decide before the pause: %v", err)
	}
	a.mono.Add(int64(2 * time.Hour))
	if _, err := client.Decide(context.Background(), req); status.Code(err) != codes.Unavailable {
		t.Fatalf("Decide right after the thaw: %v, want Unavailable", err)
	}
	testkit.WaitFor(t, quick, "the re-sync", func() bool {
		return nodeMetric(t, a.reg, "ringlimit_syncs_total") == 2 && a.node.Ready()
	})
	if _, err := client.Decide(context.Background(), req); err != nil {
		t.Fatalf("Decide after the re-sync: %v", err)
	}
	if n := nodeMetric(t, a.reg, "ringlimit_pauses_detected_total"); n != 1 {
		t.Errorf("%v pauses detected, want 1", n)
	}
	if got := nodeCount(a, "thaw"); got != 2 {
		t.Errorf("count %d, want the 2 batches answered", got)
	}
}
