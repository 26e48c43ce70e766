package rls

import (
	"math"
	"strings"
	"sync"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/bucket"
)

// Metrics holds the service's Prometheus collectors, under the names
// envoyproxy/ratelimit exports (ratelimit_service_...), plus ringlimit's own
// request metrics. It registers on the registerer it is given, never on the
// global one. Safe for concurrent use.
type Metrics struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode *prometheus.CounterVec

	domainNotFoundVec *prometheus.CounterVec
	configLoadSuccess prometheus.Counter
	configLoadError   prometheus.Counter
	requests          *prometheus.CounterVec
	latency           prometheus.Histogram

	reqOK, reqOver, reqErr prometheus.Counter

	mu      sync.Mutex
	known   map[string]*ruleStats // by label key, so reloads reuse children
	missing map[string]prometheus.Counter
}

// NewMetrics creates the collectors and registers them on reg (nil: not
// registered anywhere).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	rule := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "ratelimit", Subsystem: "service", Name: "rate_limit_" + name, Help: help,
		}, []string{"domain", "key"})
	}
	m := &Metrics{
		totalHits:   rule("total_hits", "Hits counted against a rule."),
		overLimit:   rule("over_limit", "Hits over a rule's limit."),
		nearLimit:   rule("near_limit", "Hits within the limit but above NEAR_LIMIT_RATIO of it."),
		withinLimit: rule("within_limit", "Hits within a rule's limit."),
		shadowMode:  rule("shadow_mode", "Over-limit hits allowed because the rule is in shadow mode."),
		domainNotFoundVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "ratelimit", Subsystem: "service", Name: "domain_not_found",
			Help: "Requests for a domain the config does not have.",
		}, []string{"domain"}),
		configLoadSuccess: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "ratelimit", Subsystem: "service", Name: "config_load_success", Help: "Configurations loaded.",
		}),
		configLoadError: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "ratelimit", Subsystem: "service", Name: "config_load_error", Help: "Configurations that failed to load.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_requests_total", Help: "ShouldRateLimit calls by result (ok, over_limit, error).",
		}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ringlimit_request_duration_seconds",
			Help:    "Time to decide one ShouldRateLimit call.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 14), // 25 µs .. 200 ms
		}),
		known:   map[string]*ruleStats{},
		missing: map[string]prometheus.Counter{},
	}
	m.reqOK = m.requests.WithLabelValues("ok")
	m.reqOver = m.requests.WithLabelValues("over_limit")
	m.reqErr = m.requests.WithLabelValues("error")
	if reg != nil {
		reg.MustRegister(m.totalHits, m.overLimit, m.nearLimit, m.withinLimit, m.shadowMode,
			m.domainNotFoundVec, m.configLoadSuccess, m.configLoadError, m.requests, m.latency)
	}
	return m
}

// ruleStats are one rule's counters, resolved once per config load so the
// hot path only adds to them.
type ruleStats struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode prometheus.Counter
}

// rule returns the counters of r, labelled by domain and the descriptor key
// path (StatKey without the domain).
func (m *Metrics) rule(r *Rule) *ruleStats {
	key := strings.TrimPrefix(r.StatKey, r.Domain+".")
	return m.stats(r.Domain, key)
}

func (m *Metrics) override(domain string) *ruleStats { return m.stats(domain, "override") }

func (m *Metrics) stats(domain, key string) *ruleStats {
	id := domain + "\x00" + key
	m.mu.Lock()
	defer m.mu.Unlock()
	if rs, ok := m.known[id]; ok {
		return rs
	}
	rs := &ruleStats{
		totalHits:   m.totalHits.WithLabelValues(domain, key),
		overLimit:   m.overLimit.WithLabelValues(domain, key),
		nearLimit:   m.nearLimit.WithLabelValues(domain, key),
		withinLimit: m.withinLimit.WithLabelValues(domain, key),
		shadowMode:  m.shadowMode.WithLabelValues(domain, key),
	}
	m.known[id] = rs
	return rs
}

// domainNotFound counts n descriptors of a request for an unknown domain:
// the reference counts each descriptor it looks up. The number of distinct
// domain labels is capped so a client cannot grow it without bound.
func (m *Metrics) domainNotFound(domain string, n int) {
	const maxDomains = 100
	m.mu.Lock()
	c, ok := m.missing[domain]
	if !ok {
		if len(m.missing) >= maxDomains {
			domain = "_other"
			c, ok = m.missing[domain]
		}
		if !ok {
			c = m.domainNotFoundVec.WithLabelValues(domain)
			m.missing[domain] = c
		}
	}
	m.mu.Unlock()
	c.Add(float64(n))
}

// record updates a rule's stats the way envoyproxy/ratelimit does: hits
// before and after the increment are split between within, near and over.
// The limit is the rule's capacity (a token bucket's burst) and the counts
// are the algorithm's usage (bucket.Result.Count).
func (rs *ruleStats) record(r *Rule, hits uint64, res bucket.Result, nearRatio float64) {
	limit := r.Limit.Capacity()
	after := res.Count
	before := uint64(0)
	if after > hits {
		before = after - hits
	}
	// The reference computes the threshold in float32; float64 differs for
	// some limits (0.7 of 90 is 63 in float32, 62 in float64).
	near := uint64(math.Floor(float64(float32(limit) * float32(nearRatio))))
	rs.totalHits.Add(float64(hits))
	if res.Over {
		over := hits // hits over the limit; shadow_mode counts the same
		if before < limit {
			over = after - limit
			rs.nearLimit.Add(float64(limit - max(near, before)))
		}
		rs.overLimit.Add(float64(over))
		if r.ShadowMode {
			rs.shadowMode.Add(float64(over))
		}
		return
	}
	if after > near {
		if before >= near {
			rs.nearLimit.Add(float64(hits))
		} else {
			rs.nearLimit.Add(float64(after - near))
		}
	}
	rs.withinLimit.Add(float64(hits))
}

// observe counts one call and its latency.
func (m *Metrics) observe(resp *pb.RateLimitResponse, err error, d time.Duration) {
	switch {
	case err != nil:
		m.reqErr.Inc()
	case resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT:
		m.reqOver.Inc()
	default:
		m.reqOK.Inc()
	}
	m.latency.Observe(d.Seconds())
}
