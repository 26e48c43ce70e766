package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// healthNode is an in-process `ringlimit serve` on 127.0.0.1 with its
// config directory, stopped at the end of the test.
type healthNode struct {
	http string
	hc   healthpb.HealthClient
}

var servingLine = regexp.MustCompile(`msg="ringlimit serving".* grpc=(\S+) http=(\S+)`)

func startHealthNode(t *testing.T, dir string, env environment) *healthNode {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- serveCmd(ctx, []string{"--config", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--debug-addr", "127.0.0.1:0", "--shutdown-timeout", "5s"}, env, io.Discard, &logs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("serve did not stop; log:\n%s", logs.String())
		}
	})
	var m []string
	waitUntil(t, "the serving log line", func() bool {
		m = servingLine.FindStringSubmatch(logs.String())
		return m != nil
	})
	conn, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &healthNode{http: m[2], hc: healthpb.NewHealthClient(conn)}
}

// waitUntil polls cond for at most 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling interval of a bounded wait
	}
}

// healthcheck returns /healthcheck's status code.
func (n *healthNode) healthcheck(t *testing.T) int {
	t.Helper()
	resp, err := http.Get("http://" + n.http + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// healthBody returns /healthcheck's body.
func (n *healthNode) healthBody(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + n.http + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkGRPC fails unless both gRPC health services say want.
func (n *healthNode) checkGRPC(t *testing.T, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	for _, name := range healthNames {
		r, err := n.hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatalf("gRPC health %q: %v", name, err)
		}
		if r.Status != want {
			t.Fatalf("gRPC health %q = %v, want %v", name, r.Status, want)
		}
	}
}

// With HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, a node whose config holds
// no domain is not ready: /healthcheck 500 and gRPC NOT_SERVING, as in the
// reference. Both flip together when a config arrives, and back when it
// goes. Without the setting such a node is ready.
func TestHealthWithConfig(t *testing.T) {
	dir := t.TempDir()
	n := startHealthNode(t, dir, environment{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true"})
	if code := n.healthcheck(t); code != http.StatusInternalServerError {
		t.Fatalf("/healthcheck with no config = %d, want 500", code)
	}
	if body := n.healthBody(t); body != "NOT READY: no config loaded: the config has no domain (--healthy-with-config)\n" {
		t.Errorf("/healthcheck body %q", body)
	}
	n.checkGRPC(t, healthpb.HealthCheckResponse_NOT_SERVING)

	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "/healthcheck 200 once a config is loaded", func() bool { return n.healthcheck(t) == http.StatusOK })
	n.checkGRPC(t, healthpb.HealthCheckResponse_SERVING) // at once, not a tick later

	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "/healthcheck 500 once the config is gone", func() bool { return n.healthcheck(t) == http.StatusInternalServerError })
	n.checkGRPC(t, healthpb.HealthCheckResponse_NOT_SERVING)

	other := startHealthNode(t, t.TempDir(), nil)
	if code := other.healthcheck(t); code != http.StatusOK {
		t.Fatalf("/healthcheck with no config and no setting = %d, want 200", code)
	}
	other.checkGRPC(t, healthpb.HealthCheckResponse_SERVING)
}

// freePort returns a loopback address nothing listens on (it did a moment
// ago, for the kernel to pick the port).
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// /healthcheck's 503 says why the node is not ready: here, a join whose
// seed does not answer, naming the seed and the last error.
func TestHealthcheckSaysWhyNotReady(t *testing.T) {
	leakCheck(t)
	httpAddr, seed, grpcAddr, gossipAddr := freePort(t), freePort(t), freePort(t), freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- serveCmd(ctx, []string{"--config", "../../deploy/examples/config", "--node-name", "n1",
			"--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--debug-addr", "127.0.0.1:0",
			"--gossip-addr", gossipAddr, "--join", seed, "--shutdown-timeout", "5s"}, nil, io.Discard, &errb)
	}()
	client := &http.Client{Timeout: 2 * time.Second}
	want := "NOT READY: joining the cluster: no peer reached yet"
	var last string
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(last, "last attempt: membership: join ["+seed+"]") {
		if time.Now().After(deadline) {
			t.Fatalf("/healthcheck: %s\nlog:\n%s", last, errb.String())
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited %d:\n%s", code, errb.String())
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := client.Get("http://" + httpAddr + "/healthcheck")
		if err != nil {
			last = err.Error()
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	if !strings.HasPrefix(last, "500 "+want) {
		t.Errorf("/healthcheck: %q, want 500 %q", last, want)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("serve exited %d:\n%s", code, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop within 30 s of its context ending")
	}
}

// FORCE_START_WITHOUT_INITIAL_CONFIG makes a node waiting for its first xDS
// config ready, unless HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED asks for a
// config with a domain first: with both, as in the reference, it is not
// ready until one arrives.
func TestHealthForceStartWithConfig(t *testing.T) {
	xds := environment{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=127.0.0.1:1", "FORCE_START_WITHOUT_INITIAL_CONFIG=true"}
	n := startHealthNode(t, t.TempDir(), xds)
	if code := n.healthcheck(t); code != http.StatusOK {
		t.Fatalf("force start: /healthcheck before the first config = %d, want 200", code)
	}
	n = startHealthNode(t, t.TempDir(), append(xds, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true"))
	if code := n.healthcheck(t); code != http.StatusInternalServerError {
		t.Fatalf("force start with --healthy-with-config: /healthcheck before the first config = %d, want 500", code)
	}
	if body := n.healthBody(t); !strings.HasPrefix(body, "NOT READY: no config loaded: waiting for the first config") {
		t.Errorf("/healthcheck body %q", body)
	}
	n.checkGRPC(t, healthpb.HealthCheckResponse_NOT_SERVING)
}
