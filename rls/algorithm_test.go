package rls

import (
	"context"
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/bucket"
)

// TestParseAlgorithmFields covers ringlimit's rate_limit extension:
// algorithm and burst, their defaults, the Limit they give, the warning a
// rule using them carries and the /rlconfig line.
func TestParseAlgorithmFields(t *testing.T) {
	const min = int64(60e9)
	tests := []struct {
		name string
		rate string // the rate_limit mapping of descriptor a, line 3
		lim  bucket.Limit
		warn string // "": no Extension
		dump string // the /rlconfig line
	}{
		{"no extension", "{unit: minute, requests_per_unit: 5}",
			bucket.Limit{Requests: 5, Unit: min}, "",
			"d.a: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false"},
		{"explicit fixed window is still an extension", "{unit: minute, requests_per_unit: 5, algorithm: fixed_window}",
			bucket.Limit{Requests: 5, Unit: min},
			"rls: f.yaml: descriptors[0].rate_limit: algorithm: " + extensionMsg,
			"d.a: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false"},
		{"sliding window, any case", "{unit: minute, requests_per_unit: 5, algorithm: Sliding_Window}",
			bucket.Limit{Algorithm: bucket.SlidingWindow, Requests: 5, Unit: min},
			"rls: f.yaml: descriptors[0].rate_limit: algorithm: " + extensionMsg,
			"d.a: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false, algorithm: sliding_window"},
		{"token bucket: burst defaults to requests_per_unit", "{unit: minute, requests_per_unit: 5, algorithm: token_bucket}",
			bucket.Limit{Algorithm: bucket.TokenBucket, Requests: 5, Unit: min, Burst: 5},
			"rls: f.yaml: descriptors[0].rate_limit: algorithm: " + extensionMsg,
			"d.a: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false, algorithm: token_bucket, burst: 5"},
		{"token bucket with burst", "{unit: minute, requests_per_unit: 5, algorithm: TOKEN_BUCKET, burst: 50}",
			bucket.Limit{Algorithm: bucket.TokenBucket, Requests: 5, Unit: min, Burst: 50},
			"rls: f.yaml: descriptors[0].rate_limit: algorithm, burst: " + extensionMsg,
			"d.a: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false, algorithm: token_bucket, burst: 50"},
		{"token bucket that blocks", "{unit: minute, algorithm: token_bucket, burst: 3}",
			bucket.Limit{Algorithm: bucket.TokenBucket, Unit: min, Burst: 3},
			"rls: f.yaml: descriptors[0].rate_limit: algorithm, burst: " + extensionMsg,
			"d.a: unit=MINUTE requests_per_unit=0, shadow_mode: false, quota_mode: false, algorithm: token_bucket, burst: 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("f.yaml", []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: "+tt.rate+"\n"))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			r := c.Rules()[0]
			if r.Limit != tt.lim {
				t.Errorf("Limit = %+v, want %+v", r.Limit, tt.lim)
			}
			if err := r.Limit.Validate(); err != nil {
				t.Errorf("Limit.Validate: %v", err)
			}
			switch {
			case tt.warn == "" && r.Extension != nil:
				t.Errorf("Extension = %v, want none", r.Extension)
			case tt.warn != "" && (r.Extension == nil || r.Extension.Error() != tt.warn || r.Extension.Line != 4):
				t.Errorf("Extension = %+v, want %q on line 4", r.Extension, tt.warn)
			}
			if got := c.Dump(); got != tt.dump+"\n" {
				t.Errorf("Dump = %q, want %q", got, tt.dump+"\n")
			}
		})
	}
}

func TestParseAlgorithmErrors(t *testing.T) {
	const f = "rls: ratelimit.yaml: descriptors[0].rate_limit."
	tests := []struct {
		name string
		rate string
		want []string
	}{
		{"unknown algorithm", "{unit: second, algorithm: leaky_bucket}",
			[]string{f + "algorithm: invalid rate limit algorithm 'leaky_bucket': want fixed_window, sliding_window or token_bucket"}},
		{"empty algorithm", "{unit: second, algorithm: \"\"}",
			[]string{f + "algorithm: invalid rate limit algorithm '': want fixed_window, sliding_window or token_bucket"}},
		{"algorithm is a list", "{unit: second, algorithm: [token_bucket]}",
			[]string{f + "algorithm: expected a string, got a list (line 4)",
				f + "algorithm: invalid rate limit algorithm '': want fixed_window, sliding_window or token_bucket"}},
		{"burst without an algorithm", "{unit: second, requests_per_unit: 1, burst: 2}",
			[]string{f + "burst: burst is only valid with algorithm token_bucket, not fixed_window"}},
		{"burst with a sliding window", "{unit: second, algorithm: sliding_window, burst: 2}",
			[]string{f + "burst: burst is only valid with algorithm token_bucket, not sliding_window"}},
		{"burst with an unknown algorithm: one error", "{unit: second, algorithm: gcra, burst: 2}",
			[]string{f + "algorithm: invalid rate limit algorithm 'gcra': want fixed_window, sliding_window or token_bucket"}},
		{"burst 0", "{unit: second, algorithm: token_bucket, burst: 0}",
			[]string{f + "burst: burst must be at least 1"}},
		{"burst null is 0", "{unit: second, algorithm: token_bucket, burst: null}",
			[]string{f + "burst: burst must be at least 1"}},
		{"negative burst", "{unit: second, algorithm: token_bucket, burst: -3}",
			[]string{f + "burst: expected an integer from 0 to 4294967295, got the integer -3 (line 4)",
				f + "burst: burst must be at least 1"}},
		{"fractional burst", "{unit: second, algorithm: token_bucket, burst: 2.5}",
			[]string{f + "burst: expected an integer from 0 to 4294967295, got the number 2.5 (line 4)",
				f + "burst: burst must be at least 1"}},
		{"algorithm when unlimited", "{unlimited: true, algorithm: token_bucket}",
			[]string{f + "algorithm: should not specify rate limit algorithm when unlimited"}},
		{"burst when unlimited", "{unlimited: true, burst: 3}",
			[]string{f + "burst: should not specify burst when unlimited"}},
		{"a bad unit and a bad algorithm", "{unit: fortnight, algorithm: fifo}",
			[]string{f + "unit: invalid rate limit unit 'fortnight'",
				f + "algorithm: invalid rate limit algorithm 'fifo': want fixed_window, sliding_window or token_bucket"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("ratelimit.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: "+tt.rate+"\n"))
			if c != nil {
				t.Fatalf("Parse returned a config: %q", c.Dump())
			}
			if got := cfgErrLines(err); strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("errors:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

// svAlgoConfig has one rule per algorithm, all 3 per minute.
const svAlgoConfig = `domain: algos
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window}
  - key: token
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: token_bucket, burst: 2}
`

// TestServiceAlgorithms drives the service in process with a fake clock and
// shows the statuses each algorithm gives for the same timeline: three hits
// 50 s into a minute, one more, then hits across the minute's edge.
// limit_remaining is what is left now; duration_until_reset is, when over,
// the time until a hit would be admitted and, when not, the time until the
// whole quota is back (the fixed window: until its window ends), rounded up
// to seconds.
func TestServiceAlgorithms(t *testing.T) {
	at := svT0 + 50*svSec // 10 s before a minute boundary
	req := func(key string) *pb.RateLimitRequest { return svReq("algos", 0, svD(key, "x")) }
	st := func(code pb.RateLimitResponse_Code, remaining uint32, reset int64) *pb.RateLimitResponse {
		return svResp(code, svSt(code, 3, svMinute, "", remaining, reset))
	}
	tests := []struct {
		key   string
		steps []svStep
	}{
		{"fixed", []svStep{
			{at: at, req: req("fixed"), want: st(svOK, 2, 10)},
			{at: at, req: req("fixed"), want: st(svOK, 1, 10)},
			{at: at, req: req("fixed"), want: st(svOK, 0, 10)},
			{at: at, req: req("fixed"), want: st(svOver, 0, 10)},
			// the edge: a whole new quota
			{at: at + 10*svSec, req: req("fixed"), want: st(svOK, 2, 60)},
			{at: at + 30*svSec, req: req("fixed"), want: st(svOK, 1, 40)},
		}},
		{"sliding", []svStep{
			// the hits weigh until the end of the next minute: 10 s + 60 s
			{at: at, req: req("sliding"), want: st(svOK, 2, 70)},
			{at: at, req: req("sliding"), want: st(svOK, 1, 70)},
			{at: at, req: req("sliding"), want: st(svOK, 0, 70)},
			// one fits when the 3 weigh 2: 20 s into the next minute
			{at: at, req: req("sliding"), want: st(svOver, 0, 30)},
			{at: at + 10*svSec, req: req("sliding"), want: st(svOver, 0, 20)},
			{at: at + 30*svSec, req: req("sliding"), want: st(svOK, 0, 100)},
		}},
		{"token", []svStep{
			// a bucket of 2, one token back every 20 s
			{at: at, req: req("token"), want: st(svOK, 1, 20)},
			{at: at, req: req("token"), want: st(svOK, 0, 40)},
			{at: at, req: req("token"), want: st(svOver, 0, 20)},
			{at: at + 10*svSec, req: req("token"), want: st(svOver, 0, 10)},
			{at: at + 20*svSec, req: req("token"), want: st(svOK, 0, 40)},
			{at: at + 30*svSec, req: req("token"), want: st(svOver, 0, 10)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			svRun(t, svNew(t, svAlgoConfig, Options{}), tt.steps)
		})
	}
}

// TestServiceAlgorithmsHeadersAndStats: the RateLimit-* headers follow the
// statuses, and the near/over stats of a token bucket use its burst.
func TestServiceAlgorithmsHeadersAndStats(t *testing.T) {
	h := svNew(t, svAlgoConfig, Options{ResponseHeaders: true})
	h.clock.Set(svT0 + 50*svSec)
	var last *pb.RateLimitResponse
	for range 3 {
		resp, err := h.svc.ShouldRateLimit(context.Background(), svReq("algos", 0, svD("token", "x"), svD("sliding", "x")))
		if err != nil {
			t.Fatal(err)
		}
		last = resp
	}
	// token is over (retry in 20 s); sliding has 0 left.
	want := []*core.HeaderValue{
		{Key: "RateLimit-Limit", Value: "3"},
		{Key: "RateLimit-Remaining", Value: "0"},
		{Key: "RateLimit-Reset", Value: "20"},
	}
	if len(last.ResponseHeadersToAdd) != len(want) {
		t.Fatalf("headers %v, want %v", last.ResponseHeadersToAdd, want)
	}
	for i := range want {
		if !proto.Equal(last.ResponseHeadersToAdd[i], want[i]) {
			t.Errorf("header %d = %v, want %v", i, last.ResponseHeadersToAdd[i], want[i])
		}
	}
	m := h.svc.metrics
	// burst 2: near threshold floor(2*0.8) = 1; hits 1, 2 within (2 near), 3 over.
	got := [4]float64{svMetric(t, m.totalHits, "algos", "token"), svMetric(t, m.withinLimit, "algos", "token"),
		svMetric(t, m.nearLimit, "algos", "token"), svMetric(t, m.overLimit, "algos", "token")}
	if got != [4]float64{3, 2, 1, 1} {
		t.Errorf("token stats {total within near over} = %v, want [3 2 1 1]", got)
	}
}
