// Package lifecycle is a ringlimit node's life as a pure state machine.
//
// Step takes a State, an Event and the time and returns the next State and
// the Actions to carry out. It starts no goroutine, reads no clock and does
// no I/O: the node's executor (package cluster) turns actions into gossip,
// rings, syncs and pushes, and turns what happens (membership changes,
// finished syncs, timers, a detected pause, a drain) into events. Each
// State names where an op for a key goes (Route, Rings), so "where does this
// op go" is one function of the state.
//
// A State is a value; Step never modifies the one it is given. Nothing here
// is safe for concurrent use: one goroutine steps a node's machine.
package lifecycle

import (
	"slices"
	"strings"
	"time"
)

// Config is what a node's machine needs to know of its settings.
type Config struct {
	// Self is this node's ID.
	Self string
	// JoinRelay is how long a node that has just gone ready relays; 0 or
	// less: never.
	JoinRelay time.Duration
	// Replicated reports that writes are replicated (Replicas > 1). A join
	// relay needs it: the counts gathered at the previous owners reach the
	// joining node by replication.
	Replicated bool
	// Load: the node restores counters it saved on disk before it syncs
	// from its peers (merged with theirs by the usual maximum rule).
	Load bool
}

// State is one node's lifecycle state. The zero value is not usable: start
// from New.
type State struct {
	cfg     Config
	phase   Phase
	since   time.Time // when phase began
	members []Member  // live peers, sorted by ID, without this node

	route Route
	want  Flags // the flags last asked to be gossiped

	syncGen  uint64 // the sync whose result is awaited
	relayGen uint64 // the current (or last) join relay
	ending   bool   // the relay's end is being gossiped
	pushing  bool   // the drain's push has started
	joined   bool   // Loading: the membership has joined meanwhile
	failing  bool   // drains because another live process holds its identity
}

// New returns the state of a node that has just started and what to do
// first: load its saved counters (Config.Load), or nothing until it joins.
func New(cfg Config, now time.Time) (State, []Action) {
	if cfg.Load {
		return State{cfg: cfg, phase: Loading, since: now}, []Action{{Kind: Load}}
	}
	return State{cfg: cfg, phase: Joining, since: now}, nil
}

// Phase returns the current phase and when it began.
func (s State) Phase() (Phase, time.Time) { return s.phase, s.since }

// Route returns how the node treats ops now.
func (s State) Route() Route { return s.route }

// RelayGen returns the number of the current (or last) join relay: the Gen
// of its RelayTimer.
func (s State) RelayGen() uint64 { return s.relayGen }

// Members returns the live peers the state was last told of. The slice is
// shared: do not modify it.
func (s State) Members() []Member { return s.members }

// Step returns the state after ev at now and what to do about it. Events
// that do not apply in the current phase (a stale sync or timer, a second
// drain) change nothing.
func Step(s State, ev Event, now time.Time) (State, []Action) {
	var acts []Action
	if ev.Kind == MembersChanged {
		s.members = peers(ev.Members, s.cfg.Self)
		acts = append(acts, Action{Kind: Publish})
		if s.phase == Relaying && s.someDraining() {
			// A draining peer relays its keys here and pushes them here:
			// this node decides its keys from now on, at once, so that
			// the two do not relay a key to each other.
			return s.stopRelay(now, acts)
		}
		return s, acts
	}
	switch s.phase {
	case Loading:
		switch ev.Kind {
		case Joined:
			s.joined = true
		case Loaded:
			if s.joined {
				return s.startSync(Syncing, now, acts)
			}
			s.phase, s.since = Joining, now
			return s, acts
		case Paused:
			return s, append(acts, Action{Kind: Forgive})
		case DrainRequested:
			return s.drain(now)
		}
	case Joining:
		switch ev.Kind {
		case Joined:
			return s.startSync(Syncing, now, acts)
		case Paused:
			return s, append(acts, Action{Kind: Forgive})
		case DrainRequested:
			return s.drain(now)
		}
	case Syncing, Resyncing:
		switch ev.Kind {
		case Synced:
			if ev.Gen == s.syncGen {
				return s.goReady(now)
			}
		case Paused:
			// What was synced may be stale already: sync again.
			return s.startSync(Resyncing, now, append(acts, Action{Kind: Forgive}))
		case DrainRequested:
			return s.drain(now)
		case Conflict:
			if ev.Gen == s.syncGen {
				return s.refuse(now)
			}
		}
	case Relaying:
		switch ev.Kind {
		case RelayTimer:
			if ev.Gen == s.relayGen && !s.ending {
				// Peers learn first, then this node switches: a peer that
				// relays itself then sends this node's keys here.
				s.ending = true
				return s, s.announce(Flags{Ready: true}, acts)
			}
		case Announced:
			if s.ending && ev.Flags == s.want {
				return s.stopRelay(now, acts)
			}
		case Paused:
			return s.resync(now)
		case DrainRequested:
			return s.drain(now)
		case Conflict:
			return s.yield(now)
		}
	case Serving:
		switch ev.Kind {
		case Announced:
			if !s.route.InRing && ev.Flags == s.want {
				// Peers have it in their rings about now: so does it.
				s.route.InRing = true
				return s, append(acts, Action{Kind: Publish})
			}
		case Paused:
			return s.resync(now)
		case DrainRequested:
			return s.drain(now)
		case Conflict:
			return s.yield(now)
		}
	case Draining:
		switch ev.Kind {
		case Paused:
			// Its counters may be stale now: the new owners decide its
			// keys from here on, from their copies; the push goes on
			// (merging keeps the larger count).
			s.route.Serve, s.route.Relay = false, RelayAll
			return s, append(acts, Action{Kind: Forgive}, Action{Kind: Publish})
		case Announced:
			if !s.pushing && ev.Flags == s.want {
				s.pushing = true
				return s, append(acts, Action{Kind: PushAll})
			}
		case Pushed:
			// The new owners hold this node's counts: they decide its
			// keys from now on, and it relays what it is still sent.
			s.phase, s.since = Leaving, now
			s.route.Relay = RelayAll
			return s, append(acts, Action{Kind: Publish}, Action{Kind: Leave})
		}
	case Leaving:
		switch ev.Kind {
		case Paused:
			s.route.Serve = false
			return s, append(acts, Action{Kind: Forgive}, Action{Kind: Publish})
		case LeaveDone:
			s.phase, s.since = Left, now
			if s.failing {
				acts = append(acts, Action{Kind: Fail})
			}
		}
	}
	return s, acts
}

// startSync enters phase p (Syncing or Resyncing) with a new sync.
func (s State) startSync(p Phase, now time.Time, acts []Action) (State, []Action) {
	s.phase, s.since = p, now
	s.syncGen++
	return s, append(acts, Action{Kind: StartSync, Gen: s.syncGen})
}

// goReady ends a sync. With settled peers to relay to, the node puts itself
// in its own ring at once and relays its keys' ops to their previous owners
// while its readiness spreads; without, it answers Decide, gossips its
// readiness and enters its own ring once that is gossiped.
func (s State) goReady(now time.Time) (State, []Action) {
	s.route.Serve = true
	if s.cfg.JoinRelay > 0 && s.cfg.Replicated && s.someSettled() && !s.someDraining() {
		s.phase, s.since = Relaying, now
		s.relayGen++
		s.ending = false
		s.route.InRing, s.route.Relay = true, RelayOwn
		acts := []Action{{Kind: Publish}}
		acts = s.announce(Flags{Ready: true, Relaying: true}, acts)
		acts = append(acts, Action{Kind: StartTimer, Gen: s.relayGen, After: s.cfg.JoinRelay})
		return s, acts
	}
	s.phase, s.since = Serving, now
	return s, s.announce(Flags{Ready: true}, []Action{{Kind: Publish}})
}

// stopRelay ends the join relay: the node decides its keys. A relay cut
// short (a peer drains) tells its peers afterwards.
func (s State) stopRelay(now time.Time, acts []Action) (State, []Action) {
	s.phase, s.since = Serving, now
	s.route.Relay, s.ending = RelayNone, false
	acts = append(acts, Action{Kind: Publish})
	if s.want.Relaying {
		acts = s.announce(Flags{Ready: true}, acts)
	}
	return s, acts
}

// resync takes a ready node that was frozen out of the rings: it refuses
// Decide and leaves its own ring before it gossips that it is not ready,
// then syncs again.
func (s State) resync(now time.Time) (State, []Action) {
	s.route = Route{}
	s.ending = false
	acts := []Action{{Kind: Forgive}, {Kind: Publish}}
	acts = s.announce(Flags{}, acts)
	return s.startSync(Resyncing, now, acts)
}

// drain starts a graceful stop from any phase before it. The node keeps
// deciding (or refusing) as it did; a join relay in progress becomes a
// relay of every op. Its writes replicate to the ring without it from now
// on, and the push starts once the drain is gossiped: a joining peer that
// sees it stops relaying to this node before this node relays to it.
func (s State) drain(now time.Time) (State, []Action) {
	s.phase, s.since = Draining, now
	if s.route.Relay == RelayOwn {
		s.route.Relay = RelayAll
	}
	s.route.Departing = true
	s.ending = false
	w := s.want
	w.Relaying, w.Draining = false, true
	return s, s.announce(w, []Action{{Kind: Publish}})
}

// yield stops a ready node that found its identity held by another live
// process that counts over it (two started together, each seeing the other
// only once both were ready): it drains as on SIGTERM, so that its counts
// reach the keys' holders, then fails.
func (s State) yield(now time.Time) (State, []Action) {
	s.failing = true
	return s.drain(now)
}

// refuse stops a node that found its identity held by another live
// process: it never goes ready, leaves, and fails.
func (s State) refuse(now time.Time) (State, []Action) {
	s.phase, s.since = Left, now
	s.route = Route{}
	return s, []Action{{Kind: Publish}, {Kind: Leave}, {Kind: Fail}}
}

// announce asks for f to be gossiped.
func (s *State) announce(f Flags, acts []Action) []Action {
	s.want = f
	return append(acts, Action{Kind: Announce, Flags: f})
}

// someSettled reports whether a peer is settled: ready, neither relaying
// nor draining. Without one nobody holds older counts (the first node, or
// every node starting at once), and a node going ready does not relay.
func (s State) someSettled() bool {
	return slices.ContainsFunc(s.members, Member.settled)
}

func (s State) someDraining() bool {
	return slices.ContainsFunc(s.members, func(m Member) bool { return m.Draining })
}

// peers copies ms without self, sorted by ID.
func peers(ms []Member, self string) []Member {
	out := make([]Member, 0, len(ms))
	for _, m := range ms {
		if m.ID != self {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return out
}
