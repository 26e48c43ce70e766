package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/ringlimit/ringlimit/ring"
)

// After every ring change the handoff goroutine has replication push the
// keys whose replica set changed to their new holders
// (replication.Replicator.Handoff); a graceful leave (Drain) pushes every
// key to its replica set on the ring without this node.

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
	retry := time.NewTimer(time.Hour)
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
		case <-retry.C:
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
		start := time.Now()
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
			n.log.Info("cluster: handed off counters after a ring change", "pushed", pushed, "took", time.Since(start), "after_failures", fails)
		}
		last, fails, failed = cur, 0, nil
		retry.Stop()
	}
}

// Drain hands this node's counters off before it leaves: it stops counting
// itself as a replica target, pushes every live key to its replica set on
// the ring without this node, then relays every op it is still sent to the
// key's new owner (Node.relaying) and ships the writes it made since
// the push, announces a graceful leave, and ships what was written
// meanwhile. The node is no longer Ready once Drain starts. ctx bounds the
// whole drain; the leave gets at least half of what remains after the push.
// Close must still be called.
func (n *Node) Drain(ctx context.Context) error {
	pushErr := n.handOff(ctx)
	leave := time.Second
	if dl, ok := ctx.Deadline(); ok {
		leave = max(time.Until(dl)/2, time.Millisecond)
	}
	leaveErr := n.m.Leave(leave)
	flushErr := n.repl.Flush(ctx)
	return errors.Join(pushErr, leaveErr, flushErr)
}

// handOff is Drain up to the leave: the node stops counting itself as a
// replica target, pushes every live key to its replica set on the ring
// without it, then relays what it is still sent (Node.relaying) and
// ships the writes made since the push. Until the push is done it keeps
// deciding its keys (unless it is re-syncing after a freeze).
func (n *Node) handOff(ctx context.Context) error {
	// A joining node that relays ends its relay when it sees the drain
	// (Node.joinCut): from then on it decides its keys, and this node
	// relays and pushes them to it.
	n.gossipDraining()
	n.draining.Store(true)
	n.rebuild()
	start := time.Now()
	pushed, pushErr := n.repl.Drain(ctx, n.view.Load().targets)
	n.log.Info("cluster: drain: handed off counters", "pushed", pushed, "took", time.Since(start), "err", pushErr)
	// From now on the new owners decide this node's keys: ops still sent
	// here (by peers that have not seen the leave yet, or by Envoys) are
	// relayed to them, so that no key is counted on two nodes while the
	// leave spreads. The writes made since the push follow by replication.
	n.relaying.Store(true)
	_ = n.repl.Flush(ctx) // its undelivered writes are reported by Drain's flush
	return pushErr
}

// gossipDraining adds the draining flag to what this node gossips. It holds
// readyMu, as every change of the flags does, so that it keeps the ready
// and relaying flags a concurrent change sets.
func (n *Node) gossipDraining() {
	n.readyMu.Lock()
	defer n.readyMu.Unlock()
	f := n.m.Flags()
	f.Draining = true
	if err := n.m.SetFlags(f); err != nil {
		n.log.Debug("cluster: drain: gossiping the drain", "err", err)
	}
}
