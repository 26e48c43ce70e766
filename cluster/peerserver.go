package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
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

// MaxMessageSize bounds the messages peers send each other: a Decide or
// Replicate batch carries at most 1 MiB of keys (fwdMaxBatchBytes,
// replMaxBytes) and 4096 ops or entries of a few dozen bytes besides. A
// gRPC server that registers the Peer service must accept messages this
// large (grpc.MaxRecvMsgSize), and need not accept larger ones.
const MaxMessageSize = 2 << 20

// Errors the peer server maps to gRPC codes in peerStatus.
var (
	// errPeerInvalid marks a request the owner refuses as a whole.
	errPeerInvalid = errors.New("cluster: invalid peer request")
	// errPeerNotServing refuses Decide and Ping while the node re-syncs.
	errPeerNotServing = errors.New("cluster: node is re-syncing its counters")
	// errPeerExpired skips a Decide batch read after its deadline.
	errPeerExpired = errors.New("cluster: decide batch expired")
)

// Keepalive of peer connections. A connection that stops carrying anything
// without closing (a peer's packets dropped by the network, a lost NAT or
// conntrack entry) would otherwise keep failing every forwarded op and
// probe until TCP gives up, which takes minutes or, with the peer's socket
// buffers still accepting, never; memberlist may meanwhile hold the peer
// alive, since its gossip uses other connections.
const (
	// peerKeepaliveTime is how long a peer connection may read nothing
	// before the client pings it (gRPC's minimum).
	peerKeepaliveTime = 10 * time.Second
	// peerKeepaliveTimeout is how long the client waits for the ping's
	// answer before it closes the connection and dials again.
	peerKeepaliveTimeout = 3 * time.Second
	// peerServerPingTime and peerServerPingTimeout are the server's side:
	// it pings a client connection idle that long and closes one that does
	// not answer, ending the streams a vanished peer left open.
	peerServerPingTime    = 30 * time.Second
	peerServerPingTimeout = 10 * time.Second
)

// peerWindow is the HTTP/2 flow-control window, per stream and per
// connection, of peer connections and of the server's connections (see
// ServerOptions). A fixed window turns off gRPC's bandwidth estimation,
// which pings the sender after reads to size the window: with many small
// messages those pings are extra frames, writes and wake-ups on both sides
// (3 to 5% of the server CPU per call of a three-node cluster, measured
// interleaved). 4 MiB holds any message gRPC accepts by default, so flow
// control never splits one, and moves a sync at gigabytes per second at
// LAN round trips; a window is credit, not a buffer allocated up front.
const peerWindow = 4 << 20

// ServerOptions are the gRPC server options a server that serves the Peer
// service (see Register) needs: it must accept the peers' keepalive pings,
// which gRPC's default policy (one per 5 minutes) answers by closing the
// connection, and it pings idle clients itself; its flow-control window is
// fixed (peerWindow). They apply to every client of that server, which for
// a node is Envoy too: pings and windows are part of HTTP/2.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(peerWindow), grpc.InitialConnWindowSize(peerWindow),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             peerKeepaliveTime / 2,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:    peerServerPingTime,
			Timeout: peerServerPingTimeout,
		}),
	}
}

// Register registers the Peer service on s, next to the rate limit
// service; s should be built with ServerOptions. Decide applies ops to the
// forwarder's Local store with its Clock; Replicate and Sync answer
// Unimplemented (a Node serves them, see Node.Register).
func (f *Forwarder) Register(s *grpc.Server) { f.register(s, nil) }

// register registers the Peer service with st serving Replicate and Sync
// (nil: Unimplemented).
func (f *Forwarder) register(s *grpc.Server, st stateService) {
	peerpb.RegisterPeerServer(s, &peerServer{f: f, st: st})
}

// stateService serves the counter-state RPCs. Requests reach it validated.
type stateService interface {
	// replicate merges entries and returns how many changed a counter.
	replicate(from string, entries []*peerpb.Entry) int
	// sync streams the caller's entries.
	sync(req *peerpb.SyncRequest, stream grpc.ServerStreamingServer[peerpb.SyncResponse]) error
}

// peerServer is the owner side of the Peer protocol.
type peerServer struct {
	peerpb.UnimplementedPeerServer
	f  *Forwarder
	st stateService
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

// peerStreamMaxAge is how long the owner keeps a DecideStream open: it
// then ends it after an answer, and the sender opens a new one, which the
// server's interceptors admit again (a node no longer a member loses its
// stream within this time).
const peerStreamMaxAge = 30 * time.Second

// peerStreamGrace is how long past peerStreamMaxAge the owner still
// applies a batch on a stream (senders renew theirs before
// peerStreamMaxAge, by their own clock).
const peerStreamGrace = 5 * time.Second

// DecideStream answers each DecideRequest on the stream as Decide would,
// one at a time, reporting a refused batch in-band so the stream stays
// open. Its buffers are reused from batch to batch.
func (s *peerServer) DecideStream(stream grpc.BidiStreamingServer[peerpb.DecideRequest, peerpb.DecideResponse]) error {
	ctx := stream.Context()
	opened := time.Now()
	maxAge := time.Duration(s.f.streamMaxAge.Load())
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
		if time.Since(opened) >= maxAge+peerStreamGrace {
			// A sender renews its stream before maxAge: this one was kept
			// idle past it, and must be admitted again before it counts.
			out.Code, out.Message, out.Last = uint32(codes.Unavailable), "cluster: stream too old; open a new one", true
			return stream.Send(&out)
		}
		if err := s.decide(ctx, &req, &out, &results); err != nil {
			st := peerStatus(err)
			out.Results, out.Code, out.Message = out.Results[:0], uint32(status.Code(st)), status.Convert(st).Message()
		}
		out.Last = time.Since(opened) >= maxAge
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
	now := s.f.clock()
	if dl := req.GetDeadlineNs(); dl != 0 && now >= dl {
		s.f.m.expired.Add(float64(len(ops)))
		return fmt.Errorf("%w: %v past the sender's deadline", errPeerExpired, time.Duration(now-dl))
	}
	if s.f.relaying.Load() && !req.GetRelayed() {
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
		setPeerResult(pr, s.f.local.Apply(now, &op))
		out.Results = append(out.Results, pr)
	}
	return nil
}

// relay decides a batch where Node.placement puts its keys, within the
// sender's deadline, rather than here. A leaving node (Forwarder.relaying)
// is sent ops by peers that have not yet seen it leave, and relays them to
// the keys' new owners, which hold their counts (Node.Drain pushed them). A
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
		if s.f.marksRelay == nil || s.f.marksRelay(op.Key) {
			g = &marked
		}
		g.idx = append(g.idx, i)
		g.ops = append(g.ops, op)
	}
	results := make([]bucket.Result, len(req.GetOps()))
	start := time.Now()
	send := func(g group, relayed bool) {
		if len(g.ops) == 0 {
			return
		}
		res := make([]bucket.Result, len(g.ops))
		s.f.apply(ctx, now, g.ops, res, wait-time.Since(start), relayed)
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

// Ping answers with this node's ID, or Unavailable while Decide is refused.
func (s *peerServer) Ping(ctx context.Context, _ *peerpb.PingRequest) (*peerpb.PingResponse, error) {
	if !s.f.serving() {
		return nil, peerStatus(errPeerNotServing)
	}
	return &peerpb.PingResponse{Id: s.f.self}, nil
}

// Replicate validates every entry first, so a bad batch merges nothing.
func (s *peerServer) Replicate(ctx context.Context, req *peerpb.ReplicateRequest) (*peerpb.ReplicateResponse, error) {
	if s.st == nil {
		return s.UnimplementedPeerServer.Replicate(ctx, req)
	}
	if err := peerValidateEntries(req.GetEntries()); err != nil {
		return nil, peerStatus(err)
	}
	n := s.st.replicate(req.GetFrom(), req.GetEntries())
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
	opened := time.Now()
	maxAge := time.Duration(s.f.streamMaxAge.Load())
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
		if time.Since(opened) >= maxAge+peerStreamGrace {
			out.Code, out.Message, out.Last = uint32(codes.Unavailable), "cluster: stream too old; open a new one", true
			return stream.Send(&out)
		}
		if err := peerValidateEntries(req.GetEntries()); err != nil {
			st := status.Convert(peerStatus(err))
			out.Code, out.Message = uint32(st.Code()), st.Message()
		} else {
			out.Merged = uint32(s.st.replicate(req.GetFrom(), req.GetEntries()))
		}
		out.Last = time.Since(opened) >= maxAge
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
	if err := s.st.sync(req, stream); err != nil {
		return peerStatus(err)
	}
	return nil
}

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

// peerMaxIDLen bounds a node ID in a SyncRequest.
const peerMaxIDLen = 256

// peerValidateEntries checks every entry of a Replicate request or Sync
// chunk.
func peerValidateEntries(entries []*peerpb.Entry) error {
	if len(entries) > replMaxEntries {
		return fmt.Errorf("%w: %d entries, more than %d", errPeerInvalid, len(entries), replMaxEntries)
	}
	for i, e := range entries {
		switch {
		case e == nil:
			return fmt.Errorf("%w: entry %d: missing", errPeerInvalid, i)
		case len(e.GetKey()) == 0:
			return fmt.Errorf("%w: entry %d: empty key", errPeerInvalid, i)
		case len(e.GetKey()) > peerMaxKeyLen:
			return fmt.Errorf("%w: entry %d: key is %d bytes, more than %d", errPeerInvalid, i, len(e.GetKey()), peerMaxKeyLen)
		case e.GetAlgorithm() > 0xff:
			return fmt.Errorf("%w: entry %d: unknown algorithm %d", errPeerInvalid, i, e.GetAlgorithm())
		}
		lim := bucket.Limit{Algorithm: bucket.Algorithm(e.GetAlgorithm()), Unit: e.GetUnitNs()}
		if err := lim.Validate(); err != nil {
			return fmt.Errorf("%w: entry %d: %w", errPeerInvalid, i, err)
		}
		if lim.Algorithm == bucket.SlidingWindow && (e.GetCount() > math.MaxUint32 || e.GetPrev() > math.MaxUint32) {
			return fmt.Errorf("%w: entry %d: sliding window counts above %d", errPeerInvalid, i, uint64(math.MaxUint32))
		}
		if lim.Algorithm != bucket.TokenBucket && !bucket.OnWindowGrid(e.GetWindowNs(), e.GetUnitNs()) {
			// Merged, it would win as "later" and match no window: the
			// key's next op would count from zero.
			return fmt.Errorf("%w: entry %d: window %d is not a multiple of its unit %d", errPeerInvalid, i, e.GetWindowNs(), e.GetUnitNs())
		}
	}
	return nil
}

// peerValidateSync checks a Sync request.
func peerValidateSync(req *peerpb.SyncRequest) error {
	from := req.GetFrom()
	switch {
	case from == "":
		return fmt.Errorf("%w: sync: empty from", errPeerInvalid)
	case len(from) > peerMaxIDLen:
		return fmt.Errorf("%w: sync: from is %d bytes, more than %d", errPeerInvalid, len(from), peerMaxIDLen)
	case !utf8.ValidString(from):
		return fmt.Errorf("%w: sync: from is not valid UTF-8", errPeerInvalid)
	case req.GetReplicas() < 1 || req.GetReplicas() > MaxReplicas:
		return fmt.Errorf("%w: sync: replicas must be 1 to %d, got %d", errPeerInvalid, MaxReplicas, req.GetReplicas())
	}
	return nil
}

// peerStatus maps the server's errors to gRPC status errors: the one place
// where the Peer service chooses codes.
func peerStatus(err error) error {
	switch {
	case errors.Is(err, errPeerInvalid):
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
