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

// RingIDs are the members of the rings a node routes by, each sorted.
type RingIDs struct {
	// Ring owns keys: the ready peers, and this node when Route().InRing.
	Ring []string
	// Targets is where this node's writes replicate: Ring, less this node
	// while it departs.
	Targets []string
	// Relay is where relayed ops go. RelayAll: Targets. RelayOwn: Ring
	// less this node, where the peers that have not seen it ready yet send
	// its keys (their previous owners). RelayNone: Ring.
	Relay []string
	// Behind (RelayOwn only) is Relay less the peers in their own join
	// relay (Relaying): a key whose owner on Relay is such a peer goes
	// where that peer relays it, its owner on Behind. Empty when that
	// leaves nobody.
	Behind []string
	// Relaying are the ready peers in their own join relay.
	Relaying []string
}

// Rings returns the rings the state routes by.
func (s State) Rings() RingIDs {
	var r RingIDs
	for _, m := range s.members {
		if m.Ready {
			r.Ring = append(r.Ring, m.ID)
			if m.Relaying {
				r.Relaying = append(r.Relaying, m.ID)
			} else {
				r.Behind = append(r.Behind, m.ID)
			}
		}
	}
	others := r.Ring
	if s.route.InRing {
		r.Ring = insertSorted(slices.Clone(r.Ring), s.cfg.Self)
	}
	r.Targets = r.Ring
	if s.route.Departing {
		r.Targets = others
	}
	r.Relay = r.Ring
	switch s.route.Relay {
	case RelayAll:
		r.Relay = r.Targets
	case RelayOwn:
		r.Relay = others
	}
	if s.route.Relay != RelayOwn {
		r.Behind = nil
	}
	return r
}

func insertSorted(ids []string, id string) []string {
	i, ok := slices.BinarySearch(ids, id)
	if ok {
		return ids
	}
	return slices.Insert(ids, i, id)
}
