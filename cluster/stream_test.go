package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/ring"
)

// One DecideStream carries batch after batch; a refused batch is answered
// in-band and the stream keeps working.
func TestPeerDecideStream(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"b"}, nil, nil)
	b := nodes["b"]
	client := peerTestClient(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := client.DecideStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bad := peerValidPB("b/bad")
	bad.UnitNs = 0
	tests := []struct {
		name      string
		req       *peerpb.DecideRequest
		notServe  bool
		wantCode  codes.Code
		wantCount []uint64
	}{
		{"batch", &peerpb.DecideRequest{Ops: []*peerpb.Op{peerValidPB("b/x"), peerValidPB("b/y"), peerValidPB("b/x")}}, false, codes.OK, []uint64{1, 1, 2}},
		{"invalid batch applies nothing", &peerpb.DecideRequest{Ops: []*peerpb.Op{peerValidPB("b/x"), bad}}, false, codes.InvalidArgument, nil},
		{"past the deadline", &peerpb.DecideRequest{DeadlineNs: b.now - 1, Ops: []*peerpb.Op{peerValidPB("b/x")}}, false, codes.DeadlineExceeded, nil},
		{"re-syncing", &peerpb.DecideRequest{Ops: []*peerpb.Op{peerValidPB("b/x")}}, true, codes.Unavailable, nil},
		{"fewer results after more", &peerpb.DecideRequest{Ops: []*peerpb.Op{peerValidPB("b/x")}}, false, codes.OK, []uint64{3}},
		{"empty batch", &peerpb.DecideRequest{}, false, codes.OK, []uint64{}},
	}
	for _, tt := range tests {
		b.f.setServing(!tt.notServe)
		if err := stream.Send(tt.req); err != nil {
			t.Fatalf("%s: Send: %v", tt.name, err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: Recv: %v", tt.name, err)
		}
		if got := codes.Code(resp.GetCode()); got != tt.wantCode {
			t.Errorf("%s: code %v (%q), want %v", tt.name, got, resp.GetMessage(), tt.wantCode)
		}
		if tt.wantCode != codes.OK && (resp.GetMessage() == "" || len(resp.GetResults()) != 0) {
			t.Errorf("%s: refusal with message %q and %d results", tt.name, resp.GetMessage(), len(resp.GetResults()))
		}
		if tt.wantCount != nil {
			if len(resp.GetResults()) != len(tt.wantCount) {
				t.Fatalf("%s: %d results, want %d", tt.name, len(resp.GetResults()), len(tt.wantCount))
			}
			for i, want := range tt.wantCount {
				if got := resp.GetResults()[i].GetCount(); got != want {
					t.Errorf("%s: result %d count %d, want %d", tt.name, i, got, want)
				}
			}
		}
		if resp.GetLast() {
			t.Fatalf("%s: the owner ended a fresh stream", tt.name)
		}
	}
	b.f.setServing(true)
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv after CloseSend: %v, want EOF", err)
	}
}

// An owner past its stream's age answers with last set and ends the
// stream; the sender goes on with a new stream, and nothing is lost or
// counted twice.
func TestForwardStreamRenewal(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"a", "b"}, nil, nil)
	a, b := nodes["a"], nodes["b"]
	b.f.streamMaxAge.Store(0) // every answer ends its stream
	client := peerTestClient(t, b)
	stream, err := client.DecideStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&peerpb.DecideRequest{Ops: []*peerpb.Op{peerValidPB("b/last")}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || !resp.GetLast() {
		t.Fatalf("Recv = %v, %v; want an answer with last set", resp, err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv after last: %v, want EOF", err)
	}

	res := make([]bucket.Result, 1)
	const n = 20
	for i := range n {
		a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp("b/renew")}, res)
		if res[0].Count != uint64(i+1) {
			t.Fatalf("call %d: count %d, want %d", i, res[0].Count, i+1)
		}
	}
	if c := fwdReadCounts(t, a.reg); c.forwarded != n || c.timeout+c.error+c.suspect+c.unknown != 0 {
		t.Errorf("counts %+v, want %d forwarded and no fallback", c, n)
	}
	p := (*a.f.peers.Load())["b"]
	if p.unaryUntil.Load() != 0 {
		t.Error("the sender fell back to Decide calls")
	}
	if p.onTime.Load() == 0 {
		t.Error("answers in time did not mark the peer as answering in time")
	}
}

// A peer without DecideStream (an older version) gets Decide calls.
func TestForwardUnaryFallback(t *testing.T) {
	peer := fwdStartFakePeer(t, fwdPeerBlocking)
	peer.noStream.Store(true)
	peer.open()
	nodes := fwdStartCluster(t, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
		c.Timeout = 5 * time.Second
	})
	a := nodes["a"]
	res := make([]bucket.Result, 1)
	for i := range 3 {
		a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp("b/old")}, res)
		if res[0].Count != 777 {
			t.Fatalf("call %d: count %d, want the peer's 777", i, res[0].Count)
		}
	}
	if n := peer.decides.Load(); n != 3 {
		t.Errorf("%d Decide calls, want 3", n)
	}
	if p := (*a.f.peers.Load())["b"]; p.unaryUntil.Load() <= a.f.mono() {
		t.Error("the sender did not note that the peer has no DecideStream")
	}
	if len(a.f.Suspects()) != 0 {
		t.Errorf("Suspects() = %v, want none", a.f.Suspects())
	}
}

// Timeouts do not make a peer suspect while it keeps answering other
// waiters in time: it is busy, not gone.
func TestForwardBusyPeerIsNotSuspect(t *testing.T) {
	peer := fwdStartFakePeer(t, fwdPeerBlocking)
	nodes := fwdStartCluster(t, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
		c.Timeout = 20 * time.Millisecond
	})
	a := nodes["a"]
	p := (*a.f.peers.Load())["b"]
	for i := range 2 * peerSuspectAfter {
		p.onTime.Store(a.f.mono()) // as if another waiter had just got its answer
		p.noteFailure("timeout", nil)
		if s := a.f.Suspects(); len(s) != 0 {
			t.Fatalf("after %d timeouts with answers in between: Suspects() = %v", i+1, s)
		}
	}
	p.onTime.Store(a.f.mono() - int64(2*peerQuietFor)) // quiet since
	for range peerSuspectAfter {
		p.noteFailure("timeout", nil)
	}
	if s := a.f.Suspects(); len(s) != 1 {
		t.Fatalf("a quiet peer after %d timeouts: Suspects() = %v, want [b]", peerSuspectAfter, s)
	}
}

// A stream whose owner does not answer in time is ended; the next batch
// goes on a new stream and gets its own answer, never the late one.
func TestForwardStreamTimeoutReopens(t *testing.T) {
	peer := fwdStartFakePeer(t, fwdPeerBlocking)
	nodes := fwdStartCluster(t, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
		c.Timeout = 30 * time.Millisecond
	})
	a := nodes["a"]
	res := make([]bucket.Result, 1)
	a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp("b/late")}, res)
	if c := fwdReadCounts(t, a.reg); c.timeout != 1 {
		t.Fatalf("counts %+v after a batch the peer held, want 1 timeout", c)
	}
	// The sender ends the stream once its wait (max(Timeout, 250 ms)) has
	// passed, while the owner still holds the batch: its handler ends.
	fwdWaitFor(t, fwdWait, "the stream to be ended", func() bool { return peer.ended.Load() == 1 })
	peer.open()
	fwdWaitFor(t, fwdWait, "a forwarded answer", func() bool {
		a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp("b/next")}, res)
		return fwdReadCounts(t, a.reg).forwarded == 1
	})
	if res[0].Count != 777 {
		t.Fatalf("count %d, want the peer's 777", res[0].Count)
	}
	if n := peer.streams.Load(); n < 2 {
		t.Errorf("%d streams opened, want the ended one and a new one", n)
	}
}

// A peer whose every answer arrives after its caller gave up is suspect
// after peerSuspectAfter such calls: late answers do not clear failures.
func TestForwardAlwaysLatePeerIsSuspect(t *testing.T) {
	peer := fwdStartFakePeer(t, fwdPeerBlocking)
	peer.delay.Store(int64(80 * time.Millisecond)) // late for a 30 ms wait, inside the 250 ms exchange
	peer.open()
	nodes := fwdStartCluster(t, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
		c.Timeout = 30 * time.Millisecond
		c.SuspectFor = time.Minute
	})
	a := nodes["a"]
	res := make([]bucket.Result, 1)
	for i := 0; i < 4*peerSuspectAfter && len(a.f.Suspects()) == 0; i++ {
		a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp(fmt.Sprintf("b/%d", i))}, res)
	}
	if s := a.f.Suspects(); len(s) != 1 {
		t.Fatalf("Suspects() = %v after a peer answered every call late, want [b]", s)
	}
}

// replRecorder is a stateService that records what it merges.
type replRecorder struct {
	mu      sync.Mutex
	batches int
	got     map[string]bucket.State
}

func (r *replRecorder) replicate(_ string, entries []*peerpb.Entry) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches++
	for _, e := range entries {
		r.got[string(e.GetKey())] = bucket.MaxState(r.got[string(e.GetKey())], stateFromPB(e))
	}
	return len(entries)
}

func (r *replRecorder) sync(*peerpb.SyncRequest, grpc.ServerStreamingServer[peerpb.SyncResponse]) error {
	return errors.New("not served here")
}

func (r *replRecorder) state(key string) (bucket.State, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[key], r.batches
}

// replStreamServer serves the Peer service on loopback with rec behind
// Replicate and ReplicateStream. It returns the server's forwarder (for
// its stream age), a client, and a count of the ReplicateStreams opened.
func replStreamServer(t *testing.T, rec stateService) (*Forwarder, peerpb.PeerClient, *atomic.Int32) {
	t.Helper()
	f, err := NewForwarder(ForwarderConfig{
		Self:       "b",
		Local:      newFwdFakeStore(),
		Owners:     &fwdFakeOwners{self: "b", tab: map[string]fwdOwnerEntry{}},
		Registerer: prometheus.NewRegistry(),
	})
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
	f.register(srv, rec)
	l := fwdListen(t)
	fwdServe(t, srv, l)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return f, peerpb.NewPeerClient(conn), opened
}

// replStreamTestReplicator replicates to "b" only, through client.
func replStreamTestReplicator(t *testing.T, client peerpb.PeerClient) *replicator {
	t.Helper()
	rg, err := ring.New([]string{"a", "b"}, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r := &replicator{
		self:     "a",
		replicas: 2,
		log:      newReplLog(),
		interval: time.Hour, // sends only on flush
		targets:  func() *ring.Ring { return rg },
		client:   func(string) peerpb.PeerClient { return client },
		m:        newReplMetrics(),
		logger:   slog.New(slog.DiscardHandler),
	}
	r.start()
	t.Cleanup(r.close)
	return r
}

// The replicator sends cycle after cycle on one ReplicateStream, reusing
// its buffers, and renews the stream when the receiver ends it.
func TestReplicatorStream(t *testing.T) {
	for _, renew := range []bool{false, true} {
		t.Run(fmt.Sprintf("renew=%v", renew), func(t *testing.T) {
			rec := &replRecorder{got: map[string]bucket.State{}}
			f, client, opened := replStreamServer(t, rec)
			if renew {
				f.streamMaxAge.Store(0) // every answer ends its stream
			}
			r := replStreamTestReplicator(t, client)
			const cycles, keys = 5, 300
			win := replWindow()
			for c := range cycles {
				for k := range keys {
					r.log.record(fmt.Appendf(nil, "key-%d", k), bucket.State{Window: win, Unit: int64(nodeUnit), Count: uint64(c + 1)})
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
			if got := opened.Load(); got != want {
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

// A batch the receiver refuses is answered in-band, merges nothing, and
// the stream stays open for the next one.
func TestReplicateStreamRefusal(t *testing.T) {
	rec := &replRecorder{got: map[string]bucket.State{}}
	_, client, opened := replStreamServer(t, rec)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := client.ReplicateStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	good := &peerpb.Entry{Key: []byte("k"), WindowNs: replWindow(), UnitNs: int64(nodeUnit), Count: 3}
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
	// The replicator drops the refused entries (sent again, they would be
	// refused again) and counts them, so the writes recorded after them
	// still reach the replica.
	r := replStreamTestReplicator(t, client)
	r.log.record([]byte("bad"), bucket.State{Window: replWindow(), Unit: 0, Count: 1})
	if err := r.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := testCounterValue(t, r.m.drop[replDropRefused]); got != 1 {
		t.Errorf("%v refused writes counted as dropped, want 1", got)
	}
	r.log.record([]byte("k2"), bucket.State{Window: replWindow(), Unit: int64(nodeUnit), Count: 5})
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
	rec := &replRecorder{got: map[string]bucket.State{}}
	_, client, _ := replStreamServer(t, rec)
	r := replStreamTestReplicator(t, client)
	const good = replMaxEntries + 1000
	r.log.record([]byte("bad"), bucket.State{Window: replWindow(), Unit: 0, Count: 1})
	for i := range good {
		r.log.record(fmt.Appendf(nil, "k%d", i), bucket.State{Window: replWindow(), Unit: int64(nodeUnit), Count: 1})
	}
	if err := r.flush(context.Background()); err != nil {
		t.Fatalf("flush: %v (a refusal is not a failure to deliver)", err)
	}
	rec.mu.Lock()
	delivered := len(rec.got)
	rec.mu.Unlock()
	refused := int(testCounterValue(t, r.m.drop[replDropRefused]))
	if delivered+refused != good+1 || refused > replMaxEntries || delivered < good+1-replMaxEntries {
		t.Errorf("delivered %d and refused %d of %d writes; want every write in a batch without the bad entry delivered", delivered, refused, good+1)
	}
}

// A batch on a stream kept past its age and the grace is refused unmerged,
// and the receiver ends the stream.
func TestReplicateStreamTooOld(t *testing.T) {
	rec := &replRecorder{got: map[string]bucket.State{}}
	f, client, _ := replStreamServer(t, rec)
	f.streamMaxAge.Store(-int64(peerStreamGrace)) // every stream is too old at once
	stream, err := client.ReplicateStream(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	e := &peerpb.Entry{Key: []byte("k"), WindowNs: replWindow(), UnitNs: int64(nodeUnit), Count: 1}
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
