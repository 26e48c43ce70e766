package cluster

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/ring"
)

// A handoff that fails to reach the key's new owner is run again, without
// another ring change, until the owner has the count: before, the loop moved
// on to the new ring and the key was never pushed again, so the new owner
// started it from zero.
func TestHandoffRetriesAFailedPush(t *testing.T) {
	clock := func() int64 { return int64(30 * time.Minute) }
	st := bucket.NewStore(bucket.StoreConfig{})
	n := &Node{self: "a", replicas: 1, clock: clock, log: slog.New(slog.DiscardHandler), store: st,
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
	var key []byte
	for i := 0; ; i++ { // a key that b owns once it joins
		if key = []byte{'k', byte(i)}; func() bool { id, _ := both.Owner(key); return id == "b" }() {
			break
		}
	}
	op := bucket.Op{Key: key, Limit: bucket.Limit{Requests: 100, Unit: int64(time.Hour)}, Hits: 7}
	st.Apply(clock(), &op)

	b := &replFakePeer{failFirst: 1, got: map[string]bucket.State{}} // the first push fails
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
	n.view.Store(&view{ring: both, targets: both})
	n.handoffKick <- struct{}{}
	fwdWaitFor(t, fwdWait, "the new owner to get the count", func() bool {
		got, _ := b.state(string(key))
		return got.Count == 7
	})
	if got := testCounterValue(t, n.rm.handoffFailures); got != 1 {
		t.Errorf("%v failed handoffs counted, want 1", got)
	}
}
