package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/wire"
	"github.com/ringlimit/ringlimit/ring"
)

// replWindow is the start of the current nodeUnit window (Unix ns).
func replWindow() int64 {
	now := time.Now().UnixNano()
	return now - now%int64(nodeUnit)
}

func replEntry(key string, count uint64) *peerpb.Entry {
	return &peerpb.Entry{Key: []byte(key), WindowNs: replWindow(), UnitNs: int64(nodeUnit), Count: count}
}

// replDial returns a Peer client of the node n.
func replDial(t *testing.T, n *nodeTestNode) peerpb.PeerClient {
	t.Helper()
	conn, err := grpc.NewClient(n.node.selfAddr, n.dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return peerpb.NewPeerClient(conn)
}

// Replicate merges a valid batch (never lowering a count) and refuses an
// invalid one as a whole with InvalidArgument, merging nothing.
func TestReplicateValidation(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		a := sim.start("a", nil, nil)
		nodeWaitRing(t, []*nodeTestNode{a}, []*nodeTestNode{a})
		client := replDial(t, a)
		ctx := context.Background()

		resp, err := client.Replicate(ctx, &peerpb.ReplicateRequest{From: "b", Entries: []*peerpb.Entry{replEntry("k1", 7), replEntry("k2", 3)}})
		if err != nil || resp.GetMerged() != 2 || nodeCount(a, "k1") != 7 || nodeCount(a, "k2") != 3 {
			t.Fatalf("valid batch: %v, %v; counts %d %d", resp, err, nodeCount(a, "k1"), nodeCount(a, "k2"))
		}
		resp, err = client.Replicate(ctx, &peerpb.ReplicateRequest{Entries: []*peerpb.Entry{replEntry("k1", 5)}})
		if err != nil || resp.GetMerged() != 0 || nodeCount(a, "k1") != 7 {
			t.Fatalf("lower count: %v, %v; k1 = %d, want 7 kept", resp, err, nodeCount(a, "k1"))
		}

		// Every algorithm's whole state is merged.
		w := replWindow()
		for _, st := range []bucket.State{
			{Algorithm: bucket.SlidingWindow, Window: w, Unit: int64(nodeUnit), Count: 3, Prev: 9},
			{Algorithm: bucket.TokenBucket, Unit: int64(nodeUnit), TAT: time.Now().UnixNano() + int64(time.Minute)},
		} {
			key := "algo-" + st.Algorithm.String()
			e := &peerpb.Entry{Key: []byte(key), Algorithm: uint32(st.Algorithm), WindowNs: st.Window, UnitNs: st.Unit, Count: st.Count, Prev: st.Prev, TatNs: st.TAT}
			if _, err := client.Replicate(ctx, &peerpb.ReplicateRequest{Entries: []*peerpb.Entry{e}}); err != nil {
				t.Fatal(err)
			}
			if got, ok := a.store.Get(time.Now().UnixNano(), []byte(key)); !ok || got != st {
				t.Errorf("%v: stored %+v %v, want %+v", st.Algorithm, got, ok, st)
			}
		}

		edit := func(f func(e *peerpb.Entry)) *peerpb.Entry {
			e := replEntry("bad", 1)
			f(e)
			return e
		}
		tooMany := make([]*peerpb.Entry, wire.MaxEntries+1)
		for i := range tooMany {
			tooMany[i] = replEntry("many", 1)
		}
		tests := []struct {
			name    string
			entries []*peerpb.Entry
		}{
			{"nil entry", []*peerpb.Entry{replEntry("ok", 1), nil}},
			{"empty key", []*peerpb.Entry{replEntry("ok", 1), edit(func(e *peerpb.Entry) { e.Key = nil })}},
			{"key too long", []*peerpb.Entry{replEntry("ok", 1), edit(func(e *peerpb.Entry) { e.Key = bytes.Repeat([]byte{'k'}, wire.MaxKeyLen+1) })}},
			{"zero unit", []*peerpb.Entry{replEntry("ok", 1), edit(func(e *peerpb.Entry) { e.UnitNs = 0 })}},
			{"negative unit", []*peerpb.Entry{replEntry("ok", 1), edit(func(e *peerpb.Entry) { e.UnitNs = -1 })}},
			{"unknown algorithm", []*peerpb.Entry{replEntry("ok", 1), edit(func(e *peerpb.Entry) { e.Algorithm = 17 })}},
			{"algorithm wrapping to a known one", []*peerpb.Entry{replEntry("ok", 1), edit(func(e *peerpb.Entry) { e.Algorithm = 256 })}},
			{"sliding count too large", []*peerpb.Entry{replEntry("ok", 1), edit(func(e *peerpb.Entry) { e.Algorithm = uint32(bucket.SlidingWindow); e.Count = 1 << 32 })}},
			{"sliding prev too large", []*peerpb.Entry{replEntry("ok", 1), edit(func(e *peerpb.Entry) { e.Algorithm = uint32(bucket.SlidingWindow); e.Prev = 1 << 32 })}},
			{"fixed window off the grid", []*peerpb.Entry{replEntry("ok", 1), edit(func(e *peerpb.Entry) { e.WindowNs++ })}},
			{"sliding window off the grid", []*peerpb.Entry{replEntry("ok", 1), edit(func(e *peerpb.Entry) { e.Algorithm = uint32(bucket.SlidingWindow); e.WindowNs-- })}},
			{"too many entries", tooMany},
		}
		for _, tt := range tests { // no subtests in a bubble
			_, err := client.Replicate(ctx, &peerpb.ReplicateRequest{From: "b", Entries: tt.entries})
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: err = %v, want InvalidArgument", tt.name, err)
			}
			if nodeCount(a, "ok") != 0 || nodeCount(a, "many") != 0 {
				t.Fatalf("%s: a refused batch merged entries", tt.name)
			}
		}
	})
}

// Sync refuses a bad request with InvalidArgument and changes nothing; a
// good one streams exactly the caller's keys.
func TestSyncValidationAndFilter(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		a := sim.start("a", nil, nil)
		nodeWaitRing(t, []*nodeTestNode{a}, []*nodeTestNode{a})
		client := replDial(t, a)
		ctx := context.Background()
		const keys = 200
		for k := range keys {
			nodeHit(t, a, fmt.Sprintf("sync-%d", k), 1)
		}
		before := a.store.Len()

		recv := func(req *peerpb.SyncRequest) ([]*peerpb.Entry, error) {
			stream, err := client.Sync(ctx, req)
			if err != nil {
				return nil, err
			}
			var out []*peerpb.Entry
			for {
				resp, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					return out, nil
				}
				if err != nil {
					return out, err
				}
				out = append(out, resp.GetEntries()...)
			}
		}
		bad := []struct {
			name string
			req  *peerpb.SyncRequest
		}{
			{"empty from", &peerpb.SyncRequest{Replicas: 2}},
			{"from too long", &peerpb.SyncRequest{From: strings.Repeat("n", wire.MaxIDLen+1), Replicas: 2}},
			{"zero replicas", &peerpb.SyncRequest{From: "b"}},
			{"too many replicas", &peerpb.SyncRequest{From: "b", Replicas: MaxReplicas + 1}},
		}
		for _, tt := range bad { // no subtests in a bubble
			if _, err := recv(tt.req); status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: err = %v, want InvalidArgument", tt.name, err)
			}
			if a.store.Len() != before {
				t.Fatalf("%s: a refused sync changed the store", tt.name)
			}
		}

		r, err := ring.New([]string{"a", "b"}, ring.Config{})
		if err != nil {
			t.Fatal(err)
		}
		for _, reps := range []uint32{1, 2} {
			got, err := recv(&peerpb.SyncRequest{From: "b", Replicas: reps})
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			a.store.Range(time.Now().UnixNano(), func(key []byte, _ bucket.State) bool {
				if slices.Contains(r.Successors(key, int(reps), nil), "b") {
					want++
				}
				return true
			})
			if len(got) != want || (reps == 2 && want != a.store.Len()) {
				t.Errorf("replicas %d: %d entries, want %d of %d", reps, len(got), want, a.store.Len())
			}
			for _, e := range got {
				if !slices.Contains(r.Successors(e.GetKey(), int(reps), nil), "b") || e.GetCount() != 1 {
					t.Errorf("replicas %d: unexpected entry %q count %d", reps, e.GetKey(), e.GetCount())
				}
			}
		}
	})
}
