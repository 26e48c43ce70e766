package transport

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/simnet"
)

// fwdClock is a test's clock: Now tells the Unix time the test set, which
// stands still unless the test moves it (so that a result tells whose
// clock decided it), and timers are the system's. step, when set, moves it
// on by that much after every reading.
type fwdClock struct {
	clock.Clock // clock.Real(): timers and tickers
	ns          atomic.Int64
	step        time.Duration
}

// newFwdClock returns a clock that reads ns (Unix ns).
func newFwdClock(ns int64) *fwdClock {
	c := &fwdClock{Clock: clock.Real()}
	c.ns.Store(ns)
	return c
}

func (c *fwdClock) Now() time.Time { return time.Unix(0, c.ns.Add(int64(c.step))-int64(c.step)) }

// Add moves the clock on by d.
func (c *fwdClock) Add(d time.Duration) { c.ns.Add(int64(d)) }

// fwdFakeStore is a trivial Applier: one exact counter per key, no windows.
// Its results carry now in ResetAfter, so a test can tell whose clock (and
// so which node) decided an op.
type fwdFakeStore struct {
	mu     sync.Mutex
	counts map[string]*uint64 // pointers: updating a key allocates nothing
	calls  int
}

func newFwdFakeStore() *fwdFakeStore { return &fwdFakeStore{counts: map[string]*uint64{}} }

func (s *fwdFakeStore) Apply(now int64, op *bucket.Op) bucket.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	p := s.counts[string(op.Key)]
	var c uint64
	if p != nil {
		c = *p
	}
	c += op.Hits
	if op.Mode != bucket.Peek {
		if p == nil {
			p = new(uint64)
			s.counts[string(op.Key)] = p
		}
		*p = c
	}
	r := bucket.Result{Count: c, Over: c > op.Limit.Requests, ResetAfter: now}
	if !r.Over {
		r.Remaining = op.Limit.Requests - c
	}
	return r
}

func (s *fwdFakeStore) count(key string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.counts[key]; p != nil {
		return *p
	}
	return 0
}

func (s *fwdFakeStore) numCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// fwdFakeOwners gives a key "x/..." to the node with ID x.
type fwdFakeOwners struct {
	self string
	tab  map[string]fwdOwnerEntry // fixed after construction
}

type fwdOwnerEntry struct{ id, addr string }

func (o *fwdFakeOwners) Owner(key []byte) (string, string, bool) {
	i := bytes.IndexByte(key, '/')
	if i < 0 {
		return "", "", false
	}
	e := o.tab[string(key[:i])]
	return e.id, e.addr, e.id == o.self
}

// fwdTestNode is one in-process node: a Forwarder serving Peer on a gRPC
// server, on a real loopback port or on a simulated host (fwdSim).
type fwdTestNode struct {
	id    string
	addr  string
	now   int64     // what its clock reads, unless a test moves it
	clock *fwdClock // its clock
	store *fwdFakeStore
	reg   *prometheus.Registry
	pol   *testPolicy
	f     *Forwarder
	// dial reaches it from a test's own client (nil: loopback).
	dial []grpc.DialOption
}

// testPolicy is a Policy that serves until told otherwise and never
// relays.
type testPolicy struct{ refusing atomic.Bool }

// setServing makes the node answer (true) or refuse Decide and Ping.
func (p *testPolicy) setServing(ok bool) { p.refusing.Store(!ok) }

func (p *testPolicy) Serving() bool { return !p.refusing.Load() }

func (p *testPolicy) Relaying() bool { return false }

func (p *testPolicy) MarkRelay([]byte) bool { return true }

// fwdStartCluster starts one node per ID on loopback (node i's clock reads
// (i+1)*1000 ns until the test moves it) and gives every node every other
// node, plus the extra id -> addr peers, both in its ring and in SetPeers.
// tweak may change each node's config.
func fwdStartCluster(t testing.TB, ids []string, extra map[string]string, tweak func(*ForwarderConfig)) map[string]*fwdTestNode {
	t.Helper()
	return fwdStartClusterOn(t, nil, ids, extra, tweak)
}

// fwdStartClusterOn is fwdStartCluster on sim (nil: loopback), each node
// on its own host.
func fwdStartClusterOn(t testing.TB, sim *fwdSim, ids []string, extra map[string]string, tweak func(*ForwarderConfig)) map[string]*fwdTestNode {
	t.Helper()
	tab := map[string]fwdOwnerEntry{}
	peers := map[string]string{}
	lis := map[string]net.Listener{}
	hostDial := map[string][]grpc.DialOption{}
	for _, id := range ids {
		var l net.Listener
		if sim != nil {
			var h *simnet.Host
			l, h = sim.listen()
			hostDial[id] = sim.dialFrom(h)
		} else {
			l = testkit.Listen(t)
		}
		lis[id] = l
		tab[id] = fwdOwnerEntry{id, l.Addr().String()}
		peers[id] = l.Addr().String()
	}
	for id, addr := range extra {
		tab[id] = fwdOwnerEntry{id, addr}
		peers[id] = addr
	}
	nodes := map[string]*fwdTestNode{}
	for i, id := range ids {
		n := &fwdTestNode{id: id, addr: peers[id], now: int64(i+1) * 1000, store: newFwdFakeStore(), reg: prometheus.NewRegistry(), pol: &testPolicy{}}
		n.clock = newFwdClock(n.now)
		cfg := ForwarderConfig{
			Self:        id,
			Local:       n.store,
			Owners:      &fwdFakeOwners{self: id, tab: tab},
			Policy:      n.pol,
			Clock:       n.clock,
			DialOptions: hostDial[id],
			Timeout:     5 * time.Second, // exactness tests must not time out under -race
			SuspectFor:  time.Minute,
			Registerer:  n.reg,
		}
		if sim != nil {
			n.dial = sim.dialFrom(sim.host())
		}
		if tweak != nil {
			tweak(&cfg)
			if c, ok := cfg.Clock.(*fwdClock); ok {
				n.clock = c
			}
		}
		f, err := NewForwarder(cfg)
		if err != nil {
			t.Fatal(err)
		}
		n.f = f
		srv := grpc.NewServer(ServerOptions()...)
		Register(srv, f, nil)
		testkit.Serve(t, srv, lis[id])
		t.Cleanup(func() {
			if err := f.Close(); err != nil {
				t.Errorf("close %s: %v", id, err)
			}
		})
		nodes[id] = n
	}
	for _, n := range nodes {
		n.f.SetPeers(peers) // includes the node itself: must be ignored
	}
	return nodes
}

// fwdOp is a consuming op of one hit under a roomy limit.
func fwdOp(key string) bucket.Op {
	return bucket.Op{Key: []byte(key), Limit: bucket.Limit{Requests: 1 << 40, Unit: int64(time.Minute)}, Hits: 1}
}

// fwdHist returns the sample count and sum of histogram name in reg.
func fwdHist(t testing.TB, reg *prometheus.Registry, name string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0, 0
}

// fwdCounts reads the forwarded and fallback counters of f.
type fwdCounts struct{ forwarded, timeout, error, suspect, unknown float64 }

func fwdReadCounts(t testing.TB, reg *prometheus.Registry) fwdCounts {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var c fwdCounts
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue()
			switch mf.GetName() {
			case "ringlimit_forwarded_decisions_total":
				c.forwarded = v
			case "ringlimit_local_fallbacks_total":
				switch m.GetLabel()[0].GetValue() {
				case "timeout":
					c.timeout = v
				case "error":
					c.error = v
				case "suspect":
					c.suspect = v
				case "unknown":
					c.unknown = v
				}
			}
		}
	}
	return c
}

// fwdWait bounds a wait for what takes milliseconds on an idle machine:
// generous, as a busy -race run stalls for seconds at times. Inside a
// bubble (fwdSim) it is virtual time, which stalls do not advance.
const fwdWait = 20 * time.Second
