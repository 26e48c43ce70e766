package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
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
	conn, err := grpc.NewClient(n.node.selfAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
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
	a := nodeStart(t, "a", nil, nil)
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
	tooMany := make([]*peerpb.Entry, replMaxEntries+1)
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
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := client.Replicate(ctx, &peerpb.ReplicateRequest{From: "b", Entries: tt.entries})
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
			if nodeCount(a, "ok") != 0 || nodeCount(a, "many") != 0 {
				t.Fatal("a refused batch merged entries")
			}
		})
	}
}

// Sync refuses a bad request with InvalidArgument and changes nothing; a
// good one streams exactly the caller's keys.
func TestSyncValidationAndFilter(t *testing.T) {
	t.Parallel()
	a := nodeStart(t, "a", nil, nil)
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
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := recv(tt.req); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
			if a.store.Len() != before {
				t.Fatal("a refused sync changed the store")
			}
		})
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
}

// Recording a write for replication allocates nothing in steady state.
func TestRecordingStoreZeroAllocs(t *testing.T) {
	store := bucket.NewStore(bucket.StoreConfig{})
	log := newReplLog()
	rs := recordingStore{store: store, log: log}
	op := bucket.Op{Key: []byte("domain\x00key\x00value"), Limit: bucket.Limit{Requests: 1 << 40, Unit: int64(time.Minute)}, Hits: 1}
	var spare [replStripes]replBuf
	drain := func() {
		for i := range spare {
			log.swap(i, &spare[i])
			spare[i].reset()
		}
	}
	for range 2 * replStripeRecs { // grow every buffer to steady state
		rs.Apply(1e18, &op)
	}
	drain()
	drain()
	if n := testing.AllocsPerRun(1000, func() { rs.Apply(1e18, &op) }); n != 0 {
		t.Fatalf("%v allocs per recorded apply, want 0", n)
	}
	recs := 0
	for i := range log.stripes {
		recs += len(log.stripes[i].buf.recs)
	}
	if recs == 0 {
		t.Fatal("nothing recorded")
	}
}

// A full stripe drops records and counts them instead of blocking.
func TestReplLogDropsWhenFull(t *testing.T) {
	log := &replLog{maxRecs: 2, maxBytes: 1 << 10}
	st := bucket.State{Window: 0, Unit: 1, Count: 1}
	key := []byte("same-stripe")
	for range 5 {
		log.record(key, st)
	}
	if d := log.dropped.Load(); d != 3 {
		t.Fatalf("dropped %d, want 3", d)
	}
}

// replFakePeer is a peerpb.PeerClient that records Replicate calls and
// fails the first failFirst of them.
type replFakePeer struct {
	peerpb.PeerClient // nil: only Replicate is used
	mu                sync.Mutex
	failFirst         int
	down              bool // fails every call while set
	calls             int
	got               map[string]bucket.State
}

func (p *replFakePeer) Replicate(ctx context.Context, req *peerpb.ReplicateRequest, _ ...grpc.CallOption) (*peerpb.ReplicateResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.calls <= p.failFirst || p.down {
		return nil, status.Error(codes.Unavailable, "down")
	}
	for _, e := range req.GetEntries() {
		p.got[string(e.GetKey())] = bucket.MaxState(p.got[string(e.GetKey())], wire.EntryState(e))
	}
	return &peerpb.ReplicateResponse{Merged: uint32(len(req.GetEntries()))}, nil
}

// ReplicateStream answers as a node without it would: the replicator then
// sends Replicate calls.
func (p *replFakePeer) ReplicateStream(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[peerpb.ReplicateRequest, peerpb.ReplicateResponse], error) {
	return nil, status.Error(codes.Unimplemented, "no ReplicateStream")
}

func (p *replFakePeer) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
}

func (p *replFakePeer) state(key string) (bucket.State, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got[key], p.calls
}

// The replicator sends each key's latest state to its replicas only,
// retries a destination that failed, and never sends to itself.
func TestReplicatorCoalescesAndRetries(t *testing.T) {
	rg, err := ring.New([]string{"a", "b", "c"}, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	peers := map[string]*replFakePeer{
		"b": {down: true, got: map[string]bucket.State{}},
		"c": {got: map[string]bucket.State{}},
	}
	r := &replicator{
		self:     "a",
		replicas: 2,
		log:      newReplLog(),
		interval: time.Millisecond,
		targets:  func() *ring.Ring { return rg },
		client: func(id string) peerpb.PeerClient {
			if p := peers[id]; p != nil {
				return p
			}
			return nil
		},
		m:      newReplMetrics(),
		logger: slog.New(slog.DiscardHandler),
	}
	r.start()
	defer r.close()
	const keys = 50
	for k := range keys {
		key := []byte{'k', byte(k)}
		for c := uint64(1); c <= 5; c++ {
			r.log.record(key, bucket.State{Window: int64(time.Hour), Unit: int64(time.Hour), Count: c})
		}
	}
	// b refuses sends while it is down: flush says so (a drain reports
	// it), and the writes wait for a retry.
	if err := r.flush(context.Background()); err == nil || !strings.Contains(err.Error(), "not delivered") {
		t.Fatalf("flush with a failing replica: %v, want writes not delivered", err)
	}
	peers["b"].setDown(false)
	// The background retry or a forced send delivers them now.
	testkit.WaitFor(t, quick, "a flush to deliver everything", func() bool { return r.flush(context.Background()) == nil })
	for k := range keys {
		key := []byte{'k', byte(k)}
		succ := rg.Successors(key, 2, nil)
		for id, p := range peers {
			st, _ := p.state(string(key))
			switch want := slices.Contains(succ, id); {
			case want && st.Count != 5:
				t.Errorf("key %d: %s holds %+v, want count 5", k, id, st)
			case !want && st.Count != 0:
				t.Errorf("key %d: %s is no replica but holds %+v", k, id, st)
			}
		}
	}
	if got := testCounterValue(t, r.m.sent); got == 0 {
		t.Error("no entry counted as sent")
	}
	if got := testCounterValue(t, r.m.rpcErrors); got < 1 {
		t.Errorf("%v RPC errors counted, want at least the first", got)
	}
}

// testCounterValue reads one counter.
func testCounterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		t.Fatalf("gather: %v", err)
	}
	return mfs[0].GetMetric()[0].GetCounter().GetValue()
}

// A key decided here instead of at its owner continues from the owner's
// last remembered answer, in the owner's window; answers far below the
// limit are not remembered.
func TestRecordingStoreRemembersAnswers(t *testing.T) {
	const unit = int64(time.Minute)
	w := int64(1_700_000_000) * int64(time.Second)
	w -= w % unit
	now := w + 20*int64(time.Second)
	lim := bucket.Limit{Requests: 10, Unit: unit}
	op := func(key string, mode bucket.Mode) *bucket.Op {
		return &bucket.Op{Key: []byte(key), Limit: lim, Hits: 1, Mode: mode}
	}
	answer := func(count uint64, skew int64) bucket.Result {
		r := bucket.Result{Count: count, Over: count > 10, ResetAfter: w + unit - now + skew}
		if !r.Over {
			r.Remaining = 10 - count
		}
		return r
	}
	tests := []struct {
		name   string
		op     *bucket.Op
		answer bucket.Result
		want   bucket.Result // of the next hit decided here
	}{
		{"over", op("a", bucket.Consume), answer(12, 0), bucket.Result{Over: true, Count: 13, ResetAfter: w + unit - now}},
		{"exhausted, owner clock behind", op("b", bucket.Consume), answer(10, -3*int64(time.Millisecond)), bucket.Result{Over: true, Count: 11, ResetAfter: w + unit - now}},
		{"half used, owner clock ahead", op("c", bucket.Consume), answer(5, 3*int64(time.Millisecond)), bucket.Result{Count: 6, Remaining: 4, ResetAfter: w + unit - now}},
		{"far below the limit: not kept", op("d", bucket.Consume), answer(2, 0), bucket.Result{Count: 1, Remaining: 9, ResetAfter: w + unit - now}},
		{"peek: the hits were not stored", op("e", bucket.Peek), answer(12, 0), bucket.Result{Over: true, Count: 12, ResetAfter: w + unit - now}},
		{"stop on over: the hits were not stored", op("f", bucket.StopOnOver), answer(11, 0), bucket.Result{Over: true, Count: 11, ResetAfter: w + unit - now}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs := recordingStore{store: bucket.NewStore(bucket.StoreConfig{}), shadow: bucket.NewStore(bucket.StoreConfig{MaxKeys: 16})}
			rs.Remember(now, tt.op, tt.answer)
			next := *tt.op
			next.Mode = bucket.Consume
			if got := rs.ApplyInstead(now, &next); got != tt.want {
				t.Fatalf("next hit here: %+v, want %+v", got, tt.want)
			}
		})
	}
}

// A key its owner answered over the limit is answered over here until the
// owner's window ends, without asking the owner again; anything else still
// goes to the owner.
func TestRecordingStoreOverUntil(t *testing.T) {
	const unit = int64(time.Minute)
	w := int64(1_700_000_000) * int64(time.Second)
	w -= w % unit
	now := w + 20*int64(time.Second)
	lim := bucket.Limit{Requests: 10, Unit: unit}
	answer := func(count uint64) bucket.Result {
		r := bucket.Result{Count: count, Over: count > 10, ResetAfter: w + unit - now}
		if !r.Over {
			r.Remaining = 10 - count
		}
		return r
	}
	tests := []struct {
		name     string
		answered uint64
		at       int64        // when the next hit comes
		lim      bucket.Limit // of the next hit
		hits     uint64
		want     bucket.Result
		wantOver bool
	}{
		{"over: answered here", 11, now + int64(time.Second), lim, 1, bucket.Result{Over: true, Count: 12, ResetAfter: w + unit - now - int64(time.Second)}, true},
		{"over, check only", 11, now, lim, 0, bucket.Result{Over: true, Count: 11, ResetAfter: w + unit - now}, true},
		{"exactly at the limit: ask the owner", 10, now, lim, 1, bucket.Result{}, false},
		{"next window: ask the owner", 11, w + unit, lim, 1, bucket.Result{}, false},
		{"limit raised by a reload: ask the owner", 11, now, bucket.Limit{Requests: 20, Unit: unit}, 1, bucket.Result{}, false},
		{"unit changed: ask the owner", 11, now, bucket.Limit{Requests: 10, Unit: int64(time.Hour)}, 1, bucket.Result{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs := recordingStore{store: bucket.NewStore(bucket.StoreConfig{}), shadow: bucket.NewStore(bucket.StoreConfig{MaxKeys: 16})}
			rs.Remember(now, &bucket.Op{Key: []byte("k"), Limit: lim, Hits: 1}, answer(tt.answered))
			got, over := rs.OverUntil(tt.at, &bucket.Op{Key: []byte("k"), Limit: tt.lim, Hits: tt.hits})
			if over != tt.wantOver || got != tt.want {
				t.Fatalf("overUntil = %+v, %v; want %+v, %v", got, over, tt.want, tt.wantOver)
			}
		})
	}
	// Nothing remembered, or no shadow at all: ask the owner.
	rs := recordingStore{store: bucket.NewStore(bucket.StoreConfig{})}
	if _, over := rs.OverUntil(now, &bucket.Op{Key: []byte("k"), Limit: lim, Hits: 1}); over {
		t.Fatal("no shadow: answered locally")
	}
}

// A node that becomes the owner of keys it held no copy of adopts the
// owners' last answers: the keys it now owns continue from them (and go to
// the replication log), the others stay as they were.
func TestRecordingStoreAdopt(t *testing.T) {
	const unit = int64(time.Minute)
	w := int64(1_700_000_000) * int64(time.Second)
	w -= w % unit
	now := w + 20*int64(time.Second)
	lim := bucket.Limit{Requests: 10, Unit: unit}
	log := newReplLog()
	rs := recordingStore{store: bucket.NewStore(bucket.StoreConfig{}), log: log, shadow: bucket.NewStore(bucket.StoreConfig{MaxKeys: 16})}
	over := bucket.Result{Over: true, Count: 11, ResetAfter: w + unit - now}
	for _, k := range []string{"mine", "theirs"} {
		rs.Remember(now, &bucket.Op{Key: []byte(k), Limit: lim, Hits: 1}, over)
	}
	rs.adopt(now, func(key []byte) bool { return string(key) == "mine" })

	for _, tt := range []struct {
		key  string
		want bucket.Result
	}{
		{"mine", bucket.Result{Over: true, Count: 12, ResetAfter: w + unit - now}},
		{"theirs", bucket.Result{Count: 1, Remaining: 9, ResetAfter: w + unit - now}},
	} {
		if got := rs.store.(*bucket.Store).Apply(now, &bucket.Op{Key: []byte(tt.key), Limit: lim, Hits: 1}); got != tt.want {
			t.Errorf("%s after adopt: %+v, want %+v", tt.key, got, tt.want)
		}
	}
	var spare replBuf
	var recorded []string
	for i := range replStripes {
		log.swap(i, &spare)
		for _, r := range spare.recs {
			recorded = append(recorded, string(spare.keys[r.off:r.off+r.n]))
		}
		spare.recs, spare.keys = spare.recs[:0], spare.keys[:0]
	}
	if len(recorded) != 1 || recorded[0] != "mine" {
		t.Errorf("replication log holds %q, want the adopted key only", recorded)
	}
}

// A remembered answer under another unit (a reload changed the limit, or
// an override shares the descriptor) does not replace the live counter.
func TestRecordingStoreAdoptKeepsOtherUnits(t *testing.T) {
	const minute, hour = int64(time.Minute), int64(time.Hour)
	w := int64(1_700_000_000) * int64(time.Second)
	w -= w % hour
	now := w + 20*int64(time.Second)
	rs := recordingStore{store: bucket.NewStore(bucket.StoreConfig{}), shadow: bucket.NewStore(bucket.StoreConfig{MaxKeys: 16})}
	hourly := bucket.Limit{Requests: 1000, Unit: hour}
	for range 900 {
		rs.store.(*bucket.Store).Apply(now, &bucket.Op{Key: []byte("k"), Limit: hourly, Hits: 1})
	}
	rs.Remember(now, &bucket.Op{Key: []byte("k"), Limit: bucket.Limit{Requests: 100, Unit: minute}, Hits: 1},
		bucket.Result{Over: true, Count: 101, ResetAfter: minute - now%minute})
	rs.adopt(now, func([]byte) bool { return true })
	if got := rs.ApplyInstead(now, &bucket.Op{Key: []byte("k"), Limit: hourly, Hits: 1}); got.Count != 901 {
		t.Fatalf("hourly count after adopting a per-minute answer: %d, want 901", got.Count)
	}
}
