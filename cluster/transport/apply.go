package transport

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
)

// Apply decides ops, writing results[i] for ops[i]; results must be at
// least as long as ops. now is the entry node's clock (Unix ns), used for
// the ops this node owns and for every fallback.
//
// Ops this node owns are applied directly. The others are queued to their
// owners' batchers and wait together at most the forwarder's Timeout and
// ctx. An op whose owner is unknown or suspect goes to the key's first
// healthy replica when Owners implements Holders (rerouted). An op with no
// reachable holder, or whose owner fails or is too slow, is decided by the
// local store instead (a fallback, counted by reason; from at least the
// owner's last answer when Local is an AnswerCache) and a failing or slow
// owner becomes suspect. A call whose deadline has passed before anything
// is forwarded is decided locally at once. Apply never fails: a down peer costs
// accuracy, not availability. An op the owner did answer after its waiter
// gave up is counted at both nodes.
//
// Ops of one call on the same key are applied in call order, so that
// results[i] is the count after ops[:i+1] (give or take other callers'
// ops): batches to one peer travel in parallel (up to fwdInflight in
// flight), so the ops from an op whose key is already forwarded in this
// call onwards are sent in a next round, once the previous round is
// answered, within the same wait.
//
// With leases on (ForwarderConfig.LeaseTTL), an op for a key another node
// owns is decided here when this node holds a lease on the key that covers
// it (lease.go), and a forwarded op asks its owner for one.
func (f *Forwarder) Apply(ctx context.Context, now int64, ops []bucket.Op, results []bucket.Result) {
	f.m.decisions.Add(float64(len(ops)))
	f.apply(ctx, now, ops, results, f.waitFor(ctx), false)
}

// apply is Apply with the forwarded ops' wait given; relayed marks them as
// relayed (peerpb.DecideRequest.Relayed), so that their receiver applies
// them even if it relays too. It decides ops in rounds (see Apply), all
// within wait and its deadline.
func (f *Forwarder) apply(ctx context.Context, now int64, ops []bucket.Op, results []bucket.Result, wait time.Duration, relayed bool) {
	results = results[:len(ops)]
	deadline := now + int64(wait)
	var begin time.Time // when the call began: the rounds share its wait
	if len(ops) > 1 {
		begin = f.clock.Now()
	}
	for off := 0; off < len(ops); {
		w := wait
		if off > 0 {
			w = wait - f.clock.Now().Sub(begin)
		}
		off += f.round(ctx, now, deadline, ops[off:], results[off:], w, relayed)
	}
}

// round decides ops up to (not including) the first whose key an earlier op
// of the round forwarded, and returns how many it decided: it waits for
// their answers at most wait, and forwards them with the call's deadline.
func (f *Forwarder) round(ctx context.Context, now, deadline int64, ops []bucket.Op, results []bucket.Result, wait time.Duration, relayed bool) int {
	var (
		req   *fwdRequest
		peers map[string]*peerClient
		late  bool // the caller has given up already: forward nothing
	)
	for i := range ops {
		op := &ops[i]
		if req != nil && req.forwards(op.Key) {
			// The same key's earlier op may still be on its way: this one
			// and the rest wait for the next round.
			f.wait(ctx, now, req, ops, results)
			return i
		}
		id, _, self := f.owners.Owner(op.Key)
		var p *peerClient
		if self || id == f.self {
			if f.serving() {
				results[i] = f.local.Apply(now, op)
				continue
			}
			// This node refuses Decide (it found it was frozen): its
			// count may be stale, and the key's next holder decides it,
			// as for a suspect owner; with nobody else, this node does.
			if peers == nil {
				peers = *f.peers.Load()
			}
			if p, _ = f.reroute(op.Key, peers); p == nil {
				results[i] = f.local.Apply(now, op)
				continue
			}
			f.m.rerouted.Inc()
		} else {
			if !relayed {
				if r, ok := f.leased(now, op); ok {
					results[i] = r
					continue
				}
			}
			if f.ac != nil {
				if r, over := f.ac.OverUntil(now, op); over {
					results[i] = r
					f.m.overLocal.Inc()
					continue
				}
			}
		}
		if peers == nil {
			peers = *f.peers.Load()
		}
		if p == nil {
			p = peers[id]
		}
		if p == nil || p.suspect.Load() {
			q, toSelf := f.reroute(op.Key, peers)
			switch {
			case toSelf:
				results[i] = f.applyInstead(now, op)
				f.m.rerouted.Inc()
				continue
			case q != nil:
				p = q
				f.m.rerouted.Inc()
			case p == nil:
				f.fallback(now, op, &results[i], f.m.fbUnknown)
				continue
			default:
				f.fallback(now, op, &results[i], f.m.fbSuspect)
				continue
			}
		}
		switch {
		case peerValidateOp(op) != nil:
			// The owner would refuse the whole batch this op lands in: the
			// local store decides it as it would decide its own keys.
			results[i] = f.local.Apply(now, op)
			continue
		}
		if late {
			f.fallback(now, op, &results[i], f.m.fbTimeout)
			continue
		}
		if req == nil {
			if wait <= 0 {
				// No owner can answer in time (a call read late, e.g. by a
				// process thawed after a freeze): decide locally, and do not
				// blame the owner for it.
				late = true
				f.fallback(now, op, &results[i], f.m.fbTimeout)
				continue
			}
			req = f.getRequest()
			req.deadline, req.wait, req.relayed = deadline, wait, relayed
		}
		it := req.add(i, p, op)
		it.now = now
		if !relayed && p.id == id { // the owner itself, not a stand-in
			it.want, it.slot = f.leaseWant(now, op)
		}
		if f.tracer != nil {
			f.startForward(ctx, it)
		}
		if ok, closed := p.enqueue(it); !ok {
			it.endForward(outcomeNotSent, bucket.Result{}, nil)
			f.leaseAnswered(it, nil)
			req.unadd()
			if closed {
				f.fallback(now, op, &results[i], f.m.fbUnknown)
				continue
			}
			p.markSuspect("queue full", nil)
			f.fallback(now, op, &results[i], f.m.fbError)
		}
	}
	if req != nil {
		f.wait(ctx, now, req, ops, results)
	}
	return len(ops)
}

// reroute finds where an op goes when its owner is suspect or unknown: the
// first holder after the owner that is this node (toSelf) or a peer that is
// not suspect (p). Both are zero when Owners does not implement Holders or
// no holder qualifies.
func (f *Forwarder) reroute(key []byte, peers map[string]*peerClient) (p *peerClient, toSelf bool) {
	h, ok := f.owners.(Holders)
	if !ok {
		return nil, false
	}
	for i := 1; ; i++ {
		id, self, ok := h.Holder(key, i)
		switch {
		case !ok:
			return nil, false
		case self || id == f.self:
			return nil, true
		}
		if q := peers[id]; q != nil && !q.suspect.Load() {
			return q, false
		}
	}
}

// wait collects the answers of req's forwarded ops, falling back for the
// ops still pending when the timeout or ctx ends the wait.
func (f *Forwarder) wait(ctx context.Context, now int64, req *fwdRequest, ops []bucket.Op, results []bucket.Result) {
	complete := req.pending.Add(-1) == 0 // drop the guard taken by getRequest
	timedOut := false
	if !complete && req.n > 0 {
		req.timer.Reset(req.wait)
		select {
		case <-req.done:
			complete = true
		case <-req.timer.C():
			timedOut = true
		case <-ctx.Done():
		}
		req.timer.Stop()
	}
	forwarded := 0
	ac := f.ac
	var late *peerClient // the last peer noted late: one note per peer per call
	for _, it := range req.items[:req.n] {
		i := it.index
		if !complete && it.state.CompareAndSwap(fwdPending, fwdAbandoned) {
			// ctx ending is the caller giving up, not the peer failing.
			if timedOut && it.peer != late {
				it.peer.noteFailure("timeout", nil)
				late = it.peer
			}
			it.endForward(outcomeTimeout, bucket.Result{}, nil)
			f.fallback(now, &ops[i], &results[i], f.m.fbTimeout)
			continue
		}
		if it.err != nil {
			// The RPC deadline is Timeout too: its expiry is a timeout.
			c := f.m.fbError
			if status.Code(it.err) == codes.DeadlineExceeded {
				c = f.m.fbTimeout
				if it.peer != late {
					it.peer.noteFailure("timeout", nil)
					late = it.peer
				}
			}
			it.endForward(outcomeError, bucket.Result{}, it.err)
			f.fallback(now, &ops[i], &results[i], c)
			continue
		}
		it.endForward(outcomeAnswered, it.res, nil)
		results[i] = it.res
		if ac != nil {
			r := it.res
			if it.leased > 0 {
				// The owner's count includes the quota it leased here.
				r.Count += it.leased
				r.Remaining -= min(r.Remaining, it.leased)
			}
			ac.Remember(now, &ops[i], r)
		}
		forwarded++
	}
	if forwarded > 0 {
		f.m.forwarded.Add(float64(forwarded))
	}
	if complete {
		// Every sender is done with req: it can be reused. A request with
		// abandoned items may still be touched by a sender; the GC takes it.
		req.release()
		f.reqs.Put(req)
	}
}

// fwdDeadlineMargin is kept free of the caller's deadline for the local
// fallback and the answer's way back.
const fwdDeadlineMargin = 3 * time.Millisecond

// fwdMaxWait caps how long a forwarded op waits, whatever the deadline;
// it is also how long a Decide exchange (a stream's answer, or a call) may
// take before the sender gives up on it.
const fwdMaxWait = 250 * time.Millisecond

// waitFor is how long forwarded ops may wait for their owner: until the
// caller's deadline less fwdDeadlineMargin (Envoy sends its 20 ms timeout as
// the gRPC deadline, so answers stay inside it), capped at fwdMaxWait; or
// Timeout when the caller set no deadline. A busy owner is then waited for
// as long as the caller allows instead of being counted around, which is
// what keeps counts exact on a loaded machine.
func (f *Forwarder) waitFor(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return f.timeout
	}
	return max(0, min(dl.Sub(f.clock.Now())-fwdDeadlineMargin, fwdMaxWait))
}

// fallback decides op locally and counts it under c.
func (f *Forwarder) fallback(now int64, op *bucket.Op, res *bucket.Result, c prometheus.Counter) {
	*res = f.applyInstead(now, op)
	c.Inc()
}

// applyInstead decides op with the local store for a key another node owns.
func (f *Forwarder) applyInstead(now int64, op *bucket.Op) bucket.Result {
	if f.ac != nil {
		return f.ac.ApplyInstead(now, op)
	}
	return f.local.Apply(now, op)
}

func (f *Forwarder) getRequest() *fwdRequest {
	r := f.reqs.Get().(*fwdRequest)
	r.n = 0
	r.pending.Store(1) // guard: no sender can complete r while Apply still adds to it
	return r
}
