package transport

import (
	"context"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// peerMethodPrefix selects the RPCs of the Peer service.
const peerMethodPrefix = "/ringlimit.peer.v1.Peer/"

// Gate admits calls to the Peer service on a gRPC server it shares with
// other services (the rate limit service, whose calls pass through). The
// zero Gate admits nobody. A Gate is safe for concurrent use if Admit is.
type Gate struct {
	// MTLS admits exactly the callers whose client certificate the TLS
	// handshake verified (the server's TLS config names the CA); Admit is
	// then not asked.
	MTLS bool
	// Admit reports whether a caller at ip may use the Peer service: the
	// IP of a cluster member's gRPC or gossip host, say. Nil admits nobody.
	Admit func(ip net.IP) bool
}

// ServerOptions are the server options that enforce g: a tap that checks a
// call when its headers arrive, before its message is read and decoded (a
// caller that may not use the Peer service costs no decode of a message up
// to the receive limit), and interceptors that check again, for a server
// built without the tap.
func (g Gate) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.InTapHandle(g.tap),
		grpc.ChainUnaryInterceptor(g.unary), grpc.ChainStreamInterceptor(g.stream)}
}

// admit returns nil or a status error for an RPC to method.
func (g Gate) admit(ctx context.Context, method string) error {
	if !strings.HasPrefix(method, peerMethodPrefix) {
		return nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "transport: peer rpc: unknown caller")
	}
	if g.MTLS {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
			return nil
		}
		return status.Error(codes.Unauthenticated, "transport: peer rpc needs a client certificate signed by the peer CA")
	}
	if ip := addrIP(p.Addr); ip != nil && g.Admit != nil && g.Admit(ip) {
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "transport: peer rpc from %v: not a cluster member", p.Addr)
}

// addrIP is the IP of a TCP address, or nil.
func addrIP(a net.Addr) net.IP {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP
	}
	if a == nil {
		return nil
	}
	h, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return nil
	}
	return net.ParseIP(h)
}

func (g Gate) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	return ctx, g.admit(ctx, info.FullMethodName)
}

func (g Gate) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := g.admit(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (g Gate) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := g.admit(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}
