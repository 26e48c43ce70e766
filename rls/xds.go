package rls

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"
	"unicode/utf8"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// XDSBackoff is how long an XDSClient waits before it opens a new stream
// after one that had delivered a response ended, with the meaning
// envoyproxy/ratelimit gives its XDS_CLIENT_BACKOFF_* settings: the n-th
// wait in a row (n from 0) is Initial*Factor^n, drawn uniformly between
// Initial and that when Jitter is set, and kept within [Initial, Max]. A
// Factor below 1 (the reference's default, 0.5) therefore waits Initial
// every time; 0 means 2. The count starts again after a stream delivers a
// response.
type XDSBackoff struct {
	Initial, Max time.Duration
	Factor       float64
	Jitter       bool
}

// Delay is the wait before attempt n (from 0); r in [0, 1) draws the
// jitter.
func (b XDSBackoff) Delay(n int, r float64) time.Duration {
	lo, hi := b.Initial, b.Max
	if lo <= 0 {
		lo = 10 * time.Second
	}
	if hi <= 0 {
		hi = time.Minute
	}
	if lo >= hi {
		return hi
	}
	f := b.Factor
	if f <= 0 {
		f = 2
	}
	d := float64(lo) * math.Pow(f, float64(n))
	if b.Jitter && d > float64(lo) {
		d = float64(lo) + r*(d-float64(lo))
	}
	switch {
	case d >= float64(hi) || math.IsNaN(d):
		return hi
	case d <= float64(lo):
		return lo
	}
	return time.Duration(d)
}

// XDSOptions configures an XDSClient. Server, NodeID, Apply and Reject are
// required.
type XDSOptions struct {
	// Server is the management server's gRPC target, e.g. "host:18001".
	Server string
	// NodeID and NodeMetadata identify this client in every request: the
	// server's snapshot cache is keyed by the node id.
	NodeID       string
	NodeMetadata map[string]string
	// Headers are sent as gRPC metadata when a stream opens.
	Headers map[string]string
	// DialOptions are added to the client's own; they must carry the
	// transport credentials (insecure ones for plaintext).
	DialOptions []grpc.DialOption
	// ConnectRetryInterval is the wait between attempts to reach a server
	// that is not answering, and before a new stream after one that ended
	// without delivering a response, until the first response of all
	// (default 3 s).
	ConnectRetryInterval time.Duration
	// Backoff is the wait before a new stream once a response has arrived
	// on any stream: after one that delivered a response ended, and after
	// each attempt that follows it without one.
	Backoff XDSBackoff
	// MaxMsgSize is the largest response accepted, in bytes (0: gRPC's
	// default, 4 MiB).
	MaxMsgSize int
	// Load is how resources become a Config (MergeDomains).
	Load LoadOptions
	// Apply receives every valid config, in order, on the client's
	// goroutine, before it is ACKed.
	Apply func(*Config)
	// Reject receives the error of each rejected version, once: the server
	// sends a rejected version again after the NACK, and those repeats are
	// NACKed and counted, but not reported again.
	Reject func(error)
	// Logger receives the client's logs; nil discards them.
	Logger *slog.Logger
	// Metrics is where the client reports; nil: not reported.
	Metrics *XDSMetrics
}

// xdsRenackDelay is the wait before NACKing a re-sent copy of the version
// just rejected. A go-control-plane server answers a NACK with the same
// version at once; without the wait the pair loops thousands of times a
// second. It also bounds how late a fixed version arrives (the server sends
// it in answer to the NACK).
const xdsRenackDelay = 500 * time.Millisecond

// xdsMaxErrorDetail bounds the error_detail of a NACK, in bytes.
const xdsMaxErrorDetail = 16 << 10

// XDSClient subscribes to the RateLimitConfig resources of an xDS
// management server over the Aggregated Discovery Service, state of the
// world: every response holds every domain. Each response is converted
// whole (ConfigFromXDS); a valid one is handed to Apply and ACKed, an
// invalid one is NACKed with the errors in error_detail and the last good
// config stays. A lost stream is opened again after a backoff, and the
// config applied stays meanwhile. It owns one goroutine, stopped and joined
// by Close.
type XDSClient struct {
	opt  XDSOptions
	conn *grpc.ClientConn
	node *core.Node
	log  *slog.Logger
	m    *XDSMetrics

	cancel context.CancelFunc
	exited chan struct{}
	once   sync.Once
}

// NewXDSClient checks opt, creates the connection (which dials lazily) and
// starts subscribing.
func NewXDSClient(opt XDSOptions) (*XDSClient, error) {
	switch {
	case opt.Server == "":
		return nil, errors.New("rls: xds: no server address")
	case opt.NodeID == "":
		return nil, errors.New("rls: xds: empty node id")
	case opt.Apply == nil || opt.Reject == nil:
		return nil, errors.New("rls: xds: client needs both Apply and Reject")
	case opt.MaxMsgSize < 0:
		return nil, fmt.Errorf("rls: xds: max message size %d < 0", opt.MaxMsgSize)
	}
	if opt.ConnectRetryInterval <= 0 {
		opt.ConnectRetryInterval = 3 * time.Second
	}
	dial := []grpc.DialOption{
		// Reconnect at the retry interval, not after gRPC's own backoff,
		// which grows to two minutes while the server is away.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: opt.ConnectRetryInterval, Multiplier: 1, Jitter: 0.2, MaxDelay: opt.ConnectRetryInterval},
			MinConnectTimeout: 20 * time.Second,
		}),
	}
	if opt.MaxMsgSize > 0 {
		dial = append(dial, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opt.MaxMsgSize)))
	}
	conn, err := grpc.NewClient(opt.Server, append(dial, opt.DialOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("rls: xds: %w", err)
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range opt.NodeMetadata {
		md.Fields[k] = structpb.NewStringValue(v)
	}
	c := &XDSClient{
		opt:    opt,
		conn:   conn,
		node:   &core.Node{Id: opt.NodeID, Metadata: md},
		log:    opt.Logger,
		m:      opt.Metrics,
		exited: make(chan struct{}),
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.m == nil {
		c.m = NewXDSMetrics(nil)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.run(ctx)
	return c, nil
}

// Close stops the subscription, waits for the goroutine (and an Apply in
// progress) and closes the connection. Safe to call more than once.
func (c *XDSClient) Close() error {
	var err error
	c.once.Do(func() {
		c.cancel()
		<-c.exited
		err = c.conn.Close()
	})
	<-c.exited
	return err
}

func (c *XDSClient) run(ctx context.Context) {
	defer close(c.exited)
	c.log.Info("xds: subscribing to rate limit configs", "server", c.opt.Server, "node_id", c.opt.NodeID)
	var st xdsState
	attempt := 0
	lastErr := ""
	for {
		received, err := c.stream(ctx, &st)
		c.m.connected.Set(0)
		if ctx.Err() != nil {
			return
		}
		wait := c.opt.ConnectRetryInterval
		if received {
			attempt = 0
		}
		if received || st.everReceived {
			wait = c.opt.Backoff.Delay(attempt, rand.Float64())
			attempt++
		}
		c.m.streamErrors.Inc()
		// The same failure again and again (a server away for long) is
		// logged once at Warn, then at Debug.
		level := slog.LevelWarn
		if msg := fmt.Sprint(err); !received && msg == lastErr {
			level = slog.LevelDebug
		} else {
			lastErr = msg
		}
		c.log.Log(ctx, level, "xds: no stream to the management server; the config in use stays", "server", c.opt.Server, "err", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// xdsState is what the client remembers across streams.
type xdsState struct {
	acked        string // version_info of the config applied last
	everReceived bool
	// rejected identifies the response rejected last (its version and
	// resources), so that its re-sent copies are NACKed without being
	// converted and reported again.
	rejected    [sha256.Size]byte
	rejectedErr string
	hasRejected bool
}

// stream runs one ADS stream until it fails; received reports whether a
// response arrived on it.
func (c *XDSClient) stream(ctx context.Context, st *xdsState) (received bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.opt.Headers) > 0 {
		sctx = metadata.NewOutgoingContext(sctx, metadata.New(c.opt.Headers))
	}
	s, err := discovery.NewAggregatedDiscoveryServiceClient(c.conn).StreamAggregatedResources(sctx)
	if err != nil {
		return false, err
	}
	// A new stream asks without a version, so that the server sends its
	// whole current state even if it restarted and counts versions again.
	if err := s.Send(&discovery.DiscoveryRequest{Node: c.node, TypeUrl: XDSTypeURL}); err != nil {
		return false, err
	}
	c.m.connected.Set(1)
	for {
		resp, err := s.Recv()
		if err != nil {
			return received, err
		}
		received, st.everReceived = true, true
		req, repeat := c.handle(resp, st)
		if repeat {
			// A re-sent copy of the rejected version: wait before the NACK.
			t := time.NewTimer(xdsRenackDelay)
			select {
			case <-ctx.Done():
				t.Stop()
				return received, ctx.Err()
			case <-t.C:
			}
		}
		if err := s.Send(req); err != nil {
			return received, err
		}
	}
}

// handle converts and applies one response and returns the ACK or NACK;
// repeat reports a re-sent copy of the response rejected last.
func (c *XDSClient) handle(resp *discovery.DiscoveryResponse, st *xdsState) (req *discovery.DiscoveryRequest, repeat bool) {
	req = &discovery.DiscoveryRequest{Node: c.node, TypeUrl: XDSTypeURL, ResponseNonce: resp.GetNonce()}
	sum := xdsSum(resp)
	if st.hasRejected && sum == st.rejected {
		c.m.nacks.Inc()
		req.VersionInfo = st.acked
		req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: st.rejectedErr}
		return req, true
	}
	cfg, err := c.convert(resp)
	if err != nil {
		msg := err.Error()
		if len(msg) > xdsMaxErrorDetail {
			// On a character boundary: a proto string must be UTF-8.
			cut := xdsMaxErrorDetail
			for cut > 0 && !utf8.RuneStart(msg[cut]) {
				cut--
			}
			msg = msg[:cut] + "..."
		}
		st.rejected, st.rejectedErr, st.hasRejected = sum, msg, true
		c.m.nacks.Inc()
		c.log.Warn("xds: config rejected (NACK); keeping the last good config", "version", resp.GetVersionInfo(), "acked", st.acked)
		c.opt.Reject(err)
		req.VersionInfo = st.acked
		req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: msg}
		return req, false
	}
	st.hasRejected = false
	c.opt.Apply(cfg)
	c.m.setVersion(resp.GetVersionInfo())
	c.m.acks.Inc()
	st.acked = resp.GetVersionInfo()
	req.VersionInfo = st.acked
	return req, false
}

// convert is ConfigFromXDS for one response, with a panic of a decoder
// turned into an error.
func (c *XDSClient) convert(resp *discovery.DiscoveryResponse) (cfg *Config, err error) {
	defer func() {
		if r := recover(); r != nil {
			cfg, err = nil, fmt.Errorf("rls: xds: converting version %q failed: %v", resp.GetVersionInfo(), r)
		}
	}()
	if t := resp.GetTypeUrl(); t != XDSTypeURL {
		return nil, fmt.Errorf("rls: xds: response of type %q, want %q", t, XDSTypeURL)
	}
	return ConfigFromXDS(resp.GetVersionInfo(), resp.GetResources(), c.opt.Load)
}

// xdsSum identifies a response by its version and resources.
func xdsSum(resp *discovery.DiscoveryResponse) [sha256.Size]byte {
	h := sha256.New()
	put := func(s string) {
		var n [8]byte
		for i, l := 0, uint64(len(s)); i < 8; i++ {
			n[i] = byte(l >> (8 * i))
		}
		h.Write(n[:])
		h.Write([]byte(s))
	}
	put(resp.GetTypeUrl())
	put(resp.GetVersionInfo())
	for _, r := range resp.GetResources() {
		put(r.GetTypeUrl())
		put(string(r.GetValue()))
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// XDSMetrics are an XDSClient's Prometheus collectors. Safe for concurrent
// use.
type XDSMetrics struct {
	version      *prometheus.GaugeVec
	acks, nacks  prometheus.Counter
	connected    prometheus.Gauge
	streamErrors prometheus.Counter

	mu      sync.Mutex
	current string
	has     bool
}

// NewXDSMetrics creates the collectors and registers them on reg (nil: not
// registered anywhere).
func NewXDSMetrics(reg prometheus.Registerer) *XDSMetrics {
	m := &XDSMetrics{
		version: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ringlimit_config_xds_version_info",
			Help: "1, labelled with the version_info of the xDS config applied last; absent before the first.",
		}, []string{"version"}),
		acks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_config_xds_acks_total", Help: "xDS config versions applied and ACKed.",
		}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_config_xds_nacks_total", Help: "xDS responses rejected (NACKed), re-sent copies included.",
		}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_config_xds_connected", Help: "1 while a stream to the xDS management server is open.",
		}),
		streamErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_config_xds_stream_errors_total", Help: "Streams to the xDS management server that ended or failed to open.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.version, m.acks, m.nacks, m.connected, m.streamErrors)
	}
	return m
}

func (m *XDSMetrics) setVersion(v string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.has && m.current != v {
		m.version.DeleteLabelValues(m.current)
	}
	m.version.WithLabelValues(v).Set(1)
	m.current, m.has = v, true
}
