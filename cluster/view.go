package cluster

import (
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/cluster/lifecycle"
	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/ring"
)

// view is what the lifecycle last published: its phase and route, and the
// rings of lifecycle.State.Rings built. Ops, the peer server and the
// replicator read it without locks. Immutable once published.
type view struct {
	phase lifecycle.Phase
	since time.Time
	route lifecycle.Route
	// ring owns keys; targets places the replicas of this node's writes;
	// relay places the ops it relays, and behind those of its own keys that
	// relay gives to a peer in its own join relay (see lifecycle.RingIDs).
	ring, targets, relay, behind *ring.Ring
	relaying                     map[string]bool    // peers in their own join relay
	addrs                        map[string]string  // ID -> gRPC address
	members                      []lifecycle.Member // the live peers the rings were built from
	built                        time.Time
}

// placement is the ring an op for key follows in v: the state's route
// names it (lifecycle.Relay). relayed reports an own key in a join relay.
func (n *Node) placement(v *view, key []byte) (r *ring.Ring, relayed bool) {
	switch v.route.Relay {
	case lifecycle.RelayAll:
		return v.relay, false
	case lifecycle.RelayOwn:
		if id, ok := v.ring.Owner(key); ok && id == n.self {
			// Where the peers that have not seen this node ready send the
			// key; if that is a peer relaying too, where it relays it.
			if o, ok := v.relay.Owner(key); ok && v.relaying[o] && v.behind.Len() > 0 {
				return v.behind, true
			}
			return v.relay, true
		}
	}
	return v.ring, false
}

// Owner implements transport.Owners from the current view, without locks.
func (n *Node) Owner(key []byte) (id, grpcAddr string, self bool) {
	v := n.view.Load()
	r, _ := n.placement(v, key)
	id, ok := r.Owner(key)
	if !ok || id == n.self {
		return n.self, v.addrs[n.self], true
	}
	return id, v.addrs[id], false
}

// Holder implements transport.Holders from the current view: the i-th of
// the key's first Replicas distinct successors. A key this node relays
// while it joins has two: where it relays it, then this node, which holds
// the copy that previous owner replicated to it (should the previous owner
// fail, this node decides the key rather than a peer with an older copy).
// It takes no lock and does not allocate.
func (n *Node) Holder(key []byte, i int) (id string, self, ok bool) {
	if i < 0 || i >= n.replicas {
		return "", false, false
	}
	r, relayed := n.placement(n.view.Load(), key)
	if relayed && i > 0 {
		return n.self, true, i == 1
	}
	var buf [MaxReplicas]string
	s := r.Successors(key, i+1, buf[:0])
	if len(s) <= i {
		return "", false, false
	}
	return s[i], s[i] == n.self, true
}

// policy is a Node as its peer server's transport.Policy.
type policy Node

// Serving answers Decide and Ping while the route says so, unless a pause
// was detected that the lifecycle has not stepped yet (see stalled).
func (p *policy) Serving() bool {
	n := (*Node)(p)
	return !n.stalled() && n.view.Load().route.Serve && n.pauses.Load() == n.pausesSeen.Load()
}

// Relaying reports whether the node relays the batches it is sent.
func (p *policy) Relaying() bool { return p.view.Load().route.Relay != lifecycle.RelayNone }

// MarkRelay reports whether a relayed op for key is marked relayed, so
// that its receiver applies it: every op of a departing node; in a join
// relay, those for the keys the ring gives this node. An op for another
// key (sent here by a peer whose view differs) goes on unmarked to its
// owner, which relays it in turn if it has just joined too.
func (p *policy) MarkRelay(key []byte) bool {
	v := p.view.Load()
	if v.route.Relay == lifecycle.RelayAll {
		return true
	}
	id, ok := v.ring.Owner(key)
	return ok && id == p.self
}

// publish builds the rings of st and publishes them with its route. A ring
// change first adopts the owners' last answers for the keys this node now
// owns (no op decides such a key from a count below what its last owner
// told this node), gives new members their clients before the ring routes
// to them, and wakes the handoff. It runs on the lifecycle goroutine.
func (n *Node) publish(st lifecycle.State, alive []membership.Member) {
	prev := n.view.Load()
	ids := st.Rings()
	build := func(ids []string, reuse ...*ring.Ring) *ring.Ring {
		for _, r := range reuse {
			if r != nil && slices.Equal(r.Members(), ids) {
				return r
			}
		}
		r, err := ring.New(ids, n.ringCfg)
		if err != nil {
			n.log.Error("ring rebuild failed; keeping the previous ring", "members", ids, "err", err)
			return nil
		}
		return r
	}
	r := build(ids.Ring, prev.ring)
	targets := build(ids.Targets, r, prev.targets)
	relay := build(ids.Relay, r, targets, prev.relay)
	behind := build(ids.Behind, relay, prev.behind)
	if r == nil || targets == nil || relay == nil || behind == nil {
		return
	}
	relaying := make(map[string]bool, len(ids.Relaying))
	for _, id := range ids.Relaying {
		relaying[id] = true
	}
	addrs := map[string]string{n.self: n.selfAddr}
	peers := map[string]string{}
	for _, m := range alive {
		if m.ID != n.self && m.Ready {
			addrs[m.ID] = m.GRPCAddr
			peers[m.ID] = m.GRPCAddr
		}
	}
	changed := r != prev.ring
	if changed {
		// Releases of quota leased under the previous ring are refused
		// from now on: the count they would lower may no longer be the
		// one that decides.
		n.fwd.NewLeaseEpoch()
		n.rec.Adopt(n.clock.Now().UnixNano(), func(key []byte) bool {
			id, ok := r.Owner(key)
			return ok && id == n.self
		})
	}
	n.fwd.AddPeers(peers)
	phase, since := st.Phase()
	n.view.Store(&view{phase: phase, since: since, route: st.Route(), ring: r, targets: targets, relay: relay,
		behind: behind, relaying: relaying, addrs: addrs, members: st.Members(), built: n.clock.Now()})
	n.fwd.SetPeers(peers)
	n.metrics.members.Set(float64(r.Len()))
	if st.Route().InRing {
		n.metrics.ready.Set(1)
	} else {
		n.metrics.ready.Set(0)
	}
	if changed {
		n.metrics.rebuilds.Inc()
		n.log.Info("ring rebuilt", "members", ids.Ring)
		select {
		case n.handoffKick <- struct{}{}:
		default:
		}
	}
}

// ringSameMembers reports whether two rings place keys identically: rings
// built with one Config from the same members do.
func ringSameMembers(a, b *ring.Ring) bool {
	return a == b || slices.Equal(a.Members(), b.Members())
}
