package chaos

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// writeTestPKI writes a CA (ca.pem) and one peer certificate per name
// (name.crt, name.key, for server and client use on 127.0.0.1 and as the
// DNS name name) into dir and
// returns the CA's pool.
func writeTestPKI(t *testing.T, dir string, names ...string) *x509.CertPool {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "chaos-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ca.pem", "CERTIFICATE", caDER)
	for i, name := range names {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
			DNSNames:    []string{name},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		write(name+".crt", "CERTIFICATE", der)
		write(name+".key", "EC PRIVATE KEY", kb)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return pool
}

// TestPeerMTLSCluster runs two nodes whose peer RPCs need mTLS: they
// become ready (the sync before ready is a peer RPC), and hits on one key
// sent half to each node are counted once, by the key's owner (forwarding
// is a peer RPC). The RLS client dials TLS without a certificate.
func TestPeerMTLSCluster(t *testing.T) {
	pki := t.TempDir()
	pool := writeTestPKI(t, pki, "node0", "node1")
	c := startNodes(t, 2, func(_ *Cluster, i int) []string {
		name := []string{"node0", "node1"}[i]
		return []string{
			"--peer-tls-cert", filepath.Join(pki, name+".crt"),
			"--peer-tls-key", filepath.Join(pki, name+".key"),
			"--peer-tls-ca", filepath.Join(pki, "ca.pem"),
		}
	})
	for _, n := range c.Nodes {
		if err := n.WaitReady(20 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := WaitRing(30*time.Second, c.Nodes, c.Nodes); err != nil {
		t.Fatal(err)
	}
	windowSafe(t, 10*time.Second)
	countedOnceOverTLS(t, c, credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}), "/mtls/")
	if cr := c.Crashes(); len(cr) > 0 {
		t.Errorf("crashes: %v", cr)
	}
}

// countedOnceOverTLS sends 120 hits on one key, spread evenly over the
// nodes of c through creds, and checks that the 100-a-minute limit let
// exactly 100 through (counted once, by the key's owner) and that the
// non-owners forwarded their hits to it: the peer RPCs work.
func countedOnceOverTLS(t *testing.T, c *Cluster, creds credentials.TransportCredentials, pathPrefix string) {
	t.Helper()
	n := len(c.Nodes)
	var clients []pb.RateLimitServiceClient
	for _, nd := range c.Nodes {
		conn, err := grpc.NewClient(nd.GRPC, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		clients = append(clients, pb.NewRateLimitServiceClient(conn))
	}
	// Every call carries a deadline, as Envoy's do: the entry node then
	// waits for the owner up to its cap (250 ms) rather than the 10 ms it
	// gives a call without one, which an mTLS round trip on a busy machine
	// can exceed (a local fallback: inexact, and counted below).
	hit := func(i int, path string) bool {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := clients[i%n].ShouldRateLimit(ctx, Request("ratelimit", "remote_address", "10.9.9.9", "PATH", path))
		if err != nil {
			t.Fatalf("hit %d: %v", i, err)
		}
		return resp.OverallCode == pb.RateLimitResponse_OK
	}
	fallbacks := func() float64 {
		sum := 0.0
		for _, nd := range c.Nodes {
			fb, _ := nd.Metric("ringlimit_local_fallbacks_total")
			sum += fb
		}
		return sum
	}
	// The hits must count in one minute window.
	inOneMinute(t, func(attempt int) (func(), string) {
		path := fmt.Sprintf("%s%d", pathPrefix, attempt)
		ok := 0
		for i := 0; i < 120; i++ { // the same number to each node; the limit is 100 a minute
			if hit(i, path) {
				ok++
			}
		}
		return func() {
			// Exact, unless an owner stalled past the entry node's 250 ms
			// cap on a loaded machine: each such local fallback may move
			// the count by one (and is bounded below).
			if fb := fallbacks(); (fb == 0 && ok != 100) || math.Abs(float64(ok-100)) > fb {
				t.Errorf("%d of 120 hits allowed across %d nodes with %v local fallbacks, want exactly 100 (give or take the fallbacks)", ok, n, fb)
			}
		}, fmt.Sprintf("%d allowed", ok)
	})
	// The non-owners' hits: each is forwarded to the owner over mTLS, or
	// decided from a lease of the key's quota that a forward over mTLS
	// brought back; after the first over-limit answer, a non-owner answers
	// the key over the limit itself until the window ends (hot-key
	// answers).
	var forwarded, leased, hot float64
	for _, nd := range c.Nodes {
		f, err := nd.Metric("ringlimit_forwarded_decisions_total")
		if err != nil {
			t.Fatal(err)
		}
		l, _ := nd.Metric(`ringlimit_leased_hits_total{event="used"`)
		h, _ := nd.Metric("ringlimit_hot_key_local_answers_total")
		forwarded, leased, hot = forwarded+f, leased+l, hot+h
	}
	// mTLS forwarding works: every non-owner forwarded (its first hit at
	// least), and nearly every op reached its owner or a lease from it (a
	// stall may make a few fall back; a broken handshake would make all of
	// them).
	minFwd, nonOwner := float64(n-1), float64(120*(n-1)/n)
	if fb := fallbacks(); forwarded < minFwd || forwarded+leased+hot+fb < nonOwner || fb > 3 {
		t.Errorf("forwarded %v, decided from leases %v, hot-key local answers %v, local fallbacks %v; want >= %v forwarded over mTLS, %v in all, at most a stall's few fallbacks",
			forwarded, leased, hot, fb, minFwd, nonOwner)
	}
}
