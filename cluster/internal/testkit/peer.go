package testkit

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/wire"
)

// ReplicaPeer is a peerpb.PeerClient that records Replicate calls, fails
// the first FailFirst of them, and fails every call while it is down. It
// has no ReplicateStream (a peer of an older version), so senders fall
// back to Replicate calls. Its other methods are not implemented.
type ReplicaPeer struct {
	peerpb.PeerClient // nil: only Replicate is used

	mu        sync.Mutex
	failFirst int
	down      bool
	calls     int
	got       map[string]bucket.State
}

// NewReplicaPeer returns a peer that fails its first failFirst calls and,
// if down, every call until SetDown(false).
func NewReplicaPeer(failFirst int, down bool) *ReplicaPeer {
	return &ReplicaPeer{failFirst: failFirst, down: down, got: map[string]bucket.State{}}
}

func (p *ReplicaPeer) Replicate(ctx context.Context, req *peerpb.ReplicateRequest, _ ...grpc.CallOption) (*peerpb.ReplicateResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.calls <= p.failFirst || p.down {
		return nil, status.Error(codes.Unavailable, "down")
	}
	for _, e := range req.GetEntries() {
		p.got[string(e.GetKey())] = bucket.MaxState(p.got[string(e.GetKey())], wire.EntryState(e))
	}
	return &peerpb.ReplicateResponse{Merged: uint32(len(req.GetEntries()))}, nil
}

// ReplicateStream answers as a node without it would: the sender then
// sends Replicate calls.
func (p *ReplicaPeer) ReplicateStream(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[peerpb.ReplicateRequest, peerpb.ReplicateResponse], error) {
	return nil, status.Error(codes.Unimplemented, "no ReplicateStream")
}

// SetDown makes every call fail (true) or not.
func (p *ReplicaPeer) SetDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
}

// State returns the state p holds for key and how many calls it took.
func (p *ReplicaPeer) State(key string) (bucket.State, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got[key], p.calls
}
