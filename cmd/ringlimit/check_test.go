package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/rls"
)

// startRLS serves config (one YAML file) with a real rls.Service on a free
// loopback port, until the test ends.
func startRLS(t *testing.T, config string) string {
	t.Helper()
	cfg, err := rls.Parse("ratelimit.yaml", []byte(config))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.NewService(rls.Options{}, rls.LocalCounter{Store: bucket.NewStore(bucket.StoreConfig{})}, rls.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	svc.SetConfig(cfg)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	svc.Register(gs)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); wg.Wait() })
	return lis.Addr().String()
}

// check says when no rule matched a descriptor, and --fail-over-limit
// turns an OVER_LIMIT answer into its own exit status.
func TestCheckOutputAndExitCodes(t *testing.T) {
	leakCheck(t)
	addr := startRLS(t, "domain: d\ndescriptors:\n"+
		"  - {key: k, value: one, rate_limit: {unit: hour, requests_per_unit: 1}}\n"+
		"  - {key: free, rate_limit: {unlimited: true}}\n")
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     []string // in stdout
		notWant  []string
	}{
		{"a rule, first hit", []string{"--domain", "d", "--descriptor", "k=one", "--fail-over-limit"}, checkExitOK,
			[]string{"overall_code: OK", "current_limit: 1/HOUR", "limit_remaining: 0"}, []string{"no rule matched"}},
		{"over the limit", []string{"--domain", "d", "--descriptor", "k=one"}, checkExitOK,
			[]string{"overall_code: OVER_LIMIT", "code: OVER_LIMIT"}, nil},
		{"over the limit, --fail-over-limit", []string{"--domain", "d", "--descriptor", "k=one", "--fail-over-limit"}, checkExitOverLimit,
			[]string{"overall_code: OVER_LIMIT"}, nil},
		{"unknown domain", []string{"--domain", "nope", "--descriptor", "k=one"}, checkExitOK,
			[]string{"overall_code: OK", "  no rule matched: not counted", `no rule matched any descriptor: is domain "nope" loaded`},
			[]string{"limit_remaining"}},
		{"a descriptor no rule matches beside one that does", []string{"--domain", "d", "--descriptor", "other=x", "--descriptor", "free=y"}, checkExitOK,
			[]string{"descriptor[0] other=x\n  code: OK\n  no rule matched", "descriptor[1] free=y\n  code: OK\n  unlimited"},
			[]string{"no rule matched any descriptor"}},
		{"bad flags", []string{"--domain", "d"}, checkExitUsage, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := checkCmd(context.Background(), append([]string{"--addr", addr, "--timeout", "10s"}, tt.args...), &out, &errb)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d; stdout %q stderr %q", code, tt.wantCode, out.String(), errb.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(out.String(), w) {
					t.Errorf("stdout has %q:\n%s", w, out.String())
				}
			}
		})
	}
}
