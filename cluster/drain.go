package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/ringlimit/ringlimit/cluster/lifecycle"
)

// drainState is a graceful stop in progress: the first Drain's context,
// what its steps failed with, and a channel closed when it has ended.
type drainState struct {
	ctx  context.Context
	errs []error
	done chan struct{}
	once bool // done is closed
}

// drainLeaseTimeout bounds how long a drain waits for the owners to take
// back the quota this node's leases did not use.
const drainLeaseTimeout = time.Second

// Drain hands this node's counters off before it leaves (the lifecycle's
// draining, leaving and left phases): it gives back the unused quota of its
// leases and stops asking for more, gossips the drain and stops
// replicating to itself, pushes every live key to its holders on the ring
// without it, then relays every op it is still sent to the key's new owner,
// ships the writes made since the push, announces a graceful leave and
// ships what was written meanwhile. The node is no longer Ready once Drain
// starts. ctx bounds the whole drain; the leave gets at least half of what
// remains after the push. A second Drain waits for the first. Close must
// still be called.
func (n *Node) Drain(ctx context.Context) error {
	n.mu.Lock()
	d := n.drain
	first := d == nil
	if first {
		d = &drainState{ctx: ctx, done: make(chan struct{})}
		n.drain = d
	}
	n.mu.Unlock()
	if first {
		// The quota leased here goes back to the keys' owners first, and
		// this node asks for no more: its hits are decided by the owners.
		rctx, cancel := context.WithTimeout(ctx, drainLeaseTimeout)
		n.fwd.ReturnLeases(rctx)
		cancel()
		n.post(event{Event: lifecycle.Event{Kind: lifecycle.DrainRequested}})
	}
	select {
	case <-d.done:
	case <-ctx.Done():
		return ctx.Err()
	case <-n.ctx.Done():
		return errors.New("cluster: drain: node closed")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return errors.Join(d.errs...)
}

// drainCtx is the context the drain's steps run under: the first Drain's,
// or selfDrainTimeout when the node leaves on its own (another process
// holds its identity); either ends when the node closes.
func (n *Node) drainCtx() (context.Context, context.CancelFunc) {
	n.mu.Lock()
	d := n.drain
	n.mu.Unlock()
	var (
		ctx    context.Context
		cancel context.CancelFunc
	)
	if d != nil {
		ctx, cancel = context.WithCancel(d.ctx)
	} else {
		ctx, cancel = context.WithTimeout(context.Background(), selfDrainTimeout)
	}
	stop := context.AfterFunc(n.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// selfDrainTimeout bounds a drain no caller asked for.
const selfDrainTimeout = 10 * time.Second

// drainErr records a failed step of the drain.
func (n *Node) drainErr(err error) {
	if err == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.drain != nil {
		n.drain.errs = append(n.drain.errs, err)
	}
}

// drained ends the wait of Drain.
func (n *Node) drained() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if d := n.drain; d != nil && !d.once {
		d.once = true
		close(d.done)
	}
}

// pushAll carries out lifecycle.PushAll: every live key goes to its holders
// on the ring without this node. Until the lifecycle steps Pushed the node
// keeps deciding its keys (unless it was re-syncing after a freeze).
func (n *Node) pushAll() {
	ctx, cancel := n.drainCtx()
	defer cancel()
	start := n.clock.Now()
	pushed, err := n.repl.Drain(ctx, n.view.Load().targets)
	n.log.Info("cluster: drain: handed off counters", "pushed", pushed, "took", n.clock.Now().Sub(start), "err", err)
	n.drainErr(err)
	n.post(event{Event: lifecycle.Event{Kind: lifecycle.Pushed}})
}

// leave carries out lifecycle.Leave: it ships the writes made since the
// push (the node relays by now), announces the leave, with at least half of
// what the drain has left, and ships what was written meanwhile.
func (n *Node) leave() {
	ctx, cancel := n.drainCtx()
	defer cancel()
	_ = n.repl.Flush(ctx) // undelivered writes are reported by the flush below
	wait := time.Second
	if dl, ok := ctx.Deadline(); ok {
		wait = max(dl.Sub(n.clock.Now())/2, time.Millisecond)
	}
	if n.hooks.beforeLeave != nil {
		n.hooks.beforeLeave()
	}
	n.drainErr(n.m.Leave(wait))
	n.drainErr(n.repl.Flush(ctx))
	n.post(event{Event: lifecycle.Event{Kind: lifecycle.LeaveDone}})
}
