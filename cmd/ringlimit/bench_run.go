package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// benchConfig is one load run, after flags are validated.
type benchConfig struct {
	Targets        []string        // gRPC addresses; connections are spread over them round-robin
	Requests       int             // calls to make; used when Duration is 0
	Duration       time.Duration   // how long to send (-z); wins over Requests
	Concurrency    int             // workers, each with one call in flight
	RPS            float64         // total calls per second over all workers; 0: as fast as answered
	Connections    int             // gRPC connections (>= len(Targets)); worker w uses connection w mod Connections
	Keys           int             // distinct keys
	Dist           string          // "uniform" or "zipf"
	ZipfS          float64         // zipf exponent (> 1)
	Seed           uint64          // key choice seed; worker w's stream is (Seed, w)
	Template       *descTemplate   // the request sent
	Deadline       time.Duration   // per-call deadline; a later answer is a fail-open. 0: none
	Warmup         time.Duration   // load sent and discarded before the measured run
	ConnectTimeout time.Duration   // how long every connection may take to become ready
	Creds          grpc.DialOption // transport credentials; nil: plaintext
	Label          string          // names the run in --json and --compare
	Limits         bool            // keep every answer per key-window and count early refusals and hits over the limit
	ServerPIDs     []int           // server processes whose CPU time the measured run is charged (Linux /proc)
}

// benchLoad is what a run sent: the request and how its keys were chosen.
type benchLoad struct {
	Domain      string   `json:"domain"`
	Descriptors []string `json:"descriptors"` // as --descriptor, {ip} and {key} unexpanded
	HitsAddend  uint32   `json:"hits_addend"` // 0: Envoy's default, 1
	Keys        int      `json:"keys"`
	Dist        string   `json:"dist"`             // uniform or zipf
	ZipfS       float64  `json:"zipf_s,omitempty"` // with zipf
	Seed        uint64   `json:"seed"`
}

// load is the benchLoad of cfg.
func (cfg *benchConfig) load() benchLoad {
	l := benchLoad{Domain: cfg.Template.domain, Descriptors: cfg.Template.descriptors(), HitsAddend: cfg.Template.hits,
		Keys: cfg.Keys, Dist: cfg.Dist, Seed: cfg.Seed}
	if cfg.Dist == "zipf" {
		l.ZipfS = cfg.ZipfS
	}
	return l
}

// benchResult is a measured run.
type benchResult struct {
	Label       string
	Load        benchLoad
	Targets     []string
	Concurrency int
	Connections int
	Deadline    time.Duration
	Total       time.Duration // wall time from the first call to the last answer
	Interrupted bool          // the run was cut short (Ctrl-C); calls cut with it are not counted

	hist             *latencyHist // every counted call, whatever its outcome
	OK               uint64
	OverLimit        uint64
	Unknown          uint64 // answered with overall code UNKNOWN
	Errors           uint64 // any gRPC error but DeadlineExceeded
	DeadlineExceeded uint64 // DeadlineExceeded, or an answer later than Deadline: Envoy fails open
	ErrorCodes       []errorCount
	PerTarget        []uint64 // calls answered (in any way) per Targets[i]

	Limits     *limitCount   // with Config.Limits: over the warmup and the measured calls, which share windows
	ServerPIDs []int         // with Config.ServerPIDs
	ServerCPU  time.Duration // user + system CPU of ServerPIDs during the measured run
	ClientCPU  time.Duration // with ServerPIDs: this process's own CPU during the measured run
}

// errorCount is how many calls failed with one gRPC code, with the first
// message seen.
type errorCount struct {
	Code    codes.Code
	Message string
	Count   uint64
}

// calls is every counted call.
func (r *benchResult) calls() uint64 {
	return r.OK + r.OverLimit + r.Unknown + r.Errors + r.DeadlineExceeded
}

// callsPerSec is calls over wall time.
func (r *benchResult) callsPerSec() float64 {
	if r.Total <= 0 {
		return 0
	}
	return float64(r.calls()) / r.Total.Seconds()
}

// maxStatStripes bounds how many tallies a run keeps: workers share them
// (worker w records into stripe w mod stripes), so memory does not grow
// with -c.
const maxStatStripes = 64

// workerStats is the tally of a stripe of workers; merged after the run.
// mu guards every field while workers record.
type workerStats struct {
	mu                                   sync.Mutex
	hist                                 *latencyHist
	ok, over, unknown, errs, deadlineExc uint64
	codes                                map[codes.Code]*errorCount
	perTarget                            []uint64
}

func newWorkerStats(targets int) *workerStats {
	return &workerStats{hist: newLatencyHist(), codes: map[codes.Code]*errorCount{}, perTarget: make([]uint64, targets)}
}

// record classifies one finished call as Envoy would see it: lat goes to
// the latency histogram, and call (the call itself, from send to answer) is
// held against the deadline, as Envoy's timeout would be.
func (s *workerStats) record(resp *pb.RateLimitResponse, err error, lat, call, deadline time.Duration, target int) {
	s.hist.record(lat)
	s.perTarget[target]++
	switch {
	case err == nil && deadline > 0 && call > deadline:
		s.deadlineExc++
	case err == nil:
		switch resp.GetOverallCode() {
		case pb.RateLimitResponse_OK:
			s.ok++
		case pb.RateLimitResponse_OVER_LIMIT:
			s.over++
		default:
			s.unknown++
		}
	case status.Code(err) == codes.DeadlineExceeded:
		s.deadlineExc++
	default:
		s.errs++
		st := status.Convert(err)
		e := s.codes[st.Code()]
		if e == nil {
			e = &errorCount{Code: st.Code(), Message: st.Message()}
			s.codes[st.Code()] = e
		}
		e.Count++
	}
}

// benchRun owns the connections of one bench invocation.
type benchRun struct {
	cfg    *benchConfig
	conns  []*grpc.ClientConn
	target []int         // conns[i] is pinned to cfg.Targets[target[i]]
	limits []*limitTally // with cfg.Limits: stripes shared by the warmup and the measured run
}

// grpcTarget pins an address to itself (no DNS re-resolution or balancing)
// unless it names a resolver scheme.
func grpcTarget(addr string) string {
	if strings.Contains(addr, "://") || strings.HasPrefix(addr, "unix:") {
		return addr
	}
	return "passthrough:///" + addr
}

// dialBench opens cfg.Connections connections, connection i to target
// i mod len(Targets), as Envoy spreads its connections over the hosts of a
// headless Service, and waits until every one is ready.
func dialBench(ctx context.Context, cfg *benchConfig) (*benchRun, error) {
	b := &benchRun{cfg: cfg}
	creds := cfg.Creds
	if creds == nil {
		creds = grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	for i := range cfg.Connections {
		t := i % len(cfg.Targets)
		cc, err := grpc.NewClient(grpcTarget(cfg.Targets[t]), creds)
		if err != nil {
			b.close()
			return nil, fmt.Errorf("bench: %s: %w", cfg.Targets[t], err)
		}
		b.conns = append(b.conns, cc)
		b.target = append(b.target, t)
		cc.Connect()
	}
	wctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	for i, cc := range b.conns {
		for {
			s := cc.GetState()
			if s == connectivity.Ready {
				break
			}
			if s == connectivity.Idle {
				cc.Connect() // back to idle after a failed attempt
			}
			if !cc.WaitForStateChange(wctx, s) {
				b.close()
				return nil, fmt.Errorf("bench: %s: not ready within %v (last state %v)", cfg.Targets[b.target[i]], cfg.ConnectTimeout, s)
			}
		}
	}
	return b, nil
}

func (b *benchRun) close() {
	for _, cc := range b.conns {
		cc.Close()
	}
}

// phase is one timed stretch of load: the warmup or the measured run.
type phase struct {
	start time.Time
	end   time.Time // zero: bounded by n
	n     int64     // calls to make when end is zero
	rps   float64
	next  atomic.Int64  // ticket of the next call (and its slot in the --rps schedule)
	done  atomic.Uint64 // calls finished, for the progress line
}

// runBench dials the targets, sends the warmup, then the measured load, and
// returns the measurement. progress, when not nil, gets a progress line
// redrawn in place (for a terminal). ctx cancelled stops the run early; the
// result then says Interrupted.
func runBench(ctx context.Context, cfg *benchConfig, progress io.Writer) (*benchResult, error) {
	if _, err := newKeyChooser(cfg.Dist, cfg.Keys, cfg.ZipfS, cfg.Seed, 0); err != nil {
		return nil, err // checked once, before dialling
	}
	b, err := dialBench(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer b.close()
	if cfg.Limits {
		b.limits = make([]*limitTally, min(cfg.Concurrency, maxStatStripes))
		for i := range b.limits {
			b.limits[i] = newLimitTally()
		}
	}
	if cfg.Warmup > 0 {
		b.runPhase(ctx, 0, cfg.Warmup, nil, cfg.Seed^0x5eed)
		if ctx.Err() != nil {
			return nil, errors.New("bench: interrupted during warmup")
		}
	}
	pids := cfg.ServerPIDs
	if len(pids) > 0 {
		pids = append(slices.Clone(pids), os.Getpid()) // the last: this process
	}
	cpu0, err := processCPUs(pids)
	if err != nil {
		return nil, err
	}
	r := b.runPhase(ctx, cfg.Requests, cfg.Duration, progress, cfg.Seed)
	if len(pids) > 0 {
		cpu1, err := processCPUs(pids)
		if err != nil {
			return nil, err
		}
		n := len(pids) - 1
		r.ServerPIDs = cfg.ServerPIDs
		for i := range n {
			r.ServerCPU += cpu1[i] - cpu0[i]
		}
		r.ClientCPU = cpu1[n] - cpu0[n]
	}
	if b.limits != nil {
		c := countLimits(b.limits)
		r.Limits = &c
	}
	return r, nil
}

// runPhase sends n calls, or for d when d > 0, and tallies them.
func (b *benchRun) runPhase(ctx context.Context, n int, d time.Duration, progress io.Writer, seed uint64) *benchResult {
	cfg := b.cfg
	ph := &phase{start: time.Now(), n: int64(n), rps: cfg.RPS}
	if d > 0 {
		ph.end = ph.start.Add(d)
		ph.n = 0
	}
	stats := make([]*workerStats, min(cfg.Concurrency, maxStatStripes))
	for i := range stats {
		stats[i] = newWorkerStats(len(cfg.Targets))
	}
	var wg sync.WaitGroup
	for w := range cfg.Concurrency {
		keys, _ := newKeyChooser(cfg.Dist, cfg.Keys, cfg.ZipfS, seed, w) // validated in runBench
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lt *limitTally
			if b.limits != nil {
				lt = b.limits[w%len(b.limits)]
			}
			b.worker(ctx, w, ph, keys, stats[w%len(stats)], lt)
		}()
	}
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		if progress != nil {
			drawProgress(progress, ph, stopProgress)
		}
	}()
	wg.Wait()
	total := time.Since(ph.start)
	close(stopProgress)
	<-progressDone

	all := newWorkerStats(len(cfg.Targets))
	for _, s := range stats {
		all.hist.merge(s.hist)
		all.ok += s.ok
		all.over += s.over
		all.unknown += s.unknown
		all.errs += s.errs
		all.deadlineExc += s.deadlineExc
		for i, c := range s.perTarget {
			all.perTarget[i] += c
		}
		for c, e := range s.codes {
			if a := all.codes[c]; a != nil {
				a.Count += e.Count
			} else {
				cp := *e
				all.codes[c] = &cp
			}
		}
	}
	r := &benchResult{
		Label: cfg.Label, Load: cfg.load(), Targets: cfg.Targets, Concurrency: cfg.Concurrency, Connections: len(b.conns),
		Deadline: cfg.Deadline, Total: total, Interrupted: ctx.Err() != nil, hist: all.hist,
		OK: all.ok, OverLimit: all.over, Unknown: all.unknown, Errors: all.errs, DeadlineExceeded: all.deadlineExc,
		PerTarget: all.perTarget,
	}
	for _, e := range all.codes {
		r.ErrorCodes = append(r.ErrorCodes, *e)
	}
	sort.Slice(r.ErrorCodes, func(i, j int) bool {
		a, b := r.ErrorCodes[i], r.ErrorCodes[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		return a.Code < b.Code
	})
	return r
}

// worker sends calls one at a time until the phase ends.
// lt, when not nil, gets every call for the limit accounting.
func (b *benchRun) worker(ctx context.Context, w int, ph *phase, keys keyChooser, st *workerStats, lt *limitTally) {
	cfg := b.cfg
	hits := uint64(max(cfg.Template.hits, 1))
	ci := w % len(b.conns)
	conn, target := b.conns[ci], b.target[ci]
	req := cfg.Template.newRequest()
	resp := new(pb.RateLimitResponse)
	var buf []byte
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		i := ph.next.Add(1) - 1
		if ph.end.IsZero() && i >= ph.n {
			return
		}
		var sched time.Time // the call's time on the --rps schedule
		if ph.rps > 0 {
			at := ph.start.Add(time.Duration(float64(i) * float64(time.Second) / ph.rps))
			sched = at
			if !ph.end.IsZero() && !at.Before(ph.end) {
				return
			}
			if wait := time.Until(at); wait > 0 {
				if timer == nil {
					timer = time.NewTimer(wait)
				} else {
					timer.Reset(wait)
				}
				select {
				case <-timer.C:
				case <-ctx.Done():
					return
				}
			}
		}
		k := keys.next()
		buf = cfg.Template.fill(req, k, buf)
		if ctx.Err() != nil {
			return
		}
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if cfg.Deadline > 0 {
			cctx, cancel = context.WithTimeout(ctx, cfg.Deadline)
		}
		t0 := time.Now()
		if !ph.end.IsZero() && !t0.Before(ph.end) {
			cancel()
			return
		}
		err := conn.Invoke(cctx, pb.RateLimitService_ShouldRateLimit_FullMethodName, req, resp)
		end := time.Now()
		cancel()
		if err != nil && ctx.Err() != nil {
			return // cut by the user, not by the server: not counted
		}
		call, lat := end.Sub(t0), end.Sub(t0)
		if !sched.IsZero() && sched.Before(t0) {
			lat = end.Sub(sched) // paced: the time it waited to be sent counts
		}
		st.mu.Lock()
		st.record(resp, err, lat, call, cfg.Deadline, target)
		st.mu.Unlock()
		if lt != nil {
			lt.record(k, len(req.Descriptors), hits, t0, end, resp, err != nil)
		}
		ph.done.Add(1)
	}
}

// drawProgress redraws one status line every 250 ms until stop, then
// erases it.
func drawProgress(w io.Writer, ph *phase, stop <-chan struct{}) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			fmt.Fprint(w, "\r\033[K")
			return
		case now := <-t.C:
			el := now.Sub(ph.start)
			done := ph.done.Load()
			rate := float64(done) / el.Seconds()
			if ph.end.IsZero() {
				fmt.Fprintf(w, "\r\033[K%d/%d calls  %.1fs  %.0f calls/s", done, ph.n, el.Seconds(), rate)
			} else {
				fmt.Fprintf(w, "\r\033[K%d calls  %.1fs/%.1fs  %.0f calls/s", done, el.Seconds(), ph.end.Sub(ph.start).Seconds(), rate)
			}
		}
	}
}
