package transport

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// fuzzApplier counts the ops a Decide applies and decides them on a real
// store.
type fuzzApplier struct {
	store   *bucket.Store
	applied int
}

func (a *fuzzApplier) Apply(now int64, op *bucket.Op) bucket.Result {
	a.applied++
	return a.store.Apply(now, op)
}

// fuzzOwners owns every key.
type fuzzOwners struct{}

func (fuzzOwners) Owner([]byte) (string, string, bool) { return "self", "", true }

// fuzzState counts Replicate's calls and the entries handed to them.
type fuzzState struct {
	calls, entries int
}

func (s *fuzzState) Replicate(_ string, entries []*peerpb.Entry) int {
	s.calls++
	s.entries += len(entries)
	return len(entries)
}

func (s *fuzzState) Sync(*peerpb.SyncRequest, grpc.ServerStreamingServer[peerpb.SyncResponse]) error {
	return nil
}

// FuzzPeerDecode feeds arbitrary bytes to the peer server as a
// DecideRequest (kind even) or a ReplicateRequest (kind odd), the way gRPC
// hands them over: unmarshal, then the handler. It must never panic; a
// request the handler refuses must apply nothing; one it accepts must
// apply each op, or hand each entry over, exactly once.
func FuzzPeerDecode(f *testing.F) {
	const now = int64(1_700_000_000) * int64(time.Second)
	seed := func(kind byte, m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(kind, b)
	}
	seed(0, &peerpb.DecideRequest{Ops: []*peerpb.Op{peerValidPB("a"), peerValidPB("b"), peerValidPB("a")}})
	seed(0, &peerpb.DecideRequest{Ops: []*peerpb.Op{{Key: []byte("k"), Requests: 1, UnitNs: 0, Hits: 1}}})
	seed(0, &peerpb.DecideRequest{Ops: []*peerpb.Op{peerValidPB("x")}, DeadlineNs: now - 1})
	seed(1, &peerpb.ReplicateRequest{From: "n1", Entries: []*peerpb.Entry{{Key: []byte("a"), UnitNs: int64(time.Second), Count: 3}}})
	seed(1, &peerpb.ReplicateRequest{From: "n1", Entries: []*peerpb.Entry{{Key: nil}}})
	f.Add(byte(0), []byte{0xff, 0xff, 0xff})
	f.Add(byte(1), []byte{})

	app := &fuzzApplier{}
	fw, err := NewForwarder(ForwarderConfig{Self: "self", Local: app, Owners: fuzzOwners{}, Clock: newFwdClock(now)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { fw.Close() })
	st := &fuzzState{}
	srv := &peerServer{f: fw, st: st}
	ctx := context.Background()

	f.Fuzz(func(t *testing.T, kind byte, b []byte) {
		app.store, app.applied = bucket.NewStore(bucket.StoreConfig{}), 0
		*st = fuzzState{}
		if kind%2 == 0 {
			var req peerpb.DecideRequest
			if proto.Unmarshal(b, &req) != nil {
				return
			}
			resp, err := srv.Decide(ctx, &req)
			if err != nil {
				if app.applied != 0 || app.store.Len() != 0 {
					t.Fatalf("refused batch (%v) applied %d ops, stored %d keys", err, app.applied, app.store.Len())
				}
				return
			}
			if n := len(req.GetOps()); app.applied != n || len(resp.GetResults()) != n {
				t.Fatalf("%d ops: applied %d, %d results", n, app.applied, len(resp.GetResults()))
			}
			return
		}
		var req peerpb.ReplicateRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		resp, err := srv.Replicate(ctx, &req)
		if err != nil {
			if st.calls != 0 {
				t.Fatalf("refused batch (%v) merged %d entries", err, st.entries)
			}
			return
		}
		if st.calls != 1 || st.entries != len(req.GetEntries()) || int(resp.GetMerged()) != len(req.GetEntries()) {
			t.Fatalf("%d entries: %d calls, %d handed over, %d merged", len(req.GetEntries()), st.calls, st.entries, resp.GetMerged())
		}
	})
}
