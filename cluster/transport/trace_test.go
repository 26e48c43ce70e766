package transport

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// tracedCluster starts nodes a and b, each tracing to its own recorder.
func tracedCluster(t *testing.T) (map[string]*fwdTestNode, map[string]*tracetest.SpanRecorder, map[string]*sdktrace.TracerProvider) {
	t.Helper()
	recs := map[string]*tracetest.SpanRecorder{}
	tps := map[string]*sdktrace.TracerProvider{}
	nodes := fwdStartCluster(t, []string{"a", "b"}, nil, func(c *ForwarderConfig) {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
		t.Cleanup(func() { tp.Shutdown(context.Background()) })
		recs[c.Self], tps[c.Self] = rec, tp
		c.Tracer = tp.Tracer("test")
	})
	return nodes, recs, tps
}

// A forwarded op of a sampled decision has a forward span at the entry
// node, child of the decision's, and the owner's span is its child in the
// same trace; an unsampled decision leaves no span on either side.
func TestForwardTrace(t *testing.T) {
	nodes, recs, tps := tracedCluster(t)
	a := nodes["a"]
	ctx, root := tps["a"].Tracer("test").Start(context.Background(), "ShouldRateLimit")
	ops := []bucket.Op{fwdOp("b/1"), fwdOp("a/1")}
	res := make([]bucket.Result, len(ops))
	a.f.Apply(ctx, a.now, ops, res)
	root.End()

	var fwd, decide []sdktrace.ReadOnlySpan
	for _, s := range recs["a"].Ended() {
		if s.Name() == spanForward {
			fwd = append(fwd, s)
		}
	}
	for _, s := range recs["b"].Ended() {
		if s.Name() == spanDecide {
			decide = append(decide, s)
		}
	}
	if len(fwd) != 1 || len(decide) != 1 {
		t.Fatalf("%d forward spans at a, %d decide spans at b; want one each (the local op has none)", len(fwd), len(decide))
	}
	rootSC := root.SpanContext()
	if fwd[0].Parent().SpanID() != rootSC.SpanID() || fwd[0].SpanContext().TraceID() != rootSC.TraceID() || fwd[0].SpanKind() != trace.SpanKindClient {
		t.Errorf("forward span: parent %v, trace %v, kind %v; want child of %v", fwd[0].Parent().SpanID(), fwd[0].SpanContext().TraceID(), fwd[0].SpanKind(), rootSC)
	}
	if d := decide[0]; d.Parent().SpanID() != fwd[0].SpanContext().SpanID() || d.SpanContext().TraceID() != rootSC.TraceID() || !d.Parent().IsRemote() {
		t.Errorf("owner's span: parent %v (remote %v), trace %v; want a child of the forward span %v in trace %v",
			d.Parent().SpanID(), d.Parent().IsRemote(), d.SpanContext().TraceID(), fwd[0].SpanContext().SpanID(), rootSC.TraceID())
	}
	if !hasAttr(fwd[0], "ringlimit.peer", "b") || !hasAttr(fwd[0], "ringlimit.outcome", outcomeAnswered) || !hasAttr(decide[0], "ringlimit.from", "a") {
		t.Errorf("attributes: forward %v, decide %v", fwd[0].Attributes(), decide[0].Attributes())
	}

	// Not sampled: no span anywhere.
	na, nb := len(recs["a"].Ended()), len(recs["b"].Ended())
	unsampled := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}}))
	for _, c := range []context.Context{context.Background(), unsampled} {
		a.f.Apply(c, a.now, ops, res)
	}
	if len(recs["a"].Ended()) != na || len(recs["b"].Ended()) != nb {
		t.Errorf("unsampled decisions made spans: a %d -> %d, b %d -> %d", na, len(recs["a"].Ended()), nb, len(recs["b"].Ended()))
	}
}

func hasAttr(s sdktrace.ReadOnlySpan, key, value string) bool {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key && kv.Value.Emit() == value {
			return true
		}
	}
	return false
}

// A trace field of the wrong length refuses the batch; a good one or none
// is applied.
func TestDecideTraceField(t *testing.T) {
	nodes, _, _ := tracedCluster(t)
	conn, err := grpc.NewClient(nodes["b"].addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	good := encodeTrace(trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled}))
	for _, tt := range []struct {
		name  string
		trace []byte
		want  codes.Code
	}{
		{"none", nil, codes.OK},
		{"a span context", good[:], codes.OK},
		{"short", good[:24], codes.InvalidArgument},
		{"long", append(good[:], 0), codes.InvalidArgument},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := peerpb.NewPeerClient(conn).Decide(context.Background(), &peerpb.DecideRequest{From: "a",
				Ops: []*peerpb.Op{{Key: []byte("b/9"), Requests: 10, UnitNs: 1e9, Hits: 1, Trace: tt.trace}}})
			if status.Code(err) != tt.want {
				t.Fatalf("%v, want %v", err, tt.want)
			}
		})
	}
	if sc, ok := decodeTrace(good[:]); !ok || sc.TraceID() != (trace.TraceID{1}) || sc.SpanID() != (trace.SpanID{2}) || !sc.IsSampled() {
		t.Errorf("decodeTrace(encodeTrace(x)) = %v, %v", sc, ok)
	}
}
