package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// testCA is an in-test certificate authority.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes a leaf certificate for peers (server and client use, IP SAN
// 127.0.0.1 and the DNS SANs name and dns) and its key under dir as
// name.crt and name.key and returns their paths.
func (ca *testCA) issue(t *testing.T, dir, name string, serial int64, dns ...string) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     append([]string{name}, dns...),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writeFile(t, certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	writeFile(t, keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
	return certPath, keyPath
}

// writeFile writes b and moves the file's mtime forward, so that a reload
// check sees the change whatever the file system's time resolution.
func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	old, _ := os.Stat(path)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	mt := time.Now()
	if old != nil && !mt.After(old.ModTime()) {
		mt = old.ModTime().Add(time.Second)
	}
	if err := os.Chtimes(path, mt, mt); err != nil {
		t.Fatal(err)
	}
}

// leakCheck checks, after every other cleanup of t, that t started no
// goroutine that is still running.
func leakCheck(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}

// fakeMembers is an aliveLister with fixed members.
type fakeMembers []membership.Member

func (f fakeMembers) Admitted() []membership.Member { return f }

type fakePeer struct{ peerpb.UnimplementedPeerServer }

func (fakePeer) Ping(context.Context, *peerpb.PingRequest) (*peerpb.PingResponse, error) {
	return &peerpb.PingResponse{Id: "server"}, nil
}

// DecideStream answers every request with an empty response.
func (fakePeer) DecideStream(s grpc.BidiStreamingServer[peerpb.DecideRequest, peerpb.DecideResponse]) error {
	for {
		if _, err := s.Recv(); err != nil {
			return nil
		}
		if err := s.Send(&peerpb.DecideResponse{}); err != nil {
			return err
		}
	}
}

type gateRLS struct {
	pb.UnimplementedRateLimitServiceServer
}

func (gateRLS) ShouldRateLimit(context.Context, *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	return &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK}, nil
}

// gatedServer serves a fake Peer and RLS service behind grpcServerOptions
// on 127.0.0.1 and returns its address.
func gatedServer(t *testing.T, f *tlsFiles, members aliveLister) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpcServerOptions(f, members)...)
	peerpb.RegisterPeerServer(gs, fakePeer{})
	pb.RegisterRateLimitServiceServer(gs, gateRLS{})
	done := make(chan struct{})
	go func() { defer close(done); gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	return lis.Addr().String()
}

// calls makes one Ping and one ShouldRateLimit over a new connection.
func calls(t *testing.T, addr string, opts ...grpc.DialOption) (ping, rls error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A bound, not an expectation: refused handshakes fail at once, and a
	// busy -race run may take seconds over a good one.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, ping = peerpb.NewPeerClient(conn).Ping(ctx, &peerpb.PingRequest{From: "client"})
	_, rls = pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "d"})
	// A stream passes the same gate as a call: forwarded decisions travel
	// on DecideStreams.
	if err := decideStreamExchange(ctx, conn); status.Code(err) != status.Code(ping) {
		t.Errorf("DecideStream: %v, but Ping: %v", err, ping)
	}
	return ping, rls
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

func TestPeerMTLS(t *testing.T) {
	leakCheck(t)
	dir := t.TempDir()
	ca, rogue := newTestCA(t, "cluster-ca"), newTestCA(t, "rogue-ca")
	caPath := filepath.Join(dir, "ca.pem")
	writeFile(t, caPath, ca.pem)
	srvCert, srvKey := ca.issue(t, dir, "server", 2)
	peerCert, peerKey := ca.issue(t, dir, "peer", 3)
	rogueCert, rogueKey := rogue.issue(t, dir, "rogue", 4)

	server, err := newTLSFiles(&serveConfig{PeerTLSCert: srvCert, PeerTLSKey: srvKey, PeerTLSCA: caPath})
	if err != nil {
		t.Fatal(err)
	}
	addr := gatedServer(t, server, fakeMembers{}) // no members: mTLS alone admits
	peerDial := func(cert, key string) []grpc.DialOption {
		f, err := newTLSFiles(&serveConfig{PeerTLSCert: cert, PeerTLSKey: key, PeerTLSCA: caPath})
		if err != nil {
			t.Fatal(err)
		}
		return f.peerDialOptions()
	}
	// An RLS client: server TLS trusting the CA, no client certificate.
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	noCert := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}))

	tests := []struct {
		name           string
		opts           []grpc.DialOption
		wantPing       codes.Code
		wantRLS        codes.Code
		refusedAtHello bool // the handshake fails: any non-OK code
	}{
		{"peer with a CA-signed certificate", peerDial(peerCert, peerKey), codes.OK, codes.OK, false},
		{"tls client without a certificate", []grpc.DialOption{noCert}, codes.Unauthenticated, codes.OK, false},
		{"peer with a rogue certificate", peerDial(rogueCert, rogueKey), codes.Unavailable, codes.Unavailable, true},
		{"plaintext client", []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, codes.Unavailable, codes.Unavailable, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ping, rls := calls(t, addr, tt.opts...)
			if tt.refusedAtHello {
				if ping == nil || rls == nil {
					t.Fatalf("ping %v, rls %v: want both refused", ping, rls)
				}
				return
			}
			if status.Code(ping) != tt.wantPing || status.Code(rls) != tt.wantRLS {
				t.Fatalf("ping %v, rls %v: want %v, %v", ping, rls, tt.wantPing, tt.wantRLS)
			}
		})
	}

	// Rotation: a new CA and new certificates on disk are picked up by the
	// next handshake; a certificate of the old CA is refused from then on.
	ca2 := newTestCA(t, "cluster-ca-2")
	writeFile(t, caPath, ca2.pem)
	ca2.issue(t, dir, "server", 5) // overwrites the server's files
	if ping, _ := calls(t, addr, peerDial(peerCert, peerKey)...); ping == nil {
		t.Errorf("old-CA peer after rotation: ping accepted, want refused")
	}
	newCert, newKey := ca2.issue(t, dir, "peer2", 6)
	if ping, rls := calls(t, addr, peerDial(newCert, newKey)...); ping != nil || rls != nil {
		t.Errorf("new-CA peer after rotation: ping %v, rls %v; want both OK", ping, rls)
	}
}

// A node without peer mTLS admits the peer calls of its members' IPs only
// (the gate itself is tested in cluster/transport).
func TestPeerMemberIPs(t *testing.T) {
	leakCheck(t)
	// A client bound to 127.0.0.2 is not a member; 127.0.0.1 is.
	probe, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot bind 127.0.0.2: %v", err)
	}
	probe.Close()
	f, err := newTLSFiles(&serveConfig{})
	if err != nil {
		t.Fatal(err)
	}
	members := fakeMembers{{ID: "a", GRPCAddr: "127.0.0.1:8081", Addr: "127.0.0.1:7946", State: membership.MemberAlive}}
	addr := gatedServer(t, f, members)
	from := func(ip string) grpc.DialOption {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", a)
		})
	}
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
			ping, rls := calls(t, addr, plain, from(tt.from))
			if status.Code(ping) != tt.wantPing || rls != nil {
				t.Fatalf("ping %v, rls %v: want %v, OK", ping, rls, tt.wantPing)
			}
		})
	}
}

// memberIP admits the host of a member's gRPC or gossip address, and no
// other IP (transport's gate tests show what the gate does with it).
func TestMemberIP(t *testing.T) {
	members := fakeMembers{
		{ID: "a", GRPCAddr: "127.0.0.1:8081", Addr: "127.0.0.3:7946", State: membership.MemberAlive},
		{ID: "b", GRPCAddr: "not-an-address", Addr: "[::1]:7946", State: membership.MemberLeft},
	}
	admit := memberIP(members)
	tests := []struct {
		ip   string
		want bool
	}{
		{"127.0.0.1", true}, // a's gRPC host
		{"127.0.0.3", true}, // a's gossip host
		{"::1", true},       // b's gossip host: b left, its calls are still admitted
		{"127.0.0.2", false},
		{"::2", false},
	}
	for _, tt := range tests {
		if got := admit(net.ParseIP(tt.ip)); got != tt.want {
			t.Errorf("memberIP(%s) = %v, want %v", tt.ip, got, tt.want)
		}
	}
	if memberIP(fakeMembers{})(net.ParseIP("127.0.0.1")) {
		t.Error("no members: an IP admitted")
	}
}

func TestTLSFlagsTogether(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"peer cert alone", []string{"--peer-tls-cert", "c.pem"}},
		{"peer cert and key without ca", []string{"--peer-tls-cert", "c.pem", "--peer-tls-key", "k.pem"}},
		{"grpc key alone", []string{"--grpc-tls-key", "k.pem"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &serveConfig{}
			fs, _ := newServeFlags(c, nil)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if err := c.validate(); err == nil || !strings.Contains(err.Error(), "go together") {
				t.Errorf("%v: %v, want \"go together\"", tt.args, err)
			}
		})
	}
}

func TestRLSServerTLS(t *testing.T) {
	leakCheck(t)
	dir := t.TempDir()
	peerCA, rlsCA := newTestCA(t, "peer-ca"), newTestCA(t, "rls-ca")
	caPath := filepath.Join(dir, "ca.pem")
	writeFile(t, caPath, peerCA.pem)
	peerCert, peerKey := peerCA.issue(t, dir, "peer", 2)
	rlsCert, rlsKey := rlsCA.issue(t, dir, "rls", 3)
	rlsPool := x509.NewCertPool()
	rlsPool.AddCert(rlsCA.cert)
	envoy := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: rlsPool, ServerName: "127.0.0.1"}))

	tests := []struct {
		name     string
		cfg      serveConfig
		wantPeer bool // a peer dial is checked too
	}{
		{"rls tls alone", serveConfig{GRPCTLSCert: rlsCert, GRPCTLSKey: rlsKey}, false},
		{"rls tls with peer mtls", serveConfig{GRPCTLSCert: rlsCert, GRPCTLSKey: rlsKey, PeerTLSCert: peerCert, PeerTLSKey: peerKey, PeerTLSCA: caPath}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := newTLSFiles(&tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			addr := gatedServer(t, f, fakeMembers{})
			// Envoy trusts only the RLS CA: it must be shown the RLS certificate.
			if _, rls := calls(t, addr, envoy); rls != nil {
				t.Errorf("rls over tls: %v", rls)
			}
			if tt.wantPeer {
				// A peer asks for ringlimit-peer and must be shown the peer certificate.
				if ping, _ := calls(t, addr, f.peerDialOptions()...); ping != nil {
					t.Errorf("peer ping: %v", ping)
				}
			}
		})
	}
}

func TestClusterNameBound(t *testing.T) {
	c := &serveConfig{}
	fs, _ := newServeFlags(c, nil)
	if err := fs.Parse([]string{"--cluster-name", strings.Repeat("n", 256)}); err != nil {
		t.Fatal(err)
	}
	if err := c.validate(); err == nil || !strings.Contains(err.Error(), "--cluster-name") {
		t.Errorf("a 256-byte cluster name: %v, want an error naming --cluster-name", err)
	}
	if c.ClusterName = "ringlimit-prod"; c.validate() != nil && strings.Contains(c.validate().Error(), "--cluster-name") {
		t.Errorf("a short cluster name refused: %v", c.validate())
	}
}

// TestTLSReloadFailureLogged: a changed certificate or CA file that does not
// load keeps the last good one and is logged once per change, so a rotation
// that failed is seen before the old certificate expires.
func TestTLSReloadFailureLogged(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "ca")
	cert, key := ca.issue(t, dir, "node", 1)
	caPath := filepath.Join(dir, "ca.pem")
	writeFile(t, caPath, ca.pem)
	f, err := newTLSFiles(&serveConfig{PeerTLSCert: cert, PeerTLSKey: key, PeerTLSCA: caPath})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	f.setLogger(slog.New(slog.NewTextHandler(&logs, nil)))
	good, _ := f.peer.get()
	goodPool, _ := f.ca.get()

	writeFile(t, cert, []byte("half written"))
	writeFile(t, caPath, []byte("not a bundle"))
	for range 3 { // every handshake asks; one line per change
		if c, err := f.peer.get(); err != nil || c != good {
			t.Fatalf("after a bad certificate: %v, %v; want the last good one", c, err)
		}
		if p, err := f.ca.get(); err != nil || p != goodPool {
			t.Fatalf("after a bad CA bundle: %v; want the last good one", err)
		}
	}
	out := logs.String()
	if n := strings.Count(out, "reloading a changed certificate failed"); n != 1 || !strings.Contains(out, "--peer-tls-cert") {
		t.Errorf("certificate failure logged %d times, want once naming --peer-tls-cert:\n%s", n, out)
	}
	if n := strings.Count(out, "reloading a changed CA bundle failed"); n != 1 {
		t.Errorf("CA failure logged %d times, want once:\n%s", n, out)
	}
}
