package cluster

import (
	"time"

	"github.com/ringlimit/ringlimit/cluster/lifecycle"
	"github.com/ringlimit/ringlimit/cluster/membership"
)

// The node's life is stepped by one goroutine (run): the pure
// lifecycle.Step decides, run carries out its actions. Whatever takes time
// (gossiping flags, a sync, the drain's push, the leave) runs in a goroutine
// of its own that reports back with an event, so that run never waits and
// every membership change reaches the rings at once.

// event is a lifecycle event with what the executor needs besides.
type event struct {
	lifecycle.Event
	alive    []membership.Member // MembersChanged: the membership's view
	endRelay bool                // tests: the current join relay's timer fires now
}

// post hands ev to run, unless the node is closing.
func (n *Node) post(ev event) {
	select {
	case n.events <- ev:
	case <-n.ctx.Done():
	}
}

// run carries out first, then steps the lifecycle with every event and
// carries out the actions, in order. It returns when the node closes.
func (n *Node) run(st lifecycle.State, first []lifecycle.Action) {
	defer n.wg.Done()
	var (
		alive   []membership.Member // the membership's last view
		relay   interface{ Stop() bool }
		checked string // the other process with this identity last checked
	)
	defer func() {
		if relay != nil {
			relay.Stop()
		}
	}()
	for _, a := range first {
		if a.Kind == lifecycle.Load {
			n.work(n.load)
		}
	}
	for {
		var ev event
		var pauses uint64
		select {
		case <-n.ctx.Done():
			return
		case ev = <-n.events:
		case <-n.pauseKick:
			pauses = n.pauses.Load()
			ev.Kind = lifecycle.Paused
		}
		if ev.endRelay {
			ev.Kind, ev.Gen = lifecycle.RelayTimer, st.RelayGen()
		}
		if ev.Kind == lifecycle.MembersChanged {
			alive = ev.alive
		}
		before, _ := st.Phase()
		var acts []lifecycle.Action
		st, acts = lifecycle.Step(st, ev.Event, n.clock.Now())
		after, _ := st.Phase()
		if after != before {
			n.log.Info("cluster: lifecycle", "from", before.String(), "to", after.String(), "on", ev.Kind.String())
		}
		for _, a := range acts {
			switch a.Kind {
			case lifecycle.Publish:
				n.publish(st, alive)
			case lifecycle.Announce:
				n.announce(a.Flags)
			case lifecycle.StartSync:
				why := "joined"
				if after == lifecycle.Resyncing {
					why = "paused"
				}
				n.work(func() { n.syncWorker(a.Gen, why) })
			case lifecycle.Forgive:
				n.fwd.Forgive(pauseGrace)
			case lifecycle.StartTimer:
				if relay != nil {
					relay.Stop()
				}
				gen := a.Gen
				relay = n.clock.AfterFunc(a.After, func() {
					n.post(event{Event: lifecycle.Event{Kind: lifecycle.RelayTimer, Gen: gen}})
				})
			case lifecycle.PushAll:
				n.work(n.pushAll)
			case lifecycle.Leave:
				n.work(n.leave)
			case lifecycle.Fail:
				n.fail()
			case lifecycle.Load:
				n.work(n.load)
			}
		}
		if ev.Kind == lifecycle.MembersChanged && (after == lifecycle.Relaying || after == lifecycle.Serving) {
			// Alive names one process per identity: when it names another
			// one for this node's, that one may be live (two started
			// together): check, once per process.
			for _, m := range alive {
				if m.ID == n.self && m.Name != n.m.Self().Name && m.Name != checked {
					checked = m.Name
					n.checkIdentity()
				}
			}
		}
		if v := n.view.Load(); v.phase != after {
			// A phase change that moved no ring (joining to syncing, say)
			// still shows in Status.
			cp := *v
			cp.phase, cp.since = st.Phase()
			n.view.Store(&cp)
		}
		if ev.Kind == lifecycle.Paused {
			// The pause is stepped and its route published: Serving may
			// answer again if the route says so.
			n.pausesSeen.Store(pauses)
		}
		if after == lifecycle.Left {
			// Left, or refused to serve: a Drain waits no longer.
			n.drained()
		}
	}
}

// load carries out lifecycle.Load.
func (n *Node) load() {
	start := n.clock.Now()
	if err := n.restore(n.ctx); err != nil {
		n.log.Warn("cluster: restoring saved counters failed; going on without them", "err", err)
	} else {
		n.log.Info("cluster: restored saved counters", "took", n.clock.Now().Sub(start))
	}
	n.post(event{Event: lifecycle.Event{Kind: lifecycle.Loaded}})
}

// work runs f in a goroutine the node owns.
func (n *Node) work(f func()) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		f()
	}()
}

// onChange hands the membership's view to the lifecycle. It runs on the
// membership's notifier goroutine.
func (n *Node) onChange(alive []membership.Member) {
	ev := event{Event: lifecycle.Event{Kind: lifecycle.MembersChanged}, alive: alive}
	for _, m := range alive {
		ev.Members = append(ev.Members, lifecycle.Member{ID: m.ID,
			Flags: lifecycle.Flags{Ready: m.Ready, Relaying: m.Relaying, Draining: m.Draining}})
	}
	n.post(ev)
}

// awaitJoin reports the join to the lifecycle once the membership has
// reached a peer (or was reached).
func (n *Node) awaitJoin() {
	defer n.wg.Done()
	t := n.clock.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !n.m.Joined() {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C():
		}
	}
	n.post(event{Event: lifecycle.Event{Kind: lifecycle.Joined}})
}

// announce has the announcer gossip f, replacing flags not yet gossiped.
func (n *Node) announce(f lifecycle.Flags) {
	n.wantFlags.Store(&membership.Flags{Ready: f.Ready, Relaying: f.Relaying, Draining: f.Draining})
	select {
	case n.announceKick <- struct{}{}:
	default:
	}
}

// announcer gossips the flags last asked for, waiting for each broadcast
// (at most about a second), and reports each as Announced, also when the
// membership refused it (after the leave), so that the lifecycle never
// waits for an announcement that cannot come. It returns when the node
// closes.
func (n *Node) announcer() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.announceKick:
		}
		f := *n.wantFlags.Load()
		if err := n.m.SetFlags(f); err != nil {
			n.log.Debug("cluster: gossiping lifecycle flags", "flags", f, "err", err)
		}
		n.post(event{Event: lifecycle.Event{Kind: lifecycle.Announced,
			Flags: lifecycle.Flags{Ready: f.Ready, Relaying: f.Relaying, Draining: f.Draining}}})
	}
}
