package lifecycle

import (
	"strconv"
	"time"
)

// Phase is where a node is in its life.
type Phase uint8

// The phases, in the order a node usually goes through them.
const (
	// Loading: started; restoring the counters it saved on disk (a node
	// configured to keep them). Not in any ring. It joins meanwhile.
	Loading Phase = iota
	// Joining: started, not yet in touch with any peer. Not in any ring.
	Joining
	// Syncing: joined; pulling the counters it will hold from its ready
	// peers. Not in any ring; refuses Decide.
	Syncing
	// Relaying: ready and in its own ring, for a while (Config.JoinRelay)
	// it relays the ops for its keys to their previous owners, while its
	// readiness spreads to its peers one by one; those owners replicate to
	// it.
	Relaying
	// Serving: ready; decides its keys.
	Serving
	// Resyncing: found it was frozen; out of the rings, refusing Decide,
	// pulling its counters again.
	Resyncing
	// Draining: asked to stop; gossips it, then pushes every counter to
	// its holders on the ring without it. Still decides its keys.
	Draining
	// Leaving: counters pushed; relays every op it is sent to the key's
	// new owner and announces its leave.
	Leaving
	// Left: the leave is announced (or the node refused to serve); it
	// still relays until it is closed.
	Left
	numPhases
)

var phaseNames = [numPhases]string{"loading", "joining", "syncing", "relaying", "serving", "resyncing", "draining", "leaving", "left"}

func (p Phase) String() string {
	if p < numPhases {
		return phaseNames[p]
	}
	return "phase(" + strconv.Itoa(int(p)) + ")"
}

// EventKind says what happened.
type EventKind uint8

const (
	// MembersChanged: the live peers or their flags changed
	// (Event.Members).
	MembersChanged EventKind = iota
	// Joined: the membership reached a peer, or was reached.
	Joined
	// Synced: the sync Event.Gen finished.
	Synced
	// Paused: the node found it was frozen.
	Paused
	// RelayTimer: join relay Event.Gen has lasted Config.JoinRelay.
	RelayTimer
	// Announced: the membership gossiped Event.Flags.
	Announced
	// DrainRequested: the node is asked to stop.
	DrainRequested
	// Pushed: the drain's push finished.
	Pushed
	// LeaveDone: the leave has been announced.
	LeaveDone
	// Conflict: another live process holds this node's identity (before
	// the node is ready: Event.Gen is the sync that found it).
	Conflict
	// Loaded: the counters saved on disk are restored (or could not be).
	Loaded
	numEvents
)

var eventNames = [numEvents]string{"members-changed", "joined", "synced", "paused", "relay-timer", "announced", "drain-requested", "pushed", "leave-done", "conflict", "loaded"}

func (k EventKind) String() string {
	if k < numEvents {
		return eventNames[k]
	}
	return "event?"
}

// Event is something that happened to a node.
type Event struct {
	Kind    EventKind
	Members []Member // MembersChanged: every live member, any order (this node is skipped)
	Gen     uint64   // Synced, RelayTimer
	Flags   Flags    // Announced
}

// ActionKind says what to do.
type ActionKind uint8

const (
	// Publish: rebuild the rings from Rings and publish them with Route.
	Publish ActionKind = iota
	// Announce: gossip Action.Flags, then report Announced with them.
	Announce
	// StartSync: pull counters from the ready peers, check that no other
	// live process holds this identity, then report Synced (or Conflict)
	// with Action.Gen.
	StartSync
	// Forgive: the failures peers showed so far were this node's freeze.
	Forgive
	// StartTimer: report RelayTimer with Action.Gen after Action.After.
	StartTimer
	// PushAll: push every counter to its holders on targets, ship the
	// writes recorded meanwhile, then report Pushed.
	PushAll
	// Leave: announce a graceful leave, ship the last writes, then report
	// LeaveDone.
	Leave
	// Fail: the node must not serve (Conflict): stop the process with an
	// error. It comes once the node has left.
	Fail
	// Load: restore the counters saved on disk into the store, then
	// report Loaded.
	Load
	numActions
)

var actionNames = [numActions]string{"publish", "announce", "start-sync", "forgive", "start-timer", "push-all", "leave", "fail", "load"}

func (k ActionKind) String() string {
	if k < numActions {
		return actionNames[k]
	}
	return "action?"
}

// Action is one thing the executor must do, in order.
type Action struct {
	Kind  ActionKind
	Flags Flags         // Announce
	Gen   uint64        // StartSync, StartTimer
	After time.Duration // StartTimer
}
