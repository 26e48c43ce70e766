package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/wire"
	"github.com/ringlimit/ringlimit/ring"
)

// Sync: before a node declares itself ready (after it started and after a
// freeze) it asks every alive ready peer for the counters it should hold:
// those whose replica set on the peer's ring plus the caller includes the
// caller. It merges them, so it answers for its keys from the newest copy
// the cluster has. The peers' handoff, when they add it to their rings,
// brings the hits that landed in between.

// Peer is a node to sync from.
type Peer struct {
	ID       string // its ID, as the rings name it
	GRPCAddr string // where its Peer service answers
}

// Pull asks every peer in parallel for the counters this node should hold,
// each bounded by SyncTimeout, and merges what arrives. It returns how many
// entries arrived and an error naming the peers that failed (the node goes
// ready anyway: what the others sent is the cluster's copy). Unless ctx
// ended, the sync is counted, ok or partial, with its duration.
func (r *Replicator) Pull(ctx context.Context, peers []Peer) (int, error) {
	start := r.clock.Now()
	got, err := r.pull(ctx, peers)
	if ctx.Err() != nil {
		return got, err
	}
	r.m.syncDur.Observe(r.clock.Now().Sub(start).Seconds())
	result := "ok"
	if err != nil {
		result = "partial"
	}
	r.m.syncs.WithLabelValues(result).Inc()
	return got, err
}

// pull is Pull without the metrics.
func (r *Replicator) pull(ctx context.Context, peers []Peer) (int, error) {
	if len(peers) == 0 {
		return 0, nil
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		got  int
		errs []error
	)
	for _, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := r.pullFrom(ctx, p)
			mu.Lock()
			got += k
			if err != nil {
				errs = append(errs, fmt.Errorf("peer %s at %s: %w", p.ID, p.GRPCAddr, err))
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return got, errors.Join(errs...)
}

// pullFrom streams one peer's entries for this node and merges them.
func (r *Replicator) pullFrom(ctx context.Context, p Peer) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, r.syncTimeout)
	defer cancel()
	conn, err := grpc.NewClient(p.GRPCAddr, r.dialOpts...)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	// Not WaitForReady: a peer that refuses connections (it crashed and is
	// not declared dead yet) fails at once instead of holding up the sync.
	stream, err := peerpb.NewPeerClient(conn).Sync(ctx, &peerpb.SyncRequest{From: r.self, Replicas: uint32(r.replicas)})
	if err != nil {
		return 0, err
	}
	got := 0
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		if err := wire.ValidateEntries(resp.GetEntries()); err != nil {
			return got, err
		}
		got += r.merge(resp.GetEntries())
		r.m.syncMerged.Add(float64(len(resp.GetEntries())))
	}
}

// merge merges validated entries at one reading of the clock and returns
// how many changed a counter. Merged states are not recorded for
// replication: nothing ping-pongs.
func (r *Replicator) merge(entries []*peerpb.Entry) int {
	now := r.now()
	merged := 0
	for _, e := range entries {
		if r.rec.Merge(now, e.GetKey(), wire.EntryState(e)) {
			merged++
		}
	}
	r.m.received.Add(float64(len(entries)))
	r.m.merged.Add(float64(merged))
	return merged
}

// Replicate merges a peer's validated entries (its writes, a handoff or a
// drain) and returns how many changed a counter: with Sync it serves
// transport.StateService.
func (r *Replicator) Replicate(_ string, entries []*peerpb.Entry) int {
	return r.merge(entries)
}

// Sync streams the live entries whose replica set on this node's ring plus
// the caller includes the caller (a validated request).
func (r *Replicator) Sync(req *peerpb.SyncRequest, stream grpc.ServerStreamingServer[peerpb.SyncResponse]) error {
	from := req.GetFrom()
	ids := r.ring().Members()
	if !slices.Contains(ids, from) {
		ids = append(ids, from)
	}
	rg, err := ring.New(ids, r.ringCfg)
	if err != nil {
		return fmt.Errorf("replication: sync: ring with %q: %w", from, err)
	}
	reps := int(req.GetReplicas())
	ctx := stream.Context()
	var (
		b       entryBatch
		dst     []string
		sendErr error
		sent    int
	)
	start := r.clock.Now()
	r.store.Range(r.now(), func(key []byte, st bucket.State) bool {
		dst = rg.Successors(key, reps, dst[:0])
		if !slices.Contains(dst, from) {
			return ctx.Err() == nil
		}
		b.add(key, st)
		if b.full() {
			sent += b.len()
			sendErr = stream.Send(&peerpb.SyncResponse{Entries: b.entries()})
			b.reset()
		}
		return sendErr == nil && ctx.Err() == nil
	})
	if sendErr == nil && b.len() > 0 {
		sent += b.len()
		sendErr = stream.Send(&peerpb.SyncResponse{Entries: b.entries()})
	}
	if sendErr == nil {
		sendErr = ctx.Err()
	}
	r.log.Debug("replication: served a sync", "to", from, "entries", sent, "took", r.clock.Now().Sub(start), "err", sendErr)
	return sendErr
}
