package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// runBenchJSON runs `ringlimit bench --json args...` and decodes its report.
func runBenchJSON(t *testing.T, ctx context.Context, args ...string) (benchJSON, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := benchCmd(ctx, append([]string{"--json"}, args...), &out, &errOut)
	var j benchJSON
	if code == 0 || code == 130 {
		if err := json.Unmarshal(out.Bytes(), &j); err != nil {
			t.Fatalf("exit %d, report not JSON: %v\n%s\nstderr: %s", code, err, out.String(), errOut.String())
		}
	}
	return j, code
}

// checkAddsUp fails unless every count in j agrees with the calls made.
func checkAddsUp(t *testing.T, j benchJSON, calls uint64) {
	t.Helper()
	st := j.Status
	if sum := st.OK + st.OverLimit + st.Unknown + st.Errors + st.DeadlineExceeded; sum != calls || j.Summary.Calls != calls {
		t.Errorf("statuses add to %d, summary says %d calls, want %d (%+v)", sum, j.Summary.Calls, calls, st)
	}
	var perTarget, inHist, errs uint64
	for _, tg := range j.Targets {
		perTarget += tg.Calls
	}
	for _, h := range j.Histogram {
		inHist += h.Count
	}
	for _, e := range j.Errors {
		errs += e.Count
	}
	if perTarget != calls || inHist != calls || errs != st.Errors {
		t.Errorf("targets hold %d calls, histogram %d, error list %d; want %d, %d, %d", perTarget, inHist, errs, calls, calls, st.Errors)
	}
	if calls > 0 && (j.Summary.FastestMS > j.percentileMS(50) || j.percentileMS(50) > j.percentileMS(99.9) || j.percentileMS(99.9) > j.Summary.SlowestMS) {
		t.Errorf("latencies out of order: fastest %v p50 %v p99.9 %v slowest %v", j.Summary.FastestMS, j.percentileMS(50), j.percentileMS(99.9), j.Summary.SlowestMS)
	}
}

func TestBenchAgainstNoopServer(t *testing.T) {
	defer goleak.VerifyNone(t)
	addr, stop, err := startNoop("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	addr2, stop2, err := startNoop("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()

	t.Run("count bounded, two targets", func(t *testing.T) {
		j, code := runBenchJSON(t, t.Context(), "-n", "3000", "-c", "8", "--connections", "4",
			"--addr", addr+","+addr2, "--warmup", "100ms", "--label", "floor", "--deadline", "10s")
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		checkAddsUp(t, j, 3000)
		if j.Status.OK != 3000 || j.Label != "floor" || j.Connections != 4 || j.Concurrency != 8 {
			t.Errorf("report %+v", j)
		}
		// Four connections round-robin over two targets, eight workers over
		// four connections: each target gets half the workers.
		for _, tg := range j.Targets {
			if tg.Calls < 500 {
				t.Errorf("target %s got %d of 3000 calls", tg.Addr, tg.Calls)
			}
		}
	})
	t.Run("time bounded at a capped rate", func(t *testing.T) {
		j, code := runBenchJSON(t, t.Context(), "-z", "1s", "--rps", "300", "-c", "4", "--addr", addr, "--dist", "zipf")
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		checkAddsUp(t, j, j.Summary.Calls)
		if want := (benchLoad{Domain: "ratelimit", Descriptors: []string{defaultBenchDescriptor}, Keys: 10000, Dist: "zipf", ZipfS: 1.1, Seed: 1}); !reflect.DeepEqual(j.Load, want) {
			t.Errorf("load %+v, want %+v", j.Load, want)
		}
		// The cap is the point: never more than 300. Fewer only means the
		// workers fell behind the schedule on a loaded machine.
		if j.Summary.Calls < 1 || j.Summary.Calls > 300 || j.Summary.TotalSeconds < 0.95 || j.Summary.TotalSeconds > 3 {
			t.Errorf("%d calls in %.3fs, want at most 300 at 300/s over 1s", j.Summary.Calls, j.Summary.TotalSeconds)
		}
	})
	t.Run("text report", func(t *testing.T) {
		var out, errOut bytes.Buffer
		jf := filepath.Join(t.TempDir(), "run.json")
		if code := benchCmd(t.Context(), []string{"-n", "200", "-c", "4", "--addr", addr, "--deadline", "10s", "--json-file", jf}, &out, &errOut); code != 0 {
			t.Fatalf("exit %d: %s", code, errOut.String())
		}
		reports, err := readReports([]string{jf})
		if err != nil || len(reports) != 1 {
			t.Fatalf("--json-file: %v", err)
		}
		checkAddsUp(t, reports[0], 200)
		for _, want := range []string{"Summary:\n  Domain:\tratelimit\n  Descriptor:\t" + defaultBenchDescriptor + "\n",
			"  Keys:\t10000, uniform, seed 1", "Requests/sec:", "Response time histogram (ms):", "Latency distribution:", "99.9% in ", "[OK]                  200 responses"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("report lacks %q:\n%s", want, out.String())
			}
		}
		if errOut.Len() != 0 {
			t.Errorf("stderr is not a terminal, yet got %q", errOut.String())
		}
	})
}

// fakeRLS answers by the key in the first descriptor's first value
// ("k" + index): key%4 == 0 OVER_LIMIT, 1 Unavailable, 2 no answer until
// the caller gives up, 3 OK. It counts what it answered.
type fakeRLS struct {
	pb.UnimplementedRateLimitServiceServer
	ok, over, errs, blocked atomic.Int64
	onCall                  func(n int64)
	calls                   atomic.Int64
}

func (f *fakeRLS) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if f.onCall != nil {
		f.onCall(f.calls.Add(1))
	}
	k, err := strconv.Atoi(strings.TrimPrefix(req.Descriptors[0].Entries[0].Value, "k"))
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	switch k % 4 {
	case 0:
		f.over.Add(1)
		return &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OVER_LIMIT}, nil
	case 1:
		f.errs.Add(1)
		return nil, status.Error(codes.Unavailable, "owner unreachable")
	case 2:
		f.blocked.Add(1)
		<-ctx.Done() // the client's deadline travels with the call
		return nil, ctx.Err()
	}
	f.ok.Add(1)
	return &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK}, nil
}

// startFake serves f on a free loopback port; stop ends it and joins its
// goroutine (deferred after goleak.VerifyNone, so it runs first).
func startFake(t *testing.T, f pb.RateLimitServiceServer) (addr string, stop func()) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	pb.RegisterRateLimitServiceServer(gs, f)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); gs.Serve(lis) }()
	return lis.Addr().String(), func() { gs.Stop(); wg.Wait() }
}

func TestBenchClassifiesAsEnvoyWould(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := &fakeRLS{}
	addr, stop := startFake(t, f)
	defer stop()
	j, code := runBenchJSON(t, t.Context(), "-n", "200", "-c", "16", "--addr", addr, "--keys", "4",
		"--descriptor", "key=k{key}", "--deadline", "100ms")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	checkAddsUp(t, j, 200)
	st := j.Status
	// An answer later than the deadline, or a call that never reached the
	// server in time, is a fail-open: on a loaded machine a few calls move
	// from their server outcome to deadline exceeded, never the other way.
	if st.OK > uint64(f.ok.Load()) || st.OverLimit > uint64(f.over.Load()) || st.Errors > uint64(f.errs.Load()) ||
		st.DeadlineExceeded < uint64(f.blocked.Load()) || st.OK == 0 || st.OverLimit == 0 || st.Errors == 0 {
		t.Errorf("bench %+v; server ok %d over %d errs %d blocked %d", st, f.ok.Load(), f.over.Load(), f.errs.Load(), f.blocked.Load())
	}
	if f.ok.Load() == 0 || f.over.Load() == 0 || f.errs.Load() == 0 || f.blocked.Load() == 0 {
		t.Errorf("want every outcome exercised: ok %d over %d errs %d blocked %d", f.ok.Load(), f.over.Load(), f.errs.Load(), f.blocked.Load())
	}
	if len(j.Errors) != 1 || j.Errors[0].Code != "Unavailable" || j.Errors[0].Message != "owner unreachable" {
		t.Errorf("errors %+v", j.Errors)
	}
	if j.Summary.SlowestMS < 100 {
		t.Errorf("slowest %.3f ms: calls that waited out the 100ms deadline are counted at their latency", j.Summary.SlowestMS)
	}
}

// Paced, a call is timed from its place on the schedule: when every worker
// is stuck for a while, the calls that then go out late count their wait
// (as wrk2 measures), instead of reporting fast answers to calls that left
// hundreds of milliseconds behind the schedule.
func TestBenchPacedLatencyFromSchedule(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := &fakeRLS{onCall: func(n int64) {
		if n > 50 && n <= 58 { // all 8 workers stuck at once
			time.Sleep(300 * time.Millisecond)
		}
	}}
	addr, stop := startFake(t, f)
	defer stop()
	j, code := runBenchJSON(t, t.Context(), "-n", "300", "-c", "8", "--rps", "200", "--addr", addr,
		"--keys", "1", "--descriptor", "key=k3", "--deadline", "0")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	// 8 calls took 300 ms; the ~60 scheduled during the stall left late.
	var p90 float64
	for _, l := range j.Latency {
		if l.Percentile == 90 {
			p90 = l.MS
		}
	}
	if p90 < 20 {
		t.Errorf("p90 %.3f ms: the calls sent behind the schedule did not count their wait (latency %+v)", p90, j.Latency)
	}
}

func TestBenchInterrupted(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	f := &fakeRLS{onCall: func(n int64) {
		if n == 300 {
			cancel() // as Ctrl-C would
		}
	}}
	addr, stop := startFake(t, f)
	defer stop()
	j, code := runBenchJSON(t, ctx, "-n", "100000000", "-c", "8", "--addr", addr, "--keys", "1", "--descriptor", "key=k3", "--deadline", "10s")
	if code != 130 || !j.Interrupted {
		t.Fatalf("exit %d interrupted %v, want 130 and true", code, j.Interrupted)
	}
	checkAddsUp(t, j, j.Summary.Calls)
	// The server cancels on its 300th call; up to 7 more may be answered
	// before the workers see it. Calls cut by the interrupt are not errors.
	if j.Summary.Calls < 250 || j.Summary.Calls > 307 || j.Status.OK != j.Summary.Calls {
		t.Errorf("%d calls counted (%+v); want the ~300 answered before the interrupt, all OK", j.Summary.Calls, j.Status)
	}
}

func TestBenchFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-n", "0"}, "bench: -n: 0, want >= 1 (or set -z)"},
		{[]string{"-c", "0"}, "bench: -c: 0 is not in [1, 10000]"},
		{[]string{"--addr", " , "}, "bench: --addr: no target"},
		{[]string{"--addr", "a:1,b:2,c:3", "-c", "2"}, "bench: --connections: 3, want between the number of targets (3) and -c (2)"},
		{[]string{"--connections", "9", "-c", "8"}, "bench: --connections: 9, want between"},
		{[]string{"--rps", "-1"}, "bench: --rps: -1 is not a finite rate >= 0"},
		{[]string{"--rps", "NaN"}, "bench: --rps: NaN is not a finite rate >= 0"},
		{[]string{"--rps", "+Inf"}, "bench: --rps: +Inf is not a finite rate >= 0"},
		{[]string{"-z", "-1s"}, "bench: -z: -1s is negative"},
		{[]string{"--dist", "pareto"}, `bench: --dist: unknown distribution "pareto"`},
		{[]string{"--keys", "0"}, "bench: --keys: 0 is not in"},
		{[]string{"--descriptor", "a={nope}"}, "unknown placeholder {nope}"},
		{[]string{"--deadline", "-1ms"}, "bench: --deadline and --warmup must be >= 0"},
		{[]string{"--server-pids", "12,x"}, `bench: --server-pids: "x" is not a PID`},
		{[]string{"--server-pids", "0"}, `bench: --server-pids: "0" is not a PID`},
		{[]string{"stray"}, `bench: unexpected argument "stray"`},
		{[]string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
	}
	for _, tc := range tests {
		var out, errOut bytes.Buffer
		code := benchCmd(t.Context(), tc.args, &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

func TestBenchUnreachableTarget(t *testing.T) {
	defer goleak.VerifyNone(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The port stays ours (no other test can take it) but nothing accepts
	// or speaks HTTP/2 on it: the connection is never ready.
	defer lis.Close()
	addr := lis.Addr().String()
	var out, errOut bytes.Buffer
	start := time.Now()
	code := benchCmd(t.Context(), []string{"--addr", addr, "--connect-timeout", "300ms"}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "bench: "+addr+": not ready within 300ms") {
		t.Fatalf("exit %d stderr %q", code, errOut.String())
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("gave up after %v", el)
	}
}

func TestNoopServerAnswersEveryDescriptor(t *testing.T) {
	s := newNoopServer()
	for _, n := range []int{0, 1, 2, 16, 17, 40} {
		req := &pb.RateLimitRequest{Domain: "d"}
		for range n {
			req.Descriptors = append(req.Descriptors, nil)
		}
		resp, err := s.ShouldRateLimit(t.Context(), req)
		if err != nil || resp.OverallCode != pb.RateLimitResponse_OK || len(resp.Statuses) != n {
			t.Fatalf("%d descriptors: %v, %v", n, resp, err)
		}
		for _, st := range resp.Statuses {
			if st.Code != pb.RateLimitResponse_OK {
				t.Fatalf("%d descriptors: status %v", n, st)
			}
		}
	}
}
