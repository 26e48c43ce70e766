package cluster

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	clk "github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/replication"
	"github.com/ringlimit/ringlimit/ring"
)

// handoffTestNode is node "a" alone, holding key at count 7, with its
// handoff loop running and peer "b" served by the fake b; reg has its
// replication metrics. move makes b join the ring, which moves key to b,
// and waits until the loop has read the ring it started from.
func handoffTestNode(t *testing.T, b peerpb.PeerClient) (n *Node, reg *prometheus.Registry, key []byte, move func()) {
	t.Helper()
	at := time.Unix(0, int64(30*time.Minute))
	fixed := fixedClock{clk.Real(), at}
	st := bucket.NewStore(bucket.StoreConfig{})
	n = &Node{self: "a", replicas: 1, clock: fixed, log: slog.New(slog.DiscardHandler),
		handoffKick: make(chan struct{}, 1)}
	n.rec = replication.NewRecorder(st, false)
	reg = prometheus.NewRegistry()
	repl, err := replication.New(replication.Config{
		Self: "a", Replicas: 1, Recorder: n.rec, Clock: fixed, SyncTimeout: time.Second,
		Ring: func() *ring.Ring { return n.view.Load().ring }, Conns: fakeConns{"b": b}, Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	n.repl = repl
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
	st.Apply(at.UnixNano(), &op)

	n.wg.Add(1)
	go n.handoffLoop()
	t.Cleanup(func() {
		n.cancel()
		n.wg.Wait()
		n.repl.Close()
	})
	// The loop has read the ring it starts from once it took a kick.
	n.handoffKick <- struct{}{}
	testkit.WaitFor(t, quick, "the handoff loop to start", func() bool { return len(n.handoffKick) == 0 })
	return n, reg, key, func() {
		n.view.Store(&view{ring: both, targets: both})
		n.handoffKick <- struct{}{}
	}
}

// fixedClock is a clock whose Now stands still; its timers are the
// system's (the bubble's virtual ones in these tests).
type fixedClock struct {
	clk.Clock
	at time.Time
}

func (c fixedClock) Now() time.Time { return c.at }

// fakeConns maps peer IDs to their clients.
type fakeConns map[string]peerpb.PeerClient

func (c fakeConns) Client(id string) peerpb.PeerClient { return c[id] }

// A handoff that fails to reach the key's new owner is run again, without
// another ring change, until the owner has the count: otherwise the key
// would never be pushed again, and the new owner would start it from zero.
func TestHandoffRetriesAFailedPush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := testkit.NewReplicaPeer(1, false) // the first push fails
		_, reg, key, move := handoffTestNode(t, b)
		move()
		testkit.WaitFor(t, quick, "the new owner to get the count", func() bool {
			got, _ := b.State(string(key))
			return got.Count == 7
		})
		if got := nodeMetric(t, reg, "ringlimit_handoff_failures_total"); got != 1 {
			t.Errorf("%v failed handoffs counted, want 1", got)
		}
	})
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
	synctest.Test(t, func(t *testing.T) {
		b := &refusingPeer{}
		n, reg, _, move := handoffTestNode(t, b)
		move()
		// Only the refusal drops writes here: without replicas nothing else is
		// sent.
		testkit.WaitFor(t, quick, "the refusal", func() bool { return nodeMetric(t, reg, "ringlimit_replication_dropped_total") == 1 })
		// The loop is done with that handoff once it takes the next kick.
		n.handoffKick <- struct{}{}
		testkit.WaitFor(t, quick, "the handoff loop to go on", func() bool { return len(n.handoffKick) == 0 })
		if got := nodeMetric(t, reg, "ringlimit_handoff_failures_total"); got != 0 {
			t.Errorf("%v failed handoffs counted, want 0: a refusal is final", got)
		}
		if got := b.calls.Load(); got != 1 {
			t.Errorf("%d pushes to the refusing peer, want 1", got)
		}
	})
}
