package main

import (
	"context"
	"fmt"
	"io"
	"net"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// noopServer is an RLS v3 server that decides nothing: every call is
// answered OK with one OK status per descriptor, from responses built once.
// It is the floor a load run is compared to: what gRPC itself costs on this
// machine. It is safe for concurrent use (responses are only read).
type noopServer struct {
	pb.UnimplementedRateLimitServiceServer
	canned [17]*pb.RateLimitResponse // by descriptor count
}

func newNoopServer() *noopServer {
	s := &noopServer{}
	for n := range s.canned {
		s.canned[n] = noopResponse(n)
	}
	return s
}

func noopResponse(n int) *pb.RateLimitResponse {
	r := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK}
	for range n {
		r.Statuses = append(r.Statuses, &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK})
	}
	return r
}

// ShouldRateLimit answers OK without looking at the request beyond its
// descriptor count.
func (s *noopServer) ShouldRateLimit(_ context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if n := len(req.Descriptors); n < len(s.canned) {
		return s.canned[n], nil
	}
	return noopResponse(len(req.Descriptors)), nil
}

// startNoop listens on addr and serves the noop RLS with a default
// grpc.Server (the same options `ringlimit serve` uses). stop ends it and
// waits for its goroutine.
func startNoop(addr string) (bound string, stop func(), err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("bench: --noop-server: %w", err)
	}
	gs := grpc.NewServer()
	pb.RegisterRateLimitServiceServer(gs, newNoopServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		gs.Serve(lis) // returns when stopped
	}()
	return lis.Addr().String(), func() { gs.Stop(); <-done }, nil
}

// noopServe runs the noop server on addr until ctx ends (SIGINT/SIGTERM).
func noopServe(ctx context.Context, addr string, stdout, stderr io.Writer) int {
	bound, stop, err := startNoop(addr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "noop RLS server listening on %s (answers OK, decides nothing)\n", bound)
	<-ctx.Done()
	stop()
	return 0
}
