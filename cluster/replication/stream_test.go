package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/wire"
	"github.com/ringlimit/ringlimit/ring"
)

// connsFunc is a Conns from a function.
type connsFunc func(id string) peerpb.PeerClient

func (f connsFunc) Client(id string) peerpb.PeerClient { return f(id) }

// streamReplica is a Peer server whose ReplicateStream merges each valid
// batch it is sent and refuses an invalid one in-band (InvalidArgument),
// as a node's does; with renew it ends each stream after its answer (Last),
// as a node whose stream has reached its age does.
type streamReplica struct {
	peerpb.UnimplementedPeerServer
	renew   bool
	opened  atomic.Int32 // streams opened
	mu      sync.Mutex
	batches int // batches merged
	got     map[string]bucket.State
}

func (s *streamReplica) ReplicateStream(stream grpc.BidiStreamingServer[peerpb.ReplicateRequest, peerpb.ReplicateResponse]) error {
	s.opened.Add(1)
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		out := &peerpb.ReplicateResponse{Last: s.renew}
		if err := wire.ValidateEntries(req.GetEntries()); err != nil {
			out.Code, out.Message = uint32(codes.InvalidArgument), err.Error()
		} else {
			s.mu.Lock()
			s.batches++
			for _, e := range req.GetEntries() {
				s.got[string(e.GetKey())] = bucket.MaxState(s.got[string(e.GetKey())], wire.EntryState(e))
			}
			s.mu.Unlock()
			out.Merged = uint32(len(req.GetEntries()))
		}
		if err := stream.Send(out); err != nil || out.Last {
			return err
		}
	}
}

func (s *streamReplica) state(key string) (bucket.State, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[key], s.batches
}

// replStreamServer serves a streamReplica on loopback and returns it and
// a client.
func replStreamServer(t *testing.T, renew bool) (*streamReplica, peerpb.PeerClient) {
	t.Helper()
	rec := &streamReplica{renew: renew, got: map[string]bucket.State{}}
	srv := grpc.NewServer()
	peerpb.RegisterPeerServer(srv, rec)
	lis := testkit.Listen(t)
	testkit.Serve(t, srv, lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rec, peerpb.NewPeerClient(conn)
}

// streamTestShipper replicates to "b" only, through client.
func streamTestShipper(t *testing.T, client peerpb.PeerClient) *shipper {
	t.Helper()
	rg, err := ring.New([]string{"a", "b"}, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r := &shipper{
		self:     "a",
		replicas: 2,
		log:      newWriteLog(),
		interval: time.Hour, // sends only on flush
		targets:  func() *ring.Ring { return rg },
		conns:    connsFunc(func(string) peerpb.PeerClient { return client }),
		m:        newMetrics(),
		logger:   slog.New(slog.DiscardHandler),
	}
	r.start()
	t.Cleanup(r.close)
	return r
}

// The shipper sends cycle after cycle on one ReplicateStream, reusing
// its buffers, and renews the stream when the receiver ends it.
func TestShipperStream(t *testing.T) {
	for _, renew := range []bool{false, true} {
		t.Run(fmt.Sprintf("renew=%v", renew), func(t *testing.T) {
			rec, client := replStreamServer(t, renew) // renew: every answer ends its stream
			r := streamTestShipper(t, client)
			const cycles, keys = 5, 300
			win := replWindow()
			for c := range cycles {
				for k := range keys {
					r.log.record(fmt.Appendf(nil, "key-%d", k), bucket.State{Window: win, Unit: int64(dayUnit), Count: uint64(c + 1)})
				}
				if err := r.flush(context.Background()); err != nil {
					t.Fatal(err)
				}
				if _, batches := rec.state(""); batches != c+1 {
					t.Fatalf("cycle %d: %d batches received, want %d", c, batches, c+1)
				}
			}
			for k := range keys {
				if st, _ := rec.state(fmt.Sprintf("key-%d", k)); st.Count != cycles {
					t.Fatalf("key-%d: %+v, want count %d", k, st, cycles)
				}
			}
			want := int32(1)
			if renew {
				want = cycles
			}
			if got := rec.opened.Load(); got != want {
				t.Errorf("%d streams opened, want %d", got, want)
			}
			if got := testCounterValue(t, r.m.sent); got != cycles*keys {
				t.Errorf("%v entries counted as sent, want %d", got, cycles*keys)
			}
			if got := testCounterValue(t, r.m.rpcErrors); got != 0 {
				t.Errorf("%v send errors", got)
			}
		})
	}
}

// The shipper drops the entries of a batch its replica refuses (sent
// again, they would be refused again) and counts them, so the writes
// recorded after them still reach the replica.
func TestShipperDropsRefusedBatch(t *testing.T) {
	rec, client := replStreamServer(t, false)
	r := streamTestShipper(t, client)
	r.log.record([]byte("bad"), bucket.State{Window: replWindow(), Unit: 0, Count: 1})
	if err := r.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := testCounterValue(t, r.m.drop[dropRefused]); got != 1 {
		t.Errorf("%v refused writes counted as dropped, want 1", got)
	}
	r.log.record([]byte("k2"), bucket.State{Window: replWindow(), Unit: int64(dayUnit), Count: 5})
	if err := r.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st, _ := rec.state("k2"); st.Count != 5 {
		t.Errorf("after a refused batch the receiver has k2 = %+v; want count 5", st)
	}
	rec.mu.Lock()
	_, refused := rec.got["bad"]
	rec.mu.Unlock()
	if refused {
		t.Errorf("the refused entry reached the receiver")
	}
}

// A refused batch costs only its own entries: the send goes on with the
// destination's other batches, so one bad entry among more writes than one
// batch holds does not drop the rest of the backlog.
func TestReplicateRefusalDropsOnlyItsBatch(t *testing.T) {
	rec, client := replStreamServer(t, false)
	r := streamTestShipper(t, client)
	const good = wire.MaxEntries + 1000
	r.log.record([]byte("bad"), bucket.State{Window: replWindow(), Unit: 0, Count: 1})
	for i := range good {
		r.log.record(fmt.Appendf(nil, "k%d", i), bucket.State{Window: replWindow(), Unit: int64(dayUnit), Count: 1})
	}
	if err := r.flush(context.Background()); err != nil {
		t.Fatalf("flush: %v (a refusal is not a failure to deliver)", err)
	}
	rec.mu.Lock()
	delivered := len(rec.got)
	rec.mu.Unlock()
	refused := int(testCounterValue(t, r.m.drop[dropRefused]))
	if delivered+refused != good+1 || refused > wire.MaxEntries || delivered < good+1-wire.MaxEntries {
		t.Errorf("delivered %d and refused %d of %d writes; want every write in a batch without the bad entry delivered", delivered, refused, good+1)
	}
}
