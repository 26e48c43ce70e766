package transport

import (
	"maps"
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// SetPeers replaces the set of peers: id -> gRPC address of the alive
// members. Entries for this node's own ID are ignored. A new peer gets a
// client (a connection, its senders and a probe); a peer that is gone or
// has moved to another address has its client closed, so a moved peer also
// loses its suspicion. SetPeers after Close does nothing.
func (f *Forwarder) SetPeers(peers map[string]string) { f.setPeers(peers, true) }

// AddPeers is SetPeers that only adds clients for the peers that have
// none: a ring about to route to new members calls it first, so that no
// op for their keys finds no client (and is decided here instead).
func (f *Forwarder) AddPeers(peers map[string]string) { f.setPeers(peers, false) }

// setPeers is SetPeers; without prune it keeps every client it has.
func (f *Forwarder) setPeers(peers map[string]string, prune bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	old := *f.peers.Load()
	next := make(map[string]*peerClient, len(peers))
	if !prune {
		maps.Copy(next, old)
	}
	for id, addr := range peers {
		if id == f.self || addr == "" {
			continue
		}
		if p := old[id]; p != nil && (p.addr == addr || !prune) {
			next[id] = p
			continue
		}
		p, err := newPeerClient(f, id, addr)
		if err != nil {
			f.log.Error("transport: cannot create peer client", "peer", id, "addr", addr, "err", err)
			continue
		}
		f.log.Info("transport: peer added", "peer", id, "addr", addr)
		next[id] = p
	}
	f.peers.Store(&next)
	if len(next) > 0 {
		f.startLeasesLocked()
	}
	for id, p := range old {
		if next[id] != p {
			f.log.Info("transport: peer removed", "peer", id, "addr", p.addr)
			p.close()
		}
	}
}

// Suspects returns the IDs of the peers currently bypassed, sorted.
func (f *Forwarder) Suspects() []string {
	var out []string
	for id, p := range *f.peers.Load() {
		if p.suspect.Load() {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Client returns the Peer client of peer id, or nil when id is not a
// current peer. The connection belongs to the forwarder: it closes when the
// peer is removed, failing the RPCs in flight on it.
func (f *Forwarder) Client(id string) peerpb.PeerClient {
	if p := (*f.peers.Load())[id]; p != nil {
		return p.client
	}
	return nil
}

// Forgive clears every peer's suspicion and failure count and ignores new
// failures for grace: after this process was frozen, the timeouts it saw
// were its own, not its peers'.
func (f *Forwarder) Forgive(grace time.Duration) {
	f.graceUntil.Store(f.mono() + int64(grace))
	for _, p := range *f.peers.Load() {
		p.fails.Store(0)
		p.clearSuspect("this node was paused, not the peer")
	}
}
