package wire

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/cluster/clock"
)

// Lockstep is one sender's long-lived bidi stream to a peer, used in
// lockstep: one request, then its one response. DecideStream and
// ReplicateStream senders keep one each. Set Open (and Clock) before the
// first Exchange. Not safe for concurrent use.
type Lockstep[Req, Resp any] struct {
	// Open opens a stream (a generated client's method).
	Open func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error)
	// Clock times the exchange's limit and tells the stream's age; nil
	// means clock.Real().
	Clock clock.Clock

	stream grpc.BidiStreamingClient[Req, Resp]
	opened time.Time          // when stream was opened
	cancel context.CancelFunc // ends the stream's context; nil when there is no stream
}

// Drop ends the stream and its context, if any.
func (l *Lockstep[Req, Resp]) Drop() {
	if l.cancel != nil {
		l.cancel()
	}
	l.stream, l.cancel = nil, nil
}

// Exchange sends req and receives its answer into resp, all within limit.
// Without a stream, or when the stream is maxAge old, it first opens one
// under a child of parent. A stream that fails, or does not
// answer within limit (DeadlineExceeded), is dropped; one that ended
// before the request was sent reports the status it ended with
// (Unavailable when it ended cleanly).
func (l *Lockstep[Req, Resp]) Exchange(parent context.Context, limit, maxAge time.Duration, req *Req, resp *Resp) error {
	clk := clock.Or(l.Clock)
	if l.stream != nil && clk.Now().Sub(l.opened) >= maxAge {
		l.Drop()
	}
	var ctx context.Context
	if l.stream == nil {
		ctx, l.cancel = context.WithCancel(parent)
	}
	late := clk.AfterFunc(limit, l.cancel) // opening included
	var err error
	if l.stream == nil {
		l.stream, err = l.Open(ctx)
		l.opened = clk.Now()
	}
	if err == nil {
		err = l.stream.Send(req)
		if err == nil {
			err = l.stream.RecvMsg(resp)
		} else if errors.Is(err, io.EOF) {
			// The stream ended; its status comes with the next receive.
			err = l.stream.RecvMsg(resp)
			if err == nil {
				err = status.Error(codes.Internal, "wire: peer answered a request it was not sent")
			}
		}
	}
	if !late.Stop() {
		// No answer in time: the stream is cancelled, or about to be.
		l.Drop()
		return status.Error(codes.DeadlineExceeded, "wire: peer did not answer in time")
	}
	if err != nil {
		l.Drop()
		if errors.Is(err, io.EOF) {
			err = status.Error(codes.Unavailable, "wire: peer ended the stream")
		}
	}
	return err
}
