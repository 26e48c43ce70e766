package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/membership"
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

// syncFromPeers pulls from every alive ready peer in parallel, each bounded
// by the node's SyncTimeout, and merges what arrives. It returns how many
// entries arrived and an error naming the peers that failed (the node goes
// ready anyway: what the others sent is the cluster's copy).
func (n *Node) syncFromPeers(ctx context.Context) (int, error) {
	var peers []membership.Member
	for _, m := range n.m.Alive() {
		if m.ID != n.self && m.Ready {
			peers = append(peers, m)
		}
	}
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
			k, err := n.syncFrom(ctx, p)
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

// syncFrom streams one peer's entries for this node and merges them.
func (n *Node) syncFrom(ctx context.Context, p membership.Member) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, n.syncTimeout)
	defer cancel()
	conn, err := grpc.NewClient(p.GRPCAddr, n.dialOpts...)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	// Not WaitForReady: a peer that refuses connections (it crashed and is
	// not declared dead yet) fails at once instead of holding up the sync.
	stream, err := peerpb.NewPeerClient(conn).Sync(ctx, &peerpb.SyncRequest{From: n.self, Replicas: uint32(n.replicas)})
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
		got += n.mergeEntries(resp.GetEntries())
		n.rm.syncMerged.Add(float64(len(resp.GetEntries())))
	}
}

// mergeEntries merges validated entries at one reading of the clock and
// returns how many changed a counter. Merged states are not recorded for
// replication: nothing ping-pongs.
func (n *Node) mergeEntries(entries []*peerpb.Entry) int {
	now := n.clock()
	merged := 0
	for _, e := range entries {
		if n.store.Merge(now, e.GetKey(), wire.EntryState(e)) {
			merged++
		}
	}
	n.rm.received.Add(float64(len(entries)))
	n.rm.merged.Add(float64(merged))
	return merged
}

// Replicate implements transport.StateService: a peer's writes, handoff
// or drain.
func (n *Node) Replicate(_ string, entries []*peerpb.Entry) int {
	return n.mergeEntries(entries)
}

// Sync implements transport.StateService: it streams the live entries whose replica
// set on this node's ring plus the caller includes the caller.
func (n *Node) Sync(req *peerpb.SyncRequest, stream grpc.ServerStreamingServer[peerpb.SyncResponse]) error {
	from := req.GetFrom()
	ids := n.view.Load().ring.Members()
	if !slices.Contains(ids, from) {
		ids = append(ids, from)
	}
	r, err := ring.New(ids, n.ringCfg)
	if err != nil {
		return fmt.Errorf("cluster: sync: ring with %q: %w", from, err)
	}
	reps := int(req.GetReplicas())
	ctx := stream.Context()
	var (
		b       replBatch
		dst     []string
		sendErr error
		sent    int
	)
	start := time.Now()
	n.store.Range(n.clock(), func(key []byte, st bucket.State) bool {
		dst = r.Successors(key, reps, dst[:0])
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
	n.log.Debug("cluster: served a sync", "to", from, "entries", sent, "took", time.Since(start), "err", sendErr)
	return sendErr
}
