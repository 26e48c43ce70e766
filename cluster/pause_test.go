package cluster

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/lifecycle"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// A node frozen for longer than its pause threshold notices the gap when it
// is thawed: it refuses Decide, leaves the rings, pulls the newer counts its
// peers hold and becomes ready again.
func TestNodePauseResyncs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		nodes := c.cluster([]string{"a", "b"}, nil)
		a, b := nodes[0], nodes[1]
		nodeHit(t, a, "paused-key", 5)
		testkit.WaitFor(t, quick, "replication", func() bool { return nodeCount(a, "paused-key") == 5 && nodeCount(b, "paused-key") == 5 })

		// While a is frozen (shorter than failure detection), b counts on.
		c.freeze(a)
		time.Sleep(2 * time.Second)
		now := time.Now().UnixNano()
		stB, _ := b.store.Get(now, []byte("paused-key"))
		stB.Count = 40
		b.store.Merge(now, []byte("paused-key"), stB)
		c.thaw(a)

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
	})
}

// A Decide batch read right after a thaw, before the pause detector's
// ticker has run, is refused too (the batch checks the gap itself), and
// the node re-syncs once.
func TestNodeDecideRightAfterThawRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		slowTicker := func(cfg *NodeConfig) { cfg.Timing.PauseThreshold = time.Minute } // ticks every 6 s
		a := c.start("a", nil, slowTicker)
		nodeWaitRing(t, []*nodeTestNode{a}, []*nodeTestNode{a})
		client := replDial(t, a)
		req := &peerpb.DecideRequest{Ops: []*peerpb.Op{nodeValidPB("thaw")}}
		if _, err := client.Decide(context.Background(), req); err != nil {
			t.Fatalf("Decide before the pause: %v", err)
		}
		// Frozen for two minutes, as far as the node's timers know; the
		// network stays up, so the next batch reaches it at once.
		a.clock.Freeze()
		time.Sleep(2 * time.Minute)
		if _, err := client.Decide(context.Background(), req); status.Code(err) != codes.Unavailable {
			t.Fatalf("Decide right after the thaw: %v, want Unavailable", err)
		}
		a.clock.Thaw()
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
	})
}

// A pause while the node syncs makes it sync again before it goes ready.
func TestNodePauseWhileSyncingSyncsAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		a := c.cluster([]string{"a"}, nil)[0]
		pulled := make(chan struct{})
		resume := make(chan struct{})
		var b *nodeTestNode
		b = c.start("b", []string{"a"}, func(cfg *NodeConfig) {
			first := true
			cfg.hooks.afterPull = func() {
				if first {
					first = false
					close(pulled)
					<-resume
				}
			}
		})
		var once sync.Once
		release := func() { once.Do(func() { close(resume) }) }
		t.Cleanup(release)
		select {
		case <-pulled:
		case <-time.After(time.Minute):
			t.Fatal("b did not pull within a minute")
		}
		if p := b.node.Status().Phase; p != lifecycle.Syncing {
			t.Fatalf("b is %v after its first pull, want syncing", p)
		}
		b.node.refuse()
		b.node.paused(5 * time.Second)
		release()
		nodeWaitRing(t, []*nodeTestNode{a, b}, []*nodeTestNode{a, b})
		if n := nodeMetric(t, b.reg, "ringlimit_syncs_total"); n < 2 {
			t.Errorf("%v syncs, want the first and one after the pause", n)
		}
	})
}

// A node that restores saved counters is not ready before they are loaded,
// joins meanwhile, and then merges them with what its peers hold.
func TestNodeRestoresBeforeReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		a := c.cluster([]string{"a"}, nil)[0]
		nodeHit(t, a, "restored", 5)
		release := make(chan struct{})
		var once sync.Once
		t.Cleanup(func() { once.Do(func() { close(release) }) })
		var b *nodeTestNode
		b = c.start("b", []string{"a"}, func(cfg *NodeConfig) {
			cfg.Restore = func(ctx context.Context) error {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
				now := time.Now().UnixNano()
				st, _ := a.store.Get(now, []byte("restored"))
				st.Count = 9 // this node had counted further before it stopped
				b.store.Merge(now, []byte("restored"), st)
				return nil
			}
		})
		time.Sleep(3 * time.Second)
		if st := b.node.Status(); st.Phase != lifecycle.Loading || st.Ready || !b.node.Membership().Joined() {
			t.Fatalf("while loading: %+v, joined %v; want loading, joined, not ready", st, b.node.Membership().Joined())
		}
		once.Do(func() { close(release) })
		nodeWaitRing(t, []*nodeTestNode{a, b}, []*nodeTestNode{a, b})
		if got := nodeCount(b, "restored"); got != 9 {
			t.Fatalf("b holds %d, want its restored 9 (the larger of 9 and a's 5)", got)
		}
	})
}

// A node's own Envoys' calls, read right after a thaw before the pause
// detector ticks, are not decided from its stale counters either: its keys
// go to their next holder until it has re-synced.
func TestNodeApplyRightAfterThawUsesHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		nodes := c.cluster([]string{"a", "b"}, func(cfg *NodeConfig) { cfg.Timing.PauseThreshold = time.Minute })
		a, b := nodes[0], nodes[1]
		key := ""
		for i := 0; key == ""; i++ {
			if k := fmt.Sprintf("thaw-own-%d", i); nodeSuccessors(a, k, 1)[0] == "a" {
				key = k
			}
		}
		nodeHit(t, a, key, 6)
		testkit.WaitFor(t, quick, "b's copy", func() bool { return nodeCount(b, key) == 6 })
		a.clock.Freeze()
		time.Sleep(2 * time.Minute)
		now := time.Now().UnixNano()
		st, _ := b.store.Get(now, []byte(key))
		st.Count = 40 // b took the key over meanwhile and counted on
		b.store.Merge(now, []byte(key), st)
		if r := nodeHit(t, a, key, 1); r.Count != 41 {
			t.Fatalf("a's first call after the thaw: count %d, want 41 (b's count, not a's stale 6)", r.Count)
		}
		a.clock.Thaw()
	})
}

// A pause while a node drains: it stops deciding (its counters may be
// stale) and sends its keys to their new owners, while its push goes on.
func TestNodePauseWhileDrainingStopsDeciding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		a := c.cluster([]string{"a", "b"}, nil)[0]
		a.holdLeave.Store(true)
		go a.node.Drain(context.Background()) // returns when the node closes
		testkit.WaitFor(t, quick, "a draining", func() bool { return a.node.Status().Phase >= lifecycle.Draining })
		a.node.refuse()
		a.node.paused(5 * time.Second)
		testkit.WaitFor(t, quick, "the pause stepped", func() bool { return a.node.pausesSeen.Load() == a.node.pauses.Load() })
		if (*policy)(a.node).Serving() {
			t.Fatal("a draining node serves again after a pause, without re-syncing")
		}
		if st := a.node.Status(); st.Route.Relay != lifecycle.RelayAll {
			t.Fatalf("route %+v, want every op relayed to the new owners", st.Route)
		}
	})
}
