package chaos

import (
	"context"
	"crypto/tls"
	"path/filepath"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TestRLSMTLSCluster runs three nodes whose RLS clients need a client
// certificate, set as Envoy Gateway sets it (GRPC_SERVER_USE_TLS,
// GRPC_SERVER_TLS_CERT/_KEY and GRPC_SERVER_TLS_CA_CERT, here with
// GRPC_CLIENT_TLS_SAN too), and peer mTLS with its own CA: the nodes become
// ready and forward to each other, hits with a client certificate are
// counted once across the three, and a client without one is refused.
func TestRLSMTLSCluster(t *testing.T) {
	pki, clientPKI := t.TempDir(), t.TempDir()
	names := []string{"node0", "node1", "node2"}
	pool := writeTestPKI(t, pki, names...)
	writeTestPKI(t, clientPKI, "envoy") // its certificate names 127.0.0.1
	c := startNodes(t, 3, func(c *Cluster, i int) []string {
		cert, key := filepath.Join(pki, names[i]+".crt"), filepath.Join(pki, names[i]+".key")
		c.Nodes[i].Env = []string{
			"GRPC_SERVER_USE_TLS=true",
			"GRPC_SERVER_TLS_CERT=" + cert,
			"GRPC_SERVER_TLS_KEY=" + key,
			"GRPC_SERVER_TLS_CA_CERT=" + filepath.Join(clientPKI, "ca.pem"),
			"GRPC_CLIENT_TLS_SAN=127.0.0.1",
		}
		return []string{"--peer-tls-cert", cert, "--peer-tls-key", key, "--peer-tls-ca", filepath.Join(pki, "ca.pem")}
	})
	for _, n := range c.Nodes {
		if err := n.WaitReady(20 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := WaitRing(30*time.Second, c.Nodes, c.Nodes); err != nil {
		t.Fatal(err)
	}

	// No client certificate: refused by every node.
	noCert := credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	for _, n := range c.Nodes {
		conn, err := grpc.NewClient(n.GRPC, grpc.WithTransportCredentials(noCert))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, Request("ratelimit", "remote_address", "10.9.9.8", "PATH", "/nocert"))
		cancel()
		conn.Close()
		if err == nil {
			t.Errorf("%s answered a client without a certificate", n.ID)
		}
	}

	envoy, err := tls.LoadX509KeyPair(filepath.Join(clientPKI, "envoy.crt"), filepath.Join(clientPKI, "envoy.key"))
	if err != nil {
		t.Fatal(err)
	}
	windowSafe(t, 10*time.Second)
	countedOnceOverTLS(t, c, credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{envoy}}), "/rlsmtls/")
	if cr := c.Crashes(); len(cr) > 0 {
		t.Errorf("crashes: %v", cr)
	}
}
