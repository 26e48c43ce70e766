package transport

import (
	"context"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// Kinds of peers that do not answer.
const (
	fwdPeerBlocking = "blocking handler" // a Peer server whose handlers wait for a gate
	fwdPeerSilent   = "silent listener"  // accepts TCP connections and never speaks
	fwdPeerRefused  = "refused"          // nothing listens on the port
)

// fwdFakePeer is a peer "b" that does not answer until open is called
// (blocking kind), or never (the others).
type fwdFakePeer struct {
	addr    string
	gate    chan struct{}
	once    sync.Once
	decides atomic.Int64 // Decide calls and DecideStream batches received
	decided atomic.Int64 // ops answered
	pings   atomic.Int64 // Ping calls received
	streams atomic.Int64 // DecideStreams opened
	ended   atomic.Int64 // DecideStreams whose handler returned
	// noStream makes DecideStream answer Unimplemented (an older peer).
	noStream atomic.Bool
	// delay holds every answer this long (ns) after the gate opens.
	delay atomic.Int64
}

// open lets the blocking handlers answer, now and from now on.
func (p *fwdFakePeer) open() { p.once.Do(func() { close(p.gate) }) }

type fwdBlockingServer struct {
	peerpb.UnimplementedPeerServer
	p *fwdFakePeer
}

func (s fwdBlockingServer) Decide(ctx context.Context, req *peerpb.DecideRequest) (*peerpb.DecideResponse, error) {
	s.p.decides.Add(1)
	select {
	case <-s.p.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if d := time.Duration(s.p.delay.Load()); d > 0 {
		time.Sleep(d) // a slow owner: the answer comes, but late
	}
	out := &peerpb.DecideResponse{}
	for range req.GetOps() {
		out.Results = append(out.Results, &peerpb.Result{Count: 777})
	}
	s.p.decided.Add(int64(len(req.GetOps())))
	return out, nil
}

// DecideStream answers each batch as Decide does, once the gate is open.
func (s fwdBlockingServer) DecideStream(stream grpc.BidiStreamingServer[peerpb.DecideRequest, peerpb.DecideResponse]) error {
	if s.p.noStream.Load() {
		return status.Error(codes.Unimplemented, "no DecideStream here")
	}
	s.p.streams.Add(1)
	defer s.p.ended.Add(1)
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		out, err := s.Decide(stream.Context(), req)
		if err != nil {
			return err
		}
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

func (s fwdBlockingServer) Ping(ctx context.Context, _ *peerpb.PingRequest) (*peerpb.PingResponse, error) {
	s.p.pings.Add(1)
	select {
	case <-s.p.gate:
		return &peerpb.PingResponse{Id: "b"}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// fwdStartFakePeer starts a fake peer of kind on a host of its own on sim.
func fwdStartFakePeer(t testing.TB, sim *fwdSim, kind string) *fwdFakePeer {
	t.Helper()
	p := &fwdFakePeer{gate: make(chan struct{})}
	if kind == fwdPeerRefused {
		p.addr = sim.refusing()
		return p
	}
	lis, _ := sim.listen()
	p.addr = lis.Addr().String()
	switch kind {
	case fwdPeerBlocking:
		srv := grpc.NewServer(ServerOptions()...)
		peerpb.RegisterPeerServer(srv, fwdBlockingServer{p: p})
		testkit.Serve(t, srv, lis)
		t.Cleanup(p.open) // release handlers first (cleanups run last-in first-out)
	case fwdPeerSilent:
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			conns []net.Conn
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		}()
		t.Cleanup(func() {
			lis.Close()
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			for _, c := range conns {
				c.Close()
			}
		})
	default:
		t.Fatalf("unknown peer kind %q", kind)
	}
	return p
}

func TestForwardDeadPeer(t *testing.T) {
	const timeout = 50 * time.Millisecond
	tests := []struct {
		kind       string
		wantReason string // of the first fallbacks
		wait       time.Duration
	}{
		{fwdPeerBlocking, "timeout", timeout},
		{fwdPeerSilent, "timeout", timeout}, // connected, never a preface
		{fwdPeerRefused, "error", 0},
	}
	for _, tt := range tests {
		t.Run(tt.kind, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sim := newFwdSim(t)
				peer := fwdStartFakePeer(t, sim, tt.kind)
				nodes := fwdStartClusterOn(t, sim, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
					c.Timeout = timeout
				})
				a := nodes["a"]
				if tt.kind == fwdPeerRefused {
					// Let the connection attempt fail first, so the op meets a
					// refused peer rather than one still connecting.
					p := (*a.f.peers.Load())["b"]
					testkit.WaitFor(t, fwdWait, "the dial to fail", func() bool {
						return p.conn.GetState().String() == "TRANSIENT_FAILURE"
					})
				}

				// The first request waits Timeout (of virtual time) for a
				// peer that does not answer, then falls back; a refused one
				// fails it at once.
				ops := []bucket.Op{fwdOp("b/1"), fwdOp("a/1"), fwdOp("b/2")}
				res := make([]bucket.Result, len(ops))
				start := time.Now()
				a.f.Apply(context.Background(), a.now, ops, res)
				if took := time.Since(start); took != tt.wait {
					t.Errorf("Apply took %v, want %v", took, tt.wait)
				}
				for i, r := range res {
					if r.Count != 1 || r.ResetAfter != a.now {
						t.Errorf("result %d = %+v, want a local decision", i, r)
					}
				}
				// The first failure may make b suspect before the second op is
				// queued (a refused dial fails at once).
				c := fwdReadCounts(t, a.reg)
				got := map[string]float64{"timeout": c.timeout, "error": c.error}
				if got[tt.wantReason] < 1 || c.timeout+c.error+c.suspect != 2 || c.forwarded != 0 {
					t.Errorf("counters %+v, want 2 fallbacks, at least one %s", c, tt.wantReason)
				}
				// A refused peer is suspect at once; a silent one after
				// peerSuspectAfter late answers in a row.
				fwdMakeSuspect(t, a, "b/3")
				c = fwdReadCounts(t, a.reg)

				// While b is suspect its ops fall back without waiting: the
				// suspect counter shows the path, the virtual clock that no
				// time passed.
				const suspectOps = 100
				start = time.Now()
				for range suspectOps {
					a.f.Apply(context.Background(), a.now, ops[:1], res[:1])
				}
				if took := time.Since(start); took != 0 {
					t.Errorf("%d ops on a suspect peer took %v, want no wait", suspectOps, took)
				}
				if got := fwdReadCounts(t, a.reg).suspect - c.suspect; got != suspectOps {
					t.Errorf("suspect fallbacks +%v, want +%d", got, suspectOps)
				}
				if n := peer.decided.Load(); n != 0 {
					t.Errorf("the dead peer answered %d ops", n)
				}
			})
		})
	}
}

func TestForwardProbeClearsSuspicion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		peer := fwdStartFakePeer(t, sim, fwdPeerBlocking)
		nodes := fwdStartClusterOn(t, sim, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
			c.Timeout = 250 * time.Millisecond
		})
		a := nodes["a"]
		res := make([]bucket.Result, 1)
		apply := func(key string) bucket.Result {
			a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp(key)}, res)
			return res[0]
		}
		fwdMakeSuspect(t, a, "b/1")
		// Probes keep failing while the peer hangs: wait for a few of them.
		testkit.WaitFor(t, fwdWait, "failed probes", func() bool { return peer.pings.Load() >= 2 })
		if s := a.f.Suspects(); len(s) != 1 {
			t.Fatalf("Suspects() = %v while the peer still hangs, want [b]", s)
		}

		peer.open()
		testkit.WaitFor(t, fwdWait, "the probe to clear b", func() bool { return len(a.f.Suspects()) == 0 })
		if r := apply("b/2"); r.Count != 777 {
			t.Fatalf("first op after the probe: %+v, want the peer's answer", r)
		}
		if got := fwdReadCounts(t, a.reg).forwarded; got != 1 {
			t.Errorf("forwarded = %v, want 1", got)
		}
	})
}

func TestForwardSuspicionExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		peer := fwdStartFakePeer(t, sim, fwdPeerBlocking)
		nodes := fwdStartClusterOn(t, sim, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
			c.Timeout = 30 * time.Millisecond
			// Passed on a's clock by the test, not by waiting.
			c.SuspectFor = time.Second
		})
		a := nodes["a"]
		fwdMakeSuspect(t, a, "b/1")
		// The peer never answers a probe, but SuspectFor ends the bypass: a's
		// clock passes it, and the next failed probe sees that.
		a.clock.Add(time.Second)
		testkit.WaitFor(t, fwdWait, "the suspicion to expire", func() bool { return len(a.f.Suspects()) == 0 })
	})
}

// fwdMakeSuspect applies ops for key until its owner b is suspect: at most
// peerSuspectAfter late or failed answers in a row.
func fwdMakeSuspect(t *testing.T, a *fwdTestNode, key string) {
	t.Helper()
	res := make([]bucket.Result, 1)
	for i := 0; i < peerSuspectAfter && len(a.f.Suspects()) == 0; i++ {
		a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp(key)}, res)
	}
	if s := a.f.Suspects(); len(s) != 1 || s[0] != "b" {
		t.Fatalf("Suspects() = %v after %d failures, want [b]", s, peerSuspectAfter)
	}
}

func TestForwardOneLateAnswerIsNotSuspicion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		peer := fwdStartFakePeer(t, sim, fwdPeerBlocking)
		nodes := fwdStartClusterOn(t, sim, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
			c.Timeout = 30 * time.Millisecond
		})
		a := nodes["a"]
		res := make([]bucket.Result, 1)
		for i := 1; i < peerSuspectAfter; i++ {
			a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp("b/1")}, res)
			if s := a.f.Suspects(); len(s) != 0 {
				t.Fatalf("after %d late answer(s): Suspects() = %v, want none", i, s)
			}
		}
	})
}

// fwdHolderOwners adds Holders to fwdFakeOwners: key "x/..." is held by x,
// then by the IDs in next[x].
type fwdHolderOwners struct {
	*fwdFakeOwners
	next map[string][]string
}

func (o fwdHolderOwners) Holder(key []byte, i int) (string, bool, bool) {
	id, _, _ := o.Owner(key)
	hs := append([]string{id}, o.next[id]...)
	if i >= len(hs) {
		return "", false, false
	}
	return hs[i], hs[i] == o.self, true
}

// Ops for a suspect owner go to its first healthy replica (or are decided
// locally when that replica is this node), not to the entry node's own
// counter.
func TestForwardReroutesToReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		dead := fwdStartFakePeer(t, sim, fwdPeerRefused)
		nodes := fwdStartClusterOn(t, sim, []string{"a", "b"}, map[string]string{"c": dead.addr, "d": dead.addr}, func(c *ForwarderConfig) {
			c.Owners = fwdHolderOwners{c.Owners.(*fwdFakeOwners), map[string][]string{"c": {"b", "a"}, "d": {"a", "b"}}}
		})
		a, b := nodes["a"], nodes["b"]
		res := make([]bucket.Result, 1)
		// The first op finds c refusing connections: it falls back and c
		// becomes suspect at once.
		a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp("c/k")}, res)
		testkit.WaitFor(t, fwdWait, "c suspect", func() bool { return slices.Contains(a.f.Suspects(), "c") })
		tests := []struct {
			key     string
			decider *fwdTestNode
		}{
			{"c/k", b}, // c's first replica is b
			{"d/k", a}, // d's first replica is a itself
		}
		for _, tt := range tests {
			for range 3 {
				a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp(tt.key)}, res)
				if res[0].ResetAfter != tt.decider.now {
					t.Fatalf("%s: decided with clock %d, want %s's", tt.key, res[0].ResetAfter, tt.decider.id)
				}
			}
		}
		if n := b.store.count("c/k"); n != 3 {
			t.Errorf("replica b counted %d, want 3", n)
		}
		if n := a.store.count("d/k"); n != 3 {
			t.Errorf("a counted %d of d's ops, want 3", n)
		}
	})
}

// A call whose deadline has already passed (read late, e.g. after a freeze)
// is decided locally without reaching the owner or blaming it.
func TestForwardLateCallStaysLocal(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"a", "b"}, nil, nil)
	a, b := nodes["a"], nodes["b"]
	// The deadline is on a's clock, which waitFor reads it against.
	ctx, cancel := context.WithDeadline(context.Background(), a.clock.Now().Add(-time.Second))
	defer cancel()
	res := make([]bucket.Result, 2)
	for range 5 {
		a.f.Apply(ctx, a.now, []bucket.Op{fwdOp("b/late1"), fwdOp("b/late2")}, res)
		if res[0].ResetAfter != a.now || res[1].ResetAfter != a.now {
			t.Fatalf("results %+v, want local decisions", res)
		}
	}
	if b.store.numCalls() != 0 {
		t.Errorf("the owner got %d ops", b.store.numCalls())
	}
	if s := a.f.Suspects(); len(s) != 0 {
		t.Errorf("suspects %v after late calls, want none", s)
	}
	if c := fwdReadCounts(t, a.reg); c.timeout != 10 {
		t.Errorf("fallbacks %+v, want 10 timeouts", c)
	}
}

// After forgive (this process was frozen) peers are no longer suspect and
// failures within the grace do not make them suspect again.
func TestForwardForgive(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"a", "b"}, nil, nil)
	a := nodes["a"]
	p := (*a.f.peers.Load())["b"]
	p.markSuspect("test", nil)
	a.f.Forgive(time.Hour)
	if s := a.f.Suspects(); len(s) != 0 {
		t.Fatalf("suspects %v after forgive", s)
	}
	for range 2 * peerSuspectAfter {
		p.noteFailure("timeout", nil)
	}
	if s := a.f.Suspects(); len(s) != 0 {
		t.Fatalf("suspects %v after failures within the grace", s)
	}
}

// TestForwardRefusedPeerStaysSuspect: a peer whose connection is refused (a
// crashed process) stays suspect past SuspectFor while its probes fail, so
// entry nodes keep sending its keys to their replicas instead of deciding
// another batch on their own counters every SuspectFor until memberlist
// declares it dead.
func TestForwardRefusedPeerStaysSuspect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		const suspectFor = 300 * time.Millisecond
		nodes := fwdStartClusterOn(t, sim, []string{"a"}, map[string]string{"b": sim.refusing()}, func(c *ForwarderConfig) {
			c.Timeout = 30 * time.Millisecond
			c.SuspectFor = suspectFor
		})
		a := nodes["a"]
		fwdMakeSuspect(t, a, "b/1")
		// SuspectFor has passed on a's clock: the suspicion must hold
		// through several probes all the same, sampled every 20 ms of
		// virtual time.
		a.clock.Add(4 * suspectFor)
		end := time.Now().Add(4 * suspectFor)
		for time.Now().Before(end) {
			if s := a.f.Suspects(); len(s) != 1 {
				t.Fatalf("Suspects() = %v while b refuses connections, want [b]", s)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
