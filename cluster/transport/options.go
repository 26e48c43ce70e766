package transport

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/ringlimit/ringlimit/cluster/wire"
)

// MaxMessageSize bounds the messages peers send each other (see
// wire.MaxMessageSize). A gRPC server that registers the Peer service must
// accept messages this large (grpc.MaxRecvMsgSize), and need not accept
// larger ones.
const MaxMessageSize = wire.MaxMessageSize

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
