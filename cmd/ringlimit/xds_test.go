package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/rls/xdstest"
)

// The reference's xDS variables set the --xds-* flags, with its defaults;
// RINGLIMIT_ variables and flags win over them.
func TestXDSFlagsFromEnv(t *testing.T) {
	c, _, err := parseServeFlags([]string{"--node-name", "n"}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.xds() || c.XDSServer != "localhost:18000" || c.XDSNodeID != "default" || c.XDSConnectRetry != 3*time.Second ||
		c.XDSBackoffInitial != 10*time.Second || c.XDSBackoffMax != time.Minute || c.XDSBackoffFactor != 0.5 || !c.XDSBackoffJitter || c.ForceStart {
		t.Fatalf("defaults: %+v", c)
	}
	env := environment{
		"CONFIG_TYPE=grpc_xds_sotw",
		"CONFIG_GRPC_XDS_SERVER_URL=envoy-gateway.envoy-gateway-system.svc.cluster.local:18001",
		"CONFIG_GRPC_XDS_NODE_ID=envoy-gateway-system/eg",
		"CONFIG_GRPC_XDS_NODE_METADATA=zone=a,team=b",
		"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=1s",
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=x-a:1,x-b:2",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/certs/tls.crt",
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=/certs/tls.key",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/certs/ca.crt",
		"CONFIG_GRPC_XDS_SERVER_TLS_SAN=envoy-gateway",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=2s",
		"XDS_CLIENT_BACKOFF_MAX_INTERVAL=20s",
		"XDS_CLIENT_BACKOFF_RANDOM_FACTOR=2",
		"XDS_CLIENT_BACKOFF_JITTER=false",
		"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES=8388608",
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"RINGLIMIT_XDS_NODE_ID=from-ringlimit-env",
	}
	c, _, err = parseServeFlags([]string{"--node-name", "n", "--xds-backoff-max", "30s"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := serveConfig{
		ConfigType: "grpc_xds_sotw", ForceStart: true,
		XDSServer: "envoy-gateway.envoy-gateway-system.svc.cluster.local:18001", XDSNodeID: "from-ringlimit-env",
		XDSNodeMetadata: "zone=a,team=b", XDSConnectRetry: time.Second, XDSHeaders: "x-a:1,x-b:2",
		XDSTLS: true, XDSTLSCert: "/certs/tls.crt", XDSTLSKey: "/certs/tls.key", XDSTLSCA: "/certs/ca.crt", XDSTLSSAN: "envoy-gateway",
		XDSBackoffInitial: 2 * time.Second, XDSBackoffMax: 30 * time.Second, XDSBackoffFactor: 2, XDSBackoffJitter: false,
		XDSMaxMessageBytes: 8 << 20,
	}
	got := serveConfig{
		ConfigType: c.ConfigType, ForceStart: c.ForceStart, XDSServer: c.XDSServer, XDSNodeID: c.XDSNodeID,
		XDSNodeMetadata: c.XDSNodeMetadata, XDSConnectRetry: c.XDSConnectRetry, XDSHeaders: c.XDSHeaders,
		XDSTLS: c.XDSTLS, XDSTLSCert: c.XDSTLSCert, XDSTLSKey: c.XDSTLSKey, XDSTLSCA: c.XDSTLSCA, XDSTLSSAN: c.XDSTLSSAN,
		XDSBackoffInitial: c.XDSBackoffInitial, XDSBackoffMax: c.XDSBackoffMax, XDSBackoffFactor: c.XDSBackoffFactor,
		XDSBackoffJitter: c.XDSBackoffJitter, XDSMaxMessageBytes: c.XDSMaxMessageBytes,
	}
	if got != want || !c.xds() {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}

// Bad xDS settings are refused at start, naming the flag.
func TestXDSFlagErrors(t *testing.T) {
	xds := []string{"--node-name", "n", "--config-type", "GRPC_XDS_SOTW"}
	for _, tc := range []struct {
		args []string
		env  environment
		want string
	}{
		{[]string{"--node-name", "n", "--config-type", "GRPC_XDS_DELTA"}, nil, `--config-type: unknown type "GRPC_XDS_DELTA"`},
		{[]string{"--node-name", "n"}, environment{"CONFIG_TYPE=REDIS"}, `--config-type: unknown type "REDIS"`},
		{[]string{"--xds-server", ""}, nil, "--xds-server: empty address"},
		{[]string{"--xds-node-id", ""}, nil, "--xds-node-id: empty"},
		{[]string{"--xds-node-metadata", "zone"}, nil, `--xds-node-metadata: "zone" is not key=value`},
		{nil, environment{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=x-a=1"}, `--xds-headers: "x-a=1" is not key:value`},
		{[]string{"--xds-backoff-initial", "0s"}, nil, "--xds-backoff-initial and --xds-backoff-max must be > 0"},
		{[]string{"--xds-backoff-factor", "-1"}, nil, "--xds-backoff-factor: -1 is not a number >= 0"},
		{[]string{"--xds-max-message-bytes", "-1"}, nil, "--xds-max-message-bytes: -1 < 0"},
		{[]string{"--xds-tls", "--xds-tls-cert", "c.pem"}, nil, "--xds-tls-cert and --xds-tls-key go together"},
		{nil, environment{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/ca.pem"}, "--xds-tls (CONFIG_GRPC_XDS_SERVER_USE_TLS) is false"},
		{nil, environment{"CONFIG_GRPC_XDS_SERVER_USE_TLS=maybe"}, `CONFIG_GRPC_XDS_SERVER_USE_TLS="maybe"`},
		{nil, environment{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=10"}, `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL="10"`},
	} {
		args := tc.args
		if len(args) == 0 || args[0] != "--node-name" {
			args = append(append([]string(nil), xds...), args...)
		}
		_, _, err := parseServeFlags(args, tc.env, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("args %q env %q: err %v, want %q", args, tc.env, err, tc.want)
		}
	}
}

// The TLS flags reach a server that requires TLS 1.3 and a client
// certificate, and only one whose certificate carries --xds-tls-san.
func TestXDSDialTLS(t *testing.T) {
	leakCheck(t)
	dir := t.TempDir()
	ca, rogue := newTestCA(t, "xds-ca"), newTestCA(t, "rogue-ca")
	caPath, roguePath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "rogue.pem")
	writeFile(t, caPath, ca.pem)
	writeFile(t, roguePath, rogue.pem)
	srvCert, srvKey := ca.issue(t, dir, "server", 2)
	cliCert, cliKey := ca.issue(t, dir, "client", 3)
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	kp, err := tls.LoadX509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := xdstest.Start("127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{kp},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	const san = "server" // the server certificate's DNS name
	for _, tc := range []struct {
		name    string
		c       serveConfig
		wantErr string // "" for a working stream
	}{
		{"CA, SAN and client certificate", serveConfig{XDSTLS: true, XDSTLSCA: caPath, XDSTLSSAN: san, XDSTLSCert: cliCert, XDSTLSKey: cliKey}, ""},
		// TLS 1.3: the server refuses after the handshake; the error says
		// "certificate required" or just that the connection broke.
		{"no client certificate", serveConfig{XDSTLS: true, XDSTLSCA: caPath, XDSTLSSAN: san}, "rpc error"},
		{"another CA", serveConfig{XDSTLS: true, XDSTLSCA: roguePath, XDSTLSSAN: san, XDSTLSCert: cliCert, XDSTLSKey: cliKey}, "certificate"},
		{"another SAN", serveConfig{XDSTLS: true, XDSTLSCA: caPath, XDSTLSSAN: "other.example", XDSTLSCert: cliCert, XDSTLSKey: cliKey}, "certificate"},
		{"plaintext", serveConfig{}, "Unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dial, err := tc.c.xdsDialOption(slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			err = adsRoundTrip(srv.Addr, dial)
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
		})
	}
	// Files that cannot be read fail at start, naming the flag.
	for _, tc := range []struct {
		c    serveConfig
		want string
	}{
		{serveConfig{XDSTLS: true, XDSTLSCA: filepath.Join(dir, "missing.pem")}, "--xds-tls-ca"},
		{serveConfig{XDSTLS: true, XDSTLSCert: filepath.Join(dir, "missing.crt"), XDSTLSKey: cliKey}, "--xds-tls-cert"},
	} {
		if _, err := tc.c.xdsDialOption(nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want one naming %s", tc.c, err, tc.want)
		}
	}
}

// adsRoundTrip opens an ADS stream, sends a request and waits for the
// server's first answer (none comes for a node without a snapshot: the
// stream staying open until the deadline is the success).
func adsRoundTrip(addr string, dial grpc.DialOption) error {
	conn, err := grpc.NewClient(addr, dial)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"}); err != nil {
		return err
	}
	// The stream may report the deadline before ctx itself says it passed.
	if _, err := s.Recv(); err != nil && ctx.Err() == nil && status.Code(err) != codes.DeadlineExceeded {
		return err
	}
	return nil
}
