package cluster

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/lifecycle"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/ring"
)

// TestNodeLeavingNodeRelays: once a leaving node has handed its counters
// off, the ops it is still sent are decided by the key's new owner, so the
// key is counted on one node while the leave spreads. Hits sent to it by a
// peer that has not seen the leave, sent by the new owner (whose ring
// still names it), and sent to it by its own Envoys all count once, on the
// new owner. A relayed batch is never relayed again, even by a node that
// is leaving too.
func TestNodeLeavingNodeRelays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		nodes := sim.cluster([]string{"a", "b", "c"}, nil)
		c := nodes[2]
		key := ""
		for i := 0; key == ""; i++ {
			if k := fmt.Sprintf("relay-%d", i); nodeSuccessors(nodes[0], k, 1)[0] == "c" {
				key = k
			}
		}
		next := nodeByID(nodes, nodeSuccessors(nodes[0], key, 2)[1]) // takes the key over
		other := nodes[0]
		if other == next {
			other = nodes[1]
		}
		nodeHit(t, other, key, 5) // decided by c
		nodeHandOff(t, c)
		if got := nodeCount(next, key); got != 5 {
			t.Fatalf("after the hand-off the new owner holds %d, want 5", got)
		}
		// other and next have not seen c leave and send the key to c; a peer
		// that has seen it sends it to next, whose peer server applies it
		// (seen: next's store applies the op directly).
		seen := func() bucket.Result {
			op := nodeDayOp(key)
			return next.node.rec.Apply(time.Now().UnixNano(), &op)
		}
		for i := range 6 {
			var r bucket.Result
			via := []string{other.id, next.id, "a peer that saw the leave", c.id}[i%4]
			switch i % 4 {
			case 0:
				r = nodeHit(t, other, key, 1)
			case 1:
				r = nodeHit(t, next, key, 1)
			case 2:
				r = seen()
			case 3:
				r = nodeHit(t, c, key, 1)
			}
			if r.Count != uint64(6+i) {
				t.Fatalf("hit %d via %s: count %d, want %d (one counter, at %s)", i+1, via, r.Count, 6+i, next.id)
			}
		}
		if n := nodeMetric(t, c.reg, "ringlimit_relayed_ops_total"); n < 4 {
			t.Errorf("relayed ops %v, want at least the 4 its peers sent", n)
		}
		// The new owner starts leaving too, before either has seen the other
		// leave: c relays to it, and it applies the relayed batch instead of
		// sending it back; its own entry ops go to c unrelayed, which relays
		// them back to it. One counter still.
		nodeHandOff(t, next)
		for i, via := range []*nodeTestNode{other, next, other, next} {
			if r := nodeHit(t, via, key, 1); r.Count != uint64(12+i) {
				t.Fatalf("hit %d via %s with two nodes leaving: count %d, want %d", i+1, via.id, r.Count, 12+i)
			}
		}
		if fb := nodeMetric(t, c.reg, "ringlimit_local_fallbacks_total"); fb != 0 {
			t.Errorf("%v local fallbacks on the leaving node, want 0", fb)
		}
	})
}

// TestNodeJoiningNodeRelays: a node that has just gone ready relays the ops
// it is sent to the keys' previous owners until its join relay ends, so
// that while its peers add it to their rings one by one (some sending a key
// to it, some still to the previous owner), the key is counted on one
// counter; then it decides its keys itself, from the count the previous
// owner replicated to it.
func TestNodeJoiningNodeRelays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		nodes, joiners := nodeJoinRelayCluster(t, sim, []string{"a", "b"}, []string{"c"})
		c := joiners[0]
		if !nodeRelaying(c) {
			t.Fatal("c does not relay after going ready")
		}
		key := ""
		for i := 0; key == ""; i++ {
			if k := fmt.Sprintf("join-%d", i); nodeSuccessors(c, k, 1)[0] == "c" {
				key = k
			}
		}
		prevID := nodeRelayTarget(c, key)
		prev := nodeByID(nodes, prevID)
		// A peer that has not seen c ready yet sends the key to prev, whose
		// peer server applies it: prev's store applies the op directly.
		notSeen := func() bucket.Result {
			op := nodeDayOp(key)
			return prev.node.rec.Apply(time.Now().UnixNano(), &op)
		}
		hit := func(i int, via string) bucket.Result {
			switch via {
			case "a":
				return nodeHit(t, nodes[0], key, 1)
			case "b":
				return nodeHit(t, nodes[1], key, 1)
			case "c":
				return nodeHit(t, c, key, 1)
			}
			return notSeen()
		}
		vias := []string{"a", "c", "a peer that has not seen c", "b", "c", "a peer that has not seen c"}
		for i, via := range vias {
			if r := hit(i, via); r.Count != uint64(i+1) {
				t.Fatalf("hit %d via %s while c relays: count %d, want %d (one counter, at %s)", i+1, via, r.Count, i+1, prev.id)
			}
		}
		if n := nodeMetric(t, c.reg, "ringlimit_relayed_ops_total"); n < 2 {
			t.Errorf("c relayed %v ops, want at least the 2 its peers sent", n)
		}
		// The relay ends: c decides the key, from the count prev replicated to
		// it (prev's ring has c as the key's owner).
		testkit.WaitFor(t, quick, "prev's count to reach c", func() bool { return nodeCount(c, key) == uint64(len(vias)) })
		nodeEndRelay(t, c)
		for i, via := range []string{"a", "b", "c"} {
			want := uint64(len(vias) + i + 1)
			if r := hit(i, via); r.Count != want {
				t.Fatalf("hit via %s after the relay: count %d, want %d", via, r.Count, want)
			}
			if got := nodeCount(c, key); got != want {
				t.Fatalf("hit via %s after the relay: c holds %d, want %d (decided at c)", via, got, want)
			}
		}
		if fb := nodeMetric(t, c.reg, "ringlimit_local_fallbacks_total"); fb != 0 {
			t.Errorf("%v local fallbacks on c, want 0", fb)
		}
	})
}

// TestNodeTwoJoiningNodesRelay: two nodes that join at once both relay to
// the owners on the ring of the members that do not relay (the gossiped
// Relaying flag), not each to the other, so a key still has one counter.
func TestNodeTwoJoiningNodesRelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		nodes, joiners := nodeJoinRelayCluster(t, sim, []string{"a", "b"}, []string{"c", "d"})
		c, d := joiners[0], joiners[1]
		// A key of c whose owner on d's relay ring is not d: c and d relay
		// it to the same previous owner.
		key := ""
		for i := 0; key == ""; i++ {
			k := fmt.Sprintf("join2-%d", i)
			if nodeSuccessors(c, k, 1)[0] == "c" {
				key = k
			}
		}
		// c relays it past d (relaying too) to where d would: a or b.
		prevID := nodeRelayTarget(c, key)
		if prevID != "a" && prevID != "b" {
			t.Fatalf("c relays %s to %s: want one of a and b", key, prevID)
		}
		for i, via := range []*nodeTestNode{c, d, nodes[0], nodes[1], d, c} {
			if r := nodeHit(t, via, key, 1); r.Count != uint64(i+1) {
				t.Fatalf("hit %d via %s with c and d relaying: count %d, want %d (one counter, at %s)", i+1, via.id, r.Count, i+1, prevID)
			}
		}
		// c's relay ends while d's goes on: c decides its key, from the count
		// replicated to it, and d (which does not own the key) sends it there.
		testkit.WaitFor(t, quick, "the count to reach c", func() bool { return nodeCount(c, key) == 6 })
		nodeEndRelay(t, c)
		for i, via := range []*nodeTestNode{d, c, nodes[0], d, nodes[1]} {
			want := uint64(7 + i)
			if r := nodeHit(t, via, key, 1); r.Count != want || nodeCount(c, key) != want {
				t.Fatalf("hit via %s after c's relay ended: count %d, c holds %d; want %d at c", via.id, r.Count, nodeCount(c, key), want)
			}
		}
	})
}

// TestNodeDrainDuringJoinRelay: a node that drains while another relays
// after joining gossips that it drains, and the joining node ends its relay
// at once: the draining node relays to it and pushes it its counts, so the
// joining node decides its keys from then on, on one counter.
func TestNodeDrainDuringJoinRelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		nodes, joiners := nodeJoinRelayCluster(t, sim, []string{"a", "b", "c"}, []string{"d"})
		d := joiners[0]
		b := nodes[1]
		// A key of d's that d relays to b, its previous owner.
		key := ""
		for i := 0; key == ""; i++ {
			k := fmt.Sprintf("drainjoin-%d", i)
			if o := nodeRelayTarget(d, k); o == "b" && nodeSuccessors(d, k, 1)[0] == "d" {
				key = k
			}
		}
		for i := range 3 {
			if r := nodeHit(t, d, key, 1); r.Count != uint64(i+1) || nodeCount(b, key) != uint64(i+1) {
				t.Fatalf("hit %d via d while it relays: count %d, b holds %d", i+1, r.Count, nodeCount(b, key))
			}
		}
		nodeHandOff(t, b)
		testkit.WaitFor(t, quick, "d to end its relay", func() bool { return !nodeRelaying(d) })
		// d's Envoys, a peer that has not seen d (it sends the key to b, which
		// relays it), a peer that has (to d), one that has seen b drain: all
		// at d, from the count b pushed.
		counts := []uint64{nodeHit(t, d, key, 1).Count, nodeDecide(t, b, key), nodeDecide(t, d, key), nodeHit(t, nodes[0], key, 1).Count, nodeDecide(t, b, key)}
		if !slices.Equal(counts, []uint64{4, 5, 6, 7, 8}) || nodeCount(d, key) != 8 {
			t.Fatalf("counts via d, b, d, a, b: %v, d holds %d; want 4 to 8, at d", counts, nodeCount(d, key))
		}
	})
}

// TestNodeJoinRelayPreviousOwnerDies: when the previous owner a joining
// node relays a key to dies during the relay, the joining node decides the
// key itself, from the copy that owner replicated to it, not a peer with an
// older copy.
func TestNodeJoinRelayPreviousOwnerDies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		nodes, joiners := nodeJoinRelayCluster(t, sim, []string{"a", "b", "c"}, []string{"d"})
		d, b := joiners[0], nodes[1]
		key := ""
		for i := 0; key == ""; i++ {
			k := fmt.Sprintf("joindie-%d", i)
			if nodeRelayTarget(d, k) == "b" && nodeSuccessors(d, k, 1)[0] == "d" {
				key = k
			}
		}
		for i := range 5 {
			if r := nodeHit(t, d, key, 1); r.Count != uint64(i+1) {
				t.Fatalf("hit %d via d while it relays to b: count %d", i+1, r.Count)
			}
		}
		testkit.WaitFor(t, quick, "b's writes to reach d", func() bool { return nodeCount(d, key) == 5 })
		sim.crash(b, "b")
		for i := range 3 {
			if r := nodeHit(t, d, key, 1); r.Count != uint64(6+i) {
				t.Fatalf("hit %d via d after b died: count %d, want %d (d's copy of b's count)", i+1, r.Count, 6+i)
			}
		}
	})
}

// TestNodeJoinRelayForwardsOthersKeys: a node in its join relay that is
// sent a key it does not own (the sender has seen it join but not a second
// node that joined meanwhile and owns the key) forwards it unmarked, so the
// key's new owner relays it to the previous owner with its own ops, rather
// than applying it beside them.
func TestNodeJoinRelayForwardsOthersKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		_, joiners := nodeJoinRelayCluster(t, sim, []string{"a", "b"}, []string{"c", "d"})
		c, d := joiners[0], joiners[1]
		abc, err := ring.New([]string{"a", "b", "c"}, c.node.ringCfg)
		if err != nil {
			t.Fatal(err)
		}
		key := ""
		for i := 0; key == ""; i++ {
			k := fmt.Sprintf("joinfwd-%d", i)
			if o, _ := abc.Owner([]byte(k)); o == "c" && nodeSuccessors(d, k, 1)[0] == "d" {
				key = k
			}
		}
		prev := nodeRelayTarget(d, key)
		counts := []uint64{nodeDecide(t, c, key), nodeHit(t, d, key, 1).Count, nodeDecide(t, c, key), nodeHit(t, d, key, 1).Count}
		if !slices.Equal(counts, []uint64{1, 2, 3, 4}) {
			t.Fatalf("counts via a peer to c, d's Envoys, a peer to c, d's Envoys: %v, want 1 to 4 (one counter, at %s)", counts, prev)
		}
	})
}

// nodeDecide sends one hit on key to n's peer server, as a peer forwarding
// an op it takes n to own, and returns the count answered.
func nodeDecide(t *testing.T, n *nodeTestNode, key string) uint64 {
	t.Helper()
	resp, err := replDial(t, n).Decide(context.Background(), &peerpb.DecideRequest{Ops: []*peerpb.Op{{Key: []byte(key), Requests: 1 << 40, UnitNs: int64(nodeUnit), Hits: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetResults()[0].GetCount()
}

// nodeJoinRelayCluster starts on sim a cluster of the IDs settled, then
// the IDs joining, which relay after going ready until the test ends their
// relays, and waits until every node has all of them in its ring and sees
// every joining node relay.
func nodeJoinRelayCluster(t *testing.T, sim *simCluster, settled, joining []string) (nodes, joiners []*nodeTestNode) {
	t.Helper()
	nodes = sim.cluster(settled, nil)
	for _, id := range joining {
		joiners = append(joiners, sim.start(id, settled[:1], func(cfg *NodeConfig) { cfg.Timing.JoinRelay = time.Hour }))
	}
	ids := slices.Sorted(slices.Values(append(slices.Clone(settled), joining...)))
	for _, n := range append(slices.Clone(nodes), joiners...) {
		testkit.WaitFor(t, detect, fmt.Sprintf("%s ready with ring %v, seeing %v relay", n.id, ids, joining), func() bool {
			if !n.node.Ready() || !slices.Equal(n.node.view.Load().ring.Members(), ids) {
				return false
			}
			relaying := 0
			for _, m := range n.node.Membership().Alive() {
				if m.Relaying {
					relaying++
				}
			}
			return relaying == len(joining)
		})
	}
	return nodes, joiners
}

// nodeHandOff has n drain until it relays every op to the keys' new
// owners, and holds it there, before it announces its leave, until the
// test ends: its peers still have it in their rings.
func nodeHandOff(t *testing.T, n *nodeTestNode) {
	t.Helper()
	n.holdLeave.Store(true)
	go n.node.Drain(context.Background()) // returns when the node closes
	testkit.WaitFor(t, quick, n.id+" to hand off and relay", func() bool {
		return n.node.Status().Phase == lifecycle.Leaving
	})
}

// nodeRelaying reports whether n relays ops rather than deciding them.
func nodeRelaying(n *nodeTestNode) bool { return n.node.Status().Route.Relay != lifecycle.RelayNone }

// nodeEndRelay ends n's join relay as its timer would, and waits until it
// decides its keys.
func nodeEndRelay(t *testing.T, n *nodeTestNode) {
	t.Helper()
	n.node.post(event{endRelay: true})
	testkit.WaitFor(t, quick, n.id+" to end its join relay", func() bool { return !nodeRelaying(n) })
}

// nodeRelayTarget is the node n sends an op for key to: for a key of its own
// in its join relay, the previous owner it relays to.
func nodeRelayTarget(n *nodeTestNode, key string) string {
	id, _, _ := n.node.Owner([]byte(key))
	return id
}
