package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/transport"
	"github.com/ringlimit/ringlimit/ring"
)

// Bounds of the waits for what takes well under a second on an idle
// machine (quick: joins, leaves, metadata, replication) and for failure
// detection (detect): a busy 2-core -race run stalls goroutines for seconds
// at times, and a bound costs nothing when the wait succeeds early.
const (
	quick  = 15 * time.Second
	detect = 30 * time.Second
)

// nodeTestNode is one in-process Node: real memberlist on loopback (Preset
// "local", port 0) and a real gRPC server on a loopback port.
type nodeTestNode struct {
	id    string
	node  *Node
	store *bucket.Store
	reg   *prometheus.Registry
	logs  *testkit.LogSink
	mono  *atomic.Int64 // the pause detector's clock, ns
	stop  func()        // stops gRPC and closes the node (idempotent)
}

// nodeStart starts node id joining join and stops it when the test ends.
func nodeStart(t *testing.T, id string, join []string, tweak func(*NodeConfig)) *nodeTestNode {
	t.Helper()
	lis := testkit.Listen(t)
	tn := &nodeTestNode{
		id:    id,
		store: bucket.NewStore(bucket.StoreConfig{}),
		reg:   prometheus.NewRegistry(),
		logs:  &testkit.LogSink{},
		mono:  new(atomic.Int64),
	}
	cfg := NodeConfig{
		Membership: membership.Config{
			ID:             id,
			GRPCAddr:       lis.Addr().String(),
			BindAddr:       "127.0.0.1:0",
			Join:           join,
			RejoinInterval: time.Hour,
			Preset:         "local",
		},
		Store: tn.store,
		// Exactness must not depend on a busy -race run: an owner that
		// answers late is decided around, so wait long for it (a crashed
		// peer refuses connections and fails at once, not after Timeout).
		Timeout: 5 * time.Second,
		// A crashed peer stays bypassed until the ring drops it, however
		// long the test takes between two hits; a live one is cleared by
		// the first probe it answers.
		SuspectFor: time.Minute,
		// A sync cut short leaves a joining node ready without the keys
		// its tests check.
		SyncTimeout: 10 * time.Second,
		// Short, so that the tests' clusters settle quickly; nodeWaitRing
		// waits for it to end.
		JoinRelay:  200 * time.Millisecond,
		Registerer: tn.reg,
		Logger:     slog.New(tn.logs),
		monoClock:  func() time.Duration { return time.Duration(tn.mono.Load()) },
	}
	if tweak != nil {
		tweak(&cfg)
	}
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatalf("NewNode(%s): %v", id, err)
	}
	tn.node = n
	srv := grpc.NewServer(transport.ServerOptions()...)
	n.Register(srv)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = srv.Serve(lis)
	}()
	var once sync.Once
	tn.stop = func() {
		once.Do(func() {
			srv.Stop()
			wg.Wait()
			if err := n.Close(); err != nil {
				t.Errorf("close %s: %v", id, err)
			}
		})
	}
	t.Cleanup(func() {
		tn.stop()
		if t.Failed() {
			t.Logf("%s log:\n%s", id, tn.logs.Dump())
		}
	})
	return tn
}

// nodeCluster starts ids (each joining the first) with tweak and waits
// until every node is ready and has all of them in its ring.
func nodeCluster(t *testing.T, ids []string, tweak func(*NodeConfig)) []*nodeTestNode {
	t.Helper()
	var nodes []*nodeTestNode
	for i, id := range ids {
		var join []string
		if i > 0 {
			join = []string{nodes[0].node.Membership().Self().Addr}
		}
		nodes = append(nodes, nodeStart(t, id, join, tweak))
	}
	nodeWaitRing(t, nodes, nodes)
	return nodes
}

// nodeWaitRing waits until every node of on is ready with exactly the IDs
// of want in its ring, and the join relays have ended.
func nodeWaitRing(t *testing.T, on, want []*nodeTestNode) {
	t.Helper()
	var ids []string
	for _, n := range want {
		ids = append(ids, n.id)
	}
	sort.Strings(ids)
	for _, n := range on {
		testkit.WaitFor(t, detect, fmt.Sprintf("%s ready with ring %v, not relaying", n.id, ids), func() bool {
			if !n.node.Ready() || !slices.Equal(n.node.view.Load().ring.Members(), ids) || n.node.relaying.Load() {
				return false
			}
			// ... and sees no member relay: a relaying member is left out
			// of where a node relays to (view.relayTo).
			for _, m := range n.node.Membership().Alive() {
				if m.Relaying {
					return false
				}
			}
			return true
		})
	}
}

// nodeValidPB is a valid wire op on a day's window (nodeUnit).
func nodeValidPB(key string) *peerpb.Op {
	return &peerpb.Op{Key: []byte(key), Requests: 10, UnitNs: int64(nodeUnit), Hits: 1}
}

// nodeByID returns the node called id.
func nodeByID(nodes []*nodeTestNode, id string) *nodeTestNode {
	for _, n := range nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

// nodeUnit is the window of the limits these tests count under in real
// time (time.Now): a day, so that counts taken over the seconds a test runs
// (a crash and its detection, a drain, a join) almost never straddle a
// window edge (midnight UTC); an hour's edge would meet a 10 s test once in
// 360 runs.
const nodeUnit = 24 * time.Hour

// nodeDayOp is one consuming hit under a roomy daily limit.
func nodeDayOp(key string) bucket.Op {
	return bucket.Op{Key: []byte(key), Limit: bucket.Limit{Requests: 1 << 40, Unit: int64(nodeUnit)}, Hits: 1}
}

// nodeHit applies hits to key through n, each as its own call.
func nodeHit(t *testing.T, n *nodeTestNode, key string, hits int) bucket.Result {
	t.Helper()
	var res [1]bucket.Result
	for range hits {
		ops := []bucket.Op{nodeDayOp(key)}
		n.node.Apply(context.Background(), time.Now().UnixNano(), ops, res[:])
	}
	return res[0]
}

// nodeCount returns n's stored count for key (0 if none).
func nodeCount(n *nodeTestNode, key string) uint64 {
	st, _ := n.store.Get(time.Now().UnixNano(), []byte(key))
	return st.Count
}

// nodeSuccessors returns key's first r successors on n's ring.
func nodeSuccessors(n *nodeTestNode, key string, r int) []string {
	return n.node.view.Load().ring.Successors([]byte(key), r, nil)
}

func TestNodeConfigErrors(t *testing.T) {
	store := bucket.NewStore(bucket.StoreConfig{})
	mc := membership.Config{ID: "a", GRPCAddr: "127.0.0.1:1", BindAddr: "127.0.0.1:0", Preset: "local"}
	tests := []struct {
		name string
		cfg  NodeConfig
	}{
		{"no id", NodeConfig{Store: store}},
		{"no store", NodeConfig{Membership: mc}},
		{"replicas negative", NodeConfig{Membership: mc, Store: store, Replicas: -1}},
		{"replicas too many", NodeConfig{Membership: mc, Store: store, Replicas: MaxReplicas + 1}},
		{"negative interval", NodeConfig{Membership: mc, Store: store, ReplicateInterval: -time.Second}},
		{"negative sync timeout", NodeConfig{Membership: mc, Store: store, SyncTimeout: -time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if n, err := NewNode(tc.cfg); err == nil {
				n.Close()
				t.Fatal("NewNode succeeded")
			}
		})
	}
}

// A NewNode that fails once its metrics are registered (here: in
// membership.New) leaves the registry as it found it, so a retry succeeds.
func TestNodeFailedStartUnregisters(t *testing.T) {
	reg := prometheus.NewRegistry()
	store := bucket.NewStore(bucket.StoreConfig{})
	mc := membership.Config{ID: "a", GRPCAddr: "127.0.0.1:1", BindAddr: "127.0.0.1:0", Preset: "no-such-preset"}
	if n, err := NewNode(NodeConfig{Membership: mc, Store: store, Registerer: reg}); err == nil {
		n.Close()
		t.Fatal("NewNode with an unknown preset succeeded")
	}
	if mfs, err := reg.Gather(); err != nil || len(mfs) != 0 {
		t.Fatalf("after a failed NewNode the registry holds %d families (err %v), want 0", len(mfs), err)
	}
	mc.Preset = "local"
	n, err := NewNode(NodeConfig{Membership: mc, Store: store, Registerer: reg})
	if err != nil {
		t.Fatalf("NewNode on the same registry after a failure: %v", err)
	}
	n.Close()
}

// A lone node (no peers to sync from) is ready at once and decides every
// key itself.
func TestNodeAloneIsReady(t *testing.T) {
	t.Parallel()
	a := nodeStart(t, "a", nil, nil)
	nodeWaitRing(t, []*nodeTestNode{a}, []*nodeTestNode{a})
	if r := nodeHit(t, a, "k", 3); r.Count != 3 {
		t.Fatalf("count %d after 3 hits, want 3", r.Count)
	}
}

// Every write of an owner reaches the key's replica within a bounded wait,
// and the replica holds the owner's count, not less.
func TestNodeReplicationReachesReplica(t *testing.T) {
	t.Parallel()
	nodes := nodeCluster(t, []string{"a", "b", "c"}, nil)
	const keys = 30
	for k := range keys {
		key := fmt.Sprintf("rep-%d", k)
		nodeHit(t, nodes[k%3], key, k+1) // entry nodes vary; owners decide
	}
	for k := range keys {
		key := fmt.Sprintf("rep-%d", k)
		succ := nodeSuccessors(nodes[0], key, 2)
		owner, replica := nodeByID(nodes, succ[0]), nodeByID(nodes, succ[1])
		if got := nodeCount(owner, key); got != uint64(k+1) {
			t.Fatalf("%s: owner %s counts %d, want %d", key, owner.id, got, k+1)
		}
		testkit.WaitFor(t, quick, key+" at its replica "+replica.id, func() bool {
			return nodeCount(replica, key) == uint64(k+1)
		})
	}
	// The third node holds no copy: replication goes to the replica set only.
	for k := range keys {
		key := fmt.Sprintf("rep-%d", k)
		succ := nodeSuccessors(nodes[0], key, 2)
		for _, n := range nodes {
			if !slices.Contains(succ, n.id) && nodeCount(n, key) != 0 {
				t.Errorf("%s: %s is not a replica but holds %d", key, n.id, nodeCount(n, key))
			}
		}
	}
	if t.Failed() {
		for _, n := range nodes {
			t.Logf("%s: %s", n.id, nodeCounters(t, n))
		}
	}
}

// nodeCounters sums n's counters whose names say where its counts came
// from, for a failing test's report.
func nodeCounters(t *testing.T, n *nodeTestNode) string {
	t.Helper()
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		sum := 0.0
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() // 0 for other kinds
		}
		if sum != 0 {
			fmt.Fprintf(&b, "%s=%v ", strings.TrimPrefix(mf.GetName(), "ringlimit_"), sum)
		}
	}
	return b.String()
}

// A ring never routes to a member before the forwarder has a client for
// it: an op for such a member's key would be decided by the entry node,
// and its owner would never count it.
func TestNodeRingNotAheadOfPeers(t *testing.T) {
	t.Parallel()
	a := nodeStart(t, "a", nil, nil)
	nodeWaitRing(t, []*nodeTestNode{a}, []*nodeTestNode{a})
	var (
		stop   = make(chan struct{})
		done   = make(chan struct{})
		missed []string
	)
	go func() { // stopped and joined below
		defer close(done)
		for range 50_000_000 {
			select {
			case <-stop:
				return
			default:
			}
			members := a.node.view.Load().ring.Members()
			for _, id := range members {
				if id != "a" && a.node.fwd.Client(id) == nil && len(missed) < 10 {
					missed = append(missed, fmt.Sprintf("%s in ring %v without a client", id, members))
				}
			}
		}
	}()
	join := []string{a.node.Membership().Self().Addr}
	nodes := []*nodeTestNode{a, nodeStart(t, "b", join, nil), nodeStart(t, "c", join, nil)}
	nodeWaitRing(t, nodes, nodes)
	close(stop)
	<-done
	for _, m := range missed {
		t.Error(m)
	}
}

// An owner that crashes (no leave) hands nothing off, yet the replica that
// becomes the owner continues from the replicated count, not from zero.
func TestNodeOwnerCrashReplicaContinues(t *testing.T) {
	t.Parallel()
	nodes := nodeCluster(t, []string{"a", "b", "c"}, nil)
	// A key owned by c, with its replica among a and b.
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("crash-%d", i); nodeSuccessors(nodes[0], k, 1)[0] == "c" {
			key = k
		}
	}
	const hits = 25
	nodeHit(t, nodes[0], key, hits)
	replica := nodeByID(nodes, nodeSuccessors(nodes[0], key, 2)[1])
	// The owner holds the hits (all of them, unless one waited longer than
	// the forward timeout on a stalled machine and was decided by a), and
	// its replica the same count.
	owner := nodes[2]
	deadline := time.Now().Add(quick)
	for {
		o, r := nodeCount(owner, key), nodeCount(replica, key)
		if o >= hits-1 && r == o {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d hits via a: owner c holds %d, replica %s holds %d, a holds %d; want the replica to catch up with the owner",
				hits, o, replica.id, r, nodeCount(nodes[0], key))
		}
		time.Sleep(5 * time.Millisecond)
	}
	replicated := nodeCount(replica, key)

	nodes[2].stop() // crash: no leave, no handoff
	survivors := nodes[:2]
	other := survivors[0]
	if other == replica {
		other = survivors[1]
	}
	// Before the ring changes, the other survivor sends c's key to the
	// replica once it holds c suspect (at most its first hit falls back to
	// its own counter): the count goes on from the replicated one.
	testkit.WaitFor(t, quick, other.id+" to hold c suspect", func() bool {
		nodeHit(t, other, key, 1)
		return slices.Contains(other.node.fwd.Suspects(), "c")
	})
	if r := nodeHit(t, other, key, 1); r.Count <= replicated {
		t.Errorf("hit via %s while c is suspect: count %d, want more than the replicated %d", other.id, r.Count, replicated)
	}
	if n := nodeMetric(t, other.reg, "ringlimit_rerouted_decisions_total"); n == 0 {
		t.Error("no decision rerouted to the replica")
	}

	nodeWaitRing(t, survivors, survivors)
	if owner := nodeSuccessors(nodes[0], key, 1)[0]; owner != replica.id {
		t.Fatalf("new owner %s, want the replica %s", owner, replica.id)
	}
	base := nodeCount(replica, key)
	if base <= replicated {
		t.Fatalf("the new owner holds %d, want more than the replicated %d", base, replicated)
	}
	for i, n := range survivors {
		if r := nodeHit(t, n, key, 1); r.Count != base+1+uint64(i) {
			t.Errorf("hit via %s after the crash: count %d, want %d", n.id, r.Count, base+1+uint64(i))
		}
	}
}

// A graceful leave (Drain) hands every key to its new owner, even with
// replication off: nothing is lost.
func TestNodeDrainHandsOffEveryKey(t *testing.T) {
	t.Parallel()
	one := func(c *NodeConfig) { c.Replicas = 1 }
	nodes := nodeCluster(t, []string{"a", "b", "c"}, one)
	leaver := nodes[1]
	const keys = 60
	want := map[string]uint64{}
	for k := range keys {
		key := fmt.Sprintf("drain-%d", k)
		nodeHit(t, nodes[k%3], key, k%7+1)
		if nodeSuccessors(leaver, key, 1)[0] == leaver.id {
			want[key] = uint64(k%7 + 1)
		}
	}
	if len(want) == 0 {
		t.Fatal("the leaver owns no key")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := leaver.node.Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if leaver.node.Ready() {
		t.Error("a draining node reports ready")
	}
	survivors := []*nodeTestNode{nodes[0], nodes[2]}
	nodeWaitRing(t, survivors, survivors)
	leaver.stop()
	for key, n := range want {
		owner := nodeByID(nodes, nodeSuccessors(nodes[0], key, 1)[0])
		if got := nodeCount(owner, key); got != n {
			t.Errorf("%s: new owner %s holds %d, want %d", key, owner.id, got, n)
		}
		if r := nodeHit(t, nodes[0], key, 1); r.Count != n+1 {
			t.Errorf("%s: next hit counts %d, want %d", key, r.Count, n+1)
		}
	}
}

// A node that joins syncs the keys it will hold before it is ready: at the
// moment it reports ready its store already matches the cluster's counts,
// and hits decided through it continue from them.
func TestNodeJoinSyncsBeforeReady(t *testing.T) {
	t.Parallel()
	nodes := nodeCluster(t, []string{"a", "b"}, nil)
	const keys = 60
	for k := range keys {
		nodeHit(t, nodes[k%2], fmt.Sprintf("join-%d", k), k+1)
	}
	// Every key is at both a and b (two nodes, two replicas).
	for k := range keys {
		key := fmt.Sprintf("join-%d", k)
		for _, n := range nodes {
			testkit.WaitFor(t, quick, key+" replicated", func() bool { return nodeCount(n, key) == uint64(k+1) })
		}
	}
	c := nodeStart(t, "c", []string{nodes[0].node.Membership().Self().Addr}, nil)
	testkit.WaitFor(t, quick, "c ready", c.node.Ready)
	// No wait: the sync finished before Ready.
	all := append(nodes, c)
	held := 0
	r, err := ring.New([]string{"a", "b", "c"}, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		key := fmt.Sprintf("join-%d", k)
		if !slices.Contains(r.Successors([]byte(key), 2, nil), "c") {
			continue
		}
		held++
		if got := nodeCount(c, key); got != uint64(k+1) {
			t.Errorf("%s: c holds %d when ready, want %d", key, got, k+1)
		}
	}
	if held == 0 {
		t.Fatal("c holds no key in a three-node ring")
	}
	if got := nodeMetric(t, c.reg, "ringlimit_sync_entries_total"); got < float64(held) {
		t.Errorf("c's sync received %v entries, want at least the %d it holds", got, held)
	}
	nodeWaitRing(t, all, all)
	for k := range keys {
		key := fmt.Sprintf("join-%d", k)
		if r := nodeHit(t, c, key, 1); r.Count != uint64(k+2) {
			t.Errorf("%s: hit via c counts %d, want %d", key, r.Count, k+2)
		}
	}
}

// The pause detector (driven by an injected monotonic clock) makes the node
// refuse Decide, leave the rings, pull the newer counts its peers hold and
// become ready again.
func TestNodePauseResyncs(t *testing.T) {
	t.Parallel()
	fast := func(c *NodeConfig) { c.PauseThreshold = 200 * time.Millisecond }
	nodes := nodeCluster(t, []string{"a", "b"}, fast)
	a, b := nodes[0], nodes[1]
	nodeHit(t, a, "paused-key", 5)
	testkit.WaitFor(t, quick, "replication", func() bool { return nodeCount(a, "paused-key") == 5 && nodeCount(b, "paused-key") == 5 })
	// While a "was frozen", b counted on: its copy is ahead.
	now := time.Now().UnixNano()
	stB, _ := b.store.Get(now, []byte("paused-key"))
	stB.Count = 40
	b.store.Merge(now, []byte("paused-key"), stB)

	a.mono.Add(int64(10 * time.Second)) // the next tick sees a 10 s gap
	testkit.WaitFor(t, quick, "a to notice the pause and re-sync", func() bool {
		return nodeMetric(t, a.reg, "ringlimit_pauses_detected_total") == 1 &&
			nodeMetric(t, a.reg, "ringlimit_syncs_total") == 2
	})
	nodeWaitRing(t, nodes, nodes)
	if got := nodeCount(a, "paused-key"); got != 40 {
		t.Fatalf("a holds %d after its re-sync, want b's 40", got)
	}
	if r := nodeHit(t, a, "paused-key", 1); r.Count != 41 {
		t.Errorf("next hit counts %d, want 41", r.Count)
	}
}

// nodeMetric sums every sample of the counter or gauge name in reg.
func nodeMetric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// A Decide batch read right after a thaw, before the pause detector's
// ticker has run, is refused too (the batch checks the gap itself), and
// the node re-syncs once.
func TestNodeDecideRightAfterThawRefused(t *testing.T) {
	t.Parallel()
	slowTicker := func(c *NodeConfig) { c.PauseThreshold = time.Hour } // ticks every 6 min
	a := nodeStart(t, "a", nil, slowTicker)
	nodeWaitRing(t, []*nodeTestNode{a}, []*nodeTestNode{a})
	client := replDial(t, a)
	req := &peerpb.DecideRequest{Ops: []*peerpb.Op{nodeValidPB("thaw")}}
	if _, err := client.Decide(context.Background(), req); err != nil {
		t.Fatalf("Decide before the pause: %v", err)
	}
	a.mono.Add(int64(2 * time.Hour))
	if _, err := client.Decide(context.Background(), req); status.Code(err) != codes.Unavailable {
		t.Fatalf("Decide right after the thaw: %v, want Unavailable", err)
	}
	testkit.WaitFor(t, quick, "the re-sync", func() bool {
		return nodeMetric(t, a.reg, "ringlimit_syncs_total") == 2 && a.node.Ready()
	})
	if _, err := client.Decide(context.Background(), req); err != nil {
		t.Fatalf("Decide after the re-sync: %v", err)
	}
	if n := nodeMetric(t, a.reg, "ringlimit_pauses_detected_total"); n != 1 {
		t.Errorf("%v pauses detected, want 1", n)
	}
	if got := nodeCount(a, "thaw"); got != 2 {
		t.Errorf("count %d, want the 2 batches answered", got)
	}
}

// Deciding a key this node owns through the Node (ring lookup, store,
// replication record) and looking up its holders allocate nothing.
func TestNodeApplyZeroAllocs(t *testing.T) {
	a := nodeStart(t, "a", nil, nil)
	nodeWaitRing(t, []*nodeTestNode{a}, []*nodeTestNode{a})
	ops := []bucket.Op{nodeDayOp("alloc-key")}
	res := make([]bucket.Result, 1)
	ctx := context.Background()
	now := time.Now().UnixNano()
	for range 2 * 8192 { // grow the replication log's buffers (8192 records a stripe)
		a.node.Apply(ctx, now, ops, res)
	}
	if n := testing.AllocsPerRun(1000, func() { a.node.Apply(ctx, now, ops, res) }); n != 0 {
		t.Errorf("Apply: %v allocs, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { a.node.Holder(ops[0].Key, 0) }); n != 0 {
		t.Errorf("Holder: %v allocs, want 0", n)
	}
}

// Every algorithm's whole state crosses the wire: a token bucket's burst
// reaches its owner with the op, and a sliding window's previous count and
// a token bucket's TAT reach the replica.
func TestNodeAlgorithmsOverTheWire(t *testing.T) {
	t.Parallel()
	nodes := nodeCluster(t, []string{"a", "b"}, nil)
	a, b := nodes[0], nodes[1]
	keyOwnedBy := func(prefix, id string) string {
		for i := 0; ; i++ {
			if k := fmt.Sprintf("%s-%d", prefix, i); nodeSuccessors(a, k, 1)[0] == id {
				return k
			}
		}
	}
	unit := int64(nodeUnit)
	tests := []struct {
		name    string
		lim     bucket.Limit
		allowed int // hits allowed in a row from zero
	}{
		{"token bucket burst", bucket.Limit{Algorithm: bucket.TokenBucket, Requests: 1, Unit: unit, Burst: 5}, 5},
		{"sliding window", bucket.Limit{Algorithm: bucket.SlidingWindow, Requests: 4, Unit: unit}, 4},
		{"fixed window", bucket.Limit{Requests: 3, Unit: unit}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := keyOwnedBy(tt.name, "b") // decided at b, entered at a
			ops := []bucket.Op{{Key: []byte(key), Limit: tt.lim, Hits: 1}}
			res := make([]bucket.Result, 1)
			for i := range tt.allowed + 1 {
				a.node.Apply(context.Background(), time.Now().UnixNano(), ops, res)
				if over := i >= tt.allowed; res[0].Over != over {
					t.Fatalf("hit %d: %+v, want over=%v", i+1, res[0], over)
				}
			}
			owner, _ := b.store.Get(time.Now().UnixNano(), []byte(key))
			testkit.WaitFor(t, quick, "the replica to hold the owner's state", func() bool {
				st, ok := a.store.Get(time.Now().UnixNano(), []byte(key))
				return ok && st == owner
			})
		})
	}
}

// TestNodeCloseShipsLastWrites: Close sends the replication writes recorded
// since the last send (here the interval is an hour, so only Close can), so
// the hits an owner decided just before it stopped reach its replica.
func TestNodeCloseShipsLastWrites(t *testing.T) {
	nodes := nodeCluster(t, []string{"a", "b"}, func(c *NodeConfig) { c.ReplicateInterval = time.Hour })
	a, b := nodes[0], nodes[1]
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("close-%d", i); nodeSuccessors(a, k, 1)[0] == "a" {
			key = k
		}
	}
	nodeHit(t, a, key, 7)
	if got := nodeCount(b, key); got != 0 {
		t.Fatalf("replica has %d before Close, want 0 (nothing sent yet)", got)
	}
	a.node.Close()
	if got := nodeCount(b, key); got != 7 {
		t.Fatalf("replica has %d after the owner's Close, want 7", got)
	}
}
