package rls

import (
	"context"
	"errors"
	"fmt"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// svMetric reads one rule counter of vec.
func svMetric(t *testing.T, vec *prometheus.CounterVec, domain, key string) float64 {
	t.Helper()
	return testutil.ToFloat64(vec.WithLabelValues(domain, key))
}

// svGathered gathers reg and returns the value of the counter family name
// whose labels are exactly labels; ok is false if there is none.
func svGathered(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (v float64, ok bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; !ok || want != lp.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

const svMetricsConfig = `domain: m
descriptors:
  - key: ten
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: ninety
    rate_limit: {unit: minute, requests_per_unit: 90}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: unl
    rate_limit: {unlimited: true}
  - key: base
    rate_limit: {unit: minute, requests_per_unit: 10, name: base}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 10, replaces: [{name: base}]}
  - key: k
    value: v
    descriptors:
      - key: inner
        rate_limit: {unit: second, requests_per_unit: 1}
`

// TestMetricsSplit checks that the per-rule stats split each request's hits
// between within_limit, near_limit, over_limit and shadow_mode exactly as
// envoyproxy/ratelimit's base limiter does: near threshold =
// floor(float32(limit) * float32(ratio)); over a limit, the hits above it are
// over_limit (all of them if the count was already at the limit), the part
// between max(near threshold, count before) and the limit is near_limit, and
// within the limit every hit is within_limit and the part above the near
// threshold is also near_limit. shadow_mode counts what over_limit counts, on
// a shadow rule. Each step's want is cumulative.
func TestMetricsSplit(t *testing.T) {
	type want struct{ total, within, near, over, shadow float64 }
	type step struct {
		hits uint64 // the descriptor's hits_addend
		want want
	}
	tests := []struct {
		name  string
		key   string
		ratio float64
		steps []step
	}{
		{"one hit at a time", "ten", 0, []step{
			{1, want{1, 1, 0, 0, 0}}, {1, want{2, 2, 0, 0, 0}}, {1, want{3, 3, 0, 0, 0}}, {1, want{4, 4, 0, 0, 0}},
			{1, want{5, 5, 0, 0, 0}}, {1, want{6, 6, 0, 0, 0}}, {1, want{7, 7, 0, 0, 0}}, {1, want{8, 8, 0, 0, 0}},
			{1, want{9, 9, 1, 0, 0}}, {1, want{10, 10, 2, 0, 0}},
			{1, want{11, 10, 2, 1, 0}}, {1, want{12, 10, 2, 2, 0}},
		}},
		{"bulk hits up to and past the limit", "ten", 0, []step{
			{7, want{7, 7, 0, 0, 0}},
			{2, want{9, 9, 1, 0, 0}},   // 7 -> 9: one above the threshold of 8
			{1, want{10, 10, 2, 0, 0}}, // 9 -> 10: all near
			{3, want{13, 10, 2, 3, 0}}, // 10 -> 13: all over
		}},
		{"crossing the limit from below the near threshold", "ten", 0, []step{
			{7, want{7, 7, 0, 0, 0}},
			{5, want{12, 7, 2, 2, 0}}, // 7 -> 12: 8..10 near, 2 over
		}},
		{"crossing the limit from inside the near band", "ten", 0, []step{
			{9, want{9, 9, 1, 0, 0}},
			{3, want{12, 9, 2, 2, 0}}, // 9 -> 12: 1 near, 2 over
		}},
		{"one hit larger than the limit", "ten", 0, []step{
			{15, want{15, 0, 2, 5, 0}},
		}},
		{"check-only requests count nothing", "ten", 0, []step{
			{10, want{10, 10, 2, 0, 0}},
			{0, want{10, 10, 2, 0, 0}},
			{0, want{10, 10, 2, 0, 0}},
		}},
		{"shadow rule: shadow_mode counts the over-limit hits", "shadow", 0, []step{
			{5, want{5, 5, 0, 0, 0}},
			{7, want{12, 5, 2, 2, 2}}, // 5 -> 12: 2 over, so 2 shadow
			{1, want{13, 5, 2, 3, 3}}, // already over: all shadow
			{4, want{17, 5, 2, 7, 7}},
		}},
		{"ratio 0.7 of 90: the threshold is 63, computed in float32", "ninety", 0.7, []step{
			{63, want{63, 63, 0, 0, 0}},
			{1, want{64, 64, 1, 0, 0}},
		}},
		{"ratio 1: no near band below the limit", "ten", 1, []step{
			{10, want{10, 10, 0, 0, 0}},
			{1, want{11, 10, 0, 1, 0}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := svNew(t, svMetricsConfig, Options{NearLimitRatio: tt.ratio})
			m := h.svc.metrics
			for i, s := range tt.steps {
				req := svReq("m", 0, svHits(svD(tt.key, "x"), s.hits))
				if _, err := h.svc.ShouldRateLimit(context.Background(), req); err != nil {
					t.Fatal(err)
				}
				got := want{
					total:  svMetric(t, m.totalHits, "m", tt.key),
					within: svMetric(t, m.withinLimit, "m", tt.key),
					near:   svMetric(t, m.nearLimit, "m", tt.key),
					over:   svMetric(t, m.overLimit, "m", tt.key),
					shadow: svMetric(t, m.shadowMode, "m", tt.key),
				}
				if got != s.want {
					t.Fatalf("step %d (+%d hits): {total within near over shadow} = %v, want %v", i, s.hits, got, s.want)
				}
			}
		})
	}
}

// TestMetricsNoStats: descriptors without a limit, unlimited ones and
// replaced ones count nothing (the reference drops their limit before its
// stats).
func TestMetricsNoStats(t *testing.T) {
	h := svNew(t, svMetricsConfig, Options{})
	m := h.svc.metrics
	req := svReq("m", 0, svD("unl", "x"), svD("base", "1"), svD("vip", "1"), svD("nothing", "x"))
	if _, err := h.svc.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"unl", "base"} {
		if got := svMetric(t, m.totalHits, "m", key); got != 0 {
			t.Errorf("total_hits{key=%q} = %v, want 0", key, got)
		}
	}
	if got := svMetric(t, m.totalHits, "m", "vip"); got != 1 {
		t.Errorf("total_hits{key=vip} = %v, want 1", got)
	}
}

// TestMetricsNames checks the exported names and label values: domain, and
// the descriptor key path ("key" or "key_value" per level, joined by ".").
func TestMetricsNames(t *testing.T) {
	h := svNew(t, svMetricsConfig, Options{})
	ctx := context.Background()
	reqs := []struct {
		domain string
		d      []string
		limit  bool // with a request-level override
	}{
		{"m", []string{"ten", "a"}, false},
		{"m", []string{"k", "v", "inner", "i"}, false},
		{"m", []string{"k", "v", "inner", "i"}, false},
		{"m", []string{"ten", "b"}, true},
		{"nope", []string{"ten", "a"}, false},
		{"nope", []string{"ten", "a"}, false},
		{"", []string{"ten", "a"}, false}, // invalid: an error
	}
	for _, r := range reqs {
		d := svD(r.d...)
		if r.limit {
			svLimit(d, 5, typev3.RateLimitUnit_MINUTE)
		}
		h.svc.ShouldRateLimit(ctx, svReq(r.domain, 0, d))
	}
	tests := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ratelimit_service_rate_limit_total_hits", map[string]string{"domain": "m", "key": "ten"}, 1},
		{"ratelimit_service_rate_limit_within_limit", map[string]string{"domain": "m", "key": "ten"}, 1},
		{"ratelimit_service_rate_limit_total_hits", map[string]string{"domain": "m", "key": "k_v.inner"}, 2},
		{"ratelimit_service_rate_limit_over_limit", map[string]string{"domain": "m", "key": "k_v.inner"}, 1},
		{"ratelimit_service_rate_limit_near_limit", map[string]string{"domain": "m", "key": "k_v.inner"}, 1},
		{"ratelimit_service_rate_limit_shadow_mode", map[string]string{"domain": "m", "key": "shadow"}, 0},
		{"ratelimit_service_rate_limit_total_hits", map[string]string{"domain": "m", "key": "override"}, 1},
		{"ratelimit_service_domain_not_found", map[string]string{"domain": "nope"}, 2},
		{"ratelimit_service_config_load_success", map[string]string{}, 1},
		{"ratelimit_service_config_load_error", map[string]string{}, 0},
		{"ringlimit_requests_total", map[string]string{"result": "ok"}, 5},
		{"ringlimit_requests_total", map[string]string{"result": "over_limit"}, 1},
		{"ringlimit_requests_total", map[string]string{"result": "error"}, 1},
	}
	for _, tt := range tests {
		got, ok := svGathered(t, h.reg, tt.name, tt.labels)
		if !ok || got != tt.want {
			t.Errorf("%s%v = %v (found %t), want %v", tt.name, tt.labels, got, ok, tt.want)
		}
	}
}

// TestMetricsConfigLoads: config_load_success counts SetConfig calls (not the
// empty config a new service starts with), config_load_error counts
// ConfigError, and rule counters continue across a reload.
func TestMetricsConfigLoads(t *testing.T) {
	h := svNew(t, svMetricsConfig, Options{})
	m := h.svc.metrics
	ctx := context.Background()
	if got := testutil.ToFloat64(m.configLoadSuccess); got != 1 {
		t.Fatalf("config_load_success after NewService and one SetConfig = %v, want 1", got)
	}
	if _, err := h.svc.ShouldRateLimit(ctx, svReq("m", 3, svD("ten", "x"))); err != nil {
		t.Fatal(err)
	}
	h.svc.ConfigError(errors.New("rls: ratelimit.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'"))
	if got := testutil.ToFloat64(m.configLoadError); got != 1 {
		t.Fatalf("config_load_error = %v, want 1", got)
	}
	cfg, err := Parse("ratelimit.yaml", []byte(svMetricsConfig))
	if err != nil {
		t.Fatal(err)
	}
	h.svc.SetConfig(cfg)
	if got := testutil.ToFloat64(m.configLoadSuccess); got != 2 {
		t.Fatalf("config_load_success = %v, want 2", got)
	}
	if _, err := h.svc.ShouldRateLimit(ctx, svReq("m", 2, svD("ten", "x"))); err != nil {
		t.Fatal(err)
	}
	if got := svMetric(t, m.totalHits, "m", "ten"); got != 5 {
		t.Fatalf("total_hits across a reload = %v, want 5", got)
	}
	// Without a private registry nothing is registered anywhere, and the
	// service still works.
	s, err := NewService(Options{}, LocalCounter{Store: h.store}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetConfig(cfg)
	if _, err := s.ShouldRateLimit(ctx, svReq("m", 0, svD("ten", "y"))); err != nil {
		t.Fatal(err)
	}
}

// TestMetricsDomainNotFoundCap: every descriptor of a request for an unknown
// domain counts, as in the reference; at most 100 distinct domain labels, the
// rest count under "_other".
func TestMetricsDomainNotFoundCap(t *testing.T) {
	h := svNew(t, svMetricsConfig, Options{})
	for i := range 105 {
		ds := []*rlv3.RateLimitDescriptor{svD("k", "v")}
		if i == 0 {
			ds = append(ds, svD("k", "w"), svD("x", "y"))
		}
		if _, err := h.svc.ShouldRateLimit(context.Background(), svReq(fmt.Sprintf("d%03d", i), 0, ds...)); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.CollectAndCount(h.svc.metrics.domainNotFoundVec); got != 101 {
		t.Fatalf("domain_not_found series = %d, want 101", got)
	}
	for _, c := range []struct {
		domain string
		want   float64
	}{{"d000", 3}, {"d099", 1}, {"_other", 5}} {
		if got, _ := svGathered(t, h.reg, "ratelimit_service_domain_not_found", map[string]string{"domain": c.domain}); got != c.want {
			t.Errorf("domain_not_found{domain=%q} = %v, want %v", c.domain, got, c.want)
		}
	}
}
