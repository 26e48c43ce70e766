package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
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
		b.pol.setServing(!tt.notServe)
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
	b.pol.setServing(true)
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
	nodes := fwdStartCluster(t, []string{"a", "b"}, nil, func(c *ForwarderConfig) {
		if c.Self == "b" {
			c.StreamMaxAge = -1 // every answer ends its stream
		}
	})
	a, b := nodes["a"], nodes["b"]
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
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		peer := fwdStartFakePeer(t, sim, fwdPeerBlocking)
		peer.noStream.Store(true)
		peer.open()
		nodes := fwdStartClusterOn(t, sim, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
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
	})
}

// Timeouts do not make a peer suspect while it keeps answering other
// waiters in time: it is busy, not gone.
func TestForwardBusyPeerIsNotSuspect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		peer := fwdStartFakePeer(t, sim, fwdPeerBlocking)
		nodes := fwdStartClusterOn(t, sim, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
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
	})
}

// A stream whose owner does not answer in time is ended; the next batch
// goes on a new stream and gets its own answer, never the late one.
func TestForwardStreamTimeoutReopens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		peer := fwdStartFakePeer(t, sim, fwdPeerBlocking)
		nodes := fwdStartClusterOn(t, sim, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
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
		testkit.WaitFor(t, fwdWait, "the stream to be ended", func() bool { return peer.ended.Load() == 1 })
		peer.open()
		testkit.WaitFor(t, fwdWait, "a forwarded answer", func() bool {
			a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp("b/next")}, res)
			return fwdReadCounts(t, a.reg).forwarded == 1
		})
		if res[0].Count != 777 {
			t.Fatalf("count %d, want the peer's 777", res[0].Count)
		}
		if n := peer.streams.Load(); n < 2 {
			t.Errorf("%d streams opened, want the ended one and a new one", n)
		}
	})
}

// A peer whose every answer arrives after its caller gave up is suspect
// after peerSuspectAfter such calls: late answers do not clear failures.
func TestForwardAlwaysLatePeerIsSuspect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		peer := fwdStartFakePeer(t, sim, fwdPeerBlocking)
		peer.delay.Store(int64(80 * time.Millisecond)) // late for a 30 ms wait, inside the 250 ms exchange
		peer.open()
		nodes := fwdStartClusterOn(t, sim, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
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
	})
}
