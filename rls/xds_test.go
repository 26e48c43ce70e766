package rls

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	confpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/rls/xdstest"
)

// startXDSServer starts an xdstest.Server on addr, stopped at cleanup.
func startXDSServer(t *testing.T, addr string) *xdstest.Server {
	t.Helper()
	s, err := xdstest.Start(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

func setXDS(t *testing.T, s *xdstest.Server, node, version string, cfgs ...*confpb.RateLimitConfig) {
	t.Helper()
	if err := s.Set(node, version, cfgs...); err != nil {
		t.Fatal(err)
	}
}

// rlc is a RateLimitConfig with one descriptor key=value limited to rpu a
// minute.
func rlc(name, domain, key, value string, rpu uint32) *confpb.RateLimitConfig {
	return &confpb.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*confpb.RateLimitDescriptor{{
		Key: key, Value: value, RateLimit: &confpb.RateLimitPolicy{Unit: confpb.RateLimitUnit_MINUTE, RequestsPerUnit: rpu},
	}}}
}

func anys(t *testing.T, msgs ...proto.Message) []*anypb.Any {
	t.Helper()
	out := make([]*anypb.Any, len(msgs))
	for i, m := range msgs {
		a, err := anypb.New(m)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

// A resource converts to the config its YAML file would load to, and is
// refused with the file's errors, naming the resource.
func TestConfigFromXDS(t *testing.T) {
	full := &confpb.RateLimitConfig{Name: "b", Domain: "d", Descriptors: []*confpb.RateLimitDescriptor{
		{Key: "remote_address", RateLimit: &confpb.RateLimitPolicy{Unit: confpb.RateLimitUnit_SECOND, RequestsPerUnit: 5, Name: "ip"},
			Descriptors: []*confpb.RateLimitDescriptor{{Key: "PATH", Value: "/a*", ShadowMode: true, DetailedMetric: true,
				RateLimit: &confpb.RateLimitPolicy{Unit: confpb.RateLimitUnit(7), RequestsPerUnit: 1,
					Replaces: []*confpb.RateLimitReplace{{Name: "ip"}}}}}},
		{Key: "free", RateLimit: &confpb.RateLimitPolicy{Unlimited: true}},
		{Key: "blocked", RateLimit: &confpb.RateLimitPolicy{Unit: confpb.RateLimitUnit_HOUR}},
	}}
	yaml := `domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 5, name: ip}
    descriptors:
      - key: PATH
        value: "/a*"
        shadow_mode: true
        detailed_metric: true
        rate_limit: {unit: week, requests_per_unit: 1, replaces: [{name: ip}]}
  - key: free
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: hour}
`
	want, err := Parse("f.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	got, err := ConfigFromXDS("7", anys(t, full, rlc("a", "other", "k", "v", 3)), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Version() != "7" || !strings.HasPrefix(got.Dump(), want.Dump()) || len(got.Domains()) != 2 {
		t.Fatalf("version %q, dump\n%s\nwant it to start with\n%s", got.Version(), got.Dump(), want.Dump())
	}
	if empty, err := ConfigFromXDS("1", nil, LoadOptions{}); err != nil || len(empty.Domains()) != 0 {
		t.Fatalf("no resources: %v, %v; want an empty config", empty, err)
	}

	badUnit := rlc("bad", "d", "k", "", 1)
	badUnit.Descriptors[0].RateLimit.Unit = confpb.RateLimitUnit_UNKNOWN
	weird := rlc("weird", "d", "k", "", 1)
	weird.Descriptors[0].RateLimit.Unit = confpb.RateLimitUnit(42)
	for _, tc := range []struct {
		name  string
		res   []*anypb.Any
		opt   LoadOptions
		wants []string
	}{
		{"unknown unit", anys(t, badUnit), LoadOptions{}, []string{`rls: xds RateLimitConfig "bad": descriptors[0].rate_limit.unit: invalid rate limit unit 'UNKNOWN'`}},
		{"unit out of range", anys(t, weird), LoadOptions{}, []string{`descriptors[0].rate_limit.unit: invalid rate limit unit '42'`}},
		{"empty domain", anys(t, rlc("x", "", "k", "", 1)), LoadOptions{}, []string{`"x": domain: config file cannot have empty domain`}},
		{"empty key", anys(t, rlc("x", "d", "", "", 1)), LoadOptions{}, []string{`"x": descriptors[0]: descriptor has empty key`}},
		{"domain twice", anys(t, rlc("x", "d", "k", "", 1), rlc("y", "d", "j", "", 1)), LoadOptions{}, []string{`"y": domain: duplicate domain 'd'`}},
		{"descriptor twice, merged", anys(t, rlc("x", "d", "k", "", 1), rlc("y", "d", "k", "", 1)), LoadOptions{MergeDomains: true}, []string{`"y": descriptors[0]: duplicate descriptor composite key 'd.k'`}},
		{"another type", anys(t, &discovery.DiscoveryRequest{}), LoadOptions{}, []string{`rls: xds resources[0]: type "type.googleapis.com/envoy.service.discovery.v3.DiscoveryRequest"`}},
		{"not a message", []*anypb.Any{{TypeUrl: XDSTypeURL, Value: []byte{0xff}}}, LoadOptions{}, []string{`rls: xds resources[0]:`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ConfigFromXDS("1", tc.res, tc.opt)
			if err == nil {
				t.Fatalf("got %v, want an error", cfg.Dump())
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	merged, err := ConfigFromXDS("1", anys(t, rlc("x", "d", "k", "", 1), rlc("y", "d", "j", "", 1)), LoadOptions{MergeDomains: true})
	if err != nil || len(merged.Rules()) != 2 {
		t.Fatalf("merged: %v, %v", merged, err)
	}
}

func TestXDSBackoffDelay(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		b    XDSBackoff
		n    int
		r    float64
		want time.Duration
	}{
		{XDSBackoff{10 * s, 60 * s, 0.5, true}, 0, 0.9, 10 * s}, // the reference's defaults: always the first wait
		{XDSBackoff{10 * s, 60 * s, 0.5, true}, 5, 0.9, 10 * s},
		{XDSBackoff{s, 60 * s, 2, false}, 0, 0, s},
		{XDSBackoff{s, 60 * s, 2, false}, 3, 0, 8 * s},
		{XDSBackoff{s, 60 * s, 2, false}, 10, 0, 60 * s},
		{XDSBackoff{s, 60 * s, 2, true}, 3, 0.5, 4500 * time.Millisecond}, // between 1 s and 8 s
		{XDSBackoff{s, 60 * s, 0, false}, 2, 0, 4 * s},                    // factor 0 means 2
		{XDSBackoff{5 * s, 2 * s, 2, false}, 0, 0, 2 * s},                 // max below initial
		{XDSBackoff{s, 60 * s, 2, false}, 5000, 0, 60 * s},                // overflow
		{XDSBackoff{}, 0, 0, 10 * s},
	} {
		if got := tc.b.Delay(tc.n, tc.r); got != tc.want {
			t.Errorf("%+v.Delay(%d, %v) = %v, want %v", tc.b, tc.n, tc.r, got, tc.want)
		}
	}
}

// xdsFixture is a client subscribed to a server, recording what it applies.
type xdsFixture struct {
	client  *XDSClient
	metrics *XDSMetrics
	mu      sync.Mutex
	applied []*Config
	errs    []error
}

func newXDSFixture(t *testing.T, addr string, b XDSBackoff) *xdsFixture {
	t.Helper()
	f := &xdsFixture{metrics: NewXDSMetrics(prometheus.NewRegistry())}
	c, err := NewXDSClient(XDSOptions{
		Server: addr, NodeID: "node-a", NodeMetadata: map[string]string{"k": "v"}, Headers: map[string]string{"x-test": "1"},
		DialOptions:          []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		ConnectRetryInterval: 50 * time.Millisecond, Backoff: b,
		Apply: func(c *Config) {
			f.mu.Lock()
			f.applied = append(f.applied, c)
			f.mu.Unlock()
		},
		Reject: func(err error) {
			f.mu.Lock()
			f.errs = append(f.errs, err)
			f.mu.Unlock()
		},
		Metrics: f.metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.client = c
	t.Cleanup(func() { c.Close() })
	return f
}

// last is the version applied last ("" for none) and the rejections.
func (f *xdsFixture) last() (string, *Config, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.applied) == 0 {
		return "", nil, len(f.errs)
	}
	c := f.applied[len(f.applied)-1]
	return c.Version(), c, len(f.errs)
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond) // polling interval of a bounded wait
	}
}

// The client applies and ACKs each version, NACKs a bad one (once per
// version, re-sent copies paced) while keeping the last good config, keeps
// it while the server is away, and applies what a restarted server counting
// from 1 again serves.
func TestXDSClientAgainstGoControlPlane(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // after the other cleanups
	srv := startXDSServer(t, "127.0.0.1:0")
	setXDS(t, srv, "other-node", "9", rlc("x", "wrong", "k", "", 1))
	f := newXDSFixture(t, srv.Addr, XDSBackoff{Initial: 50 * time.Millisecond, Max: 100 * time.Millisecond, Factor: 2})

	setXDS(t, srv, "node-a", "1", rlc("r", "d", "k", "v", 10))
	waitUntil(t, 10*time.Second, "version 1 applied and ACKed", func() bool {
		v, _, _ := f.last()
		acks := srv.ACKs()
		return v == "1" && len(acks) > 0 && acks[len(acks)-1] == "1"
	})
	if testutil.ToFloat64(f.metrics.version.WithLabelValues("1")) != 1 || testutil.ToFloat64(f.metrics.connected) != 1 {
		t.Fatal("version_info{version=1} or connected is not 1")
	}

	setXDS(t, srv, "node-a", "2", rlc("r", "d", "k", "v", 20), rlc("s", "e", "k", "", 1))
	waitUntil(t, 5*time.Second, "version 2 applied", func() bool { v, _, _ := f.last(); return v == "2" })
	_, cfg, _ := f.last()
	if len(cfg.Domains()) != 2 || cfg.Rules()[0].RequestsPerUnit != 20 {
		t.Fatalf("version 2: %s", cfg.Dump())
	}
	if testutil.CollectAndCount(f.metrics.version) != 1 {
		t.Fatal("version_info keeps the old version's series")
	}

	bad := rlc("r", "d", "k", "v", 30)
	bad.Descriptors[0].RateLimit.Unit = confpb.RateLimitUnit_UNKNOWN
	setXDS(t, srv, "node-a", "3", bad)
	waitUntil(t, 5*time.Second, "version 3 NACKed", func() bool { return len(srv.NACKs()) > 0 })
	nack := srv.NACKs()[0]
	if nack.GetVersionInfo() != "2" || !strings.Contains(nack.GetErrorDetail().GetMessage(), `xds RateLimitConfig "r": descriptors[0].rate_limit.unit: invalid rate limit unit 'UNKNOWN'`) {
		t.Fatalf("NACK version %q, detail %q", nack.GetVersionInfo(), nack.GetErrorDetail().GetMessage())
	}
	// The server re-sends the rejected version at once after each NACK:
	// the repeats are paced and reported once.
	start := time.Now()
	waitUntil(t, 5*time.Second, "the rejected version re-sent and NACKed again", func() bool { return len(srv.NACKs()) >= 3 })
	n := len(srv.NACKs())
	if max := 2 + int(time.Since(start)/xdsRenackDelay); n > max {
		t.Fatalf("%d NACKs in %v, want at most %d", n, time.Since(start), max)
	}
	if v, _, rejected := f.last(); v != "2" || rejected != 1 {
		t.Fatalf("after the bad version: applied %q, %d rejections reported; want 2 and 1", v, rejected)
	}

	setXDS(t, srv, "node-a", "4", rlc("r", "d", "k", "v", 40))
	waitUntil(t, 5*time.Second, "version 4 applied after the bad one", func() bool { v, _, _ := f.last(); return v == "4" })

	// The server goes away: nothing changes; a new one (versions from 1
	// again) is applied.
	srv.Stop()
	waitUntil(t, 5*time.Second, "disconnected", func() bool { return testutil.ToFloat64(f.metrics.connected) == 0 })
	if v, _, _ := f.last(); v != "4" {
		t.Fatalf("applied %q after the server left", v)
	}
	srv2 := startXDSServer(t, srv.Addr)
	setXDS(t, srv2, "node-a", "1", rlc("r", "d", "k", "v", 50))
	waitUntil(t, 10*time.Second, "version 1 of the new server applied", func() bool {
		_, c, _ := f.last()
		return c.Version() == "1" && c.Rules()[0].RequestsPerUnit == 50
	})
	if err := f.client.Close(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// Before the first config a Service started Unconfigured refuses to decide
// with the reference's error, and decides once a config is set.
func TestServiceUnconfigured(t *testing.T) {
	svc, err := NewService(Options{Unconfigured: true}, LocalCounter{Store: bucket.NewStore(bucket.StoreConfig{})}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if svc.HasConfig() || svc.Config() != nil {
		t.Fatal("configured before SetConfig")
	}
	req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{svD("k", "v")}}
	if _, err := svc.ShouldRateLimit(context.Background(), req); err == nil || !strings.Contains(err.Error(), "code = Unknown desc = no rate limit configuration loaded") {
		t.Fatalf("err %v, want Unknown: no rate limit configuration loaded", err)
	}
	cfg, err := ConfigFromXDS("5", anys(t, rlc("r", "d", "k", "v", 1)), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.SetConfig(cfg)
	if resp, err := svc.ShouldRateLimit(context.Background(), req); err != nil || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 1 {
		t.Fatalf("after SetConfig: %v, %v", resp, err)
	}
}

// FuzzConfigFromXDS feeds arbitrary bytes as a RateLimitConfig resource:
// conversion never panics, and a config it accepts has the resource's
// domain only and converts the same way twice.
func FuzzConfigFromXDS(f *testing.F) {
	for _, m := range []*confpb.RateLimitConfig{
		rlc("r", "d", "k", "v", 3),
		{Name: "n", Domain: "d", Descriptors: []*confpb.RateLimitDescriptor{{Key: "a", Value: "x*", Descriptors: []*confpb.RateLimitDescriptor{
			{Key: "b", RateLimit: &confpb.RateLimitPolicy{Unit: 7, RequestsPerUnit: 2, Name: "b", Replaces: []*confpb.RateLimitReplace{{Name: "c"}}}}}}}},
		{Domain: "d", Descriptors: []*confpb.RateLimitDescriptor{{Key: "u", RateLimit: &confpb.RateLimitPolicy{Unlimited: true}}}},
		{Domain: "d", Descriptors: []*confpb.RateLimitDescriptor{{Key: "q", QuotaMode: true, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"s": structpb.NewStringValue("x"), "l": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewNumberValue(1), structpb.NewNullValue()}}),
		}}, RateLimit: &confpb.RateLimitPolicy{Unit: 1, RequestsPerUnit: 1}}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		res := []*anypb.Any{{TypeUrl: XDSTypeURL, Value: b}}
		cfg, err := ConfigFromXDS("v", res, LoadOptions{})
		if err != nil {
			return
		}
		var m confpb.RateLimitConfig
		if err := proto.Unmarshal(b, &m); err != nil {
			t.Fatalf("accepted bytes that do not unmarshal: %v", err)
		}
		if d := cfg.Domains(); len(d) != 1 || d[0] != m.GetDomain() {
			t.Fatalf("domains %q, want [%q]", d, m.GetDomain())
		}
		again, err := ConfigFromXDS("v", res, LoadOptions{})
		if err != nil || again.Dump() != cfg.Dump() {
			t.Fatalf("second conversion: %v, dump %q vs %q", err, again.Dump(), cfg.Dump())
		}
	})
}

// A NACK's error_detail is cut to xdsMaxErrorDetail bytes on a character
// boundary: a proto string must be UTF-8, and a NACK that cannot be
// marshalled never reaches the server (the stream fails instead, again for
// every re-sent copy).
func TestXDSNACKLongErrorIsUTF8(t *testing.T) {
	for pad := range 2 {
		c := &XDSClient{opt: XDSOptions{Reject: func(error) {}}, log: slog.New(slog.DiscardHandler), m: NewXDSMetrics(nil)}
		// The resource's name is in every error about it; no domain is one.
		name := strings.Repeat("x", pad) + strings.Repeat("é", xdsMaxErrorDetail)
		resp := &discovery.DiscoveryResponse{VersionInfo: "1", TypeUrl: XDSTypeURL, Nonce: "n",
			Resources: anys(t, &confpb.RateLimitConfig{Name: name})}
		var st xdsState
		req, _ := c.handle(resp, &st)
		msg := req.GetErrorDetail().GetMessage()
		if msg == "" || len(msg) > xdsMaxErrorDetail+len("...") {
			t.Fatalf("pad %d: error_detail of %d bytes, want a message of at most %d", pad, len(msg), xdsMaxErrorDetail+len("..."))
		}
		if _, err := proto.Marshal(req); err != nil {
			t.Fatalf("pad %d: the NACK does not marshal: %v", pad, err)
		}
	}
}

// A resource's quota_mode and metadata reach the rule as a file's do, as the
// reference reads them from xDS.
func TestConfigFromXDSQuotaModeAndMetadata(t *testing.T) {
	md, err := structpb.NewStruct(map[string]any{
		"team": "a", "n": 3, "f": 0.5, "on": true, "none": nil, "big": 1e21, "tiny": -1e-7, "inf": math.Inf(1),
		"nested": map[string]any{"x": "y", "list": []any{1, "two", false}},
	})
	if err != nil {
		t.Fatal(err)
	}
	res := rlc("r", "d", "k", "v", 10)
	res.Descriptors[0].QuotaMode = true
	res.Descriptors[0].Metadata = md
	got, err := ConfigFromXDS("1", anys(t, res), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := Parse("f.yaml", []byte(`domain: d
descriptors:
  - key: k
    value: v
    quota_mode: true
    metadata: {team: a, n: 3, f: 0.5, "on": true, none: null, big: 1e21, tiny: -1e-7, inf: .inf, nested: {x: "y", list: [1, two, false]}}
    rate_limit: {unit: minute, requests_per_unit: 10}
`))
	if err != nil {
		t.Fatal(err)
	}
	g, w := got.Rules()[0], want.Rules()[0]
	if !g.QuotaMode || !proto.Equal(g.Metadata, w.Metadata) || !proto.Equal(g.Metadata, md) {
		t.Fatalf("quota_mode %v, metadata %v; want true and %v (the file's: %v)", g.QuotaMode, g.Metadata, md, w.Metadata)
	}
}
