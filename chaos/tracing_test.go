package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// otlpSpan is what the test keeps of a received span.
type otlpSpan struct {
	traceID, spanID, parentID string // hex
	name, instance            string
	attrs                     map[string]string
}

// otlpReceiver is an OTLP/gRPC trace collector that keeps every span.
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []otlpSpan
}

func (r *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		instance := attrMap(rs.GetResource().GetAttributes())["service.instance.id"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, otlpSpan{
					traceID: hex.EncodeToString(s.GetTraceId()), spanID: hex.EncodeToString(s.GetSpanId()),
					parentID: hex.EncodeToString(s.GetParentSpanId()), name: s.GetName(), instance: instance,
					attrs: attrMap(s.GetAttributes()),
				})
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func attrMap(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		v := kv.GetValue()
		switch {
		case v.GetStringValue() != "":
			m[kv.GetKey()] = v.GetStringValue()
		default:
			m[kv.GetKey()] = fmt.Sprint(v.GetValue())
		}
	}
	return m
}

func (r *otlpReceiver) byTrace(traceID string) []otlpSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []otlpSpan
	for _, s := range r.spans {
		if s.traceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

// TestTracingAcrossNodes runs two nodes that export traces over OTLP/gRPC
// (TRACING_* and OTEL_EXPORTER_OTLP_* as with the reference) to a
// collector in the test. Each key is asked of both nodes, under a W3C
// trace context of the test's, so one of the two asks is forwarded: its
// trace holds the entry node's ShouldRateLimit span (child of the test's
// span, with the domain and the code), the entry node's forward span (its
// child) and the owner's decide span (the forward span's child), all with
// the test's trace ID.
func TestTracingAcrossNodes(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	recv := &otlpReceiver{}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, recv)
	served := make(chan struct{})
	go func() { defer close(served); gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); <-served })

	c := startNodes(t, 2, func(c *Cluster, i int) []string {
		c.Nodes[i].Env = []string{
			"TRACING_ENABLED=true",
			"TRACING_EXPORTER_PROTOCOL=grpc",
			"TRACING_SERVICE_NAMESPACE=chaos",
			"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + lis.Addr().String(),
			"OTEL_BSP_SCHEDULE_DELAY=100", // ms: export soon, not every 5 s
		}
		return nil
	})
	for _, n := range c.Nodes {
		if err := n.WaitReady(20 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := WaitRing(30*time.Second, c.Nodes, c.Nodes); err != nil {
		t.Fatal(err)
	}
	var clients []pb.RateLimitServiceClient
	for _, n := range c.Nodes {
		conn, err := grpc.NewClient(n.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		clients = append(clients, pb.NewRateLimitServiceClient(conn))
	}

	type ask struct{ traceID, parent string }
	var asks []ask
	for k := range 4 {
		for i, cl := range clients {
			tid, sid := make([]byte, 16), make([]byte, 8)
			rand.Read(tid)
			rand.Read(sid)
			a := ask{hex.EncodeToString(tid), hex.EncodeToString(sid)}
			asks = append(asks, a)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+a.traceID+"-"+a.parent+"-01")
			_, err := cl.ShouldRateLimit(ctx, Request("ratelimit", "remote_address", "10.7.7.7", "PATH", fmt.Sprintf("/trace/%d", k)))
			cancel()
			if err != nil {
				t.Fatalf("key %d at node %d: %v", k, i, err)
			}
		}
	}

	// complete finds a trace with the three spans, linked.
	complete := func() (string, bool) {
		for _, a := range asks {
			var decision, fwd *otlpSpan
			spans := recv.byTrace(a.traceID)
			for i := range spans {
				if s := &spans[i]; s.name == "ShouldRateLimit" && s.parentID == a.parent {
					decision = s
				}
			}
			if decision == nil {
				continue
			}
			for i := range spans {
				if s := &spans[i]; s.name == "ringlimit.forward" && s.parentID == decision.spanID && s.instance == decision.instance {
					fwd = s
				}
			}
			if fwd == nil {
				continue
			}
			for _, s := range spans {
				if s.name == "ringlimit.peer.decide" && s.parentID == fwd.spanID && s.instance != decision.instance {
					if decision.attrs["ratelimit.domain"] != "ratelimit" || decision.attrs["ratelimit.code"] != "OK" {
						return fmt.Sprintf("decision span attributes %v, want domain ratelimit and code OK", decision.attrs), true
					}
					return "", true
				}
			}
		}
		return "", false
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		problem, ok := complete()
		if ok {
			if problem != "" {
				t.Error(problem)
			}
			break
		}
		if time.Now().After(deadline) {
			recv.mu.Lock()
			n := len(recv.spans)
			recv.mu.Unlock()
			t.Fatalf("no trace with a decision, a forward and the owner's span within 20 s (%d spans received)", n)
		}
		time.Sleep(50 * time.Millisecond) // polling interval of a bounded wait
	}
	if cr := c.Crashes(); len(cr) > 0 {
		t.Errorf("crashes: %v", cr)
	}
}
