package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/transport"
	"github.com/ringlimit/ringlimit/rls"
)

// serveCmd runs the service until ctx ends (SIGTERM/SIGINT), then drains.
func serveCmd(ctx context.Context, args []string, env environment, stdout, stderr io.Writer) int {
	c, ignored, err := parseServeFlags(args, env, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, err)
		return 2
	}
	log := newLogger(c, stderr)
	if len(ignored) > 0 {
		log.Warn("ignoring envoyproxy/ratelimit settings that have no meaning here (no Redis, no statsd; metrics are on the debug listener)", "vars", strings.Join(ignored, ","))
	}
	var cfg *rls.Config // nil with xDS: it comes from the server
	if !c.xds() {
		if _, err := os.Stat(c.Config); err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err // the path is in the message already
			}
			fmt.Fprintln(stderr, c.flagError("config", err))
			return 1
		}
		cfg, err = rls.Load(c.Config, rls.LoadOptions{MergeDomains: c.MergeDomains})
		if err != nil {
			for _, e := range flattenErrors(err) {
				fmt.Fprintln(stderr, e)
			}
			return 1
		}
		warnConfig(log, c.Config, cfg)
	}
	if c.DryRun {
		c.writeSettings(stdout)
		if cfg == nil {
			fmt.Fprintf(stdout, "# config: from the xds server %s as node %q\n", c.XDSServer, c.XDSNodeID)
		} else {
			fmt.Fprintf(stdout, "# config: %d domain(s), %d rule(s)\n", len(cfg.Domains()), len(cfg.Rules()))
		}
		return 0
	}
	if err := serve(ctx, c, cfg, log); err != nil {
		log.Error("serve failed", "err", err)
		return 1
	}
	return 0
}

func newLogger(c *serveConfig, w io.Writer) *slog.Logger {
	var level slog.Level
	// trace, fatal and panic are the reference's (logrus) levels beyond
	// slog's: the nearest slog level.
	switch strings.ToLower(c.LogLevel) {
	case "debug", "trace":
		level = slog.LevelDebug
	case "warn", "warning":
		level = slog.LevelWarn
	case "error", "fatal", "panic":
		level = slog.LevelError
	}
	opts := &slog.HandlerOptions{Level: level}
	if strings.EqualFold(c.LogFormat, "json") {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// stopGrace is how long the gRPC server's graceful stop may take, after the
// drain, before the calls and streams still open are cut.
const stopGrace = 2 * time.Second

// serve builds the node and runs it until ctx ends; cfg is nil when the
// config comes from xDS.
func serve(ctx context.Context, c *serveConfig, cfg *rls.Config, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	clock := func() int64 { return time.Now().UnixNano() }

	store := bucket.NewStore(bucket.StoreConfig{MaxKeys: c.MaxKeys, MaxBytes: c.MaxStoreBytes})
	storeMetrics := newStoreCollector(store, log)
	reg.MustRegister(storeMetrics)
	var counter rls.Counter = rls.LocalCounter{Store: store}

	// --data-dir: saved counters come back before the node serves (in a
	// cluster, in the node's loading phase, before it syncs from its
	// peers), and are saved every second and once more at shutdown.
	var data *dataDir
	var restore func(context.Context) error
	if c.DataDir != "" {
		var err error
		if data, err = openDataDir(c.DataDir, c.NodeName, store, clock, log); err != nil {
			return err
		}
		defer data.unlock()
		reg.MustRegister(data.metrics.collectors()...)
		restore = data.restore
		if len(c.joinList()) == 0 {
			if err := data.restore(context.Background()); err != nil {
				log.Warn("data-dir: restoring saved counters failed; going on without them", "err", err)
			}
		}
	}

	tlsf, err := newTLSFiles(c)
	if err != nil {
		return err
	}
	tr, err := newTracing(c, log)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
		defer cancel()
		tr.shutdown(ctx, log)
	}()
	tlsf.setLogger(log)
	var xdsDial grpc.DialOption
	if cfg == nil {
		if xdsDial, err = c.xdsDialOption(log); err != nil {
			return err
		}
	}
	grpcLis, err := net.Listen("tcp", c.GRPCAddr)
	if err != nil {
		return c.flagError("grpc-addr", err)
	}
	httpLis, err := net.Listen("tcp", c.HTTPAddr)
	if err != nil {
		grpcLis.Close()
		return c.flagError("http-addr", err)
	}
	debugLis, err := net.Listen("tcp", c.DebugAddr)
	if err != nil {
		grpcLis.Close()
		httpLis.Close()
		return c.flagError("debug-addr", err)
	}

	var node *clusterNode
	var members aliveLister
	if len(c.joinList()) > 0 {
		node, err = startCluster(c, grpcLis.Addr().String(), store, reg, log, tlsf.peerDialOptions(), restore, tr.tracerOrNil())
		if err != nil {
			grpcLis.Close()
			httpLis.Close()
			debugLis.Close()
			return err
		}
		counter = node.node // decides each key at its owner
		members = node.node.Membership()
	}
	// gRPC's own receive limit stays above --max-request-bytes, so an
	// oversized RLS request gets InvalidArgument naming the bound rather
	// than a bare ResourceExhausted, and at the peers' largest message. It
	// is no higher: a message is decoded before any bound is checked, and
	// one of small repeated fields decodes to a hundred times its size.
	// The keepalive policy lets peers (and Envoy) ping every 5 s or more
	// and closes client connections that stop answering pings.
	gs := grpc.NewServer(append(append(append(grpcServerOptions(tlsf, members), transport.ServerOptions()...),
		grpc.MaxRecvMsgSize(max(transport.MaxMessageSize, 2*c.MaxRequestSize))), tr.serverOptions()...)...)
	if node != nil {
		node.register(gs)
	}

	metrics := rls.NewMetrics(reg)
	svc, err := rls.NewService(rls.Options{
		ShadowMode:                 c.ShadowMode,
		QuotaMode:                  c.QuotaMode,
		DynamicMetadata:            c.DynamicMetadata,
		StopIncrementWhenOverLimit: c.StopIncrement,
		NearLimitRatio:             c.NearLimitRatio,
		ResponseHeaders:            c.ResponseHeaders,
		HeaderLimit:                c.HeaderLimit,
		HeaderRemaining:            c.HeaderRemaining,
		HeaderReset:                c.HeaderReset,
		Bounds: rls.Bounds{MaxDescriptors: c.MaxDescriptors, MaxEntries: c.MaxEntries, MaxValueLen: c.MaxValueLen,
			MaxKeyLen: c.MaxKeyLen, MaxDomainLen: c.MaxKeyLen, MaxRequestSize: c.MaxRequestSize},
		Clock:        clock,
		Logger:       log,
		Unconfigured: cfg == nil,
	}, counter, metrics)
	if err != nil {
		return err
	}
	if cfg != nil {
		svc.SetConfig(cfg)
	}
	svc.Register(gs)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)

	var watcher *rls.Watcher
	var xdsClient *rls.XDSClient
	if cfg != nil {
		watcher, err = rls.NewWatcher(c.Config, rls.LoadOptions{MergeDomains: c.MergeDomains},
			func(cfg *rls.Config) {
				svc.SetConfig(cfg)
				log.Info("config reloaded", "domains", len(cfg.Domains()), "rules", len(cfg.Rules()))
				warnConfig(log, c.Config, cfg)
			}, svc.ConfigError)
		if err != nil {
			log.Warn("config hot reload disabled", "err", err)
		}
	} else if xdsClient, err = startXDS(c, xdsDial, svc, reg, log); err != nil {
		if node != nil {
			node.close()
		}
		grpcLis.Close()
		httpLis.Close()
		debugLis.Close()
		return err
	}

	var stopping atomic.Bool
	// notReady says why the node is not ready ("" when it is), in plain
	// words for /healthcheck's body.
	hc := newHealthState(hs, func() string {
		switch {
		case stopping.Load():
			return "shutting down: draining before exit"
		case node != nil && !node.node.Ready():
			return node.node.NotReadyReason()
		}
		cfg := svc.Config() // nil with xDS before the first version
		if cfg == nil {
			// --healthy-with-config asks for a config with a domain,
			// forced start or not (as the reference's health does).
			if c.ForceStart && !c.HealthyWithConfig {
				return ""
			}
			return "no config loaded: waiting for the first config from the xDS server " + c.XDSServer
		}
		// With --healthy-with-config, a config without a domain is not
		// ready, as in the reference.
		if c.HealthyWithConfig && len(cfg.Domains()) == 0 {
			return "no config loaded: the config has no domain (--healthy-with-config)"
		}
		return ""
	})
	debugMux := http.NewServeMux()
	debugMux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	debugMux.Handle("/rlconfig", svc.ConfigHandler())
	debugMux.HandleFunc("/debug/pprof/", pprof.Index)
	debugMux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	debugMux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	debugMux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	debugMux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if node != nil {
		debugMux.Handle("/debug/cluster", node.debugHandler())
	}
	// ReadTimeout bounds a slow /json body (at most a few MiB) as well.
	httpSrv := &http.Server{Handler: svc.HTTPHandler(hc.NotReady), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second}
	debugSrv := &http.Server{Handler: debugMux, ReadHeaderTimeout: 10 * time.Second}

	var wg sync.WaitGroup
	errc := make(chan error, 3)
	goServe := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
				errc <- fmt.Errorf("serve: %s: %w", name, err)
			}
		}()
	}
	if data != nil {
		data.start()
	}
	goServe("grpc", func() error { return gs.Serve(grpcLis) })
	goServe("http", func() error { return httpSrv.Serve(httpLis) })
	goServe("debug", func() error { return debugSrv.Serve(debugLis) })

	// Expired windows are dropped in the background; lookups ignore them anyway.
	sweepCtx, stopSweep := context.WithCancel(context.Background())
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-sweepCtx.Done():
				return
			case now := <-t.C:
				store.Sweep(clock())
				storeMetrics.check(now)
			}
		}
	}()

	// /healthcheck and gRPC health follow readiness (config loaded, cluster
	// joined, not stopping) together.
	hc.update()
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sweepCtx.Done():
				return
			case <-t.C:
				hc.update()
			}
		}
	}()

	source := c.Config
	if cfg == nil {
		source = "xds " + c.XDSServer
	}
	log.Info("ringlimit serving", "version", version(), "node", c.NodeName,
		"grpc", grpcLis.Addr().String(), "http", httpLis.Addr().String(), "debug", debugLis.Addr().String(),
		"config", source, "domains", len(cfg.Domains()), "rules", len(cfg.Rules()), "cluster", node != nil, "data_dir", c.DataDir)

	var runErr error
	var fatal <-chan error // a node whose identity another live member holds
	if node != nil {
		fatal = node.node.Fatal()
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down", "timeout", c.ShutdownTimeout)
	case runErr = <-errc:
	case runErr = <-fatal:
	}

	// Drain: stop answering ready, hand counters off and leave the cluster,
	// then finish in-flight calls.
	stopping.Store(true)
	hc.update()
	hs.Shutdown()
	deadline, cancel := context.WithTimeout(context.Background(), c.ShutdownTimeout)
	defer cancel()
	if node != nil {
		node.drain(deadline)
	}
	// GracefulStop lets in-flight calls finish (an RLS call takes
	// milliseconds), but it would also wait for the peers' long-lived
	// DecideStreams, which they close once they see this node leave; one
	// that has not seen it yet (frozen, partitioned) would hold the whole
	// shutdown. So it gets stopGrace, then Stop cuts what is left.
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	grace := time.NewTimer(stopGrace)
	defer grace.Stop()
	select {
	case <-stopped:
	case <-grace.C:
		gs.Stop()
		<-stopped
	case <-deadline.Done():
		gs.Stop()
		<-stopped
	}
	httpSrv.Shutdown(deadline)
	debugSrv.Shutdown(deadline)
	if data != nil {
		// Nothing counts any more (the drain is over, the listeners are
		// closed): the last save holds every count this node had.
		data.close()
	}
	if watcher != nil {
		watcher.Close()
	}
	if xdsClient != nil {
		xdsClient.Close()
	}
	if node != nil {
		node.close()
	}
	stopSweep()
	wg.Wait()
	log.Info("stopped")
	return runErr
}

// warnConfig logs what a valid config may be missing: a domain (without
// one every request is answered OK).
func warnConfig(log *slog.Logger, path string, cfg *rls.Config) {
	if len(cfg.Domains()) == 0 {
		log.Warn("config: no domain loaded: every request is answered OK", "config", path)
	}
}
