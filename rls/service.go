package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ringlimit/ringlimit/bucket"
)

// Counter applies a request's hits to their counters, wherever they live:
// results[i] is the outcome of ops[i]. now is the request's time in Unix
// nanoseconds, read once by the service. It is implemented by a local
// bucket.Store adapter (LocalCounter) and by the cluster's forwarder.
type Counter interface {
	Apply(ctx context.Context, now int64, ops []bucket.Op, results []bucket.Result)
}

// Store is the part of a bucket.Store a LocalCounter needs.
type Store interface {
	Apply(now int64, op *bucket.Op) bucket.Result
}

// LocalCounter is a Counter that applies every op to one in-process store.
type LocalCounter struct{ Store Store }

// Apply implements Counter.
func (l LocalCounter) Apply(_ context.Context, now int64, ops []bucket.Op, results []bucket.Result) {
	for i := range ops {
		results[i] = l.Store.Apply(now, &ops[i])
	}
}

// Bounds caps what one request may carry. The zero value of a field means
// its default (see DefaultBounds).
type Bounds struct {
	MaxDescriptors int // descriptors per request (default 64)
	MaxEntries     int // entries per descriptor (default 16)
	MaxKeyLen      int // bytes per entry key (default 256)
	// MaxValueLen is the longest entry value kept in a counter key as it is
	// (default 1024): a longer one is not refused but stands in the key as
	// its SHA-256 digest, so that a long path or header value neither fails
	// the request (which Envoy then lets through, or denies) nor makes a
	// key of its length.
	MaxValueLen    int
	MaxRequestSize int // bytes of the whole encoded request (default 256 KiB)
	MaxDomainLen   int // bytes of the domain (default 256)
}

// DefaultBounds are generous for real Envoy traffic.
var DefaultBounds = Bounds{MaxDescriptors: 64, MaxEntries: 16, MaxKeyLen: 256, MaxValueLen: 1024, MaxDomainLen: 256, MaxRequestSize: 256 << 10}

func (b Bounds) withDefaults() Bounds {
	d := DefaultBounds
	if b.MaxDescriptors > 0 {
		d.MaxDescriptors = b.MaxDescriptors
	}
	if b.MaxEntries > 0 {
		d.MaxEntries = b.MaxEntries
	}
	if b.MaxKeyLen > 0 {
		d.MaxKeyLen = b.MaxKeyLen
	}
	if b.MaxValueLen > 0 {
		d.MaxValueLen = b.MaxValueLen
	}
	if b.MaxRequestSize > 0 {
		d.MaxRequestSize = b.MaxRequestSize
	}
	if b.MaxDomainLen > 0 {
		d.MaxDomainLen = b.MaxDomainLen
	}
	return d
}

// Options configures a Service. The zero value works: no shadow mode,
// NearLimitRatio 0.8, no response headers, DefaultBounds, the system clock.
type Options struct {
	// ShadowMode forces every response's overall code to OK; the
	// per-descriptor codes still say what would have happened.
	ShadowMode bool
	// QuotaMode treats every rule as a quota_mode rule (the reference's
	// QUOTA_MODE): see Rule.QuotaMode.
	QuotaMode bool
	// DynamicMetadata sets the response's dynamic_metadata, as the
	// reference's RESPONSE_DYNAMIC_METADATA: the domain, the descriptors
	// and the metadata of the rules that were not over their limit (see
	// dynamicMetadata).
	DynamicMetadata bool
	// StopIncrementWhenOverLimit: when a request would put any of its
	// descriptors over the limit, only those descriptors count its hits
	// (as in envoyproxy/ratelimit): the others consume nothing.
	StopIncrementWhenOverLimit bool
	// NearLimitRatio sets the near_limit stat threshold (default 0.8).
	NearLimitRatio float64
	// ResponseHeaders adds RateLimit-Limit/-Remaining/-Reset headers from
	// the most constrained descriptor. The names default to those.
	ResponseHeaders                           bool
	HeaderLimit, HeaderRemaining, HeaderReset string
	// Bounds caps request sizes.
	Bounds Bounds
	// Clock returns Unix nanoseconds; nil means the system clock.
	Clock func() int64
	// Logger receives service logs; nil discards them.
	Logger *slog.Logger
	// Unconfigured starts the service with no configuration at all rather
	// than an empty one: until the first SetConfig, every ShouldRateLimit
	// that passes validation fails with ErrNoConfig (gRPC Unknown), as
	// envoyproxy/ratelimit answers before its first xDS config.
	Unconfigured bool
}

// ErrNoConfig is the error of a request decided before the first
// configuration of a service started with Options.Unconfigured. It maps to
// gRPC Unknown, with the reference's message.
var ErrNoConfig = errors.New("no rate limit configuration loaded")

// Service is the Envoy-facing RLS v3 service. It is safe for concurrent use;
// the configuration is swapped atomically by SetConfig.
type Service struct {
	pb.UnimplementedRateLimitServiceServer

	opt     Options
	bounds  Bounds
	counter Counter
	metrics *Metrics
	log     *slog.Logger
	now     func() int64

	state   atomic.Pointer[configState]
	scratch sync.Pool // *requestScratch
	// jsonSlots bounds the /json requests read and decoded at once.
	jsonSlots chan struct{}
}

// configState is one loaded configuration with its per-rule stats.
type configState struct {
	cfg   *Config
	stats []*ruleStats // by Rule.Index
	// overrides holds, by domain, the stats and stat key that request-level
	// limit overrides are counted under, built once per config.
	overrides map[string]overrideStats
}

// overrideStats is where a domain's request-level limit overrides count.
type overrideStats struct {
	statKey string
	stats   *ruleStats
}

// NewService returns a service deciding with counter and reporting to
// metrics (nil: a private, unexported registry). It serves an empty config
// (every domain unknown) until SetConfig.
func NewService(opt Options, counter Counter, metrics *Metrics) (*Service, error) {
	if counter == nil {
		return nil, errors.New("rls: nil counter")
	}
	if opt.NearLimitRatio == 0 {
		opt.NearLimitRatio = 0.8
	}
	if opt.NearLimitRatio < 0 || opt.NearLimitRatio > 1 || math.IsNaN(opt.NearLimitRatio) {
		return nil, fmt.Errorf("rls: near limit ratio %v is not in [0, 1]", opt.NearLimitRatio)
	}
	if opt.HeaderLimit == "" {
		opt.HeaderLimit = "RateLimit-Limit"
	}
	if opt.HeaderRemaining == "" {
		opt.HeaderRemaining = "RateLimit-Remaining"
	}
	if opt.HeaderReset == "" {
		opt.HeaderReset = "RateLimit-Reset"
	}
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	s := &Service{
		opt:     opt,
		bounds:  opt.Bounds.withDefaults(),
		counter: counter,
		metrics: metrics,
		log:     opt.Logger,
		now:     opt.Clock,

		jsonSlots: make(chan struct{}, MaxJSONInFlight),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = func() int64 { return time.Now().UnixNano() }
	}
	s.scratch.New = func() any { return new(requestScratch) }
	if !opt.Unconfigured {
		s.state.Store(&configState{cfg: &Config{}}) // not a load: no config_load_success
	}
	return s, nil
}

// SetConfig makes cfg the configuration every following request sees, and
// counts a successful load.
func (s *Service) SetConfig(cfg *Config) {
	st := &configState{cfg: cfg, stats: make([]*ruleStats, len(cfg.Rules())), overrides: map[string]overrideStats{}}
	for _, r := range cfg.Rules() {
		st.stats[r.Index] = s.metrics.rule(r)
	}
	for _, d := range cfg.Domains() {
		st.overrides[d] = overrideStats{statKey: d + ".override", stats: s.metrics.override(d)}
	}
	s.state.Store(st)
	s.metrics.configLoadSuccess.Inc()
}

// ConfigError counts a configuration that failed to load and logs why; the
// current configuration stays.
func (s *Service) ConfigError(err error) {
	s.metrics.configLoadError.Inc()
	s.log.Error("config reload failed, keeping the last good config", "err", err)
}

// Config returns the configuration in use: nil before the first SetConfig of
// a service started with Options.Unconfigured.
func (s *Service) Config() *Config {
	if st := s.state.Load(); st != nil {
		return st.cfg
	}
	return nil
}

// HasConfig reports whether the service has a configuration: always, unless
// it was started with Options.Unconfigured and SetConfig was not called yet.
func (s *Service) HasConfig() bool { return s.state.Load() != nil }

// Register registers the RLS v3 service on g.
func (s *Service) Register(g *grpc.Server) { pb.RegisterRateLimitServiceServer(g, s) }

// requestScratch holds one request's working memory, pooled.
type requestScratch struct {
	rules     []*Rule
	overrides []Rule // request-level limit overrides, by descriptor index
	stats     []*ruleStats
	idx       []int // descriptor index of each op
	ops       []bucket.Op
	results   []bucket.Result
	hits      []uint64 // count's copy of the ops' hits
	keys      []byte
	offs      []int // key offsets into keys
}

// ShouldRateLimit implements the RLS v3 service.
func (s *Service) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.decide(ctx, req)
	s.metrics.observe(resp, err, time.Since(start))
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

// InvalidRequestError is a request the service refuses to decide. It maps to
// gRPC InvalidArgument and HTTP 400.
type InvalidRequestError struct{ Msg string }

func (e *InvalidRequestError) Error() string { return "rls: invalid request: " + e.Msg }

func invalid(format string, args ...any) error {
	return &InvalidRequestError{Msg: fmt.Sprintf(format, args...)}
}

// toStatus maps service errors to gRPC status codes, in one place.
func toStatus(err error) error {
	var inv *InvalidRequestError
	switch {
	case errors.As(err, &inv):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrNoConfig):
		return status.Error(codes.Unknown, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// validate checks req against the bounds before anything is counted. A
// descriptor without entries, or an entry with an empty key, is valid, as in
// envoyproxy/ratelimit: it matches no rule (only a limit override counts it)
// and answers OK, while the request's other descriptors are decided.
func (s *Service) validate(req *pb.RateLimitRequest) error {
	b := s.bounds
	if n := proto.Size(req); n > b.MaxRequestSize {
		return invalid("request is %d bytes, more than the bound of %d", n, b.MaxRequestSize)
	}
	if req.GetDomain() == "" {
		return invalid("rate limit domain must not be empty")
	}
	if len(req.Domain) > b.MaxDomainLen {
		return invalid("domain is %d bytes, more than the bound of %d", len(req.Domain), b.MaxDomainLen)
	}
	if len(req.Descriptors) == 0 {
		return invalid("rate limit descriptor list must not be empty")
	}
	if len(req.Descriptors) > b.MaxDescriptors {
		return invalid("%d descriptors, more than the bound of %d", len(req.Descriptors), b.MaxDescriptors)
	}
	for i, d := range req.Descriptors {
		if d == nil {
			return invalid("descriptors[%d]: nil descriptor", i)
		}
		if len(d.Entries) > b.MaxEntries {
			return invalid("descriptors[%d]: %d entries, more than the bound of %d", i, len(d.Entries), b.MaxEntries)
		}
		for j, e := range d.Entries {
			switch {
			case e == nil:
				return invalid("descriptors[%d].entries[%d]: nil entry", i, j)
			case len(e.Key) > b.MaxKeyLen:
				return invalid("descriptors[%d].entries[%d].key: %d bytes, more than the bound of %d", i, j, len(e.Key), b.MaxKeyLen)
			}
		}
		if o := d.Limit; o != nil {
			if _, ok := overrideUnit(o); !ok {
				return invalid("descriptors[%d].limit.unit: unknown unit %d", i, int32(o.Unit))
			}
		}
	}
	return nil
}

// overrideUnit converts a request-level limit override's unit.
func overrideUnit(o *rlv3.RateLimitDescriptor_RateLimitOverride) (pb.RateLimitResponse_RateLimit_Unit, bool) {
	u := pb.RateLimitResponse_RateLimit_Unit(o.GetUnit())
	if UnitDuration(u) <= 0 {
		return 0, false
	}
	return u, true
}

// decide is ShouldRateLimit without metrics and status mapping.
func (s *Service) decide(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if err := s.validate(req); err != nil {
		return nil, err
	}
	now := s.now()
	st := s.state.Load()
	if st == nil {
		return nil, ErrNoConfig
	}
	n := len(req.Descriptors)
	resp := newResponse(n)
	dom := st.cfg.Domain(req.Domain)
	if dom == nil {
		s.metrics.domainNotFound(req.Domain, n)
		for i := range resp.Statuses {
			resp.Statuses[i] = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
		}
		if s.opt.DynamicMetadata {
			resp.DynamicMetadata = dynamicMetadata(req, nil, resp.Statuses)
		}
		return resp, nil
	}

	sc := s.scratch.Get().(*requestScratch)
	defer s.scratch.Put(sc)
	sc.rules = sc.rules[:0]
	sc.stats = sc.stats[:0]
	if cap(sc.overrides) < n {
		sc.overrides = make([]Rule, n) // sized before any is pointed to
	}
	sc.overrides = sc.overrides[:n]
	for i, d := range req.Descriptors {
		var (
			r  *Rule
			rs *ruleStats
		)
		if o := d.Limit; o != nil {
			r, rs = &sc.overrides[i], st.overrideRule(s, &sc.overrides[i], req.Domain, o)
		} else if r = dom.Match(d.Entries); r != nil {
			rs = st.stats[r.Index]
		}
		sc.rules = append(sc.rules, r)
		sc.stats = append(sc.stats, rs)
	}
	s.dropReplaced(sc.rules)

	// Build one op per limited descriptor.
	sc.ops, sc.idx, sc.keys = sc.ops[:0], sc.idx[:0], sc.keys[:0]
	offs := sc.offs[:0] // keys is appended first and sliced after, as it may move
	reqHits := uint64(max(1, req.HitsAddend))
	for i, d := range req.Descriptors {
		r := sc.rules[i]
		if r == nil || r.Unlimited || d.IsNegativeHits {
			continue
		}
		hits := reqHits
		if h := d.HitsAddend; h != nil {
			hits = h.Value
		}
		start := len(sc.keys)
		offs = append(offs, start)
		sc.keys = dom.AppendKey(sc.keys, req.Domain, d.Entries, r, s.bounds.MaxValueLen)
		sc.keys = capKey(sc.keys, start, req.Domain)
		sc.idx = append(sc.idx, i)
		sc.ops = append(sc.ops, bucket.Op{Limit: r.Limit, Hits: hits})
	}
	offs = append(offs, len(sc.keys))
	sc.offs = offs
	for k := range sc.ops {
		sc.ops[k].Key = sc.keys[offs[k]:offs[k+1]]
	}
	if cap(sc.results) < len(sc.ops) {
		sc.results = make([]bucket.Result, len(sc.ops))
	}
	sc.results = sc.results[:len(sc.ops)]
	if cap(sc.hits) < len(sc.ops) {
		sc.hits = make([]uint64, len(sc.ops))
	}
	s.count(ctx, now, sc.ops, sc.results, sc.hits)

	// Statuses. As in the reference, the overall code is OVER_LIMIT when a
	// descriptor that is not in quota mode is over, or when every one in
	// quota mode is (and there is one); unlimited descriptors are neither.
	var overRate, overQuota, quota int
	k := 0
	for i, d := range req.Descriptors {
		r := sc.rules[i]
		if r == nil || !r.Unlimited {
			if s.quotaMode(r) {
				quota++
			}
		}
		switch {
		case r == nil:
			resp.Statuses[i] = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
			continue
		case r.Unlimited:
			resp.Statuses[i] = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
			continue
		case d.IsNegativeHits:
			resp.Statuses[i] = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
			continue
		}
		op, res := &sc.ops[k], sc.results[k]
		k++
		code := pb.RateLimitResponse_OK
		if res.Over && !r.ShadowMode {
			code = pb.RateLimitResponse_OVER_LIMIT
			if s.quotaMode(r) {
				overQuota++
			} else {
				overRate++
			}
		}
		sc.stats[i].record(r, op.Hits, res, s.opt.NearLimitRatio)
		b := new(limitedStatus) // one allocation for the status and its two sub-messages
		b.limit.Name, b.limit.RequestsPerUnit, b.limit.Unit = r.Name, r.RequestsPerUnit, r.Unit
		b.reset.Seconds = resetSeconds(res.ResetAfter)
		b.status.Code = code
		b.status.CurrentLimit = &b.limit
		b.status.LimitRemaining = uint32(min(res.Remaining, math.MaxUint32))
		b.status.DurationUntilReset = &b.reset
		resp.Statuses[i] = &b.status
	}
	if overRate > 0 || (quota > 0 && overQuota == quota) {
		resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
	}
	if s.opt.ResponseHeaders {
		resp.ResponseHeadersToAdd = s.headers(resp.Statuses, sc.rules)
	}
	if s.opt.DynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, sc.rules, resp.Statuses)
	}
	if s.opt.ShadowMode {
		resp.OverallCode = pb.RateLimitResponse_OK
	}
	return resp, nil
}

// limitedStatus allocates a limited descriptor's status with the messages
// it points to, in one piece.
type limitedStatus struct {
	status pb.RateLimitResponse_DescriptorStatus
	limit  pb.RateLimitResponse_RateLimit
	reset  durationpb.Duration
}

// newResponse allocates an OK response with n status slots; for the common
// single-descriptor request, response and slot come in one allocation.
func newResponse(n int) *pb.RateLimitResponse {
	if n == 1 {
		b := new(struct {
			resp pb.RateLimitResponse
			sts  [1]*pb.RateLimitResponse_DescriptorStatus
		})
		b.resp.OverallCode = pb.RateLimitResponse_OK
		b.resp.Statuses = b.sts[:]
		return &b.resp
	}
	return &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, n)}
}

// count applies ops, honouring StopIncrementWhenOverLimit as the reference
// does: the hits are first checked without being counted; when none would
// put its descriptor over its limit, all are counted; otherwise only the
// descriptors that would be over count their hits, and the others count
// nothing and report their count as it stands. A request with one
// descriptor is therefore counted whether or not it is over, as without the
// option. hits is scratch space; ops' Hits are as given when count returns.
func (s *Service) count(ctx context.Context, now int64, ops []bucket.Op, results []bucket.Result, hits []uint64) {
	if len(ops) == 0 {
		return
	}
	if !s.opt.StopIncrementWhenOverLimit || len(ops) == 1 {
		s.counter.Apply(ctx, now, ops, results)
		return
	}
	for i := range ops {
		ops[i].Mode = bucket.Peek
	}
	s.counter.Apply(ctx, now, ops, results)
	anyOver := false
	for i := range results {
		anyOver = anyOver || results[i].Over
	}
	hits = hits[:len(ops)]
	for i := range ops {
		hits[i] = ops[i].Hits
		ops[i].Mode = bucket.Consume
		if anyOver && !results[i].Over {
			ops[i].Hits = 0 // checks only: the count as it stands
		}
	}
	s.counter.Apply(ctx, now, ops, results)
	for i := range ops {
		ops[i].Hits = hits[i]
	}
}

// dropReplaced removes every matched rule whose name another matched rule
// replaces.
func (s *Service) dropReplaced(rules []*Rule) {
	var replaced []string
	for _, r := range rules {
		if r != nil {
			replaced = append(replaced, r.Replaces...)
		}
	}
	if len(replaced) == 0 {
		return
	}
	for i, r := range rules {
		if r == nil || r.Name == "" || r.Unlimited { // as the reference: unlimited stays unlimited
			continue
		}
		for _, name := range replaced {
			if name == r.Name {
				rules[i] = nil
				break
			}
		}
	}
}

// overrideRule fills r with the rule for a request-level limit override
// (Envoy's `limit` on a descriptor) in a known domain, and returns the
// stats it is counted under (the stat key "override"). It allocates nothing.
func (st *configState) overrideRule(s *Service, r *Rule, domain string, o *rlv3.RateLimitDescriptor_RateLimitOverride) *ruleStats {
	u, _ := overrideUnit(o) // validated
	os, ok := st.overrides[domain]
	if !ok { // not reached: every domain of the config has its entry
		os = overrideStats{statKey: domain + ".override", stats: s.metrics.override(domain)}
	}
	*r = Rule{
		Domain:          domain,
		StatKey:         os.statKey,
		Unit:            u,
		RequestsPerUnit: o.RequestsPerUnit,
		Limit:           bucket.Limit{Requests: uint64(o.RequestsPerUnit), Unit: UnitDuration(u)},
	}
	return os.stats
}

// resetSeconds rounds a reset time up to whole seconds, as the reference's
// unit - now%unit computed in seconds does.
func resetSeconds(ns int64) int64 {
	if ns <= 0 {
		return 0
	}
	return (ns + int64(time.Second) - 1) / int64(time.Second)
}

// quotaMode reports whether a descriptor matched to r (nil: none) is in
// quota mode.
func (s *Service) quotaMode(r *Rule) bool {
	return s.opt.QuotaMode || (r != nil && r.QuotaMode)
}

// headers builds the optional RateLimit-* headers from the descriptor with
// the least remaining quota (the first of equals), except that, as in the
// reference, the last over-limit descriptor not in quota mode wins over any
// other. rules are the descriptors' rules.
func (s *Service) headers(sts []*pb.RateLimitResponse_DescriptorStatus, rules []*Rule) []*core.HeaderValue {
	var min *pb.RateLimitResponse_DescriptorStatus
	least := uint32(math.MaxUint32)
	for i, st := range sts {
		switch {
		case st.Code == pb.RateLimitResponse_OVER_LIMIT && !s.quotaMode(rules[i]):
			min, least = st, 0
		case st.CurrentLimit != nil && st.LimitRemaining < least:
			min, least = st, st.LimitRemaining
		}
	}
	if min == nil {
		return nil
	}
	return []*core.HeaderValue{
		{Key: s.opt.HeaderLimit, Value: strconv.FormatUint(uint64(min.CurrentLimit.RequestsPerUnit), 10)},
		{Key: s.opt.HeaderRemaining, Value: strconv.FormatUint(uint64(min.LimitRemaining), 10)},
		{Key: s.opt.HeaderReset, Value: strconv.FormatInt(min.DurationUntilReset.GetSeconds(), 10)},
	}
}
