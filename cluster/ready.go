package cluster

import (
	"time"

	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/cluster/replication"
)

// Readiness. A node starts not ready: it gossips Ready=false, it is in
// nobody's ring (its own included), and its peer server refuses Decide.
// Once it has joined it syncs from its peers, then answers Decide again,
// gossips Ready=true and puts itself in its own ring. A node that finds it
// was frozen (a gap between two ticks of its pause detector) refuses Decide
// at once, leaves the rings the same way and re-syncs before it is ready
// again: it must not answer from counters the others moved past while it
// was stopped.

// pauseGrace is how long after a detected pause failures of peers are not
// held against them: calls that waited through the freeze time out as it
// ends.
const pauseGrace = time.Second

// lifecycle waits for the join, syncs and goes ready, then re-syncs after
// every detected pause. It returns when the node closes.
func (n *Node) lifecycle() {
	defer n.wg.Done()
	t := time.NewTicker(20 * time.Millisecond)
	for !n.m.Joined() {
		select {
		case <-n.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	t.Stop()
	n.resync("joined")
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.resyncKick:
		}
		n.resync("pause")
	}
}

// resync leaves the rings, syncs from the peers and goes ready again. A
// pause detected while it syncs makes it sync again before it goes ready:
// going ready would clear the refusal that pause set, with counters that
// may have gone stale meanwhile.
func (n *Node) resync(why string) {
	if n.draining.Load() {
		return
	}
	n.setReady(false)
	var gen uint64
	for {
		gen = n.pauseGen.Load()
		start := time.Now()
		got, err := n.repl.Pull(n.ctx, n.syncPeers())
		if n.ctx.Err() != nil {
			return
		}
		took := time.Since(start)
		if err != nil {
			n.log.Warn("cluster: sync incomplete; going ready with what arrived", "why", why, "entries", got, "took", took, "err", err)
		} else {
			n.log.Info("cluster: synced counters from peers", "why", why, "entries", got, "took", took)
		}
		// A pause so far is handled here, so its kick is spent; one
		// after this check kicks the lifecycle again.
		select {
		case <-n.resyncKick:
		default:
		}
		if n.pauseGen.Load() == gen || n.draining.Load() {
			break
		}
		why = "paused while syncing"
	}
	n.awaitView(time.Second)
	n.setReady(true)
	if n.pauseGen.Load() != gen {
		// Paused between the check and setReady, which let Decide in
		// again: refuse it until the lifecycle, kicked by that pause,
		// re-syncs.
		n.setServing(false)
	}
}

// syncPeers are the peers a sync pulls from: every alive ready member but
// this node.
func (n *Node) syncPeers() []replication.Peer {
	var peers []replication.Peer
	for _, m := range n.m.Alive() {
		if m.ID != n.self && m.Ready {
			peers = append(peers, replication.Peer{ID: m.ID, GRPCAddr: m.GRPCAddr})
		}
	}
	return peers
}

// setReady changes this node's readiness. Going down it first stops
// answering Decide and leaves its own ring, then gossips; going up it first
// answers Decide and gossips (waiting a bounded time for the broadcast), so
// that the others have it in their rings about when it puts itself in its
// own.
func (n *Node) setReady(ready bool) {
	n.readyMu.Lock()
	defer n.readyMu.Unlock()
	if ready && n.draining.Load() {
		return
	}
	relaying := false
	switch {
	case !ready:
		n.setServing(false)
		n.ready.Store(false)
		n.metrics.ready.Set(0)
		n.rebuild()
	case n.beginJoinRelay():
		// Relaying, it puts itself in its own ring first: it sends the
		// ops for its keys to their previous owners, so it decides none
		// that the others still send there, and it answers the peers
		// that route here once they see the readiness.
		relaying = true
		n.markReady()
		n.setServing(true)
	default:
		n.setServing(true)
	}
	if err := n.m.SetFlags(membership.Flags{Ready: ready, Relaying: relaying}); err != nil {
		n.log.Debug("cluster: gossiping readiness", "ready", ready, "err", err)
	}
	if ready && !relaying {
		n.markReady()
	}
}

// markReady puts this node in its own ring.
func (n *Node) markReady() {
	n.ready.Store(true)
	n.metrics.ready.Set(1)
	n.rebuild()
}

// pauseLoop ticks every pauseThreshold/10 and reports a pause when two
// ticks are more than pauseThreshold apart on the monotonic clock, which
// keeps running while the process is stopped. It returns when the node
// closes.
func (n *Node) pauseLoop() {
	defer n.wg.Done()
	t := time.NewTicker(max(n.pauseThreshold/10, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		now := n.mono()
		if gap := now - time.Duration(n.lastTick.Swap(int64(now))); gap > n.pauseThreshold {
			n.paused(gap)
		}
	}
}

// stalled reports a pause the ticker has not noticed yet: a Decide batch
// read right after a thaw can run before the ticker's goroutine does, and
// must not be answered from stale counters. Whoever sees the gap first
// reports it, once.
func (n *Node) stalled() bool {
	if n.pauseThreshold <= 0 {
		return false
	}
	prev := n.lastTick.Load()
	now := int64(n.mono())
	if gap := time.Duration(now - prev); gap > n.pauseThreshold && n.lastTick.CompareAndSwap(prev, now) {
		n.paused(gap)
		return true
	}
	return false
}

// paused refuses Decide at once and has the lifecycle re-sync.
func (n *Node) paused(gap time.Duration) {
	n.metrics.pauses.Inc()
	n.pauseGen.Add(1)
	n.log.Warn("cluster: this process was paused; re-syncing counters before answering again", "gap", gap)
	if n.draining.Load() {
		return
	}
	n.setServing(false)
	n.fwd.Forgive(pauseGrace)
	select {
	case n.resyncKick <- struct{}{}:
	default:
	}
}

// beginJoinRelay makes this node relay the ops for its keys to their owners
// on the ring of its settled peers (ready, not relaying themselves), for
// JoinRelay (see NodeConfig.JoinRelay), and reports whether it does.
// Without settled peers (the first node, or every node starting at once)
// nobody holds older counts, and it does not relay.
func (n *Node) beginJoinRelay() bool {
	if n.joinRelay <= 0 {
		return false
	}
	n.viewMu.Lock()
	settled := make(map[string]bool)
	draining := false
	for _, m := range n.alive {
		if m.ID != n.self && settledPeer(m) {
			settled[m.ID] = true
		}
		draining = draining || m.Draining
	}
	if len(settled) == 0 || draining {
		// Nobody holds older counts; or a draining node relays its keys
		// to this one, which must then decide them.
		n.viewMu.Unlock()
		return false
	}
	select {
	case <-n.joinCut: // meant for an earlier relay
	default:
	}
	n.joinGen++
	gen := n.joinGen
	n.joinSettled = settled
	n.joinRelaying.Store(true)
	n.relaying.Store(true)
	n.viewMu.Unlock()
	select {
	case <-n.joinKick: // an earlier relay's end, superseded
	default:
	}
	n.joinKick <- gen
	return true
}

// joinRelayLoop ends each join relay JoinRelay after it began. It returns
// when the node closes.
func (n *Node) joinRelayLoop() {
	defer n.wg.Done()
	for {
		var gen uint64
		select {
		case <-n.ctx.Done():
			return
		case gen = <-n.joinKick:
		}
		t := time.NewTimer(n.joinRelay)
		select {
		case <-n.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-n.joinCut:
			// A member drains: end the relay now, whichever it is
			// (a pause re-sync may have begun a later one).
			t.Stop()
			n.viewMu.Lock()
			gen = n.joinGen
			n.viewMu.Unlock()
			n.endJoinRelay(gen, true)
			continue
		}
		n.endJoinRelay(gen, false)
	}
}

// endJoinRelay ends join relay gen unless a later one began: from then on
// this node decides the keys it owns, from the counts their previous owners
// replicated to it. A draining node goes on relaying. At the relay's end
// peers learn first, so that one relaying itself sends this node's keys
// here from then on (it applies relayed ops) rather than to their previous
// owners. A cut (a member drains) switches first: the draining member is
// already out of the ring this node relays to, and relays to this node.
func (n *Node) endJoinRelay(gen uint64, cut bool) {
	n.readyMu.Lock()
	defer n.readyMu.Unlock()
	n.viewMu.Lock()
	current := gen == n.joinGen && n.joinRelaying.Load()
	n.viewMu.Unlock()
	if !current {
		return
	}
	if !cut {
		n.gossipRelayEnd()
	}
	n.viewMu.Lock()
	n.joinRelaying.Store(false)
	if !n.draining.Load() {
		n.relaying.Store(false)
	}
	n.rebuildLocked()
	n.viewMu.Unlock()
	n.log.Info("cluster: deciding own keys; relayed to their previous owners since going ready", "for", n.joinRelay, "cut", cut)
	if cut {
		n.gossipRelayEnd()
	}
}

// gossipRelayEnd tells the peers this node no longer relays.
func (n *Node) gossipRelayEnd() {
	if err := n.m.SetFlags(membership.Flags{Ready: n.ready.Load()}); err != nil {
		n.log.Debug("cluster: gossiping the end of the join relay", "err", err)
	}
}

// marksRelay tells the peer server which relayed ops to mark relayed
// (transport.Policy.MarkRelay): all while this node drains; in its join relay,
// those for the keys its ring gives it, which go to their previous owners.
// An op for another key, sent here by a peer whose view differs, goes on
// unmarked to the key's owner, which relays it in turn if it has just
// joined too, rather than applying it beside that relay.
func (n *Node) marksRelay(key []byte) bool {
	if n.draining.Load() {
		return true
	}
	id, ok := n.view.Load().ring.Owner(key)
	return ok && id == n.self
}

// awaitView waits, at most d, until the view this node builds its ring from
// (onChange's, which the membership delivers after a short settle delay)
// has every ready peer the membership knows: a node that goes ready before
// then would put only itself in its ring, and find no settled peer to relay
// to.
func (n *Node) awaitView(d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		want := map[string]bool{}
		for _, m := range n.m.Alive() {
			if m.ID != n.self && m.Ready {
				want[m.ID] = true
			}
		}
		n.viewMu.Lock()
		for _, m := range n.alive {
			if m.Ready {
				delete(want, m.ID)
			}
		}
		n.viewMu.Unlock()
		if len(want) == 0 || time.Now().After(deadline) {
			return
		}
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}
