package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

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
	if !strings.HasPrefix(last, "503 "+want) {
		t.Errorf("/healthcheck: %q, want 503 %q", last, want)
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
