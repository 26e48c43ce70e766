// Package xdstest runs a rate limit xDS management server for tests, shaped
// like Envoy Gateway's: go-control-plane's Aggregated Discovery Service over
// a snapshot cache keyed by node id, serving RateLimitConfig resources. It
// records the ACKs and NACKs it receives. A Server is safe for concurrent
// use.
package xdstest

import (
	"context"
	"crypto/tls"
	"net"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	confpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Server is a running management server. Stop stops it.
type Server struct {
	// Addr is the address it listens on.
	Addr string

	cache cachev3.SnapshotCache
	gs    *grpc.Server
	done  chan struct{}
	once  sync.Once

	mu      sync.Mutex
	acks    []string
	nacks   []*discovery.DiscoveryRequest
	streams map[int64]bool // streams that sent a NACK
}

// Start listens on addr ("127.0.0.1:0" for any port) and serves, over TLS
// when tlsCfg is not nil.
func Start(addr string, tlsCfg *tls.Config) (*Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: lis.Addr().String(), cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		done: make(chan struct{}), streams: map[int64]bool{}}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(id int64, req *discovery.DiscoveryRequest) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		switch {
		case req.GetErrorDetail() != nil:
			s.nacks = append(s.nacks, req)
			s.streams[id] = true
		case req.GetResponseNonce() != "":
			s.acks = append(s.acks, req.GetVersionInfo())
		}
		return nil
	}}
	var opts []grpc.ServerOption
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.gs = grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(s.gs, serverv3.NewServer(ctx, s.cache, cb))
	go func() {
		defer close(s.done)
		defer cancel()
		s.gs.Serve(lis)
	}()
	return s, nil
}

// Stop closes the listener and every stream and waits for the server to
// end. Safe to call more than once.
func (s *Server) Stop() {
	s.once.Do(s.gs.Stop)
	<-s.done
}

// Set publishes version for node: cfgs are every RateLimitConfig it serves.
func (s *Server) Set(node, version string, cfgs ...*confpb.RateLimitConfig) error {
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		return err
	}
	return s.cache.SetSnapshot(context.Background(), node, snap)
}

// ACKs returns the versions ACKed so far, in order.
func (s *Server) ACKs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.acks...)
}

// NACKs returns the NACKs received so far, in order.
func (s *Server) NACKs() []*discovery.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*discovery.DiscoveryRequest(nil), s.nacks...)
}

// NACKStreams is how many streams sent at least one NACK.
func (s *Server) NACKStreams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}
