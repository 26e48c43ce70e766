package lifecycle

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

var cfg = Config{Self: "a", JoinRelay: 2 * time.Second, Replicated: true}

// settledB is one settled peer: a joining node relays to it.
var settledB = []Member{{ID: "b", Flags: Flags{Ready: true}}}

// run steps s through evs, one millisecond apart, and returns the state and
// the actions of the last step.
func run(t *testing.T, s State, evs ...Event) (State, []Action) {
	t.Helper()
	var acts []Action
	for i, ev := range evs {
		s, acts = Step(s, ev, t0.Add(time.Duration(i+1)*time.Millisecond))
		checkInvariants(t, s)
	}
	return s, acts
}

// inPhase returns a canonical state in phase p, reached by real events.
func inPhase(t *testing.T, p Phase) State {
	t.Helper()
	if p == Loading {
		s, _ := New(Config{Self: cfg.Self, JoinRelay: cfg.JoinRelay, Replicated: true, Load: true}, t0)
		return s
	}
	s, _ := New(cfg, t0)
	step := func(ev Event) { s, _ = run(t, s, ev) }
	if p == Joining {
		return s
	}
	step(Event{Kind: MembersChanged, Members: settledB})
	step(Event{Kind: Joined})
	if p == Syncing {
		return s
	}
	step(Event{Kind: Synced, Gen: s.syncGen})
	if p == Relaying {
		return s
	}
	step(Event{Kind: RelayTimer, Gen: s.relayGen})
	step(Event{Kind: Announced, Flags: s.want})
	switch p {
	case Serving:
		return s
	case Resyncing:
		step(Event{Kind: Paused})
		return s
	}
	step(Event{Kind: DrainRequested})
	if p == Draining {
		return s
	}
	step(Event{Kind: Announced, Flags: s.want})
	step(Event{Kind: Pushed})
	if p == Leaving {
		return s
	}
	step(Event{Kind: LeaveDone})
	if s.phase != p {
		t.Fatalf("could not reach %v (at %v)", p, s.phase)
	}
	return s
}

// current builds an event of kind k that applies to s: the awaited sync,
// the current relay's timer, the flags last asked for, the same peers.
func current(s State, k EventKind) Event {
	ev := Event{Kind: k}
	switch k {
	case MembersChanged:
		ev.Members = s.members
	case Synced, Conflict:
		ev.Gen = s.syncGen
	case RelayTimer:
		ev.Gen = s.relayGen
	case Announced:
		ev.Flags = s.want
	}
	return ev
}

// TestStepTable is every phase against every event: the next phase and the
// actions, in order.
func TestStepTable(t *testing.T) {
	const (
		pub = "publish"
		ann = "announce"
		syn = "start-sync"
		fgv = "forgive"
		tmr = "start-timer"
		psh = "push-all"
		lv  = "leave"
		fl  = "fail"
	)
	type row struct {
		next Phase
		acts []string
	}
	same := func(p Phase, acts ...string) row { return row{p, acts} }
	drain := row{Draining, []string{pub, ann}}
	resync := row{Resyncing, []string{fgv, pub, ann, syn}}
	table := map[Phase]map[EventKind]row{
		Loading: {
			MembersChanged: same(Loading, pub), Joined: same(Loading), Synced: same(Loading),
			Paused: same(Loading, fgv), RelayTimer: same(Loading), Announced: same(Loading),
			DrainRequested: drain, Pushed: same(Loading), LeaveDone: same(Loading), Conflict: same(Loading),
			Loaded: same(Joining),
		},
		Joining: {
			MembersChanged: same(Joining, pub), Joined: same(Syncing, syn), Synced: same(Joining),
			Paused: same(Joining, fgv), RelayTimer: same(Joining), Announced: same(Joining),
			DrainRequested: drain, Pushed: same(Joining), LeaveDone: same(Joining), Conflict: same(Joining),
			Loaded: same(Joining),
		},
		Syncing: {
			MembersChanged: same(Syncing, pub), Joined: same(Syncing), Synced: same(Relaying, pub, ann, tmr),
			Paused: same(Resyncing, fgv, syn), RelayTimer: same(Syncing), Announced: same(Syncing),
			DrainRequested: drain, Pushed: same(Syncing), LeaveDone: same(Syncing), Conflict: same(Left, pub, lv, fl),
			Loaded: same(Syncing),
		},
		Relaying: {
			MembersChanged: same(Relaying, pub), Joined: same(Relaying), Synced: same(Relaying),
			Paused: resync, RelayTimer: same(Relaying, ann), Announced: same(Relaying),
			DrainRequested: drain, Pushed: same(Relaying), LeaveDone: same(Relaying), Conflict: drain,
			Loaded: same(Relaying),
		},
		Serving: {
			MembersChanged: same(Serving, pub), Joined: same(Serving), Synced: same(Serving),
			Paused: resync, RelayTimer: same(Serving), Announced: same(Serving),
			DrainRequested: drain, Pushed: same(Serving), LeaveDone: same(Serving), Conflict: drain,
			Loaded: same(Serving),
		},
		Resyncing: {
			MembersChanged: same(Resyncing, pub), Joined: same(Resyncing), Synced: same(Relaying, pub, ann, tmr),
			Paused: same(Resyncing, fgv, syn), RelayTimer: same(Resyncing), Announced: same(Resyncing),
			DrainRequested: drain, Pushed: same(Resyncing), LeaveDone: same(Resyncing), Conflict: same(Left, pub, lv, fl),
			Loaded: same(Resyncing),
		},
		Draining: {
			MembersChanged: same(Draining, pub), Joined: same(Draining), Synced: same(Draining),
			Paused: same(Draining, fgv, pub), RelayTimer: same(Draining), Announced: same(Draining, psh),
			DrainRequested: same(Draining), Pushed: same(Leaving, pub, lv), LeaveDone: same(Draining), Conflict: same(Draining),
			Loaded: same(Draining),
		},
		Leaving: {
			MembersChanged: same(Leaving, pub), Joined: same(Leaving), Synced: same(Leaving),
			Paused: same(Leaving, fgv, pub), RelayTimer: same(Leaving), Announced: same(Leaving),
			DrainRequested: same(Leaving), Pushed: same(Leaving), LeaveDone: same(Left), Conflict: same(Leaving),
			Loaded: same(Leaving),
		},
		Left: {
			MembersChanged: same(Left, pub), Joined: same(Left), Synced: same(Left),
			Paused: same(Left), RelayTimer: same(Left), Announced: same(Left),
			DrainRequested: same(Left), Pushed: same(Left), LeaveDone: same(Left), Conflict: same(Left),
			Loaded: same(Left),
		},
	}
	if len(table) != int(numPhases) {
		t.Fatalf("table has %d phases, want %d", len(table), numPhases)
	}
	for p := range numPhases {
		if len(table[p]) != int(numEvents) {
			t.Fatalf("%v: table has %d events, want %d", p, len(table[p]), numEvents)
		}
		for k := range numEvents {
			t.Run(p.String()+"/"+k.String(), func(t *testing.T) {
				s := inPhase(t, p)
				before := s
				next, acts := run(t, s, current(s, k))
				want := table[p][k]
				if next.phase != want.next || !slices.Equal(kinds(acts), want.acts) {
					t.Errorf("%v + %v = %v %v, want %v %v", p, k, next.phase, kinds(acts), want.next, want.acts)
				}
				if !sameState(before, s) {
					t.Errorf("Step modified the state it was given")
				}
			})
		}
	}
}

func kinds(acts []Action) []string {
	out := []string{}
	for _, a := range acts {
		out = append(out, a.Kind.String())
	}
	return out
}

func sameState(a, b State) bool { return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b) }

// checkInvariants holds for every reachable state.
func checkInvariants(t *testing.T, s State) {
	t.Helper()
	r := s.route
	switch {
	case r.InRing && !r.Serve && r.Relay != RelayAll:
		// A node that relays every op decides none: it may refuse.
		t.Fatalf("%v: in its own ring but refusing Decide: %+v", s.phase, r)
	case r.Relay == RelayOwn && (s.phase != Relaying || !r.InRing):
		t.Fatalf("%v: relays its own keys outside a join relay: %+v", s.phase, r)
	case r.Relay == RelayAll && !r.Departing:
		t.Fatalf("%v: relays every op but is not departing: %+v", s.phase, r)
	case r.Departing && s.phase < Draining, !r.Departing && (s.phase == Draining || s.phase == Leaving):
		t.Fatalf("%v: departing=%v", s.phase, r.Departing)
	case s.phase < Draining && (r.Departing || s.want.Draining):
		t.Fatalf("%v: draining before a drain: %+v %+v", s.phase, r, s.want)
	case (s.phase == Syncing || s.phase == Resyncing || s.phase == Joining || s.phase == Loading) && (r.Serve || r.InRing):
		t.Fatalf("%v: serving before it has synced: %+v", s.phase, r)
	case s.want.Relaying && !s.want.Ready:
		t.Fatalf("%v: gossips relaying without ready", s.phase)
	}
	rs := s.Rings()
	if slices.Contains(rs.Ring, s.cfg.Self) != r.InRing {
		t.Fatalf("%v: ring %v, InRing %v", s.phase, rs.Ring, r.InRing)
	}
	if r.Departing && slices.Contains(rs.Targets, s.cfg.Self) {
		t.Fatalf("%v: departing node replicates to itself: %v", s.phase, rs.Targets)
	}
	if r.Relay != RelayNone && (slices.Contains(rs.Relay, s.cfg.Self) || slices.Contains(rs.Behind, s.cfg.Self)) {
		t.Fatalf("%v: relays to itself: %+v", s.phase, rs)
	}
	for _, ids := range [][]string{rs.Ring, rs.Targets, rs.Relay, rs.Behind, rs.Relaying} {
		if !slices.IsSorted(ids) {
			t.Fatalf("%v: ring not sorted: %v", s.phase, ids)
		}
	}
}

func TestJoinRelayEndsAfterItsEndIsGossiped(t *testing.T) {
	s := inPhase(t, Relaying)
	if r := s.Route(); !r.Serve || !r.InRing || r.Relay != RelayOwn {
		t.Fatalf("relaying route = %+v", r)
	}
	if rs := s.Rings(); !slices.Equal(rs.Ring, []string{"a", "b"}) || !slices.Equal(rs.Relay, []string{"b"}) {
		t.Fatalf("rings = %+v, want [a b] relay [b]", rs)
	}
	s, acts := run(t, s, Event{Kind: RelayTimer, Gen: s.relayGen})
	if s.Route().Relay != RelayOwn || len(acts) != 1 || acts[0].Flags != (Flags{Ready: true}) {
		t.Fatalf("at the timer: route %+v, acts %+v; want still relaying, announce ready only", s.Route(), acts)
	}
	// A flag update for something else does not end it.
	s, _ = run(t, s, Event{Kind: Announced, Flags: Flags{Ready: true, Relaying: true}})
	if s.phase != Relaying {
		t.Fatalf("ended on the wrong announcement: %v", s.phase)
	}
	s, acts = run(t, s, Event{Kind: Announced, Flags: Flags{Ready: true}})
	if s.phase != Serving || s.Route().Relay != RelayNone || !slices.Equal(kinds(acts), []string{"publish"}) {
		t.Fatalf("after the end is gossiped: %v %+v %v", s.phase, s.Route(), kinds(acts))
	}
}

func TestStaleRelayTimerAndSyncAreIgnored(t *testing.T) {
	s := inPhase(t, Relaying)
	old := s.relayGen
	s, _ = run(t, s, Event{Kind: Paused})
	oldSync := s.syncGen
	s, _ = run(t, s, Event{Kind: Paused}) // a second pause: a new sync
	if s2, acts := run(t, s, Event{Kind: Synced, Gen: oldSync}); s2.phase != Resyncing || len(acts) != 0 {
		t.Fatalf("a superseded sync made it ready: %v %v", s2.phase, kinds(acts))
	}
	s, _ = run(t, s, Event{Kind: Synced, Gen: s.syncGen})
	if s.phase != Relaying || s.relayGen == old {
		t.Fatalf("after the re-sync: %v gen %d (old %d)", s.phase, s.relayGen, old)
	}
	if s2, acts := run(t, s, Event{Kind: RelayTimer, Gen: old}); s2.ending || len(acts) != 0 {
		t.Fatalf("an earlier relay's timer ended the current one: %v", kinds(acts))
	}
}

func TestDrainingPeerCutsJoinRelay(t *testing.T) {
	s := inPhase(t, Relaying)
	peers := []Member{{ID: "b", Flags: Flags{Ready: true, Draining: true}}}
	s, acts := run(t, s, Event{Kind: MembersChanged, Members: peers})
	// Switch first, then tell the peers.
	if s.phase != Serving || !slices.Equal(kinds(acts), []string{"publish", "publish", "announce"}) {
		t.Fatalf("cut: %v %v", s.phase, kinds(acts))
	}
	if r := s.Route(); !r.InRing || r.Relay != RelayNone {
		t.Fatalf("cut route %+v", r)
	}
}

func TestNoRelayWithoutSettledPeers(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg     Config
		members []Member
	}{
		"first node":         {cfg, nil},
		"peers not ready":    {cfg, []Member{{ID: "b"}}},
		"peers relaying":     {cfg, []Member{{ID: "b", Flags: Flags{Ready: true, Relaying: true}}}},
		"a peer draining":    {cfg, []Member{{ID: "b", Flags: Flags{Ready: true}}, {ID: "c", Flags: Flags{Ready: true, Draining: true}}}},
		"relay off":          {Config{Self: "a", Replicated: true}, settledB},
		"without replicas":   {Config{Self: "a", JoinRelay: time.Second}, settledB},
		"only self reported": {cfg, []Member{{ID: "a", Flags: Flags{Ready: true}}}},
	} {
		t.Run(name, func(t *testing.T) {
			s, _ := New(tc.cfg, t0)
			s, _ = run(t, s, Event{Kind: MembersChanged, Members: tc.members}, Event{Kind: Joined})
			s, acts := run(t, s, Event{Kind: Synced, Gen: s.syncGen})
			// Not in its own ring until its readiness is gossiped.
			if s.phase != Serving || s.Route().InRing || !s.Route().Serve || !slices.Equal(kinds(acts), []string{"publish", "announce"}) {
				t.Fatalf("%v %+v %v", s.phase, s.Route(), kinds(acts))
			}
			s, acts = run(t, s, Event{Kind: Announced, Flags: Flags{Ready: true}})
			if !s.Route().InRing || !slices.Equal(kinds(acts), []string{"publish"}) {
				t.Fatalf("after the announcement: %+v %v", s.Route(), kinds(acts))
			}
		})
	}
}

func TestDrainFromJoinRelayRelaysEverything(t *testing.T) {
	s := inPhase(t, Relaying)
	s, acts := run(t, s, Event{Kind: DrainRequested})
	if r := s.Route(); r.Relay != RelayAll || !r.Departing || !r.Serve {
		t.Fatalf("route %+v", r)
	}
	if acts[1].Flags != (Flags{Ready: true, Draining: true}) {
		t.Fatalf("announces %+v", acts[1].Flags)
	}
	if rs := s.Rings(); !slices.Equal(rs.Targets, []string{"b"}) || !slices.Equal(rs.Relay, []string{"b"}) || rs.Behind != nil {
		t.Fatalf("rings %+v", rs)
	}
}

func TestDrainPushesOnlyOnceGossiped(t *testing.T) {
	s := inPhase(t, Serving)
	s, _ = run(t, s, Event{Kind: DrainRequested})
	if r := s.Route(); r.Relay != RelayNone || !r.InRing {
		t.Fatalf("a draining node decides its keys until its push is done: %+v", r)
	}
	s, acts := run(t, s, Event{Kind: Announced, Flags: Flags{Ready: true}}) // an older announcement
	if len(acts) != 0 {
		t.Fatalf("pushed before the drain was gossiped: %v", kinds(acts))
	}
	s, acts = run(t, s, current(s, Announced))
	if !slices.Equal(kinds(acts), []string{"push-all"}) {
		t.Fatalf("%v", kinds(acts))
	}
	if _, acts = run(t, s, current(s, Announced)); len(acts) != 0 {
		t.Fatalf("pushed twice: %v", kinds(acts))
	}
	s, _ = run(t, s, Event{Kind: Pushed})
	if r := s.Route(); s.phase != Leaving || r.Relay != RelayAll {
		t.Fatalf("%v %+v", s.phase, r)
	}
}

// A joining node relays its keys to where the peers that have not seen it
// send them (the ring without it); a key that leads to a peer in its own
// join relay goes where that peer relays it (the ring without the relaying
// peers, Behind).
func TestRelayRingsFollowPeers(t *testing.T) {
	members := []Member{{ID: "b", Flags: Flags{Ready: true}}, {ID: "c", Flags: Flags{Ready: true}}}
	s, _ := New(cfg, t0)
	s, _ = run(t, s, Event{Kind: MembersChanged, Members: members}, Event{Kind: Joined})
	s, _ = run(t, s, Event{Kind: Synced, Gen: s.syncGen})
	// d joins and relays too; e is not ready yet.
	s, _ = run(t, s, Event{Kind: MembersChanged, Members: append(slices.Clone(members),
		Member{ID: "d", Flags: Flags{Ready: true, Relaying: true}}, Member{ID: "e"})})
	rs := s.Rings()
	want := RingIDs{Ring: []string{"a", "b", "c", "d"}, Targets: []string{"a", "b", "c", "d"},
		Relay: []string{"b", "c", "d"}, Behind: []string{"b", "c"}, Relaying: []string{"d"}}
	if fmt.Sprint(rs) != fmt.Sprint(want) {
		t.Fatalf("rings %+v, want %+v", rs, want)
	}
	// d's relay ends, c drains (which also ends this node's relay).
	s, _ = run(t, s, Event{Kind: MembersChanged, Members: []Member{members[0],
		{ID: "c", Flags: Flags{Ready: true, Draining: true}}, {ID: "d", Flags: Flags{Ready: true}}}})
	if rs := s.Rings(); s.Route().Relay != RelayNone || !slices.Equal(rs.Relay, rs.Ring) || rs.Behind != nil {
		t.Fatalf("after the cut: %+v %+v", s.Route(), rs)
	}
}

func TestConflictRefusesToServe(t *testing.T) {
	s := inPhase(t, Syncing)
	s, acts := run(t, s, current(s, Conflict))
	if s.phase != Left || s.Route() != (Route{}) || acts[len(acts)-1].Kind != Fail {
		t.Fatalf("%v %+v %v", s.phase, s.Route(), kinds(acts))
	}
	// Nothing brings it back.
	for k := range numEvents {
		if s2, _ := run(t, s, current(s, k)); s2.phase != Left || s2.Route().Serve {
			t.Fatalf("%v revived it: %v", k, s2.phase)
		}
	}
}

// A node that loads its saved counters joins meanwhile, and syncs once both
// are done, whichever ends first.
func TestLoadThenSync(t *testing.T) {
	lc := Config{Self: "a", JoinRelay: time.Second, Replicated: true, Load: true}
	s, acts := New(lc, t0)
	if p, _ := s.Phase(); p != Loading || !slices.Equal(kinds(acts), []string{"load"}) {
		t.Fatalf("start: %v %v", p, kinds(acts))
	}
	joinedFirst, acts := run(t, s, Event{Kind: Joined}, Event{Kind: Loaded})
	if joinedFirst.phase != Syncing || !slices.Equal(kinds(acts), []string{"start-sync"}) {
		t.Fatalf("joined, then loaded: %v %v", joinedFirst.phase, kinds(acts))
	}
	loadedFirst, _ := run(t, s, Event{Kind: Loaded}, Event{Kind: Joined})
	if loadedFirst.phase != Syncing {
		t.Fatalf("loaded, then joined: %v", loadedFirst.phase)
	}
	if s, acts := New(cfg, t0); s.phase != Joining || len(acts) != 0 {
		t.Fatalf("without Load: %v %v", s.phase, kinds(acts))
	}
}

// A ready node that finds another live process with its identity counting
// over it drains, so its counts reach their holders, and fails once it has
// left.
func TestConflictWhileServingDrainsThenFails(t *testing.T) {
	s := inPhase(t, Serving)
	s, acts := run(t, s, Event{Kind: Conflict})
	if s.phase != Draining || !slices.Equal(kinds(acts), []string{"publish", "announce"}) {
		t.Fatalf("%v %v", s.phase, kinds(acts))
	}
	s, _ = run(t, s, current(s, Announced), Event{Kind: Pushed})
	s, acts = run(t, s, Event{Kind: LeaveDone})
	if s.phase != Left || !slices.Equal(kinds(acts), []string{"fail"}) {
		t.Fatalf("%v %v", s.phase, kinds(acts))
	}
}

// A pause while draining: the node's counters may be stale, so it stops
// deciding (its keys go to their new owners) while its push goes on.
func TestPauseWhileDrainingStopsDeciding(t *testing.T) {
	s := inPhase(t, Draining)
	s, _ = run(t, s, Event{Kind: Paused})
	if r := s.Route(); r.Serve || r.Relay != RelayAll || s.phase != Draining {
		t.Fatalf("%v %+v", s.phase, r)
	}
	if _, acts := run(t, s, current(s, Announced)); !slices.Equal(kinds(acts), []string{"push-all"}) {
		t.Fatalf("the push does not go on: %v", kinds(acts))
	}
}

func TestPhaseSince(t *testing.T) {
	s, _ := New(cfg, t0)
	s, _ = Step(s, Event{Kind: Joined}, t0.Add(time.Second))
	if p, since := s.Phase(); p != Syncing || !since.Equal(t0.Add(time.Second)) {
		t.Fatalf("%v since %v", p, since)
	}
	if !strings.HasPrefix(Phase(200).String(), "phase(") || EventKind(200).String() != "event?" || ActionKind(200).String() != "action?" {
		t.Fatal("names of unknown values")
	}
}

// FuzzStep drives the machine with arbitrary events and checks the
// invariants after each.
func FuzzStep(f *testing.F) {
	f.Add([]byte{1, 2, 0, 4, 5, 5, 6, 5, 7, 8})
	f.Add([]byte{0x10, 1, 2, 3, 2, 0x31, 4, 6})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, _ := New(cfg, t0)
		ids := []string{"a", "b", "c", "d"}
		for i, x := range b {
			ev := Event{Kind: EventKind(x % byte(numEvents))}
			arg := x / byte(numEvents)
			switch ev.Kind {
			case MembersChanged:
				for j, id := range ids {
					f := arg >> (2 * (j % 3))
					if f&3 != 0 {
						ev.Members = append(ev.Members, Member{ID: id, Flags: Flags{Ready: f&1 != 0, Relaying: f&3 == 3, Draining: f&2 != 0 && f&1 == 0}})
					}
				}
			case Synced, Conflict:
				ev.Gen = s.syncGen - uint64(arg%2)
			case RelayTimer:
				ev.Gen = s.relayGen - uint64(arg%2)
			case Announced:
				ev.Flags = s.want
				if arg%3 == 1 {
					ev.Flags = Flags{Ready: true}
				}
			}
			s, _ = Step(s, ev, t0.Add(time.Duration(i)*time.Millisecond))
			checkInvariants(t, s)
		}
	})
}
