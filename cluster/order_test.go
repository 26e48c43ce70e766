package cluster

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/bucket"
)

// Ops of one call on the same key are applied in call order, wherever the
// key's owner is: a request that names one descriptor several times gets
// the statuses in request order (the first the lower count), as from the
// reference, which counts them one after the other. Ops that go to the
// owner may travel in different batches at once, so the forwarder must not
// let a later one overtake an earlier one.
func TestNodeSameKeyOpsInCallOrder(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		nodes := sim.cluster([]string{"a", "b", "c"}, nil)
		const calls, dup = 40, 4
		for c := range calls {
			key := fmt.Sprintf("order-%d", c)
			entry := nodes[c%3] // the owner, or a node that forwards to it
			ops := make([]bucket.Op, 0, 2*dup)
			for range dup {
				// Interleaved with another key, as a request's descriptors are.
				ops = append(ops, nodeDayOp(key), nodeDayOp(key+"-other"))
			}
			res := make([]bucket.Result, len(ops))
			entry.node.Apply(context.Background(), time.Now().UnixNano(), ops, res)
			for i := range dup {
				if got, want := res[2*i].Count, uint64(i+1); got != want {
					t.Fatalf("call %d via %s (owner %s): op %d on %s counted %d, want %d (results %+v)",
						c, entry.id, nodeSuccessors(entry, key, 1)[0], 2*i, key, got, want, res)
				}
			}
		}
	})
}

// The two steps of STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (rls.Service)
// give the owner's answer through any node: a Peek counts nothing and
// answers as if the hits were counted, a Consume of 0 hits answers the
// count as it stands, and a Consume over the limit still counts.
func TestNodePeekAndCheckAtOwner(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		nodes := sim.cluster([]string{"a", "b", "c"}, nil)
		lim := bucket.Limit{Requests: 10, Unit: int64(nodeUnit)}
		for k, entry := range nodes {
			key := []byte(fmt.Sprintf("stop-%d", k))
			apply := func(hits uint64, mode bucket.Mode) bucket.Result {
				ops := []bucket.Op{{Key: key, Limit: lim, Hits: hits, Mode: mode}}
				var res [1]bucket.Result
				entry.node.Apply(context.Background(), time.Now().UnixNano(), ops, res[:])
				return res[0]
			}
			steps := []struct {
				hits       uint64
				mode       bucket.Mode
				over       bool
				count, rem uint64
			}{
				{8, bucket.Consume, false, 8, 2},
				{5, bucket.Peek, true, 13, 0},
				{0, bucket.Consume, false, 8, 2},
				{5, bucket.Consume, true, 13, 0},
				{1, bucket.Consume, true, 14, 0},
			}
			for i, s := range steps {
				r := apply(s.hits, s.mode)
				if r.Over != s.over || r.Count != s.count || r.Remaining != s.rem {
					t.Fatalf("via %s (owner %s), step %d: %+v, want over %v count %d remaining %d",
						entry.id, nodeSuccessors(entry, string(key), 1)[0], i, r, s.over, s.count, s.rem)
				}
			}
		}
	})
}

// The rounds that keep same-key ops in call order share the call's one wait:
// a call whose owner does not answer returns when that wait ends (before the
// caller's deadline, with the margin kept for the answer's way back, or
// after the forwarder's Timeout without a deadline), however many times it
// names the key, rather than waiting again for each next round.
func TestNodeSameKeyRoundsShareTheWait(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		nodes := sim.cluster([]string{"a", "b", "c"}, nil)
		entry := nodes[0]
		key := ""
		var owner *nodeTestNode
		for i := 0; owner == nil; i++ {
			key = fmt.Sprintf("rounds-%d", i)
			for _, n := range nodes[1:] {
				if n.id == nodeSuccessors(entry, key, 1)[0] {
					owner = n
				}
			}
		}
		sim.freeze(owner)
		defer sim.thaw(owner)

		const deadline = 100 * time.Millisecond
		for _, c := range []struct {
			name string
			ctx  func() (context.Context, context.CancelFunc)
			max  time.Duration
		}{
			// The wait ends 3 ms (the forwarder's margin) before the deadline.
			{"deadline", func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), deadline)
			}, deadline - 3*time.Millisecond},
			{"no deadline", func() (context.Context, context.CancelFunc) {
				return context.WithCancel(context.Background())
			}, LAN().ForwardTimeout},
		} {
			ops := []bucket.Op{nodeDayOp(key), nodeDayOp(key), nodeDayOp(key)}
			res := make([]bucket.Result, len(ops))
			ctx, cancel := c.ctx()
			start := time.Now()
			entry.node.Apply(ctx, start.UnixNano(), ops, res)
			took := time.Since(start)
			cancel()
			if took > c.max {
				t.Errorf("%s: Apply of %d ops on one key, its owner %s frozen, took %v, want at most %v",
					c.name, len(ops), owner.id, took, c.max)
			}
		}
	})
}
