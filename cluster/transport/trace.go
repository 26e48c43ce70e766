package transport

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ringlimit/ringlimit/bucket"
)

// Tracing of forwarded decisions (ForwarderConfig.Tracer). A forwarded op
// of a sampled decision gets a client span, ringlimit.forward, child of the
// caller's span; the op carries that span's context to its owner in
// peerpb.Op.Trace, and the owner applies it under a server span,
// ringlimit.peer.decide, child of the forward span. Ops of many decisions
// share one batch, each with its own context. With a nil Tracer none of
// this runs: the forwarder checks f.tracer and nothing else.

// Span names.
const (
	spanForward = "ringlimit.forward"
	spanDecide  = "ringlimit.peer.decide"
)

// traceLen is the length of peerpb.Op.Trace: trace ID, span ID, flags.
const traceLen = 16 + 8 + 1

// wireTrace is a span context in its wire form (peerpb.Op.Trace).
type wireTrace [traceLen]byte

func encodeTrace(sc trace.SpanContext) (w wireTrace) {
	tid, sid := sc.TraceID(), sc.SpanID()
	copy(w[:16], tid[:])
	copy(w[16:24], sid[:])
	w[24] = byte(sc.TraceFlags())
	return w
}

// decodeTrace reads a wire span context; ok is false if b is not one.
func decodeTrace(b []byte) (sc trace.SpanContext, ok bool) {
	if len(b) != traceLen {
		return trace.SpanContext{}, false
	}
	var tid trace.TraceID
	var sid trace.SpanID
	copy(tid[:], b[:16])
	copy(sid[:], b[16:24])
	sc = trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(b[24]) & trace.FlagsSampled, Remote: true,
	})
	return sc, sc.IsValid()
}

// startForward starts it's forward span when ctx holds a sampled span, and
// stores the span's context in it for the owner. Call only with a tracer.
func (f *Forwarder) startForward(ctx context.Context, it *fwdItem) {
	if !trace.SpanContextFromContext(ctx).IsSampled() {
		return
	}
	_, span := f.tracer.Start(ctx, spanForward, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("ringlimit.peer", it.peer.id), attribute.Bool("ringlimit.relayed", it.relayed)))
	it.span = span
	it.trace, it.traced = encodeTrace(span.SpanContext()), true
}

// Outcomes of a forwarded op, on its forward span.
const (
	outcomeAnswered = "answered"
	outcomeTimeout  = "timeout"
	outcomeError    = "error"
	outcomeNotSent  = "not sent"
)

// endForward ends it's forward span, if any, with the op's outcome.
func (it *fwdItem) endForward(outcome string, res bucket.Result, err error) {
	span := it.span
	if span == nil {
		return
	}
	it.span = nil
	span.SetAttributes(attribute.String("ringlimit.outcome", outcome))
	if outcome == outcomeAnswered {
		span.SetAttributes(attribute.Bool("ringlimit.over", res.Over))
	} else {
		// The entry node decided the op itself (a fallback).
		msg := outcome
		if err != nil {
			msg = err.Error()
		}
		span.SetStatus(otelcodes.Error, msg)
	}
	span.End()
}

// startDecide starts the owner's span for an op that carries a trace
// context (w, validated). Call only with a tracer.
func (f *Forwarder) startDecide(ctx context.Context, from string, w []byte) trace.Span {
	parent, ok := decodeTrace(w)
	if !ok {
		return nil
	}
	_, span := f.tracer.Start(trace.ContextWithRemoteSpanContext(ctx, parent), spanDecide,
		trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attribute.String("ringlimit.from", from)))
	return span
}

// endDecide ends the owner's span with its decision.
func endDecide(span trace.Span, res bucket.Result) {
	span.SetAttributes(attribute.Bool("ringlimit.over", res.Over), attribute.Int64("ringlimit.count", int64(min(res.Count, 1<<63-1))))
	span.End()
}
