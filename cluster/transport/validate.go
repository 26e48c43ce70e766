package transport

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/wire"
)

// Limits of one Decide batch, checked by the owner and, per op, by the
// entry node before it forwards.
const (
	peerMaxOps    = 4096           // ops per DecideRequest
	peerMaxKeyLen = wire.MaxKeyLen // bytes per key
)

// Errors the peer server maps to gRPC codes in peerStatus.
var (
	// errPeerNotServing refuses Decide and Ping while the node re-syncs.
	errPeerNotServing = errors.New("transport: node is re-syncing its counters")
	// errPeerExpired skips a Decide batch read after its deadline.
	errPeerExpired = errors.New("transport: decide batch expired")
)

// peerOpFromPB converts a validated wire op. The key aliases the request.
func peerOpFromPB(o *peerpb.Op) bucket.Op {
	return bucket.Op{
		Key: o.GetKey(),
		Limit: bucket.Limit{
			Algorithm: bucket.Algorithm(o.GetAlgorithm()),
			Requests:  o.GetRequests(),
			Unit:      o.GetUnitNs(),
			Burst:     o.GetBurst(),
		},
		Hits: o.GetHits(),
		Mode: bucket.Mode(o.GetMode()),
	}
}

// peerValidateBatch checks every op of a Decide request.
func peerValidateBatch(ops []*peerpb.Op) error {
	if len(ops) > peerMaxOps {
		return fmt.Errorf("%w: %d ops, more than %d", wire.ErrInvalid, len(ops), peerMaxOps)
	}
	for i, o := range ops {
		if o == nil {
			return fmt.Errorf("%w: op %d: missing", wire.ErrInvalid, i)
		}
		// Range-check the wire integers before narrowing them.
		if o.GetAlgorithm() > 0xff {
			return fmt.Errorf("%w: op %d: unknown algorithm %d", wire.ErrInvalid, i, o.GetAlgorithm())
		}
		if o.GetMode() > 0xff {
			return fmt.Errorf("%w: op %d: unknown mode %d", wire.ErrInvalid, i, o.GetMode())
		}
		if n := len(o.GetTrace()); n != 0 && n != traceLen {
			return fmt.Errorf("%w: op %d: trace is %d bytes, want %d or none", wire.ErrInvalid, i, n, traceLen)
		}
		op := peerOpFromPB(o)
		if err := peerValidateOp(&op); err != nil {
			return fmt.Errorf("%w: op %d: %w", wire.ErrInvalid, i, err)
		}
	}
	return nil
}

// peerValidateOp checks one op as the owner will. It allocates only when
// the op is invalid.
func peerValidateOp(op *bucket.Op) error {
	switch {
	case len(op.Key) == 0:
		return errors.New("transport: empty key")
	case len(op.Key) > peerMaxKeyLen:
		return fmt.Errorf("transport: key is %d bytes, more than %d", len(op.Key), peerMaxKeyLen)
	case op.Mode > bucket.Peek:
		return fmt.Errorf("transport: unknown mode %d", op.Mode)
	}
	return op.Limit.Validate()
}

// releaseLimit is the limit of a leased op a release names.
func releaseLimit(r *peerpb.Release) bucket.Limit {
	return bucket.Limit{Algorithm: bucket.Algorithm(r.GetAlgorithm()), Requests: r.GetRequests(), Unit: r.GetUnitNs(), Burst: r.GetBurst()}
}

// peerValidateReleases checks every release of a Release request.
func peerValidateReleases(rs []*peerpb.Release) error {
	if len(rs) > peerMaxOps {
		return fmt.Errorf("%w: %d releases, more than %d", wire.ErrInvalid, len(rs), peerMaxOps)
	}
	for i, r := range rs {
		switch {
		case r == nil:
			return fmt.Errorf("%w: release %d: missing", wire.ErrInvalid, i)
		case r.GetAlgorithm() > 0xff:
			return fmt.Errorf("%w: release %d: unknown algorithm %d", wire.ErrInvalid, i, r.GetAlgorithm())
		case r.GetHits() == 0:
			return fmt.Errorf("%w: release %d: no hits", wire.ErrInvalid, i)
		}
		op := bucket.Op{Key: r.GetKey(), Limit: releaseLimit(r), Hits: r.GetHits()}
		if err := peerValidateOp(&op); err != nil {
			return fmt.Errorf("%w: release %d: %w", wire.ErrInvalid, i, err)
		}
	}
	return nil
}

// peerValidateSync checks a Sync request.
func peerValidateSync(req *peerpb.SyncRequest) error {
	from := req.GetFrom()
	switch {
	case from == "":
		return fmt.Errorf("%w: sync: empty from", wire.ErrInvalid)
	case len(from) > wire.MaxIDLen:
		return fmt.Errorf("%w: sync: from is %d bytes, more than %d", wire.ErrInvalid, len(from), wire.MaxIDLen)
	case !utf8.ValidString(from):
		return fmt.Errorf("%w: sync: from is not valid UTF-8", wire.ErrInvalid)
	case req.GetReplicas() < 1 || req.GetReplicas() > wire.MaxReplicas:
		return fmt.Errorf("%w: sync: replicas must be 1 to %d, got %d", wire.ErrInvalid, wire.MaxReplicas, req.GetReplicas())
	}
	return nil
}

// peerStatus maps the server's errors to gRPC status errors: the one place
// where the Peer service chooses codes.
func peerStatus(err error) error {
	switch {
	case errors.Is(err, wire.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, errPeerNotServing):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, errPeerExpired):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case status.Code(err) != codes.Unknown:
		return err // already a status (a failed stream send)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
