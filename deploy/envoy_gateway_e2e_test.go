package deploy_test

// End to end: three `ringlimit serve` processes with the environment Envoy
// Gateway's rate limit pods get under deploy/envoy-gateway's config (TLS on
// the gRPC port, peer mTLS from the same certificate) form one cluster, and
// an RLS client speaking TLS with a client certificate, as Envoy does, sees
// one shared limit whichever pod it calls. The rate limit config comes from
// a file, not from an xDS server.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
)

// egCerts writes what Envoy Gateway's certgen puts into the Secret
// envoy-rate-limit (ca.crt, tls.crt, tls.key: a leaf for
// *.envoy-gateway-system with no extended key usage, signed by its CA) into
// dir, and returns a client certificate from the same CA (as Envoy's) and
// the CA pool.
func egCerts(t *testing.T, dir string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "envoy-gateway"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, cn string) ([]byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			DNSNames: []string{"*.envoy-gateway-system"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	}
	crt, key := leaf(2, "envoy")
	for name, data := range map[string][]byte{
		"ca.crt":  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		"tls.crt": crt,
		"tls.key": key,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	clientCrt, clientKey := leaf(3, "envoy")
	client, err := tls.X509KeyPair(clientCrt, clientKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return client, pool
}

// xdsVar tells the variables that make the config come from Envoy
// Gateway's xDS server. This test has none: it gives the pods the seed
// config from a file instead.
func xdsVar(name string) bool {
	return name == "CONFIG_TYPE" || name == "FORCE_START_WITHOUT_INITIAL_CONFIG" || strings.HasPrefix(name, "CONFIG_GRPC_XDS_")
}

func TestEnvoyGatewayE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test skipped in -short mode")
	}
	bin := needBinary(t)
	k := loadEGKit(t)
	c := k.deployment.Spec.Template.Spec.Containers[0]

	// Each process is a pod with its own loopback IP, listening where the
	// pod does (Envoy Gateway's ports, ringlimit's defaults for the rest).
	const grpcPort, httpPort, debugPort, gossipPort = 8081, 8080, 19001, 7946
	ports := []corev1.ContainerPort{{ContainerPort: grpcPort}, {ContainerPort: httpPort}, {ContainerPort: debugPort},
		{ContainerPort: gossipPort}, {ContainerPort: gossipPort, Protocol: corev1.ProtocolUDP}}
	ips := freeBlock(t, corev1.Container{Ports: ports})

	// The Secret volumes: Envoy Gateway's certificates at /certs, the gossip
	// key at the config's mount; here, directories of their own.
	certDir, keyDir := t.TempDir(), t.TempDir()
	clientCert, caPool := egCerts(t, certDir)
	gossipKey := make([]byte, 32)
	if _, err := rand.Read(gossipKey); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(keyDir, "gossip.key"), []byte(base64.StdEncoding.EncodeToString(gossipKey)+"\n"), 0o440); err != nil {
		t.Fatal(err)
	}
	var join []string
	for _, ip := range ips {
		join = append(join, net.JoinHostPort(ip, fmt.Sprint(gossipPort)))
	}

	var procs []*proc
	var names []string
	for i, ip := range ips {
		p := pod{name: fmt.Sprintf("envoy-ratelimit-7d9f8c6b5-%05d", i), namespace: k.deployment.Namespace, ip: ip}
		names = append(names, p.name)
		env, err := podEnv(c, p)
		if err != nil {
			t.Fatal(err)
		}
		var run []string
		for _, kv := range env {
			name, v, _ := strings.Cut(kv, "=")
			switch {
			case xdsVar(name):
				continue
			case strings.HasPrefix(v, "/certs/"):
				v = filepath.Join(certDir, strings.TrimPrefix(v, "/certs/"))
			case name == "RINGLIMIT_GOSSIP_KEY_FILE":
				v = filepath.Join(keyDir, filepath.Base(v))
			case name == "RINGLIMIT_JOIN":
				// What cluster DNS resolves the peers Service to.
				v = strings.Join(join, ",")
			case name == "RINGLIMIT_DEBUG_ADDR":
				v = net.JoinHostPort(ip, fmt.Sprint(portOf(t, v)))
			}
			run = append(run, name+"="+v)
		}
		run = append(run,
			fmt.Sprintf("RINGLIMIT_GRPC_ADDR=%s:%d", ip, grpcPort),
			fmt.Sprintf("RINGLIMIT_HTTP_ADDR=%s:%d", ip, httpPort),
			fmt.Sprintf("RINGLIMIT_GOSSIP_ADDR=%s:%d", ip, gossipPort))
		args, err := podArgs(c, env)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config="+filepath.Dir(exampleConfig))
		procs = append(procs, startProc(t, p.name, run, append([]string{bin}, args[1:]...)...))
	}

	client := &http.Client{Timeout: 2 * time.Second}
	var debugAddrs []string
	for i, ip := range ips {
		addr := net.JoinHostPort(ip, fmt.Sprint(debugPort))
		debugAddrs = append(debugAddrs, addr)
		waitFor(t, names[i]+"'s ring to hold every pod", procs, func() error {
			ring, err := ringAt(client, addr)
			if err == nil && !slices.Equal(ring, names) {
				err = fmt.Errorf("ring %v", ring)
			}
			return err
		})
	}

	// Envoy's side: TLS to the RLS port, verifying the CA (not the host
	// name, as Envoy Gateway configures it), with a client certificate.
	tlsCfg := &tls.Config{RootCAs: caPool, Certificates: []tls.Certificate{clientCert}, ServerName: "envoy-ratelimit.envoy-gateway-system"}
	var clients []rlspb.RateLimitServiceClient
	for i, ip := range ips {
		conn, err := grpc.NewClient(net.JoinHostPort(ip, fmt.Sprint(grpcPort)), grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		waitHealthServing(t, names[i], procs, conn)
		clients = append(clients, rlspb.NewRateLimitServiceClient(conn))
	}
	// Forwarded decisions and replication run over peer mTLS: a count shared
	// by all three shows they do.
	checkSharedLimit(t, clients, seedConfig(t).Domain, func() float64 { return fallbackSum(t, client, debugAddrs) })
}
