package transport

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// peerTestClient dials node n's Peer service directly.
func peerTestClient(t *testing.T, n *fwdTestNode) peerpb.PeerClient {
	t.Helper()
	conn, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return peerpb.NewPeerClient(conn)
}

// dayUnit is the window of the limits these tests count under in real time
// (time.Now): a day, so that counts taken over the seconds a test runs
// almost never straddle a window edge (midnight UTC).
const dayUnit = 24 * time.Hour

// replWindow is the start of the current dayUnit window (Unix ns).
func replWindow() int64 {
	now := time.Now().UnixNano()
	return now - now%int64(dayUnit)
}

// peerValidPB is a valid op on a day's window (dayUnit), so counts taken
// over several calls in real time do not straddle a window edge.
func peerValidPB(key string) *peerpb.Op {
	return &peerpb.Op{Key: []byte(key), Requests: 10, UnitNs: int64(dayUnit), Hits: 1}
}

func TestPeerServerDecide(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"b"}, nil, nil)
	b := nodes["b"]
	client := peerTestClient(t, b)
	ctx := context.Background()

	many := make([]*peerpb.Op, peerMaxOps)
	for i := range many {
		many[i] = peerValidPB("b/many")
	}
	longKey := peerValidPB("b/" + string(bytes.Repeat([]byte{'k'}, peerMaxKeyLen-2)))
	peek := peerValidPB("b/peek")
	peek.Mode = 2
	tests := []struct {
		name  string
		ops   []*peerpb.Op
		want  []*peerpb.Result
		check func(t *testing.T)
	}{
		{"empty batch", nil, nil, nil},
		{"in order", []*peerpb.Op{peerValidPB("b/x"), peerValidPB("b/y"), peerValidPB("b/x")},
			[]*peerpb.Result{{Count: 1, Remaining: 9, ResetAfterNs: b.now}, {Count: 1, Remaining: 9, ResetAfterNs: b.now}, {Count: 2, Remaining: 8, ResetAfterNs: b.now}}, nil},
		{"peek", []*peerpb.Op{peek}, []*peerpb.Result{{Count: 1, Remaining: 9, ResetAfterNs: b.now}},
			func(t *testing.T) {
				if n := b.store.count("b/peek"); n != 0 {
					t.Errorf("peek stored %d", n)
				}
			}},
		{"largest key", []*peerpb.Op{longKey}, []*peerpb.Result{{Count: 1, Remaining: 9, ResetAfterNs: b.now}}, nil},
		{"largest batch", many, nil, func(t *testing.T) {
			if n := b.store.count("b/many"); n != peerMaxOps {
				t.Errorf("counted %d, want %d", n, peerMaxOps)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := client.Decide(ctx, &peerpb.DecideRequest{From: "test", Ops: tt.ops})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetResults()) != len(tt.ops) {
				t.Fatalf("%d results for %d ops", len(resp.GetResults()), len(tt.ops))
			}
			for i, want := range tt.want {
				got := resp.GetResults()[i]
				if got.GetOver() != want.GetOver() || got.GetCount() != want.GetCount() ||
					got.GetRemaining() != want.GetRemaining() || got.GetResetAfterNs() != want.GetResetAfterNs() {
					t.Errorf("result %d = %v, want %v", i, got, want)
				}
			}
			if tt.check != nil {
				tt.check(t)
			}
		})
	}

	ping, err := client.Ping(ctx, &peerpb.PingRequest{From: "test"})
	if err != nil || ping.GetId() != "b" {
		t.Fatalf("Ping = %v, %v; want id b", ping, err)
	}
}

func TestPeerServerRejectsInvalidBatch(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"b"}, nil, nil)
	b := nodes["b"]
	client := peerTestClient(t, b)
	edit := func(f func(o *peerpb.Op)) *peerpb.Op {
		o := peerValidPB("b/bad")
		f(o)
		return o
	}
	tooMany := make([]*peerpb.Op, peerMaxOps+1)
	for i := range tooMany {
		tooMany[i] = peerValidPB("b/many")
	}
	tests := []struct {
		name string
		ops  []*peerpb.Op
	}{
		{"empty key", []*peerpb.Op{peerValidPB("b/ok"), edit(func(o *peerpb.Op) { o.Key = nil })}},
		{"key too long", []*peerpb.Op{peerValidPB("b/ok"), edit(func(o *peerpb.Op) { o.Key = make([]byte, peerMaxKeyLen+1) })}},
		{"zero unit", []*peerpb.Op{peerValidPB("b/ok"), edit(func(o *peerpb.Op) { o.UnitNs = 0 })}},
		{"negative unit", []*peerpb.Op{peerValidPB("b/ok"), edit(func(o *peerpb.Op) { o.UnitNs = -1 })}},
		{"unknown algorithm", []*peerpb.Op{peerValidPB("b/ok"), edit(func(o *peerpb.Op) { o.Algorithm = 7 })}},
		{"algorithm wrapping to a known one", []*peerpb.Op{peerValidPB("b/ok"), edit(func(o *peerpb.Op) { o.Algorithm = 256 })}},
		{"unknown mode", []*peerpb.Op{peerValidPB("b/ok"), edit(func(o *peerpb.Op) { o.Mode = 3 })}},
		{"mode wrapping to a known one", []*peerpb.Op{peerValidPB("b/ok"), edit(func(o *peerpb.Op) { o.Mode = 256 })}},
		{"too many ops", tooMany},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := client.Decide(context.Background(), &peerpb.DecideRequest{From: "test", Ops: tt.ops})
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
			if n := b.store.numCalls(); n != 0 {
				t.Fatalf("a refused batch applied %d ops", n)
			}
		})
	}
}

func TestPeerValidateBatchNilOp(t *testing.T) {
	if err := peerValidateBatch([]*peerpb.Op{peerValidPB("b/ok"), nil}); err == nil {
		t.Fatal("nil op accepted")
	}
}

// gRPC's codec refuses to send a non-UTF-8 string; the server checks
// anyway.
func TestPeerValidateSyncNonUTF8(t *testing.T) {
	if err := peerValidateSync(&peerpb.SyncRequest{From: "\xff", Replicas: 2}); err == nil {
		t.Error("non-UTF-8 from accepted")
	}
}

// An op the owner would refuse is not forwarded (it would sink the whole
// batch): the entry node decides it locally.
func TestForwardInvalidOpStaysLocal(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"a", "b"}, nil, nil)
	a, b := nodes["a"], nodes["b"]
	bad := fwdOp("b/bad")
	bad.Limit.Unit = 0
	ops := []bucket.Op{fwdOp("b/good1"), bad, fwdOp("b/good2")}
	res := make([]bucket.Result, len(ops))
	a.f.Apply(context.Background(), a.now, ops, res)
	if res[0].ResetAfter != b.now || res[2].ResetAfter != b.now {
		t.Errorf("valid ops: %+v, %+v; want decisions from b", res[0], res[2])
	}
	if res[1].ResetAfter != a.now {
		t.Errorf("invalid op: %+v, want a local decision", res[1])
	}
	if n := b.store.count("b/bad"); n != 0 {
		t.Errorf("owner counted the invalid op")
	}
}

// The owner skips a batch read after its sender's deadline (by the owner's
// clock), and applies one read before it or with no deadline.
func TestPeerServerDecideDeadline(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"b"}, nil, nil)
	b := nodes["b"] // its clock reads 1000
	client := peerTestClient(t, b)
	tests := []struct {
		name     string
		deadline int64
		code     codes.Code
		applied  uint64
	}{
		{"passed", b.now - 1, codes.DeadlineExceeded, 0},
		{"now", b.now, codes.DeadlineExceeded, 0},
		{"ahead", b.now + 1, codes.OK, 1},
		{"none", 0, codes.OK, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "b/deadline-" + tt.name
			_, err := client.Decide(context.Background(), &peerpb.DecideRequest{From: "test", DeadlineNs: tt.deadline, Ops: []*peerpb.Op{peerValidPB(key)}})
			if status.Code(err) != tt.code {
				t.Fatalf("err = %v, want %v", err, tt.code)
			}
			if n := b.store.count(key); n != tt.applied {
				t.Fatalf("applied %d, want %d", n, tt.applied)
			}
		})
	}
}

// A thawed owner whose clock is past the entry node's deadline applies
// nothing; the entry node decides locally (it stopped waiting), so the hit
// is counted once.
func TestForwardExpiredBatchCountedOnce(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"a", "b"}, nil, func(c *ForwarderConfig) {
		if c.Self == "b" {
			c.Clock = newFwdClock(int64(time.Hour)) // far past a's deadline
		}
	})
	a, b := nodes["a"], nodes["b"]
	res := make([]bucket.Result, 1)
	a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp("b/late")}, res)
	if res[0].ResetAfter != a.now {
		t.Errorf("result %+v, want a local decision", res[0])
	}
	if n, m := b.store.count("b/late"), a.store.count("b/late"); n != 0 || m != 1 {
		t.Errorf("owner counted %d, entry node %d; want 0 and 1", n, m)
	}
	if c := fwdReadCounts(t, a.reg); c.timeout != 1 {
		t.Errorf("fallbacks %+v, want one timeout", c)
	}
}

// While a node re-syncs it refuses Decide with Unavailable and Ping with
// FailedPrecondition, and applies nothing; entry nodes fall back and hold
// it suspect.
func TestPeerServerRefusesWhileNotServing(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"a", "b"}, nil, nil)
	a, b := nodes["a"], nodes["b"]
	b.pol.setServing(false)
	client := peerTestClient(t, b)
	if _, err := client.Decide(context.Background(), &peerpb.DecideRequest{Ops: []*peerpb.Op{peerValidPB("b/x")}}); status.Code(err) != codes.Unavailable {
		t.Fatalf("Decide: %v, want Unavailable", err)
	}
	if _, err := client.Ping(context.Background(), &peerpb.PingRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Ping: %v, want FailedPrecondition", err)
	}
	res := make([]bucket.Result, 1)
	a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp("b/y")}, res)
	if res[0].ResetAfter != a.now || b.store.numCalls() != 0 {
		t.Fatalf("result %+v, owner calls %d: want a local decision", res[0], b.store.numCalls())
	}
	if got := a.f.Suspects(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("suspects %v, want [b]", got)
	}
	b.pol.setServing(true)
	testkit.WaitFor(t, fwdWait, "the probe to clear b", func() bool { return len(a.f.Suspects()) == 0 })
}
