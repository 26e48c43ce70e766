package main

import (
	"context"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ok, over and failed are one-hit answers sent at sent and answered at
// answered (any time unit).
func okAt(sent, answered int64) limitAnswer   { return limitAnswer{sent, answered, 1, limitOK} }
func overAt(sent, answered int64) limitAnswer { return limitAnswer{sent, answered, 1, limitOver} }
func failAt(sent, answered int64) limitAnswer { return limitAnswer{sent, answered, 1, limitFailed} }

// seq is n answers from one worker, one at a time: sent at start+2i,
// answered at start+2i+1.
func seq(n int, start int64, mk func(sent, answered int64) limitAnswer) []limitAnswer {
	var a []limitAnswer
	for i := range n {
		t := start + 2*int64(i)
		a = append(a, mk(t, t+1))
	}
	return a
}

func cat(parts ...[]limitAnswer) []limitAnswer {
	var a []limitAnswer
	for _, p := range parts {
		a = append(a, p...)
	}
	return a
}

func TestBenchAccountWindow(t *testing.T) {
	tests := []struct {
		name  string
		limit uint64
		ans   []limitAnswer
		want  limitCount
	}{
		{"nothing refused, under the limit", 10, seq(4, 0, okAt), limitCount{KeyWindows: 1, Budget: 4}},
		{"exact: limit OKs, then refusals", 10, cat(seq(10, 0, okAt), seq(5, 100, overAt)), limitCount{KeyWindows: 1, Budget: 10}},
		{"refused from the third hit", 10, cat(seq(2, 0, okAt), seq(20, 100, overAt)), limitCount{KeyWindows: 1, Budget: 10, Early: 8}},
		{"refused at once", 5, seq(9, 0, overAt), limitCount{KeyWindows: 1, Budget: 5, Early: 5}},
		{"early bounded by the hits refused", 10, cat(seq(3, 0, okAt), seq(2, 10, overAt), seq(5, 20, okAt)),
			limitCount{KeyWindows: 1, Budget: 10, Early: 2}},
		{"allowed beyond the limit", 10, seq(13, 0, okAt), limitCount{KeyWindows: 1, Budget: 10, Over: 3}},
		{"over the limit and refused early too", 4, cat(seq(2, 0, okAt), seq(1, 10, overAt), seq(5, 20, okAt)),
			limitCount{KeyWindows: 1, Budget: 4, Early: 1, Over: 3}},
		// Concurrent calls: an OK answered after the first refusal was sent
		// before it was answered, so it may have been decided first.
		{"in-flight OK answered after the refusal", 3, []limitAnswer{okAt(0, 1), okAt(2, 3), overAt(5, 6), okAt(4, 7), overAt(8, 9)},
			limitCount{KeyWindows: 1, Budget: 3}},
		{"OK sent after the refusal was answered", 3, []limitAnswer{okAt(0, 1), overAt(2, 3), okAt(4, 5), overAt(6, 7)},
			limitCount{KeyWindows: 1, Budget: 3, Early: 2}},
		{"earliest refusal answer, whatever the order given", 4, []limitAnswer{overAt(20, 21), okAt(0, 1), overAt(2, 3), okAt(10, 11), okAt(12, 13)},
			limitCount{KeyWindows: 1, Budget: 4, Early: 2}},
		// A call without an answer before the refusal may have been counted.
		{"failed call before the refusal counts as allowed", 3, []limitAnswer{okAt(0, 1), failAt(2, 40), okAt(3, 4), overAt(5, 6)},
			limitCount{KeyWindows: 1, Budget: 3}},
		{"failed call after the refusal does not", 3, []limitAnswer{okAt(0, 1), overAt(2, 3), failAt(4, 40)},
			limitCount{KeyWindows: 1, Budget: 2, Early: 1}},
		{"hits_addend 5", 10, []limitAnswer{{0, 1, 5, limitOK}, {2, 3, 5, limitOver}, {4, 5, 5, limitOver}},
			limitCount{KeyWindows: 1, Budget: 10, Early: 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := accountWindow(tt.limit, tt.ans); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestBenchWindowOf(t *testing.T) {
	at := func(s string) int64 {
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixNano()
	}
	end := at("2026-12-03T22:01:00Z") / int64(time.Minute)
	withReset := func(sec int64) *pb.RateLimitResponse_DescriptorStatus {
		return &pb.RateLimitResponse_DescriptorStatus{DurationUntilReset: &durationpb.Duration{Seconds: sec}}
	}
	tests := []struct {
		answered int64
		st       *pb.RateLimitResponse_DescriptorStatus
		want     int64
	}{
		{at("2026-12-03T22:00:00.2Z"), withReset(60), end},                          // reset rounded up to whole seconds
		{at("2026-12-03T22:00:59.9Z"), withReset(1), end},                           // the window's last moment
		{at("2026-12-03T22:01:00.3Z"), withReset(60), end + 1},                      // the next window
		{at("2026-12-03T22:00:59.9Z"), withReset(61), end + 1},                      // the server's clock is ahead: its window counts
		{at("2026-12-03T22:00:30Z"), &pb.RateLimitResponse_DescriptorStatus{}, end}, // no reset: the wall clock
	}
	for i, tt := range tests {
		if got := windowOf(tt.answered, time.Minute, tt.st); got != tt.want {
			t.Errorf("%d: window %d, want %d", i, got-end, tt.want-end)
		}
	}
}

func TestBenchStatCPUTicks(t *testing.T) {
	line := "4242 (ring limit) (x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 170 31 0 0 20 0 9 0 1000 1 2 3\n"
	if got, err := statCPUTicks(line); err != nil || got != 201 {
		t.Errorf("got %d, %v; want 201", got, err)
	}
	if _, err := statCPUTicks("4242 (x) S 1"); err == nil {
		t.Error("short line: want an error")
	}
}

// limiterRLS limits every key to limit hits per hour, as a server would,
// except that it allows extra more hits and refuses from limit-early on.
// It answers with current_limit and duration_until_reset.
type limiterRLS struct {
	pb.UnimplementedRateLimitServiceServer
	limit, extra, early uint32
	mu                  sync.Mutex
	counts              map[string]uint32 // key + window
}

func (f *limiterRLS) ShouldRateLimit(_ context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	now := time.Now()
	win := now.Truncate(time.Hour)
	key := req.Descriptors[0].Entries[0].Value + "@" + win.String()
	f.mu.Lock()
	f.counts[key]++
	n := f.counts[key]
	f.mu.Unlock()
	code := pb.RateLimitResponse_OK
	if n > f.limit+f.extra || (f.early > 0 && n > f.limit-f.early) {
		code = pb.RateLimitResponse_OVER_LIMIT
	}
	reset := win.Add(time.Hour).Sub(now)
	return &pb.RateLimitResponse{OverallCode: code, Statuses: []*pb.RateLimitResponse_DescriptorStatus{{
		Code:               code,
		CurrentLimit:       &pb.RateLimitResponse_RateLimit{RequestsPerUnit: f.limit, Unit: pb.RateLimitResponse_RateLimit_HOUR},
		DurationUntilReset: &durationpb.Duration{Seconds: int64((reset + time.Second - 1) / time.Second)},
	}}}, nil
}

// The accounting end to end: 4 keys, about 100 calls each against a limit
// of 50, from 16 concurrent workers, warmup included. (A run across the
// hour's edge splits a key's hits over two windows; the checks allow it.)
func TestBenchLimitAccounting(t *testing.T) {
	defer goleak.VerifyNone(t)
	tests := []struct {
		name         string
		extra, early uint32
		wantOver     uint64 // per key-window with more than 50+extra hits
		wantEarly    uint64
	}{
		{"exact", 0, 0, 0, 0},
		{"allows 3 more", 3, 0, 3, 0},
		{"refuses 5 early", 0, 5, 0, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &limiterRLS{limit: 50, extra: tt.extra, early: tt.early, counts: map[string]uint32{}}
			addr, stop := startFake(t, f)
			defer stop()
			j, code := runBenchJSON(t, t.Context(), "-n", "400", "-c", "16", "--addr", addr, "--keys", "4", "--seed", "3",
				"--descriptor", "key=k{key}", "--deadline", "0", "--warmup", "20ms", "--limits", "--server-pids", strconv.Itoa(os.Getpid()))
			if code != 0 {
				t.Fatalf("exit %d", code)
			}
			l := j.Limits
			if l == nil || j.ServerCPU == nil {
				t.Fatalf("no limits or server_cpu in the report: %+v %+v", l, j.ServerCPU)
			}
			if l.KeyWindows < 4 || l.KeyWindows > 8 || l.BudgetHits > 50*l.KeyWindows || l.BudgetHits < 4*50 {
				t.Errorf("limits %+v: want 4 key-windows (8 across an hour's edge), each with a budget of 50", l)
			}
			if l.OverLimitHits != tt.wantOver*l.KeyWindows || l.EarlyRefusals != tt.wantEarly*l.KeyWindows {
				t.Errorf("limits %+v: want %d over and %d early per key-window", l, tt.wantOver, tt.wantEarly)
			}
			if math.Abs(l.EarlyShare-float64(l.EarlyRefusals)/float64(l.BudgetHits)) > 1e-9 {
				t.Errorf("early share %v of %+v", l.EarlyShare, l)
			}
		})
	}
}

// Without --limits the report has no limits block; the text report names
// the accounting when it has one.
func TestBenchLimitsReported(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := &limiterRLS{limit: 5, counts: map[string]uint32{}}
	addr, stop := startFake(t, f)
	defer stop()
	j, code := runBenchJSON(t, t.Context(), "-n", "20", "-c", "2", "--addr", addr, "--keys", "1", "--descriptor", "key=k{key}")
	if code != 0 || j.Limits != nil || j.ServerCPU != nil {
		t.Fatalf("exit %d, limits %+v, server_cpu %+v", code, j.Limits, j.ServerCPU)
	}
	r := sampleResult()
	r.Limits = &limitCount{KeyWindows: 3, Budget: 200, Early: 5, Over: 0}
	r.ServerPIDs, r.ServerCPU, r.ClientCPU = []int{7, 8}, 300*time.Microsecond, 150*time.Microsecond
	var b strings.Builder
	writeBenchText(&b, r)
	for _, want := range []string{
		"  Server CPU:\t30.0 us per call (user + system of 2 process(es), 0.00 s)\n",
		"  Load tool CPU:\t15.0 us per call (0.00 s)\n",
		"  Early refusals:\t5 hits (2.50% of the budget: refused before their window reached its limit)\n",
		"  Over the limit:\t0 hits (allowed beyond their window's limit)\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, b.String())
		}
	}
}

func TestBenchCompareWithLimitsAndCPU(t *testing.T) {
	one := report("one node", 100, 1, 4, 8, 0, 0)
	one.ServerCPU = &serverCPUJSON{USPerCall: 30}
	one.Limits = &limitsJSON{KeyWindows: 10, BudgetHits: 1000, EarlyRefusals: 5}
	three := report("three nodes", 250, 1, 5, 9, 0, 0)
	three.ServerCPU = &serverCPUJSON{USPerCall: 80}
	three.Limits = &limitsJSON{KeyWindows: 10, BudgetHits: 1000, EarlyRefusals: 15, OverLimitHits: 2}
	floor := report("floor", 300, 1, 3, 6, 0, 0)
	floor.Limits = &limitsJSON{} // --limits against a server that states no limits
	var b strings.Builder
	writeCompare(&b, compareRows([]benchJSON{one, three, floor}))
	want := `setup       runs    calls/s  x first    p50 ms    p99 ms  p99.9 ms    p99 x fail-open    errors cpu us/call    early  early %     over
one node       1        100    1.00x     1.000     4.000     8.000    1.00x         0         0        30.0        5    0.50%        0
three nodes    1        250    2.50x     1.000     5.000     9.000    1.25x         0         0        80.0       15    1.50%        2
floor          1        300    3.00x     1.000     3.000     6.000    0.75x         0         0           -        -        -        -
`
	if b.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}
