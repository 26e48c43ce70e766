package transport

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/wire"
)

func TestNewForwarderConfig(t *testing.T) {
	ok := ForwarderConfig{Self: "a", Local: newFwdFakeStore(), Owners: &fwdFakeOwners{}}
	tests := []struct {
		name    string
		edit    func(*ForwarderConfig)
		wantErr bool
	}{
		{"defaults", func(*ForwarderConfig) {}, false},
		{"no self", func(c *ForwarderConfig) { c.Self = "" }, true},
		{"no local", func(c *ForwarderConfig) { c.Local = nil }, true},
		{"no owners", func(c *ForwarderConfig) { c.Owners = nil }, true},
		{"negative batch", func(c *ForwarderConfig) { c.MaxBatch = -1 }, true},
		{"batch too big", func(c *ForwarderConfig) { c.MaxBatch = 4097 }, true},
		{"largest batch", func(c *ForwarderConfig) { c.MaxBatch = 4096 }, false},
		{"batch of one", func(c *ForwarderConfig) { c.MaxBatch = 1 }, false},
		{"negative timeout", func(c *ForwarderConfig) { c.Timeout = -1 }, true},
		{"negative suspect", func(c *ForwarderConfig) { c.SuspectFor = -1 }, true},
		{"negative probe interval", func(c *ForwarderConfig) { c.ProbeInterval = -1 }, true},
		{"negative probe timeout", func(c *ForwarderConfig) { c.ProbeTimeout = -1 }, true},
		{"negative stream age", func(c *ForwarderConfig) { c.StreamMaxAge = -1 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.edit(&cfg)
			f, err := NewForwarder(cfg)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if f.maxBatch < 1 || f.timeout <= 0 || f.suspectFor <= 0 || f.probeInterval <= 0 || f.probeTimeout <= 0 || f.clock == nil || f.log == nil {
				t.Errorf("defaults not applied: %+v", f)
			}
			if tt.name == "defaults" && (f.probeInterval != DefaultProbeInterval || f.probeTimeout != DefaultProbeTimeout || f.streamMaxAge != wire.StreamMaxAge) {
				t.Errorf("defaults not applied: probes every %v for %v, streams for %v", f.probeInterval, f.probeTimeout, f.streamMaxAge)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestNewForwarderRegistersOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := ForwarderConfig{Self: "a", Local: newFwdFakeStore(), Owners: &fwdFakeOwners{}, Registerer: reg}
	f, err := NewForwarder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := NewForwarder(cfg); err == nil {
		t.Fatal("second forwarder on the same registry: want an error")
	}
	// The failed registration must not have left half its metrics behind.
	f.m.fbTimeout.Inc()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 16 {
		t.Fatalf("gathered %d metric families, want 16", len(mfs))
	}
}

func TestForwardExactlyOnce(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"a", "b"}, nil, nil)
	a, b := nodes["a"], nodes["b"]
	const n = 50
	for i := 1; i <= n; i++ {
		ops := []bucket.Op{fwdOp("b/k")}
		res := make([]bucket.Result, 1)
		a.f.Apply(context.Background(), a.now, ops, res)
		want := bucket.Result{Count: uint64(i), Remaining: 1<<40 - uint64(i), ResetAfter: b.now}
		if res[0] != want {
			t.Fatalf("op %d: got %+v, want %+v (decided by b with b's clock)", i, res[0], want)
		}
	}
	if got := b.store.count("b/k"); got != n {
		t.Errorf("owner counted %d, want %d", got, n)
	}
	if got := a.store.numCalls(); got != 0 {
		t.Errorf("entry store applied %d ops, want 0", got)
	}
	if c := fwdReadCounts(t, a.reg); c != (fwdCounts{forwarded: n}) {
		t.Errorf("counters %+v, want only %d forwarded", c, n)
	}
	if cnt, _ := fwdHist(t, a.reg, "ringlimit_peer_rpc_duration_seconds"); cnt == 0 {
		t.Error("no RPC duration observed")
	}
}

func TestForwardMixedOwnersInOrder(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"a", "b", "c"}, nil, nil)
	a, b, c := nodes["a"], nodes["b"], nodes["c"]
	// Give each key a distinct starting count so a misplaced result shows.
	seed := map[string]uint64{"a/x": 10, "b/y": 20, "c/z": 30, "b/w": 40, "c/v": 50}
	for key, hits := range seed {
		owner := nodes[key[:1]]
		op := fwdOp(key)
		op.Hits = hits
		owner.store.Apply(owner.now, &op)
	}
	tests := []struct {
		name string
		keys []string
		// want[i] is the node whose clock and store decide keys[i], and
		// the count it returns.
		decider []*fwdTestNode
		count   []uint64
	}{
		{"three owners", []string{"a/x", "b/y", "c/z"}, []*fwdTestNode{a, b, c}, []uint64{11, 21, 31}},
		{"interleaved", []string{"c/v", "a/x", "b/w", "c/z", "b/y"}, []*fwdTestNode{c, a, b, c, b}, []uint64{51, 12, 41, 32, 22}},
		// "q" is not a member: its op falls back to the entry node.
		{"unknown owner", []string{"b/y", "q/1", "a/x"}, []*fwdTestNode{b, a, a}, []uint64{23, 1, 13}},
		{"empty", nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ops := make([]bucket.Op, len(tt.keys))
			for i, k := range tt.keys {
				ops[i] = fwdOp(k)
			}
			res := make([]bucket.Result, len(ops))
			a.f.Apply(context.Background(), a.now, ops, res)
			for i := range ops {
				if res[i].Count != tt.count[i] || res[i].ResetAfter != tt.decider[i].now {
					t.Errorf("result %d (%s): count %d decided at %d, want count %d decided by %s at %d",
						i, tt.keys[i], res[i].Count, res[i].ResetAfter, tt.count[i], tt.decider[i].id, tt.decider[i].now)
				}
			}
		})
	}
	if got := fwdReadCounts(t, a.reg).unknown; got != 1 {
		t.Errorf("unknown fallbacks = %v, want 1", got)
	}
}

func TestForwardConcurrentBatches(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"a", "b"}, nil, nil)
	a, b := nodes["a"], nodes["b"]
	const workers, perWorker, keys = 64, 200, 8
	var wg sync.WaitGroup
	wg.Add(workers)
	for w := range workers {
		go func() {
			defer wg.Done()
			ops := []bucket.Op{fwdOp("b/" + strconv.Itoa(w%keys))}
			res := make([]bucket.Result, 1)
			for range perWorker {
				a.f.Apply(context.Background(), a.now, ops, res)
				if res[0].ResetAfter != b.now {
					t.Errorf("op decided at %d, not by the owner", res[0].ResetAfter)
					return
				}
			}
		}()
	}
	wg.Wait()
	var total uint64
	for k := range keys {
		want := uint64(workers / keys * perWorker)
		got := b.store.count("b/" + strconv.Itoa(k))
		if got != want {
			t.Errorf("key %d: owner counted %d, want %d", k, got, want)
		}
		total += got
	}
	if c := fwdReadCounts(t, a.reg); c != (fwdCounts{forwarded: workers * perWorker}) {
		t.Errorf("counters %+v, want only %d forwarded", c, workers*perWorker)
	}
	batches, ops := fwdHist(t, a.reg, "ringlimit_peer_batch_size")
	if uint64(ops) != total {
		t.Errorf("batch sizes sum to %v, want %d", ops, total)
	}
	t.Logf("%d ops in %d batches (mean %.1f)", total, batches, ops/float64(batches))
	if batches >= uint64(ops) {
		t.Errorf("%d batches for %v ops: no batching", batches, ops)
	}
}

// TestForwardLingerWhileInFlight runs on virtual time, where only timers
// and the simulated network's latency move the clock: a lone op goes out
// at once and takes one round trip, and the ops that arrive while a batch
// to the peer is in flight go out together, each delayed by at most
// fwdMaxLinger.
func TestForwardLingerWhileInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		nodes := fwdStartClusterOn(t, sim, []string{"a", "b"}, nil, func(c *ForwarderConfig) { c.Clock = clock.Real() })
		a, b := nodes["a"], nodes["b"]
		apply := func(key string) time.Duration {
			start := time.Now()
			res := make([]bucket.Result, 1)
			a.f.Apply(context.Background(), time.Now().UnixNano(), []bucket.Op{fwdOp(key)}, res)
			return time.Since(start)
		}
		// Lone ops, one after another: the first ones open the senders'
		// streams; then each takes one round trip, the same every time.
		var lone time.Duration
		for i := range 20 {
			d := apply("b/lone")
			if i >= 10 && lone != 0 && d != lone {
				t.Fatalf("lone op %d took %v, the one before %v", i, d, lone)
			}
			lone = d
		}
		p := (*a.f.peers.Load())["b"]
		if p.linger() <= 0 || lone <= 0 {
			t.Fatalf("linger %v after lone ops of %v", p.linger(), lone)
		}
		batches0, ops0 := fwdHist(t, a.reg, "ringlimit_peer_batch_size")
		if batches0 != 20 || ops0 != 20 {
			t.Fatalf("%d batches of %v ops for 20 lone ops", batches0, ops0)
		}

		// One op in flight, then a burst: the burst waits for one batch.
		var wg sync.WaitGroup
		wg.Go(func() { apply("b/first") })
		synctest.Wait() // its batch is on the network
		if n := p.inflight.Load(); n != 1 {
			t.Fatalf("%d batches in flight, want 1", n)
		}
		const burst = 20
		took := make([]time.Duration, burst)
		for i := range burst {
			wg.Go(func() { took[i] = apply("b/burst" + strconv.Itoa(i)) })
		}
		wg.Wait()
		batches, ops := fwdHist(t, a.reg, "ringlimit_peer_batch_size")
		if batches-batches0 != 2 || ops-ops0 != burst+1 {
			t.Errorf("%d ops in %d batches, want %d in 2", int(ops-ops0), batches-batches0, burst+1)
		}
		for i, d := range took {
			if d > lone+fwdMaxLinger {
				t.Errorf("burst op %d took %v, a lone op %v", i, d, lone)
			}
			if got := b.store.count("b/burst" + strconv.Itoa(i)); got != 1 {
				t.Errorf("owner counted burst op %d %d times", i, got)
			}
		}

		// Idle again: a lone op takes one round trip.
		if d := apply("b/lone"); d != lone {
			t.Errorf("lone op after the burst took %v, want %v", d, lone)
		}
	})
}

func TestForwardMaxBatchHonoured(t *testing.T) {
	const maxBatch = 3
	nodes := fwdStartCluster(t, []string{"a", "b"}, nil, func(c *ForwarderConfig) { c.MaxBatch = maxBatch })
	a, b := nodes["a"], nodes["b"]
	ops := make([]bucket.Op, 100)
	for i := range ops {
		ops[i] = fwdOp("b/" + strconv.Itoa(i))
	}
	res := make([]bucket.Result, len(ops))
	a.f.Apply(context.Background(), a.now, ops, res)
	for i, r := range res {
		if r.Count != 1 || r.ResetAfter != b.now {
			t.Fatalf("result %d = %+v, want count 1 from b", i, r)
		}
	}
	batches, sum := fwdHist(t, a.reg, "ringlimit_peer_batch_size")
	if sum != 100 || batches < (100+maxBatch-1)/maxBatch {
		t.Errorf("%d batches for %v ops with MaxBatch %d", batches, sum, maxBatch)
	}
}

func TestForwardSetPeers(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"a", "b"}, nil, nil)
	a, b := nodes["a"], nodes["b"]
	apply := func(key string) bucket.Result {
		res := make([]bucket.Result, 1)
		a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp(key)}, res)
		return res[0]
	}
	client := func() *peerClient { return (*a.f.peers.Load())["b"] }
	closed := func(p *peerClient) bool {
		select {
		case <-p.done:
			return true
		default:
			return false
		}
	}
	if r := apply("b/1"); r.ResetAfter != b.now {
		t.Fatalf("not forwarded: %+v", r)
	}
	first := client()

	// Same address: the client (and its connection) is kept.
	a.f.SetPeers(map[string]string{"a": a.addr, "b": b.addr})
	if client() != first || closed(first) {
		t.Fatal("SetPeers with an unchanged address replaced the client")
	}

	// addPeers keeps every client it has, a moved or missing peer's too.
	a.f.AddPeers(map[string]string{"b": "127.0.0.1:1"})
	a.f.AddPeers(map[string]string{})
	if client() != first || closed(first) {
		t.Fatal("addPeers replaced or closed a client")
	}

	// New address: a new client, the old one closed, suspicion reset.
	first.markSuspect("test", nil)
	if got := a.f.Suspects(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("Suspects() = %v, want [b]", got)
	}
	_, port, _ := net.SplitHostPort(b.addr)
	moved := net.JoinHostPort("localhost", port)
	a.f.SetPeers(map[string]string{"b": moved})
	second := client()
	if second == first || second.addr != moved || !closed(first) {
		t.Fatalf("moved peer: client %p addr %q, old closed %v", second, second.addr, closed(first))
	}
	if got := a.f.Suspects(); len(got) != 0 {
		t.Fatalf("Suspects() = %v after the peer moved, want none", got)
	}
	if r := apply("b/2"); r.ResetAfter != b.now {
		t.Fatalf("not forwarded to the moved peer: %+v", r)
	}

	// Gone: the client is closed and its keys fall back.
	a.f.SetPeers(map[string]string{"a": a.addr})
	if client() != nil || !closed(second) {
		t.Fatal("removed peer still has an open client")
	}
	before := fwdReadCounts(t, a.reg).unknown
	if r := apply("b/3"); r.ResetAfter != a.now {
		t.Fatalf("op for a removed peer: %+v, want a local decision", r)
	}
	if got := fwdReadCounts(t, a.reg).unknown - before; got != 1 {
		t.Errorf("unknown fallbacks +%v, want +1", got)
	}
}

func TestForwardZeroAllocs(t *testing.T) {
	nodes := fwdStartCluster(t, []string{"a", "b"}, nil, func(c *ForwarderConfig) {
		// b answers probes: without this its first probe (150 ms later on
		// a stalled machine) would clear the suspicion mid-measure.
		c.ProbeInterval = time.Hour
	})
	a := nodes["a"]
	tests := []struct {
		name  string
		key   string
		setup func()
	}{
		{"local", "a/1", func() {}},
		{"unknown owner", "q/1", func() {}},
		{"suspect owner", "b/1", func() {
			(*a.f.peers.Load())["b"].markSuspect("test", nil)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.setup()
			ops := []bucket.Op{fwdOp(tt.key)}
			res := make([]bucket.Result, 1)
			a.f.Apply(context.Background(), a.now, ops, res) // the fake store's map entry
			if n := testing.AllocsPerRun(200, func() {
				a.f.Apply(context.Background(), a.now, ops, res)
			}); n != 0 {
				t.Errorf("%v allocs per Apply, want 0 (suspects %v)", n, a.f.Suspects())
			}
		})
	}
}

func TestForwardCloseJoins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		peer := fwdStartFakePeer(t, sim, fwdPeerBlocking)
		nodes := fwdStartClusterOn(t, sim, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
			c.Timeout = time.Minute // only Close can end the wait
		})
		a := nodes["a"]
		done := make(chan bucket.Result)
		go func() {
			res := make([]bucket.Result, 1)
			a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp("b/1")}, res)
			done <- res[0]
		}()
		testkit.WaitFor(t, fwdWait, "the peer to receive the batch", func() bool { return peer.decides.Load() > 0 })
		if err := a.f.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-done:
			if r.ResetAfter != a.now {
				t.Errorf("in-flight op after Close: %+v, want a local decision", r)
			}
		case <-time.After(fwdWait):
			t.Fatal("Apply still waiting after Close")
		}
		if got := a.f.Suspects(); len(got) != 0 {
			t.Errorf("Close made %v suspect", got)
		}
		if err := a.f.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		a.f.SetPeers(map[string]string{"b": peer.addr})
		res := make([]bucket.Result, 1)
		a.f.Apply(context.Background(), a.now, []bucket.Op{fwdOp("b/2")}, res)
		if res[0].ResetAfter != a.now {
			t.Errorf("Apply after Close: %+v, want a local decision", res[0])
		}
	})
}

func TestForwardContextCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		peer := fwdStartFakePeer(t, sim, fwdPeerBlocking)
		nodes := fwdStartClusterOn(t, sim, []string{"a"}, map[string]string{"b": peer.addr}, func(c *ForwarderConfig) {
			c.Timeout = time.Minute
		})
		a := nodes["a"]
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan bucket.Result)
		go func() {
			res := make([]bucket.Result, 2)
			a.f.Apply(ctx, a.now, []bucket.Op{fwdOp("b/1"), fwdOp("a/1")}, res)
			done <- res[0]
		}()
		testkit.WaitFor(t, fwdWait, "the peer to receive the batch", func() bool { return peer.decides.Load() > 0 })
		cancel()
		select {
		case r := <-done:
			if r.ResetAfter != a.now {
				t.Errorf("cancelled op: %+v, want a local decision", r)
			}
		case <-time.After(fwdWait):
			t.Fatal("Apply ignored its context")
		}
		if got := a.f.Suspects(); len(got) != 0 {
			t.Errorf("a cancelled caller made %v suspect", got)
		}
	})
}

func BenchmarkLocalApply(b *testing.B) {
	nodes := fwdStartCluster(b, []string{"a", "b"}, nil, nil)
	a := nodes["a"]
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ops := []bucket.Op{fwdOp("a/k")}
		res := make([]bucket.Result, 1)
		for pb.Next() {
			a.f.Apply(context.Background(), a.now, ops, res)
		}
	})
}

// BenchmarkForwardParallel forwards from 32 callers per core, as under
// Envoy's concurrent requests: batches form only when callers outnumber the
// RPCs in flight.
func BenchmarkForwardParallel(b *testing.B) { benchForward(b, 32) }

// BenchmarkForwardParallelMid forwards from 8 callers per core.
func BenchmarkForwardParallelMid(b *testing.B) { benchForward(b, 8) }

// BenchmarkForwardParallelFew forwards from 2 callers per core: a light
// load, where few ops wait for each batch.
func BenchmarkForwardParallelFew(b *testing.B) { benchForward(b, 2) }

// benchForward forwards one op per Apply from perCore callers per core,
// each on its own key, on clock.Real (so that round trips are timed), and
// reports the mean ops per peer batch.
func benchForward(b *testing.B, perCore int) {
	nodes := fwdStartCluster(b, []string{"a", "b"}, nil, func(c *ForwarderConfig) { c.Clock = clock.Real() })
	a := nodes["a"]
	b.ReportAllocs()
	b.SetParallelism(perCore)
	var seq sync.Mutex
	next := 0
	b.RunParallel(func(pb *testing.PB) {
		seq.Lock()
		ops := []bucket.Op{fwdOp(fmt.Sprintf("b/%d", next))}
		next++
		seq.Unlock()
		res := make([]bucket.Result, 1)
		for pb.Next() {
			a.f.Apply(context.Background(), a.f.clock.Now().UnixNano(), ops, res)
		}
	})
	b.StopTimer()
	batches, sum := fwdHist(b, a.reg, "ringlimit_peer_batch_size")
	if batches > 0 {
		b.ReportMetric(sum/float64(batches), "ops/batch")
	}
	if c := fwdReadCounts(b, a.reg); c.timeout+c.error+c.suspect+c.unknown > 0 {
		b.Logf("fallbacks: %+v", c)
	}
}

// BenchmarkForwardPaced forwards at a fixed rate (open loop: ops arrive
// whether or not earlier ones were answered, as Envoy's requests do), from
// a pool of 256 callers, in ticks of 100 us. ns/op is only the pacing; it
// reports the process's CPU time per op, the mean latency of an op and the
// mean ops per peer batch.
func BenchmarkForwardPaced(b *testing.B) {
	for _, rate := range []int{20_000, 80_000} {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) { benchForwardPaced(b, rate) })
	}
}

func benchForwardPaced(b *testing.B, rate int) {
	nodes := fwdStartCluster(b, []string{"a", "b"}, nil, func(c *ForwarderConfig) { c.Clock = clock.Real() })
	a := nodes["a"]
	const callers, tick = 256, 100 * time.Microsecond
	jobs := make(chan int, b.N)
	var lat atomic.Int64
	var wg sync.WaitGroup
	wg.Add(callers)
	for range callers {
		go func() {
			defer wg.Done()
			ops := []bucket.Op{fwdOp("")}
			res := make([]bucket.Result, 1)
			for i := range jobs {
				ops[0].Key = strconv.AppendInt(append(ops[0].Key[:0], "b/"...), int64(i%1024), 10)
				start := time.Now()
				a.f.Apply(context.Background(), a.f.clock.Now().UnixNano(), ops, res)
				lat.Add(int64(time.Since(start)))
			}
		}()
	}
	cpu0 := fwdCPUTime(b)
	b.ResetTimer()
	tk := time.NewTicker(tick)
	start := time.Now()
	for sent := 0; sent < b.N; {
		<-tk.C
		due := min(int(time.Since(start).Seconds()*float64(rate)), b.N)
		for ; sent < due; sent++ {
			jobs <- sent
		}
	}
	tk.Stop()
	close(jobs)
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(fwdCPUTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(lat.Load())/float64(b.N)/1e3, "us-latency/op")
	batches, sum := fwdHist(b, a.reg, "ringlimit_peer_batch_size")
	if batches > 0 {
		b.ReportMetric(sum/float64(batches), "ops/batch")
	}
	if c := fwdReadCounts(b, a.reg); c.timeout+c.error+c.suspect+c.unknown > 0 {
		b.Logf("fallbacks: %+v", c)
	}
}

// fwdCPUTime returns the user and system CPU time of the process so far.
func fwdCPUTime(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
