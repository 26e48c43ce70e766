package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/ring"
)

// handoffTestNode is node "a" alone, holding key at count 7, with its
// handoff loop running and peer "b" served by the fake b. move makes b
// join the ring, which moves key to b, and waits until the loop has read
// the ring it started from.
func handoffTestNode(t *testing.T, b peerpb.PeerClient) (n *Node, key []byte, move func()) {
	t.Helper()
	clock := func() int64 { return int64(30 * time.Minute) }
	st := bucket.NewStore(bucket.StoreConfig{})
	n = &Node{self: "a", replicas: 1, clock: clock, log: slog.New(slog.DiscardHandler), store: st,
		handoffKick: make(chan struct{}, 1), rm: newReplMetrics()}
	n.rec = recordingStore{store: st}
	fwd, err := NewForwarder(ForwarderConfig{Self: "a", Local: n.rec, Owners: n})
	if err != nil {
		t.Fatal(err)
	}
	n.fwd = fwd
	n.ctx, n.cancel = context.WithCancel(context.Background())
	alone, err := ring.New([]string{"a"}, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	both, err := ring.New([]string{"a", "b"}, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	n.view.Store(&view{ring: alone, targets: alone})
	for i := 0; ; i++ { // a key that b owns once it joins
		if key = []byte{'k', byte(i)}; func() bool { id, _ := both.Owner(key); return id == "b" }() {
			break
		}
	}
	op := bucket.Op{Key: key, Limit: bucket.Limit{Requests: 100, Unit: int64(time.Hour)}, Hits: 7}
	st.Apply(clock(), &op)

	peers := map[string]*peerClient{"b": {client: b}}
	n.fwd.peers.Store(&peers)
	n.wg.Add(1)
	go n.handoffLoop()
	t.Cleanup(func() {
		n.cancel()
		n.wg.Wait()
		none := map[string]*peerClient{} // b's client is a fake: nothing to close
		n.fwd.peers.Store(&none)
		n.fwd.Close()
	})
	// The loop has read the ring it starts from once it took a kick.
	n.handoffKick <- struct{}{}
	fwdWaitFor(t, fwdWait, "the handoff loop to start", func() bool { return len(n.handoffKick) == 0 })
	return n, key, func() {
		n.view.Store(&view{ring: both, targets: both})
		n.handoffKick <- struct{}{}
	}
}

// A handoff that fails to reach the key's new owner is run again, without
// another ring change, until the owner has the count: before, the loop moved
// on to the new ring and the key was never pushed again, so the new owner
// started it from zero.
func TestHandoffRetriesAFailedPush(t *testing.T) {
	b := &replFakePeer{failFirst: 1, got: map[string]bucket.State{}} // the first push fails
	n, key, move := handoffTestNode(t, b)
	move()
	fwdWaitFor(t, fwdWait, "the new owner to get the count", func() bool {
		got, _ := b.state(string(key))
		return got.Count == 7
	})
	if got := testCounterValue(t, n.rm.handoffFailures); got != 1 {
		t.Errorf("%v failed handoffs counted, want 1", got)
	}
}

// refusingPeer refuses every Replicate call as invalid.
type refusingPeer struct {
	peerpb.PeerClient
	calls atomic.Int32
}

func (p *refusingPeer) Replicate(context.Context, *peerpb.ReplicateRequest, ...grpc.CallOption) (*peerpb.ReplicateResponse, error) {
	p.calls.Add(1)
	return nil, status.Error(codes.InvalidArgument, "unknown algorithm")
}

// A push the new owner refuses as invalid (a peer of another version) is
// counted as dropped and not retried: it would be refused again, and every
// retry would scan the store and push to every peer again.
func TestHandoffDoesNotRetryARefusal(t *testing.T) {
	b := &refusingPeer{}
	n, _, move := handoffTestNode(t, b)
	move()
	fwdWaitFor(t, fwdWait, "the refusal", func() bool { return testCounterValue(t, n.rm.drop[replDropRefused]) == 1 })
	// The loop is done with that handoff once it takes the next kick.
	n.handoffKick <- struct{}{}
	fwdWaitFor(t, fwdWait, "the handoff loop to go on", func() bool { return len(n.handoffKick) == 0 })
	if got := testCounterValue(t, n.rm.handoffFailures); got != 0 {
		t.Errorf("%v failed handoffs counted, want 0: a refusal is final", got)
	}
	if got := b.calls.Load(); got != 1 {
		t.Errorf("%d pushes to the refusing peer, want 1", got)
	}
}

// TestNodeLeavingNodeRelays: once a leaving node has handed its counters
// off, the ops it is still sent are decided by the key's new owner, so the
// key is counted on one node while the leave spreads. Hits sent to it by a
// peer that has not seen the leave, sent by the new owner (whose ring
// still names it), and sent to it by its own Envoys all count once, on the
// new owner. A relayed batch is never relayed again, even by a node that
// is leaving too.
func TestNodeLeavingNodeRelays(t *testing.T) {
	nodes := nodeCluster(t, []string{"a", "b", "c"}, nil)
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
	if err := c.node.handOff(context.Background()); err != nil {
		t.Fatal(err)
	}
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
	if err := next.node.handOff(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i, via := range []*nodeTestNode{other, next, other, next} {
		if r := nodeHit(t, via, key, 1); r.Count != uint64(12+i) {
			t.Fatalf("hit %d via %s with two nodes leaving: count %d, want %d", i+1, via.id, r.Count, 12+i)
		}
	}
	if fb := nodeMetric(t, c.reg, "ringlimit_local_fallbacks_total"); fb != 0 {
		t.Errorf("%v local fallbacks on the leaving node, want 0", fb)
	}
}
