package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// registerTracingFlags adds the --tracing* flags and their reference
// variables (TRACING_*) to fs and legacy. The exporter's endpoint, headers,
// TLS and timeouts come from the OTEL_EXPORTER_OTLP_* variables, which the
// OpenTelemetry SDK reads itself.
func registerTracingFlags(fs *flag.FlagSet, legacy map[string]legacyEnv, c *serveConfig) {
	fs.BoolVar(&c.TracingEnabled, "tracing", false, "export OpenTelemetry traces of rate limit decisions (OTLP; endpoint and options from the OTEL_EXPORTER_OTLP_* variables)")
	fs.StringVar(&c.TracingServiceName, "tracing-service-name", "RateLimit", "service.name of the traces")
	fs.StringVar(&c.TracingNamespace, "tracing-service-namespace", "", "service.namespace of the traces (empty: none)")
	fs.StringVar(&c.TracingInstanceID, "tracing-service-instance-id", "", "service.instance.id of the traces (default: --node-name)")
	fs.Float64Var(&c.TracingSamplingRate, "tracing-sampling-rate", 1, "fraction of decisions traced, 0 to 1, unless the caller's trace context decides (parent-based)")
	fs.StringVar(&c.TracingProtocol, "tracing-exporter-protocol", "http", "OTLP protocol: http (protobuf over HTTP) or grpc")
	legacy["tracing"] = plainEnv("TRACING_ENABLED")
	legacy["tracing-service-name"] = plainEnv("TRACING_SERVICE_NAME")
	legacy["tracing-service-namespace"] = plainEnv("TRACING_SERVICE_NAMESPACE")
	legacy["tracing-service-instance-id"] = plainEnv("TRACING_SERVICE_INSTANCE_ID")
	legacy["tracing-sampling-rate"] = plainEnv("TRACING_SAMPLING_RATE")
	legacy["tracing-exporter-protocol"] = plainEnv("TRACING_EXPORTER_PROTOCOL")
}

// validateTracing checks the tracing flags (on or not: a bad value is a
// mistake either way).
func (c *serveConfig) validateTracing() []error {
	var errs []error
	if !(c.TracingSamplingRate >= 0 && c.TracingSamplingRate <= 1) || math.IsNaN(c.TracingSamplingRate) {
		errs = append(errs, fmt.Errorf("serve: --tracing-sampling-rate (TRACING_SAMPLING_RATE): %v is not in [0, 1]", c.TracingSamplingRate))
	}
	switch strings.ToLower(c.TracingProtocol) {
	case "http", "grpc":
	default:
		errs = append(errs, fmt.Errorf("serve: --tracing-exporter-protocol (TRACING_EXPORTER_PROTOCOL): unknown protocol %q (http, grpc)", c.TracingProtocol))
	}
	if c.TracingEnabled && c.TracingServiceName == "" {
		errs = append(errs, errors.New("serve: --tracing-service-name (TRACING_SERVICE_NAME): empty"))
	}
	return errs
}

// tracingFlushTimeout bounds the export of the last spans at shutdown.
const tracingFlushTimeout = 5 * time.Second

// rlsMethod is the one RPC traced at the gRPC listener.
const rlsMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// tracing is the running tracer: a span per ShouldRateLimit call, child of
// the caller's W3C trace context when it sends one, and the spans of the
// cluster's forwards (cluster.NodeConfig.Tracer). A nil *tracing is
// tracing off: no interceptor is installed and no span is started.
type tracing struct {
	tp        *sdktrace.TracerProvider
	tracer    trace.Tracer
	prop      propagation.TextMapPropagator
	maxDomain int // longest domain put in a span attribute
}

// newTracing starts the exporter and the tracer provider; nil when tracing
// is off.
func newTracing(c *serveConfig, log *slog.Logger) (*tracing, error) {
	if !c.TracingEnabled {
		return nil, nil
	}
	var client otlptrace.Client
	if strings.EqualFold(c.TracingProtocol, "grpc") {
		client = otlptracegrpc.NewClient()
	} else {
		client = otlptracehttp.NewClient()
	}
	exp, err := otlptrace.New(context.Background(), client)
	if err != nil {
		return nil, fmt.Errorf("serve: tracing: %w", err)
	}
	instance := c.TracingInstanceID
	if instance == "" {
		instance = c.NodeName
	}
	attrs := []attribute.KeyValue{
		attribute.String("service.name", c.TracingServiceName),
		attribute.String("service.instance.id", instance),
		attribute.String("service.version", version()),
	}
	if c.TracingNamespace != "" {
		attrs = append(attrs, attribute.String("service.namespace", c.TracingNamespace))
	}
	// OTEL_RESOURCE_ATTRIBUTES adds attributes; the settings above win.
	res, err := resource.New(context.Background(), resource.WithFromEnv(), resource.WithAttributes(attrs...))
	if err != nil {
		log.Warn("tracing: OTEL_RESOURCE_ATTRIBUTES not read", "err", err)
		res = resource.NewSchemaless(attrs...)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.TracingSamplingRate))),
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
	)
	log.Info("tracing on", "protocol", strings.ToLower(c.TracingProtocol), "service_name", c.TracingServiceName,
		"service_namespace", c.TracingNamespace, "service_instance_id", instance, "sampling_rate", c.TracingSamplingRate)
	return &tracing{
		tp:        tp,
		tracer:    tp.Tracer("github.com/ringlimit/ringlimit"),
		prop:      propagation.TraceContext{},
		maxDomain: c.MaxKeyLen,
	}, nil
}

// tracerOrNil is the tracer for the cluster, nil when tracing is off.
func (t *tracing) tracerOrNil() trace.Tracer {
	if t == nil {
		return nil
	}
	return t.tracer
}

// serverOptions install the ShouldRateLimit span; none when tracing is off.
func (t *tracing) serverOptions() []grpc.ServerOption {
	if t == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(t.unary)}
}

// unary traces a ShouldRateLimit call: span ShouldRateLimit with the
// domain, and the overall code or the error it ended with.
func (t *tracing) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if info.FullMethod != rlsMethod {
		return h(ctx, req)
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		ctx = t.prop.Extract(ctx, mdCarrier(md))
	}
	r, _ := req.(*pb.RateLimitRequest)
	domain := r.GetDomain()
	if len(domain) > t.maxDomain { // refused by the service; still named, bounded
		domain = strings.ToValidUTF8(domain[:t.maxDomain], "")
	}
	ctx, span := t.tracer.Start(ctx, "ShouldRateLimit", trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("rpc.system", "grpc"),
		attribute.String("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
		attribute.String("rpc.method", "ShouldRateLimit"),
		attribute.String("ratelimit.domain", domain),
		attribute.Int("ratelimit.descriptors", len(r.GetDescriptors())),
	))
	defer span.End()
	resp, err := h(ctx, req)
	if err != nil {
		st := status.Convert(err)
		span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(st.Code())))
		span.SetStatus(otelcodes.Error, st.Message())
		return resp, err
	}
	if out, ok := resp.(*pb.RateLimitResponse); ok {
		span.SetAttributes(attribute.String("ratelimit.code", out.GetOverallCode().String()))
	}
	return resp, err
}

// shutdown exports the spans still buffered, within ctx.
func (t *tracing) shutdown(ctx context.Context, log *slog.Logger) {
	if t == nil {
		return
	}
	if err := t.tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: exporting the last spans failed", "err", err)
	}
}

// mdCarrier reads a trace context from gRPC metadata.
type mdCarrier metadata.MD

func (m mdCarrier) Get(key string) string {
	if v := metadata.MD(m).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (m mdCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }

func (m mdCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
