package cluster

import (
	"context"
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
