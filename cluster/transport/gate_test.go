package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// gatePeer is a Peer service that answers Ping and DecideStream.
type gatePeer struct{ peerpb.UnimplementedPeerServer }

func (gatePeer) Ping(context.Context, *peerpb.PingRequest) (*peerpb.PingResponse, error) {
	return &peerpb.PingResponse{Id: "server"}, nil
}

// DecideStream answers every request with an empty response.
func (gatePeer) DecideStream(s grpc.BidiStreamingServer[peerpb.DecideRequest, peerpb.DecideResponse]) error {
	for {
		if _, err := s.Recv(); err != nil {
			return nil
		}
		if err := s.Send(&peerpb.DecideResponse{}); err != nil {
			return err
		}
	}
}

// gatedServer serves gatePeer and, standing for the services the gate lets
// through, gRPC health behind g on 127.0.0.1, and returns its address.
func gatedServer(t *testing.T, g Gate) string {
	t.Helper()
	lis := testkit.Listen(t)
	srv := grpc.NewServer(g.ServerOptions()...)
	peerpb.RegisterPeerServer(srv, gatePeer{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	testkit.Serve(t, srv, lis)
	return lis.Addr().String()
}

// gateCalls makes one Ping and one health check over a new connection; a
// DecideStream exchange must meet the same gate as the Ping.
func gateCalls(t *testing.T, addr string, opts ...grpc.DialOption) (ping, other error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A bound, not an expectation: a busy -race run may take seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, ping = peerpb.NewPeerClient(conn).Ping(ctx, &peerpb.PingRequest{From: "client"})
	_, other = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err := decideStreamExchange(ctx, conn); status.Code(err) != status.Code(ping) {
		t.Errorf("DecideStream: %v, but Ping: %v", err, ping)
	}
	return ping, other
}

// decideStreamExchange opens a DecideStream on conn and makes one exchange.
func decideStreamExchange(ctx context.Context, conn *grpc.ClientConn) error {
	s, err := peerpb.NewPeerClient(conn).DecideStream(ctx)
	if err != nil {
		return err
	}
	if err := s.Send(&peerpb.DecideRequest{}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = s.Recv()
	return err
}

// from dials from ip.
func from(ip string) grpc.DialOption {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", a)
	})
}

// Without mTLS the gate admits the Peer calls of the IPs Admit accepts (a
// member's) and refuses the others with PermissionDenied, before their
// message is read; other services pass through.
func TestGateAdmitsMemberIPs(t *testing.T) {
	// A client bound to 127.0.0.2 is not a member; 127.0.0.1 is.
	probe, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot bind 127.0.0.2: %v", err)
	}
	probe.Close()
	member := net.ParseIP("127.0.0.1")
	addr := gatedServer(t, Gate{Admit: func(ip net.IP) bool { return ip.Equal(member) }})
	plain := grpc.WithTransportCredentials(insecure.NewCredentials())
	tests := []struct {
		from     string
		wantPing codes.Code
	}{
		{"127.0.0.1", codes.OK},
		{"127.0.0.2", codes.PermissionDenied},
	}
	for _, tt := range tests {
		t.Run(tt.from, func(t *testing.T) {
			ping, other := gateCalls(t, addr, plain, from(tt.from))
			if status.Code(ping) != tt.wantPing || other != nil {
				t.Fatalf("ping %v, other service %v: want %v, OK", ping, other, tt.wantPing)
			}
		})
	}
	// A non-member's peer call is refused before its message is read: bytes
	// that are not a protobuf message get PermissionDenied, not the decode
	// error (Internal) a check after decoding would leave them.
	conn, err := grpc.NewClient(addr, plain, from("127.0.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []byte
	err = conn.Invoke(ctx, peerMethodPrefix+"Decide", []byte{0xff, 0xff, 0xff}, &out, grpc.ForceCodec(rawCodec{}))
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("undecodable peer call from a non-member: %v, want PermissionDenied", err)
	}
}

// The zero Gate admits no Peer call.
func TestGateZeroAdmitsNobody(t *testing.T) {
	addr := gatedServer(t, Gate{})
	ping, other := gateCalls(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if status.Code(ping) != codes.PermissionDenied || other != nil {
		t.Fatalf("ping %v, other service %v: want PermissionDenied, OK", ping, other)
	}
}

// The Peer service's method prefix names the generated service.
func TestGatePrefixNamesThePeerService(t *testing.T) {
	if want := "/" + peerpb.Peer_ServiceDesc.ServiceName + "/"; peerMethodPrefix != want {
		t.Fatalf("peerMethodPrefix %q, want %q", peerMethodPrefix, want)
	}
}

// rawCodec sends []byte as is, for calls with bytes that are no message.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }
