package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// rlsMTLSPKI is a server with RLS client mTLS (client CA, SAN
// envoy.gateway.test) and peer mTLS, each with its own CA, and the files
// of its clients.
type rlsMTLSPKI struct {
	dir                  string
	serverCA, clientCA   *testCA
	peerCA, rogueCA      *testCA
	clientCAPath         string
	peerCAPath           string
	srvCert, srvKey      string
	peerCert, peerKey    string
	envoyCert, envoyKey  string // client CA, SAN envoy.gateway.test
	wildCert, wildKey    string // client CA, SAN *.gateway.test
	otherCert, otherKey  string // client CA, SAN other.example
	rogueCert, rogueKey  string // another CA, SAN envoy.gateway.test
	serverPool, peerPool *x509.CertPool
}

func newRLSMTLSPKI(t *testing.T) *rlsMTLSPKI {
	t.Helper()
	p := &rlsMTLSPKI{dir: t.TempDir()}
	p.serverCA, p.clientCA = newTestCA(t, "rls-server-ca"), newTestCA(t, "rls-client-ca")
	p.peerCA, p.rogueCA = newTestCA(t, "peer-ca"), newTestCA(t, "rogue-ca")
	p.clientCAPath, p.peerCAPath = filepath.Join(p.dir, "client-ca.pem"), filepath.Join(p.dir, "peer-ca.pem")
	writeFile(t, p.clientCAPath, p.clientCA.pem)
	writeFile(t, p.peerCAPath, p.peerCA.pem)
	p.srvCert, p.srvKey = p.serverCA.issue(t, p.dir, "rls", 2)
	p.peerCert, p.peerKey = p.peerCA.issue(t, p.dir, "peer", 3)
	p.envoyCert, p.envoyKey = p.clientCA.issue(t, p.dir, "envoy", 4, "envoy.gateway.test")
	p.wildCert, p.wildKey = p.clientCA.issue(t, p.dir, "wild", 5, "*.gateway.test")
	p.otherCert, p.otherKey = p.clientCA.issue(t, p.dir, "other", 6, "other.example")
	p.rogueCert, p.rogueKey = p.rogueCA.issue(t, p.dir, "rogue", 7, "envoy.gateway.test")
	p.serverPool, p.peerPool = x509.NewCertPool(), x509.NewCertPool()
	p.serverPool.AddCert(p.serverCA.cert)
	p.peerPool.AddCert(p.peerCA.cert)
	return p
}

// client dials as an RLS client: server TLS against the server CA, with
// the key pair certPath/keyPath if given.
func (p *rlsMTLSPKI) client(t *testing.T, certPath, keyPath string) grpc.DialOption {
	t.Helper()
	cfg := &tls.Config{RootCAs: p.serverPool, ServerName: "127.0.0.1"}
	if certPath != "" {
		kp, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg))
}

// TestRLSClientMTLS: with --grpc-tls-client-ca an RLS client needs a
// certificate of the client CA naming --grpc-tls-client-san; peers keep
// their own CA and server name, and a client certificate never opens the
// Peer service.
func TestRLSClientMTLS(t *testing.T) {
	leakCheck(t)
	p := newRLSMTLSPKI(t)
	f, err := newTLSFiles(&serveConfig{
		GRPCTLSCert: p.srvCert, GRPCTLSKey: p.srvKey,
		GRPCTLSClientCA: p.clientCAPath, GRPCTLSClientSAN: "envoy.gateway.test",
		PeerTLSCert: p.peerCert, PeerTLSKey: p.peerKey, PeerTLSCA: p.peerCAPath,
	})
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	f.setLogger(slog.New(slog.NewTextHandler(&logs, nil)))
	f.clients.every = 0
	addr := gatedServer(t, f, fakeMembers{})
	peerNoCert := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: p.peerPool, ServerName: peerServerName, InsecureSkipVerify: true}))

	tests := []struct {
		name     string
		opts     []grpc.DialOption
		wantRLS  codes.Code
		wantPing codes.Code
		wantLog  string // the reason the server logs
	}{
		{"client certificate naming the SAN", []grpc.DialOption{p.client(t, p.envoyCert, p.envoyKey)}, codes.OK, codes.Unauthenticated, ""},
		{"client certificate with a wildcard SAN", []grpc.DialOption{p.client(t, p.wildCert, p.wildKey)}, codes.OK, codes.Unauthenticated, ""},
		{"no client certificate", []grpc.DialOption{p.client(t, "", "")}, codes.Unavailable, codes.Unavailable, ""},
		{"client certificate of another CA", []grpc.DialOption{p.client(t, p.rogueCert, p.rogueKey)}, codes.Unavailable, codes.Unavailable, "certificate signed by unknown authority"},
		{"client certificate with another SAN", []grpc.DialOption{p.client(t, p.otherCert, p.otherKey)}, codes.Unavailable, codes.Unavailable, `does not name \"envoy.gateway.test\"`},
		{"plaintext", []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, codes.Unavailable, codes.Unavailable, ""},
		{"peer", f.peerDialOptions(), codes.OK, codes.OK, ""},
		{"peer server name without a certificate", []grpc.DialOption{peerNoCert}, codes.Unavailable, codes.Unavailable, ""},
		{"peer server name with a client certificate", []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			ServerName: peerServerName, InsecureSkipVerify: true, Certificates: []tls.Certificate{mustKeyPair(t, p.envoyCert, p.envoyKey)}}))},
			codes.Unavailable, codes.Unavailable, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(logs.String())
			ping, rls := calls(t, addr, tt.opts...)
			if status.Code(rls) != tt.wantRLS || status.Code(ping) != tt.wantPing {
				t.Fatalf("rls %v, ping %v: want %v, %v", rls, ping, tt.wantRLS, tt.wantPing)
			}
			// The client sees an alert (bad certificate, certificate
			// required) or, in TLS 1.3, at times only the closed
			// connection; the server's log says why.
			if tt.wantLog != "" && !strings.Contains(logs.String()[before:], tt.wantLog) {
				t.Fatalf("server log %q does not say %q", logs.String(), tt.wantLog)
			}
		})
	}

	// ringlimit check presents --tls-cert and --tls-key.
	caPath := filepath.Join(p.dir, "server-ca.pem")
	writeFile(t, caPath, p.serverCA.pem)
	base := []string{"--addr", addr, "--domain", "d", "--descriptor", "k=v", "--timeout", "20s", "--tls-ca", caPath}
	var out, errb bytes.Buffer
	if code := checkCmd(context.Background(), append(base, "--tls-cert", p.envoyCert, "--tls-key", p.envoyKey), &out, &errb); code != 0 {
		t.Errorf("check with a client certificate: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := checkCmd(context.Background(), base, &out, &errb); code != 1 || !strings.Contains(errb.String(), "check:") {
		t.Errorf("check without a client certificate: exit %d, stderr %q; want 1 and an error", code, errb.String())
	}
	errb.Reset()
	if code := checkCmd(context.Background(), append(base, "--tls-cert", p.envoyCert), &out, &errb); code != 2 || !strings.Contains(errb.String(), "go together") {
		t.Errorf("check with --tls-cert alone: exit %d, stderr %q; want 2 and \"go together\"", code, errb.String())
	}
}

func mustKeyPair(t *testing.T, certPath, keyPath string) tls.Certificate {
	t.Helper()
	kp, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// The server says why it refused a client certificate (the client only
// sees a bad-certificate alert).
func TestRLSClientAuthReasons(t *testing.T) {
	p := newRLSMTLSPKI(t)
	leaf := func(certPath, keyPath string) tls.ConnectionState {
		kp := mustKeyPair(t, certPath, keyPath)
		c, err := x509.ParseCertificate(kp.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return tls.ConnectionState{PeerCertificates: []*x509.Certificate{c}}
	}
	tests := []struct {
		name, san string
		cs        tls.ConnectionState
		wantErr   string
	}{
		{"good, no SAN asked", "", leaf(p.otherCert, p.otherKey), ""},
		{"good SAN", "envoy.gateway.test", leaf(p.envoyCert, p.envoyKey), ""},
		{"wildcard SAN", "a.gateway.test", leaf(p.wildCert, p.wildKey), ""},
		{"IP SAN", "127.0.0.1", leaf(p.envoyCert, p.envoyKey), ""},
		{"another SAN", "envoy.gateway.test", leaf(p.otherCert, p.otherKey), `does not name "envoy.gateway.test"`},
		{"another CA", "", leaf(p.rogueCert, p.rogueKey), "unknown authority"},
		{"no certificate", "", tls.ConnectionState{}, "no certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := newRLSClientAuth(p.clientCAPath, tt.san)
			if err != nil {
				t.Fatal(err)
			}
			err = a.check(tt.cs)
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("check: %v, want %q", err, tt.wantErr)
			}
		})
	}
	if _, err := newRLSClientAuth(filepath.Join(p.dir, "missing.pem"), ""); err == nil || !strings.Contains(err.Error(), "--grpc-tls-client-ca") {
		t.Errorf("a missing client CA: %v, want an error naming --grpc-tls-client-ca", err)
	}
}

func TestCertNames(t *testing.T) {
	spiffe, _ := url.Parse("spiffe://cluster.local/ns/istio-system/sa/gateway")
	cert := &x509.Certificate{DNSNames: []string{"*.gateway.test"}, IPAddresses: []net.IP{net.ParseIP("10.0.0.1")}, URIs: []*url.URL{spiffe}}
	for _, tt := range []struct {
		san  string
		want bool
	}{
		{"a.gateway.test", true},
		{"gateway.test", false},
		{"a.b.gateway.test", false},
		{"10.0.0.1", true},
		{"10.0.0.2", false},
		{"spiffe://cluster.local/ns/istio-system/sa/gateway", true},
		{"spiffe://cluster.local/ns/default/sa/gateway", false},
	} {
		if got := certNames(cert, tt.san); got != tt.want {
			t.Errorf("certNames(%q) = %v, want %v", tt.san, got, tt.want)
		}
	}
}

// GRPC_CLIENT_TLS_CACERT, Envoy Gateway's GRPC_SERVER_TLS_CA_CERT and
// GRPC_CLIENT_TLS_SAN set the client mTLS flags; settings that would leave
// the check off, or peers unable to call each other, refuse to start.
func TestRLSClientTLSEnv(t *testing.T) {
	srv := []string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/certs/tls.crt", "GRPC_SERVER_TLS_KEY=/certs/tls.key"}
	tests := []struct {
		name      string
		args, env []string
		wantCA    string
		wantSAN   string
		wantErr   string
	}{
		{"reference variables", nil, append(srv, "GRPC_CLIENT_TLS_CACERT=/certs/client-ca.crt", "GRPC_CLIENT_TLS_SAN=envoy"), "/certs/client-ca.crt", "envoy", ""},
		{"envoy gateway's variable", nil, append(srv, "GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt"), "/certs/ca.crt", "", ""},
		{"the reference's variable wins", nil, append(srv, "GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt", "GRPC_CLIENT_TLS_CACERT=/c.pem"), "/c.pem", "", ""},
		{"RINGLIMIT_ variable over the reference's", nil, append(srv, "GRPC_CLIENT_TLS_CACERT=/c.pem", "RINGLIMIT_GRPC_TLS_CLIENT_CA=/r.pem"), "/r.pem", "", ""},
		{"flag over variables", []string{"--grpc-tls-client-ca", "/f.pem", "--grpc-tls-client-san", "f"}, append(srv, "GRPC_CLIENT_TLS_CACERT=/c.pem", "GRPC_CLIENT_TLS_SAN=envoy"), "/f.pem", "f", ""},
		{"client CA without server TLS", nil, []string{"GRPC_CLIENT_TLS_CACERT=/c.pem"}, "", "", "--grpc-tls-client-ca (GRPC_CLIENT_TLS_CACERT, GRPC_SERVER_TLS_CA_CERT) needs server TLS"},
		{"envoy gateway's CA with GRPC_SERVER_USE_TLS=false", nil, []string{"GRPC_SERVER_USE_TLS=false", "GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt"}, "", "", "needs server TLS"},
		{"SAN without a client CA", nil, append(srv, "GRPC_CLIENT_TLS_SAN=envoy"), "", "", "--grpc-tls-client-san (GRPC_CLIENT_TLS_SAN) needs --grpc-tls-client-ca"},
		{"RLS TLS in a cluster without peer mTLS", []string{"--join", "10.0.0.1:7946"}, srv, "", "", "--grpc-tls-cert with --join needs peer mTLS"},
		{"RLS mTLS in a cluster with peer mTLS", []string{"--join", "10.0.0.1:7946", "--peer-tls-cert", "p.crt", "--peer-tls-key", "p.key", "--peer-tls-ca", "p.pem"},
			append(srv, "GRPC_CLIENT_TLS_CACERT=/c.pem"), "/c.pem", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := parseServeWant(t, tt.args, tt.env, tt.wantErr)
			if c == nil {
				return
			}
			if c.GRPCTLSClientCA != tt.wantCA || c.GRPCTLSClientSAN != tt.wantSAN {
				t.Fatalf("client CA %q, SAN %q; want %q, %q", c.GRPCTLSClientCA, c.GRPCTLSClientSAN, tt.wantCA, tt.wantSAN)
			}
		})
	}
}

// parseServeWant parses serve's args and env for node "n": with wantErr
// set it checks that parsing fails saying so and returns nil, else it
// returns the configuration.
func parseServeWant(t *testing.T, args, env []string, wantErr string) *serveConfig {
	t.Helper()
	c, _, err := parseServeFlags(append([]string{"--node-name", "n"}, args...), environment(env), nil)
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("err %v, want %q", err, wantErr)
		}
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}
