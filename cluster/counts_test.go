package cluster

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/ring"
)

// Every write of an owner reaches the key's replica within a bounded wait,
// and the replica holds the owner's count, not less.
func TestNodeReplicationReachesReplica(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		nodes := sim.cluster([]string{"a", "b", "c"}, nil)
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
	})
}

// An owner that crashes (no leave) hands nothing off, yet the replica that
// becomes the owner continues from the replicated count, not from zero.
func TestNodeOwnerCrashReplicaContinues(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		nodes := sim.cluster([]string{"a", "b", "c"}, nil)
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
		// The owner holds the hits, and its replica the same count.
		owner := nodes[2]
		if o := nodeCount(owner, key); o != hits {
			t.Fatalf("after %d hits via a: owner c holds %d, a holds %d", hits, o, nodeCount(nodes[0], key))
		}
		testkit.WaitFor(t, quick, "the replica "+replica.id+" to catch up with the owner", func() bool {
			return nodeCount(replica, key) == hits
		})
		replicated := nodeCount(replica, key)

		sim.crash(nodes[2], "c") // no leave, no handoff
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
	})
}

// A graceful leave (Drain) hands every key to its new owner, even with
// replication off: nothing is lost.
func TestNodeDrainHandsOffEveryKey(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		one := func(c *NodeConfig) { c.Replicas = 1 }
		nodes := sim.cluster([]string{"a", "b", "c"}, one)
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
	})
}

// A node that joins syncs the keys it will hold before it is ready: at the
// moment it reports ready its store already matches the cluster's counts,
// and hits decided through it continue from them.
func TestNodeJoinSyncsBeforeReady(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		nodes := sim.cluster([]string{"a", "b"}, nil)
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
		c := sim.start("c", []string{"a"}, nil)
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
	})
}

// Every algorithm's whole state crosses the wire: a token bucket's burst
// reaches its owner with the op, and a sliding window's previous count and
// a token bucket's TAT reach the replica.
func TestNodeAlgorithmsOverTheWire(t *testing.T) {
	t.Parallel()
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
			synctest.Test(t, func(t *testing.T) {
				sim := newSimCluster(t)
				nodes := sim.cluster([]string{"a", "b"}, nil)
				a, b := nodes[0], nodes[1]
				key := ""
				for i := 0; key == ""; i++ { // decided at b, entered at a
					if k := fmt.Sprintf("%s-%d", tt.name, i); nodeSuccessors(a, k, 1)[0] == "b" {
						key = k
					}
				}
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
		})
	}
}

// TestNodeCloseShipsLastWrites: Close sends the replication writes recorded
// since the last send (here the interval is an hour, so only Close can), so
// the hits an owner decided just before it stopped reach its replica.
func TestNodeCloseShipsLastWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		nodes := sim.cluster([]string{"a", "b"}, func(c *NodeConfig) { c.Timing.ReplicateInterval = time.Hour })
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
	})
}
