package simnet_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/cluster/simnet"
)

// gRPC runs over simnet streams: calls succeed, time out across a
// partition, succeed after Heal, and fail fast once the server's host
// crashes.
func TestGRPCHealth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(4, simnet.Config{StreamLatency: time.Millisecond})
		defer n.Close()
		a, b := mustHost(t, n, "10.0.0.1"), mustHost(t, n, "10.0.0.2")

		srv := grpc.NewServer()
		healthpb.RegisterHealthServer(srv, health.NewServer())
		served := make(chan error, 1)
		go func() { served <- srv.Serve(mustListen(t, a, 9000)) }()
		defer func() {
			srv.Stop()
			<-served // the crash closed its listener
		}()

		cc, err := grpc.NewClient("passthrough:///10.0.0.1:9000",
			grpc.WithContextDialer(b.Dial),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		client := healthpb.NewHealthClient(cc)
		check := func() (time.Duration, codes.Code) {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			return time.Since(start), status.Code(err)
		}

		start := time.Now()
		for i := range 100 {
			if d, code := check(); code != codes.OK {
				t.Fatalf("call %d: %v after %v", i, code, d)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("100 calls in %v of virtual time", time.Since(start))

		must(t, n.Partition([]string{"10.0.0.1"}, []string{"10.0.0.2"}))
		for i := range 5 {
			if d, code := check(); code != codes.DeadlineExceeded {
				t.Errorf("call %d across a partition: %v after %v, want DeadlineExceeded", i, code, d)
			}
		}
		n.Heal()
		for i := range 5 {
			if d, code := check(); code != codes.OK {
				t.Errorf("call %d after heal: %v after %v", i, code, d)
			}
		}

		must(t, n.Crash("10.0.0.1"))
		for i := range 5 {
			if d, code := check(); code != codes.Unavailable || d >= 20*time.Millisecond {
				t.Errorf("call %d to a crashed host: %v after %v, want Unavailable at once", i, code, d)
			}
		}
	})
}
