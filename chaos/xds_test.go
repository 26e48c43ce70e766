package chaos

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	confpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/rls/xdstest"
)

// startEGXDS starts a management server like Envoy Gateway's (TLS when
// tlsCfg is set), stopped at cleanup.
func startEGXDS(t *testing.T, tlsCfg *tls.Config) *xdstest.Server {
	t.Helper()
	s, err := xdstest.Start("127.0.0.1:0", tlsCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// setEG publishes version for node: one RateLimitConfig of domain "eg"
// with user=* limited to rpu a minute (unit UNKNOWN, invalid, when bad).
func setEG(t *testing.T, s *xdstest.Server, node, version string, rpu uint32, bad bool) {
	t.Helper()
	unit := confpb.RateLimitUnit_MINUTE
	if bad {
		unit = confpb.RateLimitUnit_UNKNOWN
	}
	rc := &confpb.RateLimitConfig{Name: "default/eg/http", Domain: "eg", Descriptors: []*confpb.RateLimitDescriptor{{
		Key: "user", RateLimit: &confpb.RateLimitPolicy{Unit: unit, RequestsPerUnit: rpu},
	}}}
	if err := s.Set(node, version, rc); err != nil {
		t.Fatal(err)
	}
}

// egEnv is the environment Envoy Gateway gives envoyproxy/ratelimit.
func egEnv(server, node string) []string {
	return []string{
		"CONFIG_TYPE=GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL=" + server,
		"CONFIG_GRPC_XDS_NODE_ID=" + node,
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"USE_STATSD=false",
		"LOG_LEVEL=info",
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=envoy-gateway-ratelimit-redis.envoy-gateway-system.svc.cluster.local:6379",
		"RUNTIME_ROOT=/data",
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_IGNOREDOTFILES=true",
		"RUNTIME_WATCH_ROOT=false",
	}
}

// Three nodes configured the way Envoy Gateway configures
// envoyproxy/ratelimit take their limits from a go-control-plane xDS
// server: before the first config every call fails as the reference's do;
// each version applies on every node (within a second, logged); a bad one
// is NACKed and the last good one keeps deciding; stopping the server
// changes nothing. The TLS variant speaks TLS 1.3 with client certificates,
// as Envoy Gateway's server demands.
func TestXDSConfigCluster(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  bool
	}{{"plaintext", false}, {"tls", true}} {
		t.Run(tc.name, func(t *testing.T) { runXDSCluster(t, tc.tls) })
	}
}

func runXDSCluster(t *testing.T, withTLS bool) {
	const nodeID = "envoy-gateway-system/eg"
	dir := t.TempDir()
	var tlsCfg *tls.Config
	var tlsEnv []string
	if withTLS {
		pool := writeTestPKI(t, dir, "envoy-gateway", "ratelimit")
		cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "envoy-gateway.crt"), filepath.Join(dir, "envoy-gateway.key"))
		if err != nil {
			t.Fatal(err)
		}
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
		tlsEnv = []string{
			"CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
			"CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + filepath.Join(dir, "ratelimit.crt"),
			"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + filepath.Join(dir, "ratelimit.key"),
			"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + filepath.Join(dir, "ca.pem"),
			"CONFIG_GRPC_XDS_SERVER_TLS_SAN=envoy-gateway",
		}
	}
	srv := startEGXDS(t, tlsCfg)
	// The harness passes --config; with CONFIG_TYPE=GRPC_XDS_SOTW nothing reads it.
	c, err := NewCluster(testBin, dir, filepath.Join(dir, "unused"), "127.0.0.1", 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var clients []pb.RateLimitServiceClient
	for _, n := range c.Nodes {
		n.Env = append(egEnv(srv.Addr, nodeID), tlsEnv...)
		conn, cl, err := Dial(n.GRPC)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients = append(clients, cl)
	}
	if err := c.StartAll(30 * time.Second); err != nil { // ready at once: FORCE_START_WITHOUT_INITIAL_CONFIG
		t.Fatal(err)
	}
	if err := WaitRing(30*time.Second, c.Nodes, c.Nodes); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for i, cl := range clients {
		_, err := cl.ShouldRateLimit(ctx, Request("eg", "user", "a"))
		if status.Code(err) != codes.Unknown || !strings.Contains(err.Error(), "no rate limit configuration loaded") {
			t.Fatalf("node %d before the first config: %v, want Unknown: no rate limit configuration loaded", i, err)
		}
	}

	// allowed sends n hits on user=key, round robin over the nodes, and
	// returns how many were OK.
	key := 0
	allowed := func(n int) (ok int, user string) {
		key++
		user = fmt.Sprintf("u%d-%d", time.Now().UnixNano(), key)
		for i := range n {
			resp, err := clients[i%len(clients)].ShouldRateLimit(ctx, Request("eg", "user", user))
			if err != nil {
				t.Fatalf("hit %d on user=%s: %v", i, user, err)
			}
			if resp.GetOverallCode() == pb.RateLimitResponse_OK {
				ok++
			}
		}
		return ok, user
	}
	expect := func(limit int, when string) {
		t.Helper()
		windowSafe(t, 10*time.Second)
		inOneMinute(t, func(int) (func(), string) {
			ok, user := allowed(limit + 3)
			return func() {
				if ok != limit {
					t.Fatalf("%s: %d of %d hits on user=%s allowed across the nodes, want the limit %d", when, ok, limit+3, user, limit)
				}
			}, when
		})
	}
	// applied waits until every node shows version v in /rlconfig and
	// returns how long the last one took.
	applied := func(v string, since time.Time) time.Duration {
		t.Helper()
		var slowest time.Duration
		for _, n := range c.Nodes {
			waitFor(t, 10*time.Second, n.ID+" applying version "+v, func() bool {
				_, body := httpDo(t, http.MethodGet, "http://"+n.Debug+"/rlconfig", "")
				return strings.HasPrefix(body, "# xds version_info: "+v+"\n")
			})
			slowest = max(slowest, time.Since(since))
		}
		return slowest
	}

	setEG(t, srv, nodeID, "1", 4, false)
	applied("1", time.Now())
	expect(4, "version 1")

	start := time.Now()
	setEG(t, srv, nodeID, "2", 6, false)
	took := applied("2", start)
	t.Logf("version 2 applied on all %d nodes within %v of the snapshot", len(c.Nodes), took)
	if took > time.Second {
		t.Logf("slower than a second: the machine is busy (the client applies each response as it arrives)")
	}
	expect(6, "version 2")
	for _, n := range c.Nodes {
		if _, body := httpDo(t, http.MethodGet, "http://"+n.Debug+"/metrics", ""); !strings.Contains(body, `ringlimit_config_xds_version_info{version="2"} 1`) {
			t.Fatalf("%s: /metrics has no ringlimit_config_xds_version_info{version=\"2\"} 1", n.ID)
		}
	}

	setEG(t, srv, nodeID, "3", 8, true)
	waitFor(t, 10*time.Second, "every node NACKing version 3", func() bool { return srv.NACKStreams() >= len(c.Nodes) })
	for _, nack := range srv.NACKs() {
		if nack.GetVersionInfo() != "2" || !strings.Contains(nack.GetErrorDetail().GetMessage(), `xds RateLimitConfig "default/eg/http": descriptors[0].rate_limit.unit: invalid rate limit unit 'UNKNOWN'`) {
			t.Fatalf("NACK of version %q: %q", nack.GetVersionInfo(), nack.GetErrorDetail().GetMessage())
		}
	}
	applied("2", time.Now())
	expect(6, "after the NACK of version 3")

	srv.Stop()
	for _, n := range c.Nodes {
		waitFor(t, 10*time.Second, n.ID+" seeing the xds server gone", func() bool {
			_, body := httpDo(t, http.MethodGet, "http://"+n.Debug+"/metrics", "")
			return strings.Contains(body, "\nringlimit_config_xds_connected 0\n")
		})
	}
	applied("2", time.Now())
	expect(6, "with the xds server gone")
	for _, n := range c.Nodes {
		if code, _ := httpDo(t, http.MethodGet, "http://"+n.HTTP+"/healthcheck", ""); code != http.StatusOK {
			t.Fatalf("%s: /healthcheck %d with the xds server gone", n.ID, code)
		}
	}
	if cr := c.Crashes(); len(cr) > 0 {
		t.Fatalf("crashes: %v", cr)
	}
}

// Without FORCE_START_WITHOUT_INITIAL_CONFIG a node is not ready until its
// first config arrives, as the reference waits for it.
func TestXDSNotReadyBeforeFirstConfig(t *testing.T) {
	dir := t.TempDir()
	srv := startEGXDS(t, nil)
	c, err := NewCluster(testBin, dir, filepath.Join(dir, "unused"), "127.0.0.1", 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	n := c.Nodes[0]
	for _, kv := range egEnv(srv.Addr, "n") {
		if !strings.HasPrefix(kv, "FORCE_START_WITHOUT_INITIAL_CONFIG=") {
			n.Env = append(n.Env, kv)
		}
	}
	if err := c.Start(n); err != nil {
		t.Fatal(err)
	}
	code := 0
	waitFor(t, 20*time.Second, "the node answering /healthcheck", func() bool {
		resp, err := http.Get("http://" + n.HTTP + "/healthcheck")
		if err != nil {
			return false
		}
		resp.Body.Close()
		code = resp.StatusCode
		return true
	})
	if code != http.StatusServiceUnavailable {
		t.Fatalf("/healthcheck %d before the first config, want 503", code)
	}
	setEG(t, srv, "n", "1", 4, false)
	if err := n.WaitReady(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}
