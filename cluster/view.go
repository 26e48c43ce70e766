package cluster

import (
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/ring"
)

// view is one consistent picture of the cluster: the ring and where each of
// its members answers. Immutable once published.
type view struct {
	ring *ring.Ring
	// targets places the replicas of this node's writes: ring, or ring
	// without this node while it drains.
	targets *ring.Ring
	// relayTo places the ops this node relays (Node.relaying). For a
	// draining node it is targets. For a node in its join relay it is the
	// ring of the peers that were settled when the relay began
	// (Node.joinSettled) and still are (neither relaying nor draining), so
	// that two joining nodes send a key to the same previous owner, which
	// does not change while the relay lasts; ring if there are none. When
	// this node does not relay it is ring.
	relayTo *ring.Ring
	addrs   map[string]string // ID -> gRPC address
	built   time.Time
}

// onChange records the membership's view and rebuilds the ring. It runs on
// the membership's notifier goroutine, one call at a time.
func (n *Node) onChange(alive []membership.Member) {
	n.viewMu.Lock()
	defer n.viewMu.Unlock()
	n.alive = alive
	n.rebuildLocked()
}

// rebuild rebuilds the ring from the last membership view, after this
// node's own readiness changed.
func (n *Node) rebuild() {
	n.viewMu.Lock()
	defer n.viewMu.Unlock()
	n.rebuildLocked()
}

// rebuildLocked builds the ring of the ready alive members (this node when
// it is ready, per its own flag, which is ahead of its gossip) and publishes
// it; a changed ring wakes the handoff. n.viewMu is held.
func (n *Node) rebuildLocked() {
	var ids, others, settled []string
	draining, joinRelaying := n.draining.Load(), n.joinRelaying.Load()
	someDraining := false
	addrs := map[string]string{n.self: n.selfAddr}
	for _, m := range n.alive {
		switch {
		case m.ID == n.self:
			if n.ready.Load() {
				ids = append(ids, m.ID)
			}
		case m.Ready:
			ids = append(ids, m.ID)
			others = append(others, m.ID)
			if joinRelaying && settledPeer(m) && n.joinSettled[m.ID] {
				settled = append(settled, m.ID)
			}
			if m.Draining {
				someDraining = true
			}
			addrs[m.ID] = m.GRPCAddr
		}
	}
	r, err := ring.New(ids, n.ringCfg)
	if err != nil {
		n.log.Error("ring rebuild failed; keeping the previous ring", "members", ids, "err", err)
		return
	}
	targets, relayTo := r, r
	if draining && len(others) != len(ids) {
		if targets, err = ring.New(others, n.ringCfg); err != nil {
			n.log.Error("ring rebuild failed; keeping the previous ring", "members", others, "err", err)
			return
		}
		relayTo = targets
	}
	if !draining && joinRelaying && len(settled) > 0 && len(settled) != len(ids) {
		if relayTo, err = ring.New(settled, n.ringCfg); err != nil {
			n.log.Error("ring rebuild failed; keeping the previous ring", "members", settled, "err", err)
			return
		}
	}
	changed := !ringSameMembers(n.view.Load().ring, r)
	if changed {
		// Before the ring is published: no op decides a newly owned key
		// from a count below what its last owner told this node.
		n.rec.Adopt(n.clock(), func(key []byte) bool {
			id, ok := r.Owner(key)
			return ok && id == n.self
		})
	}
	peers := make(map[string]string, len(others))
	for _, id := range others {
		peers[id] = addrs[id]
	}
	// New members get their clients before the ring routes to them (an op
	// for a key whose owner has no client is decided here, and the owner
	// never counts it); members gone lose theirs only after it stops.
	n.fwd.AddPeers(peers)
	n.view.Store(&view{ring: r, targets: targets, relayTo: relayTo, addrs: addrs, built: time.Now()})
	if joinRelaying && someDraining {
		// A draining node relays to the joining ones: the join relay
		// ends, so that a key is not sent from each to the other.
		select {
		case n.joinCut <- struct{}{}:
		default:
		}
	}
	n.fwd.SetPeers(peers)
	n.metrics.members.Set(float64(len(ids)))
	if changed {
		n.metrics.rebuilds.Inc()
		n.log.Info("ring rebuilt", "members", ids)
		select {
		case n.handoffKick <- struct{}{}:
		default:
		}
	}
}

// placement is the ring key's decisions follow in v: the ring, or while
// this node relays (Node.relaying) the ring of the members that take
// its keys over (it leaves: every key) or still hold them (it has just
// joined: the keys it owns on the ring; the others are decided where the
// ring places them, as the other nodes do).
func (n *Node) placement(v *view, key []byte) *ring.Ring {
	if !n.relaying.Load() {
		return v.ring
	}
	if !n.draining.Load() {
		if id, ok := v.ring.Owner(key); !ok || id != n.self {
			return v.ring
		}
	}
	return v.relayTo
}

// Owner implements Owners from the current ring snapshot, without locks.
func (n *Node) Owner(key []byte) (id, grpcAddr string, self bool) {
	v := n.view.Load()
	id, ok := n.placement(v, key).Owner(key)
	if !ok || id == n.self {
		return n.self, v.addrs[n.self], true
	}
	return id, v.addrs[id], false
}

// Holder implements Holders from the current ring snapshot: the i-th of
// the key's first Replicas distinct successors. It takes no lock and does
// not allocate.
func (n *Node) Holder(key []byte, i int) (id string, self, ok bool) {
	if i < 0 || i >= n.replicas {
		return "", false, false
	}
	var buf [MaxReplicas]string
	s := n.placement(n.view.Load(), key).Successors(key, i+1, buf[:0])
	if len(s) <= i {
		return "", false, false
	}
	return s[i], s[i] == n.self, true
}

// settledPeer reports whether m is where a join relay may send a key: a
// ready member that neither relays itself nor drains.
func settledPeer(m membership.Member) bool { return m.Ready && !m.Relaying && !m.Draining }

// ringSameMembers reports whether two rings place keys identically: rings
// built with one Config from the same members do.
func ringSameMembers(a, b *ring.Ring) bool {
	return a == b || slices.Equal(a.Members(), b.Members())
}
