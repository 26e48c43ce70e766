package lifecycle

import "slices"

// Flags are what a node gossips about itself.
type Flags struct {
	Ready    bool // synced: peers put it in their rings
	Relaying bool // ready, and still relays its keys to their previous owners
	Draining bool // handing its counters off before it leaves
}

// Member is a live peer as this node's membership reports it.
type Member struct {
	ID string
	Flags
}

// settled reports whether m may take a joining node's relayed ops: ready,
// neither relaying itself nor draining.
func (m Member) settled() bool { return m.Ready && !m.Relaying && !m.Draining }

// Relay says which ops a node relays rather than decides.
type Relay uint8

const (
	// RelayNone: ops go to their owner on the ring; this node decides
	// the ones it owns.
	RelayNone Relay = iota
	// RelayOwn: an op for a key this node owns on the ring goes to the
	// key's owner on the relay ring (its previous owner); others go to
	// their owner on the ring.
	RelayOwn
	// RelayAll: every op goes to its owner on the relay ring, which is
	// the ring without this node.
	RelayAll
)

// Route is how a node treats ops in its current state.
type Route struct {
	// Serve: its peer server answers Decide and Ping. A node that is not
	// synced refuses them, and its callers decide elsewhere.
	Serve bool
	// InRing: it is a member of its own ring.
	InRing bool
	// Relay: which ops it relays (see Rings for where).
	Relay Relay
	// Departing: its writes replicate to the ring without it.
	Departing bool
}

// Rings returns the member IDs of the three rings the node routes by, each
// sorted: ring, where keys are owned (the ready peers, and this node when
// Route().InRing); targets, where this node's writes replicate (ring, less
// this node while it departs); and relay, where relayed ops go (RelayAll:
// targets; RelayOwn: the peers that were settled when the join relay began
// and still are, or ring if none is; RelayNone: ring).
func (s State) Rings() (ring, targets, relay []string) {
	for _, m := range s.members {
		if m.Ready {
			ring = append(ring, m.ID)
		}
	}
	others := ring
	if s.route.InRing {
		ring = insertSorted(slices.Clone(ring), s.cfg.Self)
	}
	targets = ring
	if s.route.Departing {
		targets = others
	}
	relay = ring
	switch s.route.Relay {
	case RelayAll:
		relay = targets
	case RelayOwn:
		var still []string
		for _, m := range s.members {
			if m.settled() && contains(s.relayTo, m.ID) {
				still = append(still, m.ID)
			}
		}
		if len(still) > 0 {
			relay = still
		}
	}
	return ring, targets, relay
}
