package rls

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ringlimit/ringlimit/bucket"
)

// The tests in this file drive Service.ShouldRateLimit in process, with a
// real bucket.Store behind LocalCounter and a fake clock, and compare whole
// responses against what envoyproxy/ratelimit answers for the same timeline
// (see /work/shared/reference/rls-semantics.md).

const (
	svSec = int64(time.Second)
	// svT0 is 2026-03-08T20:00:00Z: on an hour boundary, 72000 s into its
	// day, so minute windows reset at svT0+60s.
	svT0 = 1_773_000_000 * svSec

	svOK   = pb.RateLimitResponse_OK
	svOver = pb.RateLimitResponse_OVER_LIMIT

	svSecond = pb.RateLimitResponse_RateLimit_SECOND
	svMinute = pb.RateLimitResponse_RateLimit_MINUTE
	svHour   = pb.RateLimitResponse_RateLimit_HOUR
	svDay    = pb.RateLimitResponse_RateLimit_DAY
	svWeek   = pb.RateLimitResponse_RateLimit_WEEK
	svMonth  = pb.RateLimitResponse_RateLimit_MONTH
	svYear   = pb.RateLimitResponse_RateLimit_YEAR
)

// svConfig is the config most service tests run against.
const svConfig = `domain: shapes
descriptors:
  - key: nolimit
  - key: unlimited
    rate_limit: {unlimited: true}
  - key: second
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: minute
    rate_limit: {unit: MINUTE, requests_per_unit: 5, name: per-minute}
  - key: hour
    rate_limit: {unit: Hour, requests_per_unit: 5}
  - key: day
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: week
    rate_limit: {unit: week, requests_per_unit: 5}
  - key: month
    rate_limit: {unit: month, requests_per_unit: 5}
  - key: year
    rate_limit: {unit: year, requests_per_unit: 5}
  - key: hundred
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: missing
    rate_limit: {unit: minute}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: base
    rate_limit: {unit: minute, requests_per_unit: 10, name: base}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 1000, name: vip, replaces: [{name: base}]}
  - key: free
    rate_limit: {unlimited: true, name: free, replaces: [{name: base}]}
  - key: nofree
    rate_limit: {unit: minute, requests_per_unit: 3, replaces: [{name: free}]}
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 3}
`

// svSeedConfig is the seed scenario's ConfigMap, verbatim.
const svSeedConfig = `domain: ratelimit
descriptors:
  - key: remote_address
    descriptors:
      - key: PATH
        rate_limit:
          unit: minute
          requests_per_unit: 100
`

// svClock is a fake clock: Unix nanoseconds set by the test.
type svClock struct{ ns atomic.Int64 }

// Now returns the clock's time.
func (c *svClock) Now() int64 { return c.ns.Load() }

// Set moves the clock to ns, forwards or back.
func (c *svClock) Set(ns int64) { c.ns.Store(ns) }

// svHarness is one service with its store, clock and private registry.
type svHarness struct {
	svc   *Service
	store *bucket.Store
	clock *svClock
	reg   *prometheus.Registry
	cfg   *Config
}

// svNew builds a service serving yaml (parsed with Parse) with a fresh
// store, a fake clock at svT0 and metrics on a private registry.
func svNew(tb testing.TB, yaml string, opt Options) *svHarness {
	tb.Helper()
	cfg, err := Parse("ratelimit.yaml", []byte(yaml))
	if err != nil {
		tb.Fatalf("Parse: %v", err)
	}
	h := &svHarness{
		store: bucket.NewStore(bucket.StoreConfig{}),
		clock: &svClock{},
		reg:   prometheus.NewPedanticRegistry(),
		cfg:   cfg,
	}
	h.clock.Set(svT0)
	opt.Clock = h.clock.Now
	h.svc, err = NewService(opt, LocalCounter{Store: h.store}, NewMetrics(h.reg))
	if err != nil {
		tb.Fatalf("NewService: %v", err)
	}
	h.svc.SetConfig(cfg)
	return h
}

// count is the stored counter of a descriptor at the clock's time (0 when it
// has none).
func (h *svHarness) count(domain string, d *rlv3.RateLimitDescriptor) uint64 {
	st, ok := h.store.Get(h.clock.Now(), AppendKey(nil, domain, d.Entries))
	if !ok {
		return 0
	}
	return st.Count
}

// svD builds a request descriptor from key, value pairs.
func svD(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// svHits sets the descriptor's own hits_addend.
func svHits(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// svLimit sets a request-level limit override.
func svLimit(d *rlv3.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit) *rlv3.RateLimitDescriptor {
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return d
}

// svReq builds a request; hits is the request-level hits_addend.
func svReq(domain string, hits uint32, ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits}
}

// svOKSt is the status of a descriptor with no limit: {code: OK} only.
func svOKSt() *pb.RateLimitResponse_DescriptorStatus {
	return &pb.RateLimitResponse_DescriptorStatus{Code: svOK}
}

// svUnlSt is the status of an unlimited descriptor.
func svUnlSt() *pb.RateLimitResponse_DescriptorStatus {
	return &pb.RateLimitResponse_DescriptorStatus{Code: svOK, LimitRemaining: 4294967295}
}

// svSt is the status of a limited descriptor.
func svSt(code pb.RateLimitResponse_Code, rpu uint32, unit pb.RateLimitResponse_RateLimit_Unit, name string, remaining uint32, resetSec int64) *pb.RateLimitResponse_DescriptorStatus {
	return &pb.RateLimitResponse_DescriptorStatus{
		Code:               code,
		CurrentLimit:       &pb.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: unit},
		LimitRemaining:     remaining,
		DurationUntilReset: durationpb.New(time.Duration(resetSec) * time.Second),
	}
}

// svResp builds a whole response.
func svResp(overall pb.RateLimitResponse_Code, sts ...*pb.RateLimitResponse_DescriptorStatus) *pb.RateLimitResponse {
	return &pb.RateLimitResponse{OverallCode: overall, Statuses: sts}
}

// svStep is one point of a timeline: at time at, either a request and the
// whole response (or error) it must get, or (req == nil) a check of the
// counter stored for domain + desc.
type svStep struct {
	at      int64
	req     *pb.RateLimitRequest
	want    *pb.RateLimitResponse
	wantErr string // non-empty: InvalidArgument with this in the message

	domain    string
	desc      *rlv3.RateLimitDescriptor
	wantCount uint64
}

// svCount is a counter check step.
func svCount(at int64, domain string, d *rlv3.RateLimitDescriptor, n uint64) svStep {
	return svStep{at: at, domain: domain, desc: d, wantCount: n}
}

func svText(m proto.Message) string {
	return prototext.MarshalOptions{Multiline: true, Indent: "  "}.Format(m)
}

// svRun plays steps in order against h.
func svRun(t *testing.T, h *svHarness, steps []svStep) {
	t.Helper()
	for i, s := range steps {
		h.clock.Set(s.at)
		if s.req == nil {
			if got := h.count(s.domain, s.desc); got != s.wantCount {
				t.Fatalf("step %d (t0%+ds): counter of %v = %d, want %d", i, (s.at-svT0)/svSec, s.desc.Entries, got, s.wantCount)
			}
			continue
		}
		got, err := h.svc.ShouldRateLimit(context.Background(), s.req)
		if s.wantErr != "" {
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), s.wantErr) {
				t.Fatalf("step %d: err = %v, want InvalidArgument containing %q", i, err, s.wantErr)
			}
			if got != nil {
				t.Fatalf("step %d: response %v with an error", i, got)
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d (t0%+ds): ShouldRateLimit: %v", i, (s.at-svT0)/svSec, err)
		}
		if !proto.Equal(got, s.want) {
			t.Fatalf("step %d (t0%+ds): request\n%s\ngot\n%s\nwant\n%s", i, (s.at-svT0)/svSec, svText(s.req), svText(got), svText(s.want))
		}
	}
}

func TestServiceStatusShapes(t *testing.T) {
	at := svT0 + 10*svSec // 50 s left in the minute
	h := svNew(t, svConfig, Options{})
	svRun(t, h, []svStep{
		{at: at, req: svReq("shapes", 0,
			svD("nolimit", "x"),          // node without rate_limit
			svD("unlimited", "x"),        // unlimited
			svD("unknown", "x"),          // no such key
			svD("second", "x", "e", "y"), // deeper than the config
			svD("path", "x"),             // shorter than the config
			svD("minute", "x"),           // limited
		), want: svResp(svOK,
			svOKSt(), svUnlSt(), svOKSt(), svOKSt(), svOKSt(),
			svSt(svOK, 5, svMinute, "per-minute", 4, 50))},
		{at: at, req: svReq("shapes", 0, svD("path", "p", "user", "u")),
			want: svResp(svOK, svSt(svOK, 3, svMinute, "", 2, 50))},
		{at: at, req: svReq("no-such-domain", 0, svD("minute", "x"), svD("a", "1")),
			want: svResp(svOK, svOKSt(), svOKSt())},
		// Nothing was counted for descriptors without a limit.
		svCount(at, "shapes", svD("nolimit", "x"), 0),
		svCount(at, "shapes", svD("unlimited", "x"), 0),
		svCount(at, "shapes", svD("second", "x", "e", "y"), 0),
		svCount(at, "no-such-domain", svD("minute", "x"), 0),
		svCount(at, "shapes", svD("minute", "x"), 1),
	})
}

// TestServiceResetTimes checks duration_until_reset = unit - now % unit (in
// whole seconds, now floored to the second as the reference's clock is) for
// every unit at several times, including exact window boundaries. The values
// are computed by hand from the Unix-epoch-aligned windows; month is 30 days
// and year 365 days.
func TestServiceResetTimes(t *testing.T) {
	units := []struct {
		key  string
		unit pb.RateLimitResponse_RateLimit_Unit
		name string
	}{
		{"second", svSecond, ""}, {"minute", svMinute, "per-minute"}, {"hour", svHour, ""},
		{"day", svDay, ""}, {"week", svWeek, ""}, {"month", svMonth, ""}, {"year", svYear, ""},
	}
	tests := []struct {
		name string
		now  int64 // Unix ns
		want [7]int64
	}{
		{"the epoch", 0,
			[7]int64{1, 60, 3600, 86400, 604800, 2592000, 31536000}},
		{"year, week and day boundary (day 20440)", 1_766_016_000 * svSec,
			[7]int64{1, 60, 3600, 86400, 604800, 1728000, 31536000}},
		{"half a second before that boundary", 1_766_016_000*svSec - svSec/2,
			[7]int64{1, 1, 1, 1, 1, 1728001, 1}},
		{"one ns before that boundary", 1_766_016_000*svSec - 1,
			[7]int64{1, 1, 1, 1, 1, 1728001, 1}},
		{"month boundary (day 20460)", 1_767_744_000 * svSec,
			[7]int64{1, 60, 3600, 86400, 86400, 2592000, 29808000}},
		{"t0+37s", svT0 + 37*svSec,
			[7]int64{1, 23, 3563, 14363, 273563, 2519963, 24551963}},
		{"t0+37.999999999s", svT0 + 38*svSec - 1,
			[7]int64{1, 23, 3563, 14363, 273563, 2519963, 24551963}},
		{"t0+6:59:59", svT0 + (6*3600+59*60+59)*svSec,
			[7]int64{1, 1, 1, 75601, 248401, 2494801, 24526801}},
	}
	h := svNew(t, svConfig, Options{})
	var steps []svStep
	for i, tt := range tests {
		for j, u := range units {
			value := fmt.Sprintf("case-%d", i) // a fresh counter per case
			steps = append(steps, svStep{at: tt.now,
				req:  svReq("shapes", 0, svD(u.key, value)),
				want: svResp(svOK, svSt(svOK, 5, u.unit, u.name, 4, tt.want[j]))})
		}
	}
	svRun(t, h, steps)
}

// TestServiceLimitBoundary: with a limit of 100, hits 1..100 are OK with
// remaining 99..0, hit 101 is over, and over-limit hits still count.
func TestServiceLimitBoundary(t *testing.T) {
	h := svNew(t, svConfig, Options{})
	var steps []svStep
	for i := 1; i <= 100; i++ {
		at := svT0 + int64(i)*svSec/4 // 0.25 s apart: 25 s into the minute at most
		steps = append(steps, svStep{at: at, req: svReq("shapes", 0, svD("hundred", "x")),
			want: svResp(svOK, svSt(svOK, 100, svMinute, "", uint32(100-i), 60-int64(i)/4))})
	}
	at := svT0 + 30*svSec
	steps = append(steps,
		svStep{at: at, req: svReq("shapes", 0, svD("hundred", "x")),
			want: svResp(svOver, svSt(svOver, 100, svMinute, "", 0, 30))},
		svStep{at: at, req: svReq("shapes", 0, svD("hundred", "x")),
			want: svResp(svOver, svSt(svOver, 100, svMinute, "", 0, 30))},
		svCount(at, "shapes", svD("hundred", "x"), 102),
		// The last nanosecond of the window is still in it.
		svStep{at: svT0 + 60*svSec - 1, req: svReq("shapes", 0, svD("hundred", "x")),
			want: svResp(svOver, svSt(svOver, 100, svMinute, "", 0, 1))},
		// The next window starts afresh.
		svStep{at: svT0 + 60*svSec, req: svReq("shapes", 0, svD("hundred", "x")),
			want: svResp(svOK, svSt(svOK, 100, svMinute, "", 99, 60))},
	)
	svRun(t, h, steps)
}

func TestServiceTimelines(t *testing.T) {
	const dom = "shapes"
	t0, t1, t2 := svT0, svT0+svSec, svT0+2*svSec
	lim := func(code pb.RateLimitResponse_Code, rpu, rem uint32, reset int64) *pb.RateLimitResponse_DescriptorStatus {
		return svSt(code, rpu, svMinute, "", rem, reset)
	}
	pm := func(code pb.RateLimitResponse_Code, rem uint32, reset int64) *pb.RateLimitResponse_DescriptorStatus {
		return svSt(code, 5, svMinute, "per-minute", rem, reset)
	}
	tests := []struct {
		name  string
		opt   Options
		steps []svStep
	}{
		{"overall code is the OR of the descriptors, statuses in request order", Options{}, []svStep{
			{at: t0, req: svReq(dom, 0, svD("a", "1"), svD("b", "1")),
				want: svResp(svOK, lim(svOK, 1, 0, 60), lim(svOK, 10, 9, 60))},
			{at: t1, req: svReq(dom, 0, svD("a", "1"), svD("b", "1")),
				want: svResp(svOver, lim(svOver, 1, 0, 59), lim(svOK, 10, 8, 59))},
			{at: t2, req: svReq(dom, 0, svD("b", "1"), svD("a", "1")),
				want: svResp(svOver, lim(svOK, 10, 7, 58), lim(svOver, 1, 0, 58))},
			{at: t2, req: svReq(dom, 0, svD("b", "1"), svD("nolimit", "x"), svD("a", "1"), svD("unlimited", "u")),
				want: svResp(svOver, lim(svOK, 10, 6, 58), svOKSt(), lim(svOver, 1, 0, 58), svUnlSt())},
			{at: t0 + 60*svSec, req: svReq(dom, 0, svD("a", "1")),
				want: svResp(svOK, lim(svOK, 1, 0, 60))},
		}},
		{"multi-hit requests cross the limit", Options{}, []svStep{
			{at: t0, req: svReq(dom, 3, svD("minute", "m")), want: svResp(svOK, pm(svOK, 2, 60))},
			{at: t1, req: svReq(dom, 2, svD("minute", "m")), want: svResp(svOK, pm(svOK, 0, 59))},
			{at: t1, req: svReq(dom, 0, svD("minute", "n")), want: svResp(svOK, pm(svOK, 4, 59))},
			{at: t1, req: svReq(dom, 5, svD("minute", "n")), want: svResp(svOver, pm(svOver, 0, 59))},
			svCount(t1, dom, svD("minute", "m"), 5),
			svCount(t1, dom, svD("minute", "n"), 6),
		}},
		{"descriptor hits_addend wins; 0 checks only; request hits_addend 0 means 1", Options{}, []svStep{
			{at: t0, req: svReq(dom, 3, svHits(svD("minute", "m"), 1)), want: svResp(svOK, pm(svOK, 4, 60))},
			{at: t0, req: svReq(dom, 3, svHits(svD("minute", "m"), 0)), want: svResp(svOK, pm(svOK, 4, 60))},
			svCount(t0, dom, svD("minute", "m"), 1),
			{at: t0, req: svReq(dom, 0, svD("minute", "m")), want: svResp(svOK, pm(svOK, 3, 60))},
			{at: t0, req: svReq(dom, 2, svD("minute", "m")), want: svResp(svOK, pm(svOK, 1, 60))},
			{at: t0, req: svReq(dom, 0, svHits(svD("minute", "m"), 0)), want: svResp(svOK, pm(svOK, 1, 60))},
			// Per-descriptor hits in one request.
			{at: t0, req: svReq(dom, 1, svHits(svD("minute", "m"), 2), svHits(svD("b", "1"), 7)),
				want: svResp(svOver, pm(svOver, 0, 60), lim(svOK, 10, 3, 60))},
			{at: t0, req: svReq(dom, 0, svHits(svD("minute", "m"), 0)), want: svResp(svOver, pm(svOver, 0, 60))},
			// A check-only on an unseen key creates nothing.
			{at: t0, req: svReq(dom, 0, svHits(svD("minute", "fresh"), 0)), want: svResp(svOK, pm(svOK, 5, 60))},
			svCount(t0, dom, svD("minute", "m"), 6),
			svCount(t0, dom, svD("b", "1"), 7),
			svCount(t0, dom, svD("minute", "fresh"), 0),
		}},
		{"over-limit hits still count by default", Options{}, []svStep{
			{at: t0, req: svReq(dom, 4, svD("minute", "m")), want: svResp(svOK, pm(svOK, 1, 60))},
			{at: t0, req: svReq(dom, 3, svD("minute", "m")), want: svResp(svOver, pm(svOver, 0, 60))},
			svCount(t0, dom, svD("minute", "m"), 7),
			{at: t0, req: svReq(dom, 0, svHits(svD("minute", "m"), 0)), want: svResp(svOver, pm(svOver, 0, 60))},
		}},
		{"StopIncrementWhenOverLimit: a lone descriptor counts when over, as in the reference", Options{StopIncrementWhenOverLimit: true}, []svStep{
			{at: t0, req: svReq(dom, 4, svD("minute", "m")), want: svResp(svOK, pm(svOK, 1, 60))},
			{at: t0, req: svReq(dom, 3, svD("minute", "m")), want: svResp(svOver, pm(svOver, 0, 60))},
			svCount(t0, dom, svD("minute", "m"), 7),
			{at: t0, req: svReq(dom, 0, svD("minute", "m")), want: svResp(svOver, pm(svOver, 0, 60))},
			svCount(t0, dom, svD("minute", "m"), 8),
		}},
		{"StopIncrementWhenOverLimit: only the descriptors that are over count", Options{StopIncrementWhenOverLimit: true}, []svStep{
			{at: t0, req: svReq(dom, 0, svD("a", "1"), svD("b", "1")),
				want: svResp(svOK, lim(svOK, 1, 0, 60), lim(svOK, 10, 9, 60))},
			// a would be over: a counts, b does not and reports its count as it stands.
			{at: t0, req: svReq(dom, 0, svD("a", "1"), svD("b", "1")),
				want: svResp(svOver, lim(svOver, 1, 0, 60), lim(svOK, 10, 9, 60))},
			{at: t0, req: svReq(dom, 0, svD("b", "1"), svD("a", "1")),
				want: svResp(svOver, lim(svOK, 10, 9, 60), lim(svOver, 1, 0, 60))},
			svCount(t0, dom, svD("a", "1"), 3),
			svCount(t0, dom, svD("b", "1"), 1),
			{at: t0, req: svReq(dom, 0, svD("b", "1")), want: svResp(svOK, lim(svOK, 10, 8, 60))},
			// A request with nothing over counts on every descriptor.
			{at: t1, req: svReq(dom, 0, svD("b", "1"), svD("minute", "s")),
				want: svResp(svOK, lim(svOK, 10, 7, 59), pm(svOK, 4, 59))},
		}},
		{"by default an over-limit descriptor does not stop the others counting", Options{}, []svStep{
			{at: t0, req: svReq(dom, 0, svD("a", "1"), svD("b", "1")),
				want: svResp(svOK, lim(svOK, 1, 0, 60), lim(svOK, 10, 9, 60))},
			{at: t0, req: svReq(dom, 0, svD("a", "1"), svD("b", "1")),
				want: svResp(svOver, lim(svOver, 1, 0, 60), lim(svOK, 10, 8, 60))},
			svCount(t0, dom, svD("a", "1"), 2),
			svCount(t0, dom, svD("b", "1"), 2),
		}},
		{"requests_per_unit 0 or missing blocks everything", Options{}, []svStep{
			{at: t0, req: svReq(dom, 0, svD("zero", "x")), want: svResp(svOver, lim(svOver, 0, 0, 60))},
			{at: t1, req: svReq(dom, 0, svD("missing", "x")), want: svResp(svOver, lim(svOver, 0, 0, 59))},
			{at: t1, req: svReq(dom, 0, svD("zero", "x")), want: svResp(svOver, lim(svOver, 0, 0, 59))},
		}},
		{"a matched rule named X is dropped when another matched rule replaces X", Options{}, []svStep{
			{at: t0, req: svReq(dom, 0, svD("base", "1"), svD("vip", "1")),
				want: svResp(svOK, svOKSt(), svSt(svOK, 1000, svMinute, "vip", 999, 60))},
			{at: t0, req: svReq(dom, 0, svD("vip", "1"), svD("base", "1")),
				want: svResp(svOK, svSt(svOK, 1000, svMinute, "vip", 998, 60), svOKSt())},
			svCount(t0, dom, svD("base", "1"), 0),
			{at: t0, req: svReq(dom, 0, svD("base", "1")),
				want: svResp(svOK, svSt(svOK, 10, svMinute, "base", 9, 60))},
			// Only matched rules replace: a vip descriptor that matches
			// nothing leaves base alone.
			{at: t0, req: svReq(dom, 0, svD("base", "1"), svD("vip", "1", "deeper", "x")),
				want: svResp(svOK, svSt(svOK, 10, svMinute, "base", 8, 60), svOKSt())},
			// An unlimited rule replaces, but is never replaced.
			{at: t0, req: svReq(dom, 0, svD("base", "1"), svD("free", "1")),
				want: svResp(svOK, svOKSt(), svUnlSt())},
			{at: t0, req: svReq(dom, 0, svD("free", "1"), svD("nofree", "1")),
				want: svResp(svOK, svUnlSt(), lim(svOK, 3, 2, 60))},
			svCount(t0, dom, svD("base", "1"), 2),
		}},
		{"shadow_mode rule: code OK, still counted and reported", Options{}, []svStep{
			{at: t0, req: svReq(dom, 0, svD("shadow", "s")), want: svResp(svOK, lim(svOK, 2, 1, 60))},
			{at: t0, req: svReq(dom, 0, svD("shadow", "s")), want: svResp(svOK, lim(svOK, 2, 0, 60))},
			{at: t0, req: svReq(dom, 0, svD("shadow", "s")), want: svResp(svOK, lim(svOK, 2, 0, 60))},
			{at: t0, req: svReq(dom, 5, svD("shadow", "s")), want: svResp(svOK, lim(svOK, 2, 0, 60))},
			svCount(t0, dom, svD("shadow", "s"), 8),
			{at: t0, req: svReq(dom, 0, svD("shadow", "s"), svD("a", "1")),
				want: svResp(svOK, lim(svOK, 2, 0, 60), lim(svOK, 1, 0, 60))},
			{at: t0, req: svReq(dom, 0, svD("shadow", "s"), svD("a", "1")),
				want: svResp(svOver, lim(svOK, 2, 0, 60), lim(svOver, 1, 0, 60))},
		}},
		{"global shadow mode: overall OK, descriptor codes stay", Options{ShadowMode: true}, []svStep{
			{at: t0, req: svReq(dom, 0, svD("a", "1")), want: svResp(svOK, lim(svOK, 1, 0, 60))},
			{at: t0, req: svReq(dom, 0, svD("a", "1")), want: svResp(svOK, lim(svOver, 1, 0, 60))},
			{at: t0, req: svReq(dom, 0, svD("b", "1"), svD("a", "1")),
				want: svResp(svOK, lim(svOK, 10, 9, 60), lim(svOver, 1, 0, 60))},
			svCount(t0, dom, svD("a", "1"), 3),
		}},
		{"request-level limit override", Options{}, []svStep{
			{at: t0, req: svReq(dom, 0, svLimit(svD("minute", "o"), 2, typev3.RateLimitUnit_SECOND)),
				want: svResp(svOK, svSt(svOK, 2, svSecond, "", 1, 1))},
			{at: t0 + svSec/2, req: svReq(dom, 0, svLimit(svD("minute", "o"), 2, typev3.RateLimitUnit_SECOND)),
				want: svResp(svOK, svSt(svOK, 2, svSecond, "", 0, 1))},
			{at: t0 + svSec/2, req: svReq(dom, 0, svLimit(svD("minute", "o"), 2, typev3.RateLimitUnit_SECOND)),
				want: svResp(svOver, svSt(svOver, 2, svSecond, "", 0, 1))},
			{at: t1, req: svReq(dom, 0, svLimit(svD("minute", "o"), 2, typev3.RateLimitUnit_SECOND)),
				want: svResp(svOK, svSt(svOK, 2, svSecond, "", 1, 1))},
			// An override applies to a descriptor the config does not limit.
			{at: t0, req: svReq(dom, 0, svLimit(svD("nolimit", "x"), 3, typev3.RateLimitUnit_HOUR)),
				want: svResp(svOK, svSt(svOK, 3, svHour, "", 2, 3600))},
			{at: t0, req: svReq(dom, 0, svLimit(svD("not-in-config", "x"), 7, typev3.RateLimitUnit_DAY)),
				want: svResp(svOK, svSt(svOK, 7, svDay, "", 6, 14400))},
			// An override of a shadow_mode rule is not in shadow mode.
			{at: t0, req: svReq(dom, 0, svLimit(svD("shadow", "o"), 0, typev3.RateLimitUnit_MINUTE)),
				want: svResp(svOver, lim(svOver, 0, 0, 60))},
			// Unknown domain: no limit, override or not.
			{at: t0, req: svReq("no-such-domain", 0, svLimit(svD("minute", "o"), 0, typev3.RateLimitUnit_SECOND)),
				want: svResp(svOK, svOKSt())},
			{at: t0, req: svReq(dom, 0, svD("b", "1"), svLimit(svD("minute", "o"), 2, typev3.RateLimitUnit(99))),
				wantErr: "descriptors[1].limit.unit: unknown unit 99"},
			{at: t0, req: svReq(dom, 0, svLimit(svD("minute", "o"), 2, typev3.RateLimitUnit_UNKNOWN)),
				wantErr: "unknown unit 0"},
			svCount(t0, dom, svD("b", "1"), 0),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svRun(t, svNew(t, svConfig, tt.opt), tt.steps)
		})
	}
}

// TestServiceStopIncrementReference plays the reference's rule for
// StopIncrementWhenOverLimit: a descriptor that would be over still counts
// its hits; when one is, the request's other descriptors count nothing.
func TestServiceStopIncrementReference(t *testing.T) {
	const cfg = `domain: stop
descriptors:
  - {key: a, rate_limit: {unit: hour, requests_per_unit: 2}}
  - {key: b, rate_limit: {unit: hour, requests_per_unit: 5}}
  - {key: c, rate_limit: {unit: hour, requests_per_unit: 10}}
`
	h := svNew(t, cfg, Options{StopIncrementWhenOverLimit: true})
	st := func(code pb.RateLimitResponse_Code, rpu, rem uint32) *pb.RateLimitResponse_DescriptorStatus {
		return svSt(code, rpu, svHour, "", rem, 3600)
	}
	d := func(k string, hits uint64) *rlv3.RateLimitDescriptor { return svHits(svD(k, "x"), hits) }
	svRun(t, h, []svStep{
		{at: svT0, req: svReq("stop", 0, d("c", 8)), want: svResp(svOK, st(svOK, 10, 2))},
		// Over: counted all the same, so a smaller request after it is over too.
		{at: svT0, req: svReq("stop", 0, d("c", 5)), want: svResp(svOver, st(svOver, 10, 0))},
		{at: svT0, req: svReq("stop", 0, d("c", 1)), want: svResp(svOver, st(svOver, 10, 0))},
		svCount(svT0, "stop", svD("c", "x"), 14),
		// c is over: a and b count nothing.
		{at: svT0, req: svReq("stop", 0, d("a", 1), d("b", 1), d("c", 1)),
			want: svResp(svOver, st(svOK, 2, 2), st(svOK, 5, 5), st(svOver, 10, 0))},
		svCount(svT0, "stop", svD("a", "x"), 0),
		svCount(svT0, "stop", svD("c", "x"), 15),
		// Nothing over: both count.
		{at: svT0, req: svReq("stop", 0, d("a", 1), d("b", 1)),
			want: svResp(svOK, st(svOK, 2, 1), st(svOK, 5, 4))},
		// a would be over: a counts, b reports its count as it stands.
		{at: svT0, req: svReq("stop", 0, d("a", 2), d("b", 1)),
			want: svResp(svOver, st(svOver, 2, 0), st(svOK, 5, 4))},
		svCount(svT0, "stop", svD("a", "x"), 3),
		svCount(svT0, "stop", svD("b", "x"), 1),
	})
}

// TestServiceQuotaMode: as in the reference, a descriptor in quota mode
// (its rule's quota_mode, or Options.QuotaMode for all) reports OVER_LIMIT
// as usual, but makes the overall code OVER_LIMIT only when every
// quota-mode descriptor of the request is over.
func TestServiceQuotaMode(t *testing.T) {
	const cfg = `domain: quota
descriptors:
  - {key: q1, quota_mode: true, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: q2, quota_mode: true, rate_limit: {unit: hour, requests_per_unit: 5}}
  - {key: r, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: u, rate_limit: {unlimited: true}}
`
	st := func(code pb.RateLimitResponse_Code, rpu, rem uint32) *pb.RateLimitResponse_DescriptorStatus {
		return svSt(code, rpu, svHour, "", rem, 3600)
	}
	d := func(k string) *rlv3.RateLimitDescriptor { return svD(k, "x") }
	t.Run("per rule", func(t *testing.T) {
		h := svNew(t, cfg, Options{})
		svRun(t, h, []svStep{
			{at: svT0, req: svReq("quota", 0, d("q1")), want: svResp(svOK, st(svOK, 1, 0))},
			// Only some quota-mode descriptors over: OK overall.
			{at: svT0, req: svReq("quota", 0, d("q1"), d("q2")), want: svResp(svOK, st(svOver, 1, 0), st(svOK, 5, 4))},
			// Every quota-mode descriptor over (an unlimited one is none): over.
			{at: svT0, req: svReq("quota", 0, d("q1"), d("u"), d("none")), want: svResp(svOver, st(svOver, 1, 0), svUnlSt(), svOKSt())},
			{at: svT0, req: svReq("quota", 0, d("q1"), d("r")), want: svResp(svOver, st(svOver, 1, 0), st(svOK, 1, 0))},
			// A rule not in quota mode over: over, whatever the quota.
			{at: svT0, req: svReq("quota", 0, d("r"), d("q2")), want: svResp(svOver, st(svOver, 1, 0), st(svOK, 5, 3))},
		})
	})
	t.Run("global", func(t *testing.T) {
		h := svNew(t, cfg, Options{QuotaMode: true})
		svRun(t, h, []svStep{
			{at: svT0, req: svReq("quota", 0, d("r")), want: svResp(svOK, st(svOK, 1, 0))},
			{at: svT0, req: svReq("quota", 0, d("r")), want: svResp(svOver, st(svOver, 1, 0))},
			// A descriptor with no rule is in quota mode too, and not over.
			{at: svT0, req: svReq("quota", 0, d("r"), d("none")), want: svResp(svOK, st(svOver, 1, 0), svOKSt())},
			// An unlimited one is not.
			{at: svT0, req: svReq("quota", 0, d("r"), d("u")), want: svResp(svOver, st(svOver, 1, 0), svUnlSt())},
		})
	})
	t.Run("global shadow mode wins", func(t *testing.T) {
		h := svNew(t, cfg, Options{ShadowMode: true})
		svRun(t, h, []svStep{
			{at: svT0, req: svReq("quota", 2, d("q1")), want: svResp(svOK, st(svOver, 1, 0))},
		})
	})
}

func TestServiceResponseHeaders(t *testing.T) {
	hdr := func(names [3]string, limit, remaining, reset string) []*core.HeaderValue {
		return []*core.HeaderValue{
			{Key: names[0], Value: limit}, {Key: names[1], Value: remaining}, {Key: names[2], Value: reset},
		}
	}
	std := [3]string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}
	custom := [3]string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}
	tests := []struct {
		name string
		opt  Options
		req  *pb.RateLimitRequest
		want []*core.HeaderValue
	}{
		{"least remaining wins", Options{ResponseHeaders: true},
			svReq("shapes", 0, svD("b", "1"), svHits(svD("hour", "h"), 3), svD("unlimited", "u")),
			hdr(std, "5", "2", "3590")},
		{"over limit: remaining 0", Options{ResponseHeaders: true},
			svReq("shapes", 0, svD("b", "1"), svHits(svD("minute", "m"), 6)),
			hdr(std, "5", "0", "50")},
		{"an over-limit descriptor wins over an OK one at 0 remaining", Options{ResponseHeaders: true},
			svReq("shapes", 0, svHits(svD("minute", "m"), 5), svHits(svD("hour", "h"), 6), svD("b", "1")),
			hdr(std, "5", "0", "3590")},
		{"the last over-limit descriptor wins", Options{ResponseHeaders: true},
			svReq("shapes", 0, svHits(svD("hour", "h"), 6), svHits(svD("a", "1"), 2), svD("b", "1")),
			hdr(std, "1", "0", "50")},
		{"the first of equals wins", Options{ResponseHeaders: true},
			svReq("shapes", 0, svHits(svD("minute", "m"), 3), svHits(svD("hour", "h"), 3)),
			hdr(std, "5", "2", "50")},
		{"a shadow rule over its limit counts by remaining only", Options{ResponseHeaders: true},
			svReq("shapes", 0, svHits(svD("hour", "h"), 5), svHits(svD("shadow", "s"), 3)),
			hdr(std, "5", "0", "3590")},
		{"quota mode: an over-limit descriptor counts by remaining only", Options{ResponseHeaders: true, QuotaMode: true},
			svReq("shapes", 0, svHits(svD("hour", "h"), 6), svHits(svD("a", "1"), 2), svD("b", "1")),
			hdr(std, "5", "0", "3590")},
		{"global shadow mode keeps the headers", Options{ResponseHeaders: true, ShadowMode: true},
			svReq("shapes", 0, svD("b", "1"), svHits(svD("a", "1"), 2)),
			hdr(std, "1", "0", "50")},
		{"custom names", Options{ResponseHeaders: true, HeaderLimit: custom[0], HeaderRemaining: custom[1], HeaderReset: custom[2]},
			svReq("shapes", 0, svD("b", "1")),
			hdr(custom, "10", "9", "50")},
		{"no limited descriptor: no headers", Options{ResponseHeaders: true},
			svReq("shapes", 0, svD("nolimit", "x"), svD("unlimited", "u")), nil},
		{"off by default", Options{},
			svReq("shapes", 0, svD("b", "1")), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := svNew(t, svConfig, tt.opt)
			h.clock.Set(svT0 + 10*svSec)
			resp, err := h.svc.ShouldRateLimit(context.Background(), tt.req)
			if err != nil {
				t.Fatal(err)
			}
			got := resp.ResponseHeadersToAdd
			if len(got) != len(tt.want) {
				t.Fatalf("headers = %v, want %v", got, tt.want)
			}
			for i := range got {
				if !proto.Equal(got[i], tt.want[i]) {
					t.Fatalf("headers = %v, want %v", got, tt.want)
				}
			}
		})
	}
}

// TestServiceBadInput: a request the service refuses is InvalidArgument with
// a message naming the bound, and counts nothing, even for its valid
// descriptors.
func TestServiceBadInput(t *testing.T) {
	bounds := Bounds{MaxDescriptors: 2, MaxEntries: 2, MaxKeyLen: 6, MaxDomainLen: 6}
	good := func() *rlv3.RateLimitDescriptor { return svD("b", "1") }
	entry := func(k, v string) *rlv3.RateLimitDescriptor_Entry {
		return &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	tests := []struct {
		name string
		req  *pb.RateLimitRequest
		want string
	}{
		{"nil request", nil, "domain must not be empty"},
		{"empty domain", svReq("", 0, good()), "domain must not be empty"},
		{"no descriptors", svReq("shapes", 0), "descriptor list must not be empty"},
		{"nil descriptor", svReq("shapes", 0, good(), nil), "descriptors[1]: nil descriptor"},
		{"nil entry", svReq("shapes", 0, good(), &rlv3.RateLimitDescriptor{
			Entries: []*rlv3.RateLimitDescriptor_Entry{entry("k", "v"), nil}}), "descriptors[1].entries[1]: nil entry"},
		{"too many descriptors", svReq("shapes", 0, good(), good(), good()), "3 descriptors, more than the bound of 2"},
		{"too many entries", svReq("shapes", 0, good(), svD("a", "1", "b", "2", "c", "3")),
			"descriptors[1]: 3 entries, more than the bound of 2"},
		{"key too long", svReq("shapes", 0, good(), svD("b", "1", "abcdefg", "1")),
			"descriptors[1].entries[1].key: 7 bytes, more than the bound of 6"},
		{"domain too long", svReq("shapes7", 0, good()), "domain is 7 bytes, more than the bound of 6"},
		{"unknown override unit", svReq("shapes", 0, good(), svLimit(svD("b", "2"), 1, typev3.RateLimitUnit(42))),
			"descriptors[1].limit.unit: unknown unit 42"},
	}
	h := svNew(t, svConfig, Options{Bounds: bounds})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := h.svc.ShouldRateLimit(context.Background(), tt.req)
			if resp != nil {
				t.Errorf("response %v with an invalid request", resp)
			}
			if got := status.Code(err); got != codes.InvalidArgument {
				t.Fatalf("code = %v (%v), want InvalidArgument", got, err)
			}
			if msg := status.Convert(err).Message(); !strings.HasPrefix(msg, "rls: invalid request: ") || !strings.Contains(msg, tt.want) {
				t.Fatalf("message = %q, want it to contain %q", msg, tt.want)
			}
		})
	}
	if n := h.store.Len(); n != 0 {
		t.Fatalf("store has %d entries after invalid requests, want 0", n)
	}
	if got := svMetric(t, h.svc.metrics.totalHits, "shapes", "b"); got != 0 {
		t.Fatalf("total_hits = %v after invalid requests, want 0", got)
	}
	// At the bounds, the request is fine.
	resp, err := h.svc.ShouldRateLimit(context.Background(),
		svReq("shapes", 0, svD("b", "12345"), svD("path", "v", "user", "u")))
	if err != nil {
		t.Fatalf("request at the bounds: %v", err)
	}
	if resp.Statuses[0].LimitRemaining != 9 || resp.Statuses[1].LimitRemaining != 2 {
		t.Fatalf("request at the bounds: %v", resp)
	}
}

// TestServiceEmptyDescriptors: a descriptor without entries, or with an
// empty key, matches no rule and answers OK, as in envoyproxy/ratelimit; the
// request's other descriptors are still decided. Refusing the request would
// have Envoy fail open on all of them.
func TestServiceEmptyDescriptors(t *testing.T) {
	h := svNew(t, svConfig, Options{})
	resp, err := h.svc.ShouldRateLimit(context.Background(), svReq("shapes", 0,
		svD("b", "1"), &rlv3.RateLimitDescriptor{}, svD("", "v"), svD("b", "1", "", "")))
	if err != nil {
		t.Fatal(err)
	}
	if st := resp.Statuses[0]; st.Code != svOK || st.LimitRemaining != 9 {
		t.Fatalf("descriptor b=1: %v, want OK with 9 remaining", st)
	}
	for i, st := range resp.Statuses[1:] {
		if st.Code != svOK || st.CurrentLimit != nil {
			t.Fatalf("descriptor %d: %v, want a bare OK", i+1, st)
		}
	}
	if n := h.store.Len(); n != 1 {
		t.Fatalf("store has %d entries, want 1 (b=1)", n)
	}
	// A limit override still counts a descriptor without entries.
	for want := uint32(1); want <= 2; want++ {
		resp, err = h.svc.ShouldRateLimit(context.Background(), svReq("shapes", 0,
			svLimit(&rlv3.RateLimitDescriptor{}, 2, typev3.RateLimitUnit_MINUTE)))
		if err != nil {
			t.Fatal(err)
		}
		if st := resp.Statuses[0]; st.Code != svOK || st.LimitRemaining != 2-want {
			t.Fatalf("override without entries, hit %d: %v, want OK with %d remaining", want, st, 2-want)
		}
	}
}

// TestServiceSeedConcurrent is the seed scenario's functional test: one
// client IP sends 180 concurrent requests in one minute; exactly 100 pass.
// Two other IPs send 90 each and all pass.
func TestServiceSeedConcurrent(t *testing.T) {
	defer goleak.VerifyNone(t)
	h := svNew(t, svSeedConfig, Options{})
	h.clock.Set(svT0 + 5*svSec)
	seedReq := func(ip string) *pb.RateLimitRequest {
		return svReq("ratelimit", 0, svD("remote_address", ip, "PATH", "POST /login"))
	}
	var ok, over, other atomic.Int64
	var wg sync.WaitGroup
	send := func(ip string, n int, ok, over *atomic.Int64) {
		for range n {
			wg.Go(func() {
				resp, err := h.svc.ShouldRateLimit(context.Background(), seedReq(ip))
				switch {
				case err != nil:
					other.Add(1)
				case resp.OverallCode == svOK:
					ok.Add(1)
				case resp.OverallCode == svOver:
					over.Add(1)
				default:
					other.Add(1)
				}
			})
		}
	}
	var okA, overA, okB, overB atomic.Int64
	send("10.0.0.1", 180, &ok, &over)
	send("10.0.0.2", 90, &okA, &overA)
	send("10.0.0.3", 90, &okB, &overB)
	wg.Wait()
	if ok.Load() != 100 || over.Load() != 80 || other.Load() != 0 {
		t.Fatalf("180 requests from one IP: %d OK, %d over, %d other; want 100, 80, 0", ok.Load(), over.Load(), other.Load())
	}
	if okA.Load() != 90 || okB.Load() != 90 || overA.Load()+overB.Load() != 0 {
		t.Fatalf("90 requests from each of two IPs: %d and %d OK, want 90 each", okA.Load(), okB.Load())
	}
	if got := h.count("ratelimit", seedReq("10.0.0.1").Descriptors[0]); got != 180 {
		t.Fatalf("counter = %d, want 180", got)
	}
	if got := svMetric(t, h.svc.metrics.overLimit, "ratelimit", "remote_address.PATH"); got != 80 {
		t.Fatalf("over_limit = %v, want 80", got)
	}
}

// TestServiceSeedSequential: the seed limit, one request at a time: remaining
// counts 99..0, then OVER_LIMIT until the minute ends.
func TestServiceSeedSequential(t *testing.T) {
	h := svNew(t, svSeedConfig, Options{})
	req := svReq("ratelimit", 0, svD("remote_address", "192.0.2.7", "PATH", "GET /api/healthz"))
	st := func(code pb.RateLimitResponse_Code, rem uint32, reset int64) *pb.RateLimitResponse {
		return svResp(code, svSt(code, 100, svMinute, "", rem, reset))
	}
	var steps []svStep
	for i := range 100 {
		at := svT0 + 30*svSec + int64(i)*svSec/10 // 30.0 s .. 39.9 s
		steps = append(steps, svStep{at: at, req: req, want: st(svOK, uint32(99-i), 30-int64(i)/10)})
	}
	for i := range 5 {
		at := svT0 + 50*svSec + int64(i)*svSec
		steps = append(steps, svStep{at: at, req: req, want: st(svOver, 0, 10-int64(i))})
	}
	steps = append(steps, svStep{at: svT0 + 60*svSec, req: req, want: st(svOK, 99, 60)})
	svRun(t, h, steps)
}

// TestServiceSetConfig: a new config takes effect for the next request;
// counters are kept by key.
func TestServiceSetConfig(t *testing.T) {
	h := svNew(t, svConfig, Options{})
	req := svReq("shapes", 0, svD("b", "1"))
	svRun(t, h, []svStep{{at: svT0, req: req, want: svResp(svOK, svSt(svOK, 10, svMinute, "", 9, 60))}})
	cfg, err := Parse("other.yaml", []byte("domain: shapes\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	h.svc.SetConfig(cfg)
	if h.svc.Config() != cfg {
		t.Fatal("Config() is not the config just set")
	}
	svRun(t, h, []svStep{
		{at: svT0, req: req, want: svResp(svOK, svSt(svOK, 2, svMinute, "", 0, 60))},
		{at: svT0, req: req, want: svResp(svOver, svSt(svOver, 2, svMinute, "", 0, 60))},
		{at: svT0, req: svReq("shapes", 0, svD("a", "1")), want: svResp(svOK, svOKSt())},
	})
}

func TestNewServiceErrors(t *testing.T) {
	store := LocalCounter{Store: bucket.NewStore(bucket.StoreConfig{})}
	tests := []struct {
		name    string
		opt     Options
		counter Counter
		want    string
	}{
		{"nil counter", Options{}, nil, "rls: nil counter"},
		{"negative ratio", Options{NearLimitRatio: -0.1}, store, "rls: near limit ratio -0.1 is not in [0, 1]"},
		{"ratio above 1", Options{NearLimitRatio: 1.5}, store, "rls: near limit ratio 1.5 is not in [0, 1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewService(tt.opt, tt.counter, nil)
			if err == nil || err.Error() != tt.want || s != nil {
				t.Fatalf("NewService = %v, %v; want nil, %q", s, err, tt.want)
			}
		})
	}
	// The zero Options work, with the system clock.
	s, err := NewService(Options{}, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.ShouldRateLimit(context.Background(), svReq("d", 0, svD("k", "v")))
	if err != nil || !proto.Equal(resp, svResp(svOK, svOKSt())) {
		t.Fatalf("empty config: %v, %v", resp, err)
	}
}

// TestServiceAllocs holds the allocations of one ShouldRateLimit call on a
// warm key at the response itself: one block for the message and its status
// slot, one for the status with current_limit and duration_until_reset.
func TestServiceAllocs(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("allocation counts are not meaningful in -short or with -race")
	}
	seed := svNew(t, svSeedConfig, Options{})
	shared := svNew(t, "domain: s\ndescriptors:\n  - {key: path, value: \"/api/*\", share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 1000000}}\n", Options{})
	tests := []struct {
		name string
		h    *svHarness
		req  *pb.RateLimitRequest
	}{
		{"a config rule", seed, svReq("ratelimit", 0, svD("remote_address", "10.1.2.3", "PATH", "GET /api/healthz"))},
		{"a request-level limit override", seed, svReq("ratelimit", 0, svLimit(svD("remote_address", "10.1.2.4"), 1000, typev3.RateLimitUnit_HOUR))},
		{"a share_threshold rule", shared, svReq("s", 0, svD("path", "/api/x"))},
		{"a value counted under its digest", seed, svReq("ratelimit", 0, svD("remote_address", "10.1.2.5", "PATH", strings.Repeat("/x", 1000)))},
	}
	ctx := context.Background()
	for _, tt := range tests {
		h := tt.h
		if _, err := h.svc.ShouldRateLimit(ctx, tt.req); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(1000, func() {
			if _, err := h.svc.ShouldRateLimit(ctx, tt.req); err != nil {
				t.Fatal(err)
			}
		})
		// The response: the RateLimitResponse with its statuses, handed to gRPC.
		t.Logf("ShouldRateLimit, %s, warm key: %v allocs/op", tt.name, allocs)
		if allocs > 2 {
			t.Errorf("ShouldRateLimit, %s, warm key: %v allocs/op, want at most 2", tt.name, allocs)
		}
	}
}

// BenchmarkShouldRateLimit decides the seed's request for 1024 client IPs in
// parallel, at a fixed time.
func BenchmarkShouldRateLimit(b *testing.B) {
	h := svNew(b, svSeedConfig, Options{})
	reqs := make([]*pb.RateLimitRequest, 1024)
	for i := range reqs {
		reqs[i] = svReq("ratelimit", 0, svD("remote_address", fmt.Sprintf("10.0.%d.%d", i/256, i%256), "PATH", "GET /api/healthz"))
	}
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(p *testing.PB) {
		i := next.Add(7919)
		ctx := context.Background()
		for p.Next() {
			i++
			if _, err := h.svc.ShouldRateLimit(ctx, reqs[i%uint64(len(reqs))]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A request larger than MaxRequestSize is refused with a message naming the
// bound, and counts nothing.
func TestServiceRequestSizeBound(t *testing.T) {
	h := svNew(t, svSeedConfig, Options{Bounds: Bounds{MaxRequestSize: 100}})
	ctx := context.Background()
	small := svReq("ratelimit", 0, svD("remote_address", "10.0.0.1", "PATH", "/a"))
	if _, err := h.svc.ShouldRateLimit(ctx, small); err != nil {
		t.Fatalf("small request: %v", err)
	}
	big := svReq("ratelimit", 0, svD("remote_address", "10.0.0.2", "PATH", strings.Repeat("x", 200)))
	_, err := h.svc.ShouldRateLimit(ctx, big)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "bound of 100") {
		t.Fatalf("big request: %v, want InvalidArgument naming the bound", err)
	}
}

// share_threshold: every value a wildcard pattern matches counts on one
// counter (the reference's ShareThresholdKeyPattern); without it each value
// counts alone. Nested levels keep their own values.
func TestServiceShareThreshold(t *testing.T) {
	const cfg = `domain: share
descriptors:
  - key: path
    value: "/api/*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: "/own/*"
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    value: "t-*"
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1}
`
	const dom = "share"
	t0 := svT0
	lim := func(code pb.RateLimitResponse_Code, rpu, rem uint32) *pb.RateLimitResponse_DescriptorStatus {
		return svSt(code, rpu, svMinute, "", rem, 60)
	}
	svRun(t, svNew(t, cfg, Options{}), []svStep{
		{at: t0, req: svReq(dom, 0, svD("path", "/api/a")), want: svResp(svOK, lim(svOK, 2, 1))},
		{at: t0, req: svReq(dom, 0, svD("path", "/api/b")), want: svResp(svOK, lim(svOK, 2, 0))},
		{at: t0, req: svReq(dom, 0, svD("path", "/api/c")), want: svResp(svOver, lim(svOver, 2, 0))},
		// The pattern itself as a value is the same counter.
		{at: t0, req: svReq(dom, 0, svD("path", "/api/*")), want: svResp(svOver, lim(svOver, 2, 0))},
		svCount(t0, dom, svD("path", "/api/a"), 0),
		// Without share_threshold every value has its own counter.
		{at: t0, req: svReq(dom, 0, svD("path", "/own/a")), want: svResp(svOK, lim(svOK, 1, 0))},
		{at: t0, req: svReq(dom, 0, svD("path", "/own/b")), want: svResp(svOK, lim(svOK, 1, 0))},
		svCount(t0, dom, svD("path", "/own/a"), 1),
		// Shared tenants, each user on its own within them.
		{at: t0, req: svReq(dom, 0, svD("tenant", "t-1", "user", "u")), want: svResp(svOK, lim(svOK, 1, 0))},
		{at: t0, req: svReq(dom, 0, svD("tenant", "t-2", "user", "u")), want: svResp(svOver, lim(svOver, 1, 0))},
		{at: t0, req: svReq(dom, 0, svD("tenant", "t-2", "user", "v")), want: svResp(svOK, lim(svOK, 1, 0))},
	})
}

// A value longer than MaxValueLen is not refused: it is counted under its
// SHA-256 digest, one counter per distinct value, and the key stays short.
// (Refusing it failed the whole request, so a client could pad a path to
// make Envoy skip every limit on it, or, failing closed, answer 500.)
func TestServiceLongValues(t *testing.T) {
	h := svNew(t, svConfig, Options{Bounds: Bounds{MaxValueLen: 5}})
	long1, long2 := strings.Repeat("x", 2000), strings.Repeat("y", 2000)
	lim := func(rem uint32) *pb.RateLimitResponse_DescriptorStatus {
		return svSt(svOK, 10, svMinute, "", rem, 60)
	}
	svRun(t, h, []svStep{
		{at: svT0, req: svReq("shapes", 0, svD("b", long1)), want: svResp(svOK, lim(9))},
		{at: svT0, req: svReq("shapes", 0, svD("b", long1)), want: svResp(svOK, lim(8))},
		{at: svT0, req: svReq("shapes", 0, svD("b", long2)), want: svResp(svOK, lim(9))},
		{at: svT0, req: svReq("shapes", 0, svD("b", "12345")), want: svResp(svOK, lim(9))},
		svCount(svT0, "shapes", svD("b", "12345"), 1),
	})
	if n := h.store.Len(); n != 3 {
		t.Errorf("%d counters, want 3 (two long values, one short)", n)
	}
	key := appendKeyMax(nil, "shapes", svD("b", long1).Entries, 5)
	if len(key) > 100 || !bytes.Contains(key, []byte(keyDigestPrefix)) {
		t.Errorf("key of a long value: %d bytes %q, want a short digest key", len(key), key)
	}
	if st, ok := h.store.Get(svT0, key); !ok || st.Count != 2 {
		t.Errorf("digest key holds %+v (found %v), want count 2", st, ok)
	}
}

// A counter key longer than MaxCounterKeyLen (many entries with long
// values, each under the value bound) is replaced by the digest of the whole
// key, so that it can still be forwarded to its owner; distinct descriptors
// keep distinct counters.
func TestServiceLongKeys(t *testing.T) {
	const cfg = `domain: long
descriptors:
  - key: k0
    descriptors:
      - key: k1
        descriptors:
          - key: k2
            descriptors:
              - key: k3
                descriptors:
                  - key: k4
                    descriptors:
                      - key: k5
                        descriptors:
                          - key: k6
                            descriptors:
                              - key: k7
                                rate_limit: {unit: minute, requests_per_unit: 10}
`
	h := svNew(t, cfg, Options{})
	entries := func(fill string) *rlv3.RateLimitDescriptor {
		var kv []string
		for i := range 8 {
			kv = append(kv, "k"+strconv.Itoa(i), strings.Repeat(fill, 1000))
		}
		return svD(kv...)
	}
	lim := func(rem uint32) *pb.RateLimitResponse_DescriptorStatus {
		return svSt(svOK, 10, svMinute, "", rem, 60)
	}
	svRun(t, h, []svStep{
		{at: svT0, req: svReq("long", 0, entries("a")), want: svResp(svOK, lim(9))},
		{at: svT0, req: svReq("long", 0, entries("a")), want: svResp(svOK, lim(8))},
		{at: svT0, req: svReq("long", 0, entries("b")), want: svResp(svOK, lim(9))},
	})
	full := AppendKey(nil, "long", entries("a").Entries)
	if len(full) <= MaxCounterKeyLen {
		t.Fatalf("test key is %d bytes, want more than %d", len(full), MaxCounterKeyLen)
	}
	key := capKey(full, 0, "long")
	if len(key) > 100 {
		t.Errorf("capped key is %d bytes", len(key))
	}
	if st, ok := h.store.Get(svT0, key); !ok || st.Count != 2 {
		t.Errorf("capped key holds %+v (found %v), want count 2", st, ok)
	}
	if _, _, err := ParseKey(key); err != nil {
		t.Errorf("capped key does not parse: %v", err)
	}
}

// TestServiceAlgorithmChangeNewCounter: a rule whose algorithm changes counts
// on a new counter (its key carries the algorithm and the unit), so the old
// state is not met again: at a replica, the old state would win every merge
// against the owner's new one until it expired, and an owner crash would
// then restart the key from zero. A fixed window's key is the plain
// descriptor key.
func TestServiceAlgorithmChangeNewCounter(t *testing.T) {
	const sliding = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}\n"
	const fixed = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"
	h := svNew(t, sliding, Options{})
	req := svReq("d", 0, svD("k", "v"))
	for range 3 {
		if _, err := h.svc.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	plain := AppendKey(nil, "d", req.Descriptors[0].Entries)
	if _, ok := h.store.Get(h.clock.Now(), plain); ok {
		t.Fatalf("the sliding window counted on the plain key")
	}
	cfg, err := Parse("ratelimit.yaml", []byte(fixed))
	if err != nil {
		t.Fatal(err)
	}
	h.svc.SetConfig(cfg)
	resp, err := h.svc.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Statuses[0].LimitRemaining; got != 9 {
		t.Fatalf("first hit after the change: %d remaining, want 9 (a new counter)", got)
	}
	if got := h.count("d", req.Descriptors[0]); got != 1 {
		t.Fatalf("fixed window on the plain key: count %d, want 1", got)
	}
	if n := h.store.Len(); n != 2 {
		t.Fatalf("store has %d entries, want 2 (the sliding counter, untouched, and the fixed one)", n)
	}
	// The tag is one more key part, readable by ParseKey.
	sl, err := Parse("ratelimit.yaml", []byte(sliding))
	if err != nil {
		t.Fatal(err)
	}
	dom := sl.Domain("d")
	key := dom.AppendKey(nil, "d", req.Descriptors[0].Entries, dom.Match(req.Descriptors[0].Entries), 1024)
	_, entries, err := ParseKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if want := [][2]string{{"k", "v"}, {keyTagKey, "sliding_window/1m0s"}}; !slices.Equal(entries, want) {
		t.Fatalf("ParseKey(sliding key) entries = %q, want %q", entries, want)
	}
}
