package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/cluster/lifecycle"
	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/replication"
)

// pauseGrace is how long after a detected pause failures of peers are not
// held against them: calls that waited through the freeze time out as it
// ends.
const pauseGrace = time.Second

// syncWorker carries out lifecycle.StartSync: it pulls the counters this
// node should hold from every ready peer, waits (at most a second) until
// the view its rings are built from has every ready peer the membership
// knows, checks that no other live process holds this node's identity,
// and reports Synced, or Conflict.
func (n *Node) syncWorker(gen uint64, why string) {
	start := n.clock.Now()
	got, err := n.repl.Pull(n.ctx, n.syncPeers())
	if n.ctx.Err() != nil {
		return
	}
	took := n.clock.Now().Sub(start)
	if err != nil {
		n.log.Warn("cluster: sync incomplete; going ready with what arrived", "why", why, "entries", got, "took", took, "err", err)
	} else {
		n.log.Info("cluster: synced counters from peers", "why", why, "entries", got, "took", took)
	}
	if n.hooks.afterPull != nil {
		n.hooks.afterPull()
	}
	n.awaitView(time.Second)
	kind := lifecycle.Synced
	if err := n.identityConflict(n.ctx, false); err != nil {
		n.mu.Lock()
		n.conflict = err
		n.mu.Unlock()
		kind = lifecycle.Conflict
	}
	n.post(event{Event: lifecycle.Event{Kind: kind, Gen: gen}})
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

// awaitView waits, at most d, until the view the rings are built from
// (which the membership delivers after a short settle delay) has every
// ready peer the membership knows: a node that went ready before then
// would put only itself in its ring, and find no settled peer to relay to.
func (n *Node) awaitView(d time.Duration) {
	deadline := n.clock.Now().Add(d)
	t := n.clock.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		want := map[string]bool{}
		for _, m := range n.m.Alive() {
			if m.ID != n.self && m.Ready {
				want[m.ID] = true
			}
		}
		for _, m := range n.view.Load().members {
			if m.Ready {
				delete(want, m.ID)
			}
		}
		if len(want) == 0 || n.clock.Now().After(deadline) {
			return
		}
		select {
		case <-n.ctx.Done():
			return
		case <-t.C():
		}
	}
}

// identityProbeTimeout bounds the Ping that tells whether another process
// with this node's identity is alive.
const identityProbeTimeout = 500 * time.Millisecond

// identityConflict returns an error naming the other live process that
// holds this node's identity and counts over this one, if one does. Before
// this node is ready: one that is ready, or that started before it (of two
// starting together, the later refuses). Once it is ready: one that is
// ready too and started after it (two that went ready together, each before
// it heard of the other; the membership counts the newer, so the older
// yields). A process announced at this node's own gRPC address is its
// predecessor on the same host, which is gone (this process holds the
// port); one that does not answer is gone too (a crashed pod not yet
// declared dead), so a pod restarted under its old name comes back at once.
func (n *Node) identityConflict(ctx context.Context, ready bool) error {
	self := n.m.Self()
	for _, m := range n.m.All() {
		if m.ID != n.self || m.Name == self.Name || m.State != membership.MemberAlive || m.GRPCAddr == self.GRPCAddr {
			continue
		}
		older := m.Started < self.Started || (m.Started == self.Started && m.Name < self.Name)
		if counts := (!ready && (m.Ready || older)) || (ready && m.Ready && !older); !counts {
			continue
		}
		if n.answers(ctx, m.GRPCAddr) {
			return fmt.Errorf("cluster: node name %q is held by another live member at %s (gossip %s): give every node its own --node-name", n.self, m.GRPCAddr, m.Addr)
		}
	}
	return nil
}

// answers reports whether a ringlimit process answers Ping at addr, or
// refuses it because it is not serving yet: either way it is alive.
func (n *Node) answers(ctx context.Context, addr string) bool {
	conn, err := grpc.NewClient(addr, n.fwd.DialOptions()...)
	if err != nil {
		return false
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, identityProbeTimeout)
	defer cancel()
	_, err = peerpb.NewPeerClient(conn).Ping(ctx, &peerpb.PingRequest{From: n.self})
	return err == nil || status.Code(err) == codes.FailedPrecondition
}

// checkIdentity runs identityConflict for a ready node, in a worker, when
// the membership shows another process under its identity, and reports a
// conflict to the lifecycle (which drains the node and fails it).
func (n *Node) checkIdentity() {
	n.work(func() {
		err := n.identityConflict(n.ctx, true)
		if err == nil {
			return
		}
		n.mu.Lock()
		n.conflict = err
		n.mu.Unlock()
		n.post(event{Event: lifecycle.Event{Kind: lifecycle.Conflict}})
	})
}

// fail carries out lifecycle.Fail: the process must stop (Fatal).
func (n *Node) fail() {
	n.mu.Lock()
	err := n.conflict
	n.mu.Unlock()
	if err == nil {
		err = errors.New("cluster: node refused to serve")
	}
	n.log.Error("cluster: refusing to serve", "err", err)
	select {
	case n.fatal <- err:
	default:
	}
}
