package chaos

import (
	"context"
	"net"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// fakeRLS answers by descriptor value, so every call's outcome is known:
// key-0 OK, key-1 OVER_LIMIT, key-2 too late for the deadline, key-3 an
// Unavailable error. Answers carry 90 s until the reset of a minute window.
type fakeRLS struct {
	pb.UnimplementedRateLimitServiceServer
}

func (fakeRLS) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	code := pb.RateLimitResponse_OK
	switch req.Descriptors[0].Entries[0].Value {
	case "key-1":
		code = pb.RateLimitResponse_OVER_LIMIT
	case "key-2":
		<-ctx.Done() // the caller's deadline passes first
		return nil, ctx.Err()
	case "key-3":
		return nil, status.Error(codes.Unavailable, "fake: down")
	}
	return &pb.RateLimitResponse{OverallCode: code, Statuses: []*pb.RateLimitResponse_DescriptorStatus{{
		Code: code, DurationUntilReset: durationpb.New(30 * time.Second),
	}}}, nil
}

// startFake serves fakeRLS on loopback until the test ends.
func startFake(t *testing.T, id string) *Node {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterRateLimitServiceServer(g, fakeRLS{})
	done := make(chan struct{})
	go func() { defer close(done); g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return &Node{ID: id, GRPC: lis.Addr().String()}
}

func TestLoadClassifiesFailOpen(t *testing.T) {
	a, b := startFake(t, "a"), startFake(t, "b")
	// A deadline far above a loopback answer even on a loaded machine
	// (-race on 2 busy cores stalls for hundreds of milliseconds at times),
	// so that only key-2 is late; each key-2 call waits all of it.
	const calls, deadline = 120, 500 * time.Millisecond
	l, err := StartLoad(LoadConfig{
		Domain: "d", DescriptorKey: "k", Keys: 4, Unit: time.Minute,
		Workers: 4, ConnsPerNode: 2, Deadline: deadline, MaxCalls: calls, Seed: 7,
	}, []*Node{a})
	if err != nil {
		t.Fatal(err)
	}
	l.Mark("a")
	if err := poll(20*time.Second, func() (bool, string) { return l.Calls() >= calls/2, "half the calls" }); err != nil {
		t.Fatal(err)
	}
	l.Mark("b")
	if err := l.SetTargets([]*Node{b}); err != nil {
		t.Fatal(err)
	}
	if err := l.Drain(a, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	// Every call to a has ended by now (a late one lasts the whole
	// deadline, plus any stall of a busy machine): none may end a second
	// later.
	drained := l.Now()
	// The driver stops by itself at MaxCalls.
	if err := poll(20*time.Second, func() (bool, string) { return l.Calls() >= calls, "all calls" }); err != nil {
		t.Fatal(err)
	}
	if !l.AnsweredSince(b, 0) || l.AnsweredSince(b, time.Hour) {
		t.Error("AnsweredSince(b) is wrong")
	}
	rec := l.Stop()
	if len(rec.Calls) != calls {
		t.Fatalf("%d calls recorded, want %d (MaxCalls)", len(rec.Calls), calls)
	}
	want := [...]Outcome{OutcomeOK, OutcomeOver, OutcomeLate, OutcomeFailed}
	perNode := map[string]int{}
	for i, c := range rec.Calls {
		if c.Outcome != want[c.Key] {
			t.Errorf("call %d: key %d outcome %d, want %d", i, c.Key, c.Outcome, want[c.Key])
		}
		if c.Outcome == OutcomeFailed && c.Code != codes.Unavailable {
			t.Errorf("call %d: code %v, want Unavailable", i, c.Code)
		}
		if c.Outcome == OutcomeLate && c.Latency < deadline {
			t.Errorf("call %d: late after only %v", i, c.Latency)
		}
		// Answered calls take the server's window end (now + 30 s, a
		// minute window: rounded to the nearest minute); the others the
		// client's.
		end := time.Now().UnixNano() / int64(time.Minute)
		if c.Window < end-2 || c.Window > end+2 {
			t.Errorf("call %d: window %d, want about %d", i, c.Window, end)
		}
		if i > 0 && c.End() < rec.Calls[i-1].End() {
			t.Fatalf("calls not ordered by completion at %d", i)
		}
		perNode[rec.Nodes[c.Node]]++
	}
	if perNode["a"] == 0 || perNode["b"] == 0 {
		t.Errorf("calls per node %v: want both nodes hit", perNode)
	}
	for _, c := range rec.Span(drained+time.Second, rec.Duration+time.Hour, nil) {
		if rec.Nodes[c.Node] == "a" {
			t.Errorf("a call to a a second after it was drained from the targets: %+v", c)
		}
	}
	if len(l.Stop().Calls) != 0 {
		t.Error("a second Stop returned calls")
	}
}

func TestLoadPacing(t *testing.T) {
	a := startFake(t, "a")
	l, err := StartLoad(LoadConfig{Domain: "d", DescriptorKey: "k", Keys: 1, Unit: time.Minute, Workers: 2, Rate: 100}, []*Node{a})
	if err != nil {
		t.Fatal(err)
	}
	if err := poll(20*time.Second, func() (bool, string) { return l.Calls() >= 50, "50 calls" }); err != nil {
		t.Fatal(err)
	}
	rec := l.Stop()
	// 100 calls/s: 50 calls take about half a second. A generous lower
	// bound only: the machine may be slow, never faster than the pace.
	if d := rec.Calls[len(rec.Calls)-1].Start - rec.Calls[0].Start; d < 300*time.Millisecond {
		t.Errorf("%d calls in %v at 100 calls/s", len(rec.Calls), d)
	}
}
