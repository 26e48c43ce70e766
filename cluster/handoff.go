package cluster

import (
	"time"

	"github.com/ringlimit/ringlimit/ring"
)

// After every ring change the handoff goroutine has replication push the
// keys whose replica set changed to their new holders
// (replication.Replicator.Handoff); a graceful leave (Drain) pushes every
// key to its replica set on the ring without this node (drain.go).

// Backoff between handoffs that did not reach every peer.
const (
	handoffRetryMin = 500 * time.Millisecond
	handoffRetryMax = 30 * time.Second
)

// handoffLoop runs a handoff after each ring change, coalescing changes
// that arrive while one runs. A handoff that did not reach every peer is
// run again with backoff against the same old ring, for the peers that
// failed only while the ring stays as it was (for every peer once it has
// changed again), until one succeeds. Merging makes the repeats harmless.
// It returns when the node closes.
func (n *Node) handoffLoop() {
	defer n.wg.Done()
	last := n.view.Load().ring
	retry := n.clock.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	var (
		fails   int
		failed  map[string]error // the peers the last handoff missed
		against *ring.Ring       // the ring that handoff ran for
	)
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.handoffKick:
		case <-retry.C():
		}
		cur := n.view.Load().ring
		if ringSameMembers(last, cur) {
			last, fails, failed = cur, 0, nil
			retry.Stop()
			continue
		}
		var only map[string]error
		if failed != nil && ringSameMembers(against, cur) {
			only = failed
		}
		start := n.clock.Now()
		pushed, missed, err := n.repl.Handoff(n.ctx, last, cur, only)
		if n.ctx.Err() != nil {
			return
		}
		if len(missed) > 0 {
			fails++
			failed, against = missed, cur
			wait := min(handoffRetryMax, handoffRetryMin<<min(fails-1, 10))
			if fails == 1 || fails%10 == 0 {
				n.log.Warn("cluster: handoff incomplete; retrying", "pushed", pushed, "failures", fails, "retry_in", wait, "err", err)
			}
			retry.Reset(wait)
			continue
		}
		if fails > 0 || pushed > 0 {
			n.log.Info("cluster: handed off counters after a ring change", "pushed", pushed, "took", n.clock.Now().Sub(start), "after_failures", fails)
		}
		last, fails, failed = cur, 0, nil
		retry.Stop()
	}
}
