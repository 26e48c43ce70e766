package transport

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/wire"
)

// replRecorder is a StateService that records what it merges.
type replRecorder struct {
	mu      sync.Mutex
	batches int
	got     map[string]bucket.State
}

func (r *replRecorder) Replicate(_ string, entries []*peerpb.Entry) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches++
	for _, e := range entries {
		r.got[string(e.GetKey())] = bucket.MaxState(r.got[string(e.GetKey())], wire.EntryState(e))
	}
	return len(entries)
}

func (r *replRecorder) Sync(*peerpb.SyncRequest, grpc.ServerStreamingServer[peerpb.SyncResponse]) error {
	return errors.New("not served here")
}

func (r *replRecorder) state(key string) (bucket.State, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[key], r.batches
}

// replStreamServer serves the Peer service on loopback with rec behind
// Replicate and ReplicateStream; tweak, if not nil, changes the server's
// forwarder config (its clock, its stream age). It returns a client and a
// count of the ReplicateStreams opened.
func replStreamServer(t *testing.T, rec StateService, tweak func(*ForwarderConfig)) (peerpb.PeerClient, *atomic.Int32) {
	t.Helper()
	cfg := ForwarderConfig{
		Self:       "b",
		Local:      newFwdFakeStore(),
		Owners:     &fwdFakeOwners{self: "b", tab: map[string]fwdOwnerEntry{}},
		Registerer: prometheus.NewRegistry(),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	f, err := NewForwarder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	opened := new(atomic.Int32)
	srv := grpc.NewServer(grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if strings.HasSuffix(info.FullMethod, "/ReplicateStream") {
			opened.Add(1)
		}
		return h(srv, ss)
	}))
	Register(srv, f, rec)
	l := testkit.Listen(t)
	testkit.Serve(t, srv, l)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return peerpb.NewPeerClient(conn), opened
}

// A batch the receiver refuses is answered in-band, merges nothing, and
// the stream stays open for the next one.
func TestReplicateStreamRefusal(t *testing.T) {
	rec := &replRecorder{got: map[string]bucket.State{}}
	client, opened := replStreamServer(t, rec, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := client.ReplicateStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	good := &peerpb.Entry{Key: []byte("k"), WindowNs: replWindow(), UnitNs: int64(dayUnit), Count: 3}
	bad := &peerpb.Entry{Key: []byte("bad"), UnitNs: 0}
	tests := []struct {
		name       string
		entries    []*peerpb.Entry
		wantCode   codes.Code
		wantMerged uint32
	}{
		{"invalid batch merges nothing", []*peerpb.Entry{good, bad}, codes.InvalidArgument, 0},
		{"then a good batch", []*peerpb.Entry{good}, codes.OK, 1},
		{"empty batch", nil, codes.OK, 0},
	}
	for _, tt := range tests {
		if err := stream.Send(&peerpb.ReplicateRequest{From: "a", Entries: tt.entries}); err != nil {
			t.Fatalf("%s: Send: %v", tt.name, err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: Recv: %v", tt.name, err)
		}
		if got := codes.Code(resp.GetCode()); got != tt.wantCode || resp.GetMerged() != tt.wantMerged || resp.GetLast() {
			t.Errorf("%s: code %v (%q), merged %d, last %v; want %v, %d, false", tt.name, got, resp.GetMessage(), resp.GetMerged(), resp.GetLast(), tt.wantCode, tt.wantMerged)
		}
		if tt.wantCode != codes.OK && resp.GetMessage() == "" {
			t.Errorf("%s: refusal without a message", tt.name)
		}
	}
	if st, batches := rec.state("k"); batches != 2 || st.Count != 3 {
		t.Errorf("receiver merged %d batches, k = %+v; want 2 batches (one empty) and count 3", batches, st)
	}
	if got := opened.Load(); got != 1 {
		t.Errorf("%d streams opened, want 1", got)
	}
}

// A batch on a stream kept past its age and the grace is refused unmerged,
// and the receiver ends the stream.
func TestReplicateStreamTooOld(t *testing.T) {
	rec := &replRecorder{got: map[string]bucket.State{}}
	client, _ := replStreamServer(t, rec, func(c *ForwarderConfig) {
		// Every reading of the server's clock is a stream age and the
		// grace after the one before: the stream is too old at its first
		// batch.
		clk := newFwdClock(0)
		clk.step = wire.StreamMaxAge + peerStreamGrace
		c.Clock = clk
	})
	stream, err := client.ReplicateStream(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	e := &peerpb.Entry{Key: []byte("k"), WindowNs: replWindow(), UnitNs: int64(dayUnit), Count: 1}
	if err := stream.Send(&peerpb.ReplicateRequest{From: "a", Entries: []*peerpb.Entry{e}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if codes.Code(resp.GetCode()) != codes.Unavailable || !resp.GetLast() || resp.GetMerged() != 0 {
		t.Errorf("answer %v; want Unavailable, last, nothing merged", resp)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("Recv after last: %v, want EOF", err)
	}
	if _, batches := rec.state("k"); batches != 0 {
		t.Errorf("%d batches merged, want 0", batches)
	}
}

// A receiver whose stream has reached its age merges the batch, answers
// with last set and ends the stream; the sender's next batch goes on a new
// stream (as the replicator's sender does).
func TestReplicateStreamRenewal(t *testing.T) {
	rec := &replRecorder{got: map[string]bucket.State{}}
	client, opened := replStreamServer(t, rec, func(c *ForwarderConfig) {
		c.StreamMaxAge = -1 // every answer ends its stream
	})
	for i := range 2 {
		stream, err := client.ReplicateStream(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		e := &peerpb.Entry{Key: []byte("k"), WindowNs: replWindow(), UnitNs: int64(dayUnit), Count: uint64(i + 1)}
		if err := stream.Send(&peerpb.ReplicateRequest{From: "a", Entries: []*peerpb.Entry{e}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil || codes.Code(resp.GetCode()) != codes.OK || !resp.GetLast() || resp.GetMerged() != 1 {
			t.Fatalf("batch %d: answer %v, %v; want OK, last, one merged", i+1, resp, err)
		}
		if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("batch %d: Recv after last: %v, want EOF", i+1, err)
		}
	}
	if st, batches := rec.state("k"); batches != 2 || st.Count != 2 {
		t.Errorf("receiver merged %d batches, k = %+v; want 2 and count 2", batches, st)
	}
	if got := opened.Load(); got != 2 {
		t.Errorf("%d streams opened, want 2", got)
	}
}
