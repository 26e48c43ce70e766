package cluster

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// Limits of one Decide batch, checked by the owner and, per op, by the
// entry node before it forwards.
const (
	peerMaxOps    = 4096    // ops per DecideRequest
	peerMaxKeyLen = 8 << 10 // bytes per key
)

// errPeerInvalid marks a request the owner refuses as a whole.
var errPeerInvalid = errors.New("cluster: invalid peer request")

// Register registers the Peer service (Decide and Ping) on s, next to the
// rate limit service. Decide applies ops to the forwarder's Local store
// with its Clock.
func (f *Forwarder) Register(s *grpc.Server) {
	peerpb.RegisterPeerServer(s, &peerServer{f: f})
}

// peerServer is the owner side of the Peer protocol.
type peerServer struct {
	peerpb.UnimplementedPeerServer
	f *Forwarder
}

// Decide validates the whole batch first, so a bad batch applies nothing,
// then applies every op at one reading of the owner's clock.
func (s *peerServer) Decide(ctx context.Context, req *peerpb.DecideRequest) (*peerpb.DecideResponse, error) {
	ops := req.GetOps()
	if err := peerValidateBatch(ops); err != nil {
		return nil, peerStatus(err)
	}
	if err := ctx.Err(); err != nil {
		// The sender has given up and decided these ops itself.
		return nil, peerStatus(err)
	}
	now := s.f.clock()
	results := make([]peerpb.Result, len(ops))
	out := &peerpb.DecideResponse{Results: make([]*peerpb.Result, len(ops))}
	for i, o := range ops {
		op := peerOpFromPB(o)
		r := s.f.local.Apply(now, &op)
		pr := &results[i]
		pr.Over = r.Over
		pr.Count = r.Count
		pr.Remaining = r.Remaining
		pr.ResetAfterNs = r.ResetAfter
		out.Results[i] = pr
	}
	return out, nil
}

// Ping answers with this node's ID.
func (s *peerServer) Ping(ctx context.Context, _ *peerpb.PingRequest) (*peerpb.PingResponse, error) {
	return &peerpb.PingResponse{Id: s.f.self}, nil
}

// peerOpFromPB converts a validated wire op. The key aliases the request.
func peerOpFromPB(o *peerpb.Op) bucket.Op {
	return bucket.Op{
		Key: o.GetKey(),
		Limit: bucket.Limit{
			Algorithm: bucket.Algorithm(o.GetAlgorithm()),
			Requests:  o.GetRequests(),
			Unit:      o.GetUnitNs(),
		},
		Hits: o.GetHits(),
		Mode: bucket.Mode(o.GetMode()),
	}
}

// peerValidateBatch checks every op of a Decide request.
func peerValidateBatch(ops []*peerpb.Op) error {
	if len(ops) > peerMaxOps {
		return fmt.Errorf("%w: %d ops, more than %d", errPeerInvalid, len(ops), peerMaxOps)
	}
	for i, o := range ops {
		if o == nil {
			return fmt.Errorf("%w: op %d: missing", errPeerInvalid, i)
		}
		// Range-check the wire integers before narrowing them.
		if o.GetAlgorithm() > 0xff {
			return fmt.Errorf("%w: op %d: unknown algorithm %d", errPeerInvalid, i, o.GetAlgorithm())
		}
		if o.GetMode() > 0xff {
			return fmt.Errorf("%w: op %d: unknown mode %d", errPeerInvalid, i, o.GetMode())
		}
		op := peerOpFromPB(o)
		if err := peerValidateOp(&op); err != nil {
			return fmt.Errorf("%w: op %d: %w", errPeerInvalid, i, err)
		}
	}
	return nil
}

// peerValidateOp checks one op as the owner will. It allocates only when
// the op is invalid.
func peerValidateOp(op *bucket.Op) error {
	switch {
	case len(op.Key) == 0:
		return errors.New("cluster: empty key")
	case len(op.Key) > peerMaxKeyLen:
		return fmt.Errorf("cluster: key is %d bytes, more than %d", len(op.Key), peerMaxKeyLen)
	case op.Mode > bucket.Peek:
		return fmt.Errorf("cluster: unknown mode %d", op.Mode)
	}
	return op.Limit.Validate()
}

// peerStatus maps the server's errors to gRPC status errors: the one place
// where the Peer service chooses codes.
func peerStatus(err error) error {
	switch {
	case errors.Is(err, errPeerInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
