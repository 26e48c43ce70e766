package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/ring"
)

// Handoff moves counters to the nodes that hold them after a ring change.
// After every change the handoff goroutine scans this node's store and
// pushes each live key whose replica set (its first `replicas` successors)
// differs between the ring it last handed off for and the current one to
// every member of the new set but itself. Every node that holds a key does
// so, which over-sends; Merge is idempotent, so that costs bandwidth only.
// A graceful leave (Drain) pushes every key to its replica set on the ring
// without this node.

// Backoff between handoffs that did not reach every peer.
const (
	handoffRetryMin = 500 * time.Millisecond
	handoffRetryMax = 30 * time.Second
)

// handoffLoop runs a handoff after each ring change, coalescing changes
// that arrive while one runs. A handoff that did not reach every peer is
// run again with backoff against the same old ring, for the peers that
// failed only while the ring stays as it was (for every peer once it has
// changed again), until one succeeds. Merging makes the repeats harmless.
// It returns when the node closes.
func (n *Node) handoffLoop() {
	defer n.wg.Done()
	last := n.view.Load().ring
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	var (
		fails   int
		failed  map[string]error // the peers the last handoff missed
		against *ring.Ring       // the ring that handoff ran for
	)
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.handoffKick:
		case <-retry.C:
		}
		cur := n.view.Load().ring
		if ringSameMembers(last, cur) {
			last, fails, failed = cur, 0, nil
			retry.Stop()
			continue
		}
		var only map[string]error
		if failed != nil && ringSameMembers(against, cur) {
			only = failed
		}
		start := time.Now()
		pushed, missed := n.handoff(n.ctx, last, cur, only)
		if n.ctx.Err() != nil {
			return
		}
		if len(missed) > 0 {
			fails++
			failed, against = missed, cur
			n.rm.handoffFailures.Inc()
			wait := min(handoffRetryMax, handoffRetryMin<<min(fails-1, 10))
			if fails == 1 || fails%10 == 0 {
				n.log.Warn("cluster: handoff incomplete; retrying", "pushed", pushed, "failures", fails, "retry_in", wait, "err", joinPeerErrs(missed))
			}
			retry.Reset(wait)
			continue
		}
		if fails > 0 || pushed > 0 {
			n.log.Info("cluster: handed off counters after a ring change", "pushed", pushed, "took", time.Since(start), "after_failures", fails)
		}
		last, fails, failed = cur, 0, nil
		retry.Stop()
	}
}

// handoff pushes every live key whose replica set differs between old and
// cur to its replica set on cur, minus this node, and only to the peers in
// only when it is not nil. It returns how many entries reached a peer and
// the peers it could not reach.
func (n *Node) handoff(ctx context.Context, old, cur *ring.Ring, only map[string]error) (int, map[string]error) {
	p := n.newPusher(ctx, n.rm.handoff.WithLabelValues("ring_change"))
	var was, is []string
	n.store.Range(n.clock(), func(key []byte, st bucket.State) bool {
		was = old.Successors(key, n.replicas, was[:0])
		is = cur.Successors(key, n.replicas, is[:0])
		if sameSet(was, is) {
			return true
		}
		for _, d := range is {
			if _, retry := only[d]; d != n.self && (only == nil || retry) {
				p.add(d, key, st)
			}
		}
		return ctx.Err() == nil
	})
	p.flush()
	return p.pushed, p.failed
}

// Drain hands this node's counters off before it leaves: it stops counting
// itself as a replica target, pushes every live key to its replica set on
// the ring without this node, then relays every op it is still sent to the
// key's new owner (Node.relaying) and ships the writes it made since
// the push, announces a graceful leave, and ships what was written
// meanwhile. The node is no longer Ready once Drain starts. ctx bounds the
// whole drain; the leave gets at least half of what remains after the push.
// Close must still be called.
func (n *Node) Drain(ctx context.Context) error {
	pushErr := n.handOff(ctx)
	leave := time.Second
	if dl, ok := ctx.Deadline(); ok {
		leave = max(time.Until(dl)/2, time.Millisecond)
	}
	leaveErr := n.m.Leave(leave)
	var flushErr error
	if n.repl != nil {
		flushErr = n.repl.flush(ctx)
	}
	return errors.Join(pushErr, leaveErr, flushErr)
}

// handOff is Drain up to the leave: the node stops counting itself as a
// replica target, pushes every live key to its replica set on the ring
// without it, then relays what it is still sent (Node.relaying) and
// ships the writes made since the push. Until the push is done it keeps
// deciding its keys (unless it is re-syncing after a freeze).
func (n *Node) handOff(ctx context.Context) error {
	// A joining node that relays ends its relay when it sees the drain
	// (Node.joinCut): from then on it decides its keys, and this node
	// relays and pushes them to it.
	n.gossipDraining()
	n.draining.Store(true)
	n.rebuild()
	start := time.Now()
	targets := n.view.Load().targets
	p := n.newPusher(ctx, n.rm.handoff.WithLabelValues("drain"))
	var dst []string
	n.store.Range(n.clock(), func(key []byte, st bucket.State) bool {
		dst = targets.Successors(key, n.replicas, dst[:0])
		for _, d := range dst {
			if d != n.self {
				p.add(d, key, st)
			}
		}
		return ctx.Err() == nil
	})
	pushed, pushErr := p.flush()
	n.log.Info("cluster: drain: handed off counters", "pushed", pushed, "took", time.Since(start), "err", pushErr)
	// From now on the new owners decide this node's keys: ops still sent
	// here (by peers that have not seen the leave yet, or by Envoys) are
	// relayed to them, so that no key is counted on two nodes while the
	// leave spreads. The writes made since the push follow by replication.
	n.relaying.Store(true)
	if n.repl != nil {
		_ = n.repl.flush(ctx) // its undelivered writes are reported by the flush below
	}
	return pushErr
}

// gossipDraining adds the draining flag to what this node gossips. It holds
// readyMu, as every change of the flags does, so that it keeps the ready
// and relaying flags a concurrent change sets.
func (n *Node) gossipDraining() {
	n.readyMu.Lock()
	defer n.readyMu.Unlock()
	f := n.m.Flags()
	f.Draining = true
	if err := n.m.SetFlags(f); err != nil {
		n.log.Debug("cluster: drain: gossiping the drain", "err", err)
	}
}

// pusher sends entries to several peers in full batches, synchronously, as
// they are added. A peer that fails once is skipped for the rest of the
// push. Not safe for concurrent use.
type pusher struct {
	n       *Node
	ctx     context.Context
	count   prometheus.Counter
	batches map[string]*replBatch
	failed  map[string]error
	pushed  int
}

func (n *Node) newPusher(ctx context.Context, count prometheus.Counter) *pusher {
	return &pusher{n: n, ctx: ctx, count: count, batches: map[string]*replBatch{}, failed: map[string]error{}}
}

// add queues a copy of (key, st) for peer d, sending d's batch when full.
func (p *pusher) add(d string, key []byte, st bucket.State) {
	if p.failed[d] != nil {
		return
	}
	b := p.batches[d]
	if b == nil {
		b = &replBatch{}
		p.batches[d] = b
	}
	b.add(key, st)
	if b.full() {
		p.send(d, b)
	}
}

func (p *pusher) send(d string, b *replBatch) {
	c := p.n.conns.Client(d)
	if c == nil {
		b.reset()
		p.failed[d] = errReplNoClient
		return
	}
	n := b.len()
	if err := b.send(p.ctx, c, p.n.self); err != nil {
		if status.Code(err) == codes.InvalidArgument {
			// Refused as invalid (a peer of another version): sent again
			// it would be refused again. Counted like replication's.
			p.n.rm.drop[replDropRefused].Add(float64(n))
			return
		}
		p.failed[d] = err
		return
	}
	p.pushed += b.sent
	p.count.Add(float64(b.sent))
}

// flush sends what is left and reports the entries pushed and the peers
// that failed.
func (p *pusher) flush() (int, error) {
	for d, b := range p.batches {
		if b.len() > 0 && p.failed[d] == nil {
			p.send(d, b)
		}
	}
	return p.pushed, joinPeerErrs(p.failed)
}

// joinPeerErrs joins the errors of failed peers, each naming its peer, in
// peer order (nil when none failed).
func joinPeerErrs(failed map[string]error) error {
	var errs []error
	for _, d := range slices.Sorted(maps.Keys(failed)) {
		errs = append(errs, fmt.Errorf("peer %s: %w", d, failed[d]))
	}
	return errors.Join(errs...)
}

// sameSet reports whether a and b hold the same IDs (they are short and
// have no duplicates).
func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		found := false
		for _, y := range b {
			if x == y {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// ringSameMembers reports whether two rings place keys identically: rings
// built with one Config from the same members do.
func ringSameMembers(a, b *ring.Ring) bool {
	return a == b || slices.Equal(a.Members(), b.Members())
}
