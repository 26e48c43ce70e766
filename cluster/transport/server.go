package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/wire"
)

// Register registers the Peer service on s, next to the rate limit
// service; s should be built with ServerOptions. Decide applies ops to f's
// Local store with its Clock; st serves Replicate, ReplicateStream and Sync
// (nil: they answer Unimplemented).
func Register(s *grpc.Server, f *Forwarder, st StateService) {
	peerpb.RegisterPeerServer(s, &peerServer{f: f, st: st})
}

// StateService serves the counter-state RPCs. Requests reach it validated
// (wire.ValidateEntries; a Sync request's caller and replica count).
type StateService interface {
	// Replicate merges entries from peer from (its writes, a handoff or a
	// drain) and returns how many changed a counter.
	Replicate(from string, entries []*peerpb.Entry) int
	// Sync streams the entries the caller of req should hold.
	Sync(req *peerpb.SyncRequest, stream grpc.ServerStreamingServer[peerpb.SyncResponse]) error
}

// peerServer is the owner side of the Peer protocol.
type peerServer struct {
	peerpb.UnimplementedPeerServer
	f  *Forwarder
	st StateService
}

// Decide validates the whole batch first, so a bad batch applies nothing,
// then applies every op at one reading of the owner's clock. It refuses the
// batch (Unavailable) while the node re-syncs, and skips it
// (DeadlineExceeded) when the sender's deadline has passed by this node's
// clock: the sender has decided these ops itself by now.
func (s *peerServer) Decide(ctx context.Context, req *peerpb.DecideRequest) (*peerpb.DecideResponse, error) {
	out := new(peerpb.DecideResponse)
	if err := s.decide(ctx, req, out, nil); err != nil {
		return nil, peerStatus(err)
	}
	return out, nil
}

// peerStreamGrace is how long past its stream age (ForwarderConfig's
// StreamMaxAge) the owner still applies a batch on a stream (senders renew
// theirs before wire.StreamMaxAge, by their own clock).
const peerStreamGrace = 5 * time.Second

// DecideStream answers each DecideRequest on the stream as Decide would,
// one at a time, reporting a refused batch in-band so the stream stays
// open. Its buffers are reused from batch to batch.
func (s *peerServer) DecideStream(stream grpc.BidiStreamingServer[peerpb.DecideRequest, peerpb.DecideResponse]) error {
	ctx := stream.Context()
	opened := s.f.clock.Now()
	maxAge := s.f.streamMaxAge
	var (
		req     peerpb.DecideRequest
		out     peerpb.DecideResponse
		results []peerpb.Result
	)
	for {
		if err := stream.RecvMsg(&req); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		out.Results, out.Code, out.Message = out.Results[:0], 0, ""
		if s.f.clock.Now().Sub(opened) >= maxAge+peerStreamGrace {
			// A sender renews its stream before maxAge: this one was kept
			// idle past it, and must be admitted again before it counts.
			out.Code, out.Message, out.Last = uint32(codes.Unavailable), "transport: stream too old; open a new one", true
			return stream.Send(&out)
		}
		if err := s.decide(ctx, &req, &out, &results); err != nil {
			st := peerStatus(err)
			out.Results, out.Code, out.Message = out.Results[:0], uint32(status.Code(st)), status.Convert(st).Message()
		}
		out.Last = s.f.clock.Now().Sub(opened) >= maxAge
		if err := stream.Send(&out); err != nil {
			return err
		}
		clear(out.Results) // do not pin the previous batch's results
		if out.Last {
			return nil
		}
	}
}

// decide validates and applies req, appending to out.Results. results is a
// reusable backing store for the answers (nil: allocate).
func (s *peerServer) decide(ctx context.Context, req *peerpb.DecideRequest, out *peerpb.DecideResponse, results *[]peerpb.Result) error {
	ops := req.GetOps()
	if err := peerValidateBatch(ops); err != nil {
		return err
	}
	if !s.f.serving() {
		s.f.m.refused.Add(float64(len(ops)))
		return errPeerNotServing
	}
	if err := ctx.Err(); err != nil {
		// The sender has given up and decided these ops itself.
		return err
	}
	now := s.f.clock.Now().UnixNano()
	if dl := req.GetDeadlineNs(); dl != 0 && now >= dl {
		s.f.m.expired.Add(float64(len(ops)))
		return fmt.Errorf("%w: %v past the sender's deadline", errPeerExpired, time.Duration(now-dl))
	}
	if s.f.relaying() && !req.GetRelayed() {
		return s.relay(ctx, now, req, out)
	}
	var buf []peerpb.Result
	if results != nil && cap(*results) >= len(ops) {
		buf = (*results)[:len(ops)]
		clear(buf)
	} else {
		buf = make([]peerpb.Result, len(ops))
		if results != nil {
			*results = buf
		}
	}
	out.Results = slices.Grow(out.Results[:0], len(ops))
	var op bucket.Op // escapes to Apply: one per batch, not per op
	for i, o := range ops {
		op = peerOpFromPB(o)
		pr := &buf[i]
		var span trace.Span
		if s.f.tracer != nil && len(o.GetTrace()) != 0 {
			span = s.f.startDecide(ctx, req.GetFrom(), o.GetTrace())
		}
		r := s.f.local.Apply(now, &op)
		if span != nil {
			endDecide(span, r)
		}
		setPeerResult(pr, r)
		if want := o.GetLease(); want > 0 {
			s.f.grant(now, &op, want, r, pr)
		}
		out.Results = append(out.Results, pr)
	}
	return nil
}

// relay decides a batch where Owners places its keys, within the sender's
// deadline, rather than here (see Policy.Relaying). A leaving node is sent
// ops by peers that have not yet seen it leave, and relays them to the
// keys' new owners, which hold their counts (its drain pushed them). A
// node in its join relay relays the ops for its keys to their previous
// owners. Relays happen only around membership changes, so this path
// allocates freely.
func (s *peerServer) relay(ctx context.Context, now int64, req *peerpb.DecideRequest, out *peerpb.DecideResponse) error {
	// Half of what the sender left, so that the answer is back before it
	// gives up even with some clock skew between the two (its deadline is
	// on its clock); a sender without a deadline gets the usual Timeout.
	wait := s.f.timeout
	if dl := req.GetDeadlineNs(); dl != 0 {
		wait = time.Duration(dl-now) / 2 // dl > now: checked by decide
	}
	// Ops marked relayed are applied where they land; the others (keys a
	// node that has just joined does not own: the sender's view differs)
	// go on as any forwarded op, to be relayed there if need be.
	type group struct {
		idx []int // in the batch
		ops []bucket.Op
	}
	var marked, unmarked group
	for i, o := range req.GetOps() {
		op := peerOpFromPB(o)
		g := &unmarked
		if s.f.marksRelay(op.Key) {
			g = &marked
		}
		g.idx = append(g.idx, i)
		g.ops = append(g.ops, op)
	}
	results := make([]bucket.Result, len(req.GetOps()))
	start := s.f.clock.Now()
	send := func(g group, relayed bool) {
		if len(g.ops) == 0 {
			return
		}
		res := make([]bucket.Result, len(g.ops))
		s.f.apply(ctx, now, g.ops, res, wait-s.f.clock.Now().Sub(start), relayed)
		for j, i := range g.idx {
			results[i] = res[j]
		}
	}
	send(marked, true) // this node's keys first
	send(unmarked, false)
	s.f.m.relayed.Add(float64(len(results)))
	out.Results = out.Results[:0]
	for _, r := range results {
		pr := new(peerpb.Result)
		setPeerResult(pr, r)
		out.Results = append(out.Results, pr)
	}
	return nil
}

// setPeerResult writes a decision into its wire form.
func setPeerResult(pr *peerpb.Result, r bucket.Result) {
	pr.Over = r.Over
	pr.Count = r.Count
	pr.Remaining = r.Remaining
	pr.ResetAfterNs = r.ResetAfter
}

// Ping answers with this node's ID, or FailedPrecondition while Decide is
// refused: the process is alive but not serving (a caller checking whether
// a process holds an identity tells it from a transport failure, which is
// Unavailable).
func (s *peerServer) Ping(ctx context.Context, _ *peerpb.PingRequest) (*peerpb.PingResponse, error) {
	if !s.f.serving() {
		return nil, status.Error(codes.FailedPrecondition, errPeerNotServing.Error())
	}
	return &peerpb.PingResponse{Id: s.f.self}, nil
}

// Replicate validates every entry first, so a bad batch merges nothing.
func (s *peerServer) Replicate(ctx context.Context, req *peerpb.ReplicateRequest) (*peerpb.ReplicateResponse, error) {
	if s.st == nil {
		return s.UnimplementedPeerServer.Replicate(ctx, req)
	}
	if err := wire.ValidateEntries(req.GetEntries()); err != nil {
		return nil, peerStatus(err)
	}
	n := s.st.Replicate(req.GetFrom(), req.GetEntries())
	return &peerpb.ReplicateResponse{Merged: uint32(n)}, nil
}

// ReplicateStream merges each ReplicateRequest on the stream as Replicate
// would, one at a time, reporting a refused batch in-band so the stream
// stays open. Like DecideStream it ends a stream after an answer once the
// stream is the forwarder's stream age old, and refuses batches on streams
// kept past that by more than peerStreamGrace.
func (s *peerServer) ReplicateStream(stream grpc.BidiStreamingServer[peerpb.ReplicateRequest, peerpb.ReplicateResponse]) error {
	if s.st == nil {
		return s.UnimplementedPeerServer.ReplicateStream(stream)
	}
	opened := s.f.clock.Now()
	maxAge := s.f.streamMaxAge
	var (
		req peerpb.ReplicateRequest
		out peerpb.ReplicateResponse
	)
	for {
		if err := stream.RecvMsg(&req); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		out.Merged, out.Code, out.Message = 0, 0, ""
		if s.f.clock.Now().Sub(opened) >= maxAge+peerStreamGrace {
			out.Code, out.Message, out.Last = uint32(codes.Unavailable), "transport: stream too old; open a new one", true
			return stream.Send(&out)
		}
		if err := wire.ValidateEntries(req.GetEntries()); err != nil {
			st := status.Convert(peerStatus(err))
			out.Code, out.Message = uint32(st.Code()), st.Message()
		} else {
			out.Merged = uint32(s.st.Replicate(req.GetFrom(), req.GetEntries()))
		}
		out.Last = s.f.clock.Now().Sub(opened) >= maxAge
		if err := stream.Send(&out); err != nil {
			return err
		}
		if out.Last {
			return nil
		}
	}
}

// Sync validates the request and streams the caller's entries.
func (s *peerServer) Sync(req *peerpb.SyncRequest, stream grpc.ServerStreamingServer[peerpb.SyncResponse]) error {
	if s.st == nil {
		return s.UnimplementedPeerServer.Sync(req, stream)
	}
	if err := peerValidateSync(req); err != nil {
		return peerStatus(err)
	}
	if err := s.st.Sync(req, stream); err != nil {
		return peerStatus(err)
	}
	return nil
}

// Release takes back the unused quota of leases this node granted (see
// Forwarder.grant): each release whose epoch is this node's current lease
// epoch gives its hits back to the key's counter, if it still counts in
// the lease's window. The others change nothing: their quota stays used.
// A node that is not serving, or has no Releaser, takes nothing back.
func (s *peerServer) Release(ctx context.Context, req *peerpb.ReleaseRequest) (*peerpb.ReleaseResponse, error) {
	rs := req.GetReleases()
	if err := peerValidateReleases(rs); err != nil {
		return nil, peerStatus(err)
	}
	rel, ok := s.f.local.(Releaser)
	if !ok || !s.f.serving() {
		s.f.m.releases.refused.Add(float64(len(rs)))
		return &peerpb.ReleaseResponse{}, nil
	}
	now := s.f.clock.Now().UnixNano()
	epoch := s.f.leaseEpoch.Load()
	taken := 0
	for _, r := range rs {
		if r.GetEpoch() == epoch && rel.Release(now, r.GetKey(), releaseLimit(r), r.GetWindowNs(), r.GetHits(), r.GetGrantedCount()) {
			taken++
		}
	}
	s.f.m.releases.taken.Add(float64(taken))
	s.f.m.releases.refused.Add(float64(len(rs) - taken))
	return &peerpb.ReleaseResponse{Taken: uint32(taken)}, nil
}
