package replication

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/ring"
)

// Handoff moves counters to the nodes that hold them after a ring change:
// it pushes each live key whose replica set (its first Replicas successors)
// differs between the ring last handed off for and the current one to
// every member of the new set but this node. Every node that holds a key
// does so, which over-sends; Merge is idempotent, so that costs bandwidth
// only. A graceful leave (Drain) pushes every key to its replica set on
// the ring without this node.

// Handoff pushes every live key whose replica set differs between old and
// cur to its replica set on cur, minus this node, and only to the peers in
// only when it is not nil. It returns how many entries reached a peer and
// the peers it could not reach, with an error naming them; a handoff that
// missed a peer counts as failed (ringlimit_handoff_failures_total) unless
// ctx ended.
func (r *Replicator) Handoff(ctx context.Context, old, cur *ring.Ring, only map[string]error) (int, map[string]error, error) {
	p := r.newPusher(ctx, r.m.handoff.WithLabelValues("ring_change"))
	var was, is []string
	r.store.Range(r.now(), func(key []byte, st bucket.State) bool {
		was = old.Successors(key, r.replicas, was[:0])
		is = cur.Successors(key, r.replicas, is[:0])
		if sameSet(was, is) {
			return true
		}
		for _, d := range is {
			if _, retry := only[d]; d != r.self && (only == nil || retry) {
				p.add(d, key, st)
			}
		}
		return ctx.Err() == nil
	})
	pushed, err := p.flush()
	if len(p.failed) > 0 && ctx.Err() == nil {
		r.m.handoffFailures.Inc()
	}
	return pushed, p.failed, err
}

// Drain pushes every live key to its replica set on targets (the ring
// without this node), minus this node. It returns how many entries reached
// a peer and an error naming the peers it could not reach.
func (r *Replicator) Drain(ctx context.Context, targets *ring.Ring) (int, error) {
	p := r.newPusher(ctx, r.m.handoff.WithLabelValues("drain"))
	var dst []string
	r.store.Range(r.now(), func(key []byte, st bucket.State) bool {
		dst = targets.Successors(key, r.replicas, dst[:0])
		for _, d := range dst {
			if d != r.self {
				p.add(d, key, st)
			}
		}
		return ctx.Err() == nil
	})
	return p.flush()
}

// pusher sends entries to several peers in full batches, synchronously, as
// they are added. A peer that fails once is skipped for the rest of the
// push. Not safe for concurrent use.
type pusher struct {
	r       *Replicator
	ctx     context.Context
	count   prometheus.Counter
	batches map[string]*entryBatch
	failed  map[string]error
	pushed  int
}

func (r *Replicator) newPusher(ctx context.Context, count prometheus.Counter) *pusher {
	return &pusher{r: r, ctx: ctx, count: count, batches: map[string]*entryBatch{}, failed: map[string]error{}}
}

// add queues a copy of (key, st) for peer d, sending d's batch when full.
func (p *pusher) add(d string, key []byte, st bucket.State) {
	if p.failed[d] != nil {
		return
	}
	b := p.batches[d]
	if b == nil {
		b = &entryBatch{}
		p.batches[d] = b
	}
	b.add(key, st)
	if b.full() {
		p.send(d, b)
	}
}

func (p *pusher) send(d string, b *entryBatch) {
	c := p.r.conns.Client(d)
	if c == nil {
		b.reset()
		p.failed[d] = errNoClient
		return
	}
	n := b.len()
	if err := b.send(p.ctx, c, p.r.self); err != nil {
		if status.Code(err) == codes.InvalidArgument {
			// Refused as invalid (a peer of another version): sent again
			// it would be refused again. Counted like replication's.
			p.r.m.drop[dropRefused].Add(float64(n))
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
