package main

import "testing"

// The reference's TRACING_* variables set the --tracing* flags; a bad
// sampling rate or protocol refuses to start, naming the flag and variable.
func TestTracingEnv(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     []string
		check   func(c *serveConfig) bool
		wantErr string
	}{
		{"off by default", nil, nil, func(c *serveConfig) bool {
			return !c.TracingEnabled && c.TracingServiceName == "RateLimit" && c.TracingSamplingRate == 1 && c.TracingProtocol == "http"
		}, ""},
		{"reference variables", nil, []string{"TRACING_ENABLED=true", "TRACING_SERVICE_NAME=rl", "TRACING_SERVICE_NAMESPACE=edge",
			"TRACING_SERVICE_INSTANCE_ID=pod-1", "TRACING_SAMPLING_RATE=0.25", "TRACING_EXPORTER_PROTOCOL=grpc"}, func(c *serveConfig) bool {
			return c.TracingEnabled && c.TracingServiceName == "rl" && c.TracingNamespace == "edge" && c.TracingInstanceID == "pod-1" &&
				c.TracingSamplingRate == 0.25 && c.TracingProtocol == "grpc"
		}, ""},
		{"flags over variables", []string{"--tracing=false", "--tracing-sampling-rate", "0"}, []string{"TRACING_ENABLED=true", "TRACING_SAMPLING_RATE=0.5"},
			func(c *serveConfig) bool { return !c.TracingEnabled && c.TracingSamplingRate == 0 }, ""},
		{"not a boolean", nil, []string{"TRACING_ENABLED=yes"}, nil, `TRACING_ENABLED="yes"`},
		{"rate above 1", nil, []string{"TRACING_SAMPLING_RATE=2"}, nil, "--tracing-sampling-rate (TRACING_SAMPLING_RATE): 2 is not in [0, 1]"},
		{"negative rate", []string{"--tracing-sampling-rate", "-0.1"}, nil, nil, "is not in [0, 1]"},
		{"unknown protocol", nil, []string{"TRACING_EXPORTER_PROTOCOL=zipkin"}, nil, `unknown protocol "zipkin" (http, grpc)`},
		{"empty service name", []string{"--tracing", "--tracing-service-name", ""}, nil, nil, "--tracing-service-name (TRACING_SERVICE_NAME): empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := parseServeWant(t, tt.args, tt.env, tt.wantErr)
			if c == nil {
				return
			}
			if !tt.check(c) {
				t.Fatalf("tracing settings %v %q %q %q %v %q", c.TracingEnabled, c.TracingServiceName, c.TracingNamespace,
					c.TracingInstanceID, c.TracingSamplingRate, c.TracingProtocol)
			}
		})
	}
}

// Off, tracing adds no server option and no tracer: nothing of it runs on
// a request.
func TestTracingOff(t *testing.T) {
	tr, err := newTracing(&serveConfig{NodeName: "n"}, nil)
	if err != nil || tr != nil {
		t.Fatalf("tracing off: %v, %v; want nil, nil", tr, err)
	}
	if tr.serverOptions() != nil || tr.tracerOrNil() != nil {
		t.Fatal("tracing off: server options or a tracer")
	}
	tr.shutdown(t.Context(), nil) // a no-op
}
