package transport

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/simnet"
)

// silentProxy forwards connections to target, on a simulated host of its
// own, until silence: from then on every connection open so far reads and
// drops everything, both ways, and never closes, as when the network drops
// a connection's packets (its NAT or conntrack entry lost). Connections
// accepted later work. (A simnet partition or freeze would hold the new
// connections too.)
type silentProxy struct {
	lis      net.Listener
	host     *simnet.Host
	target   string
	accepted atomic.Int32
	mu       sync.Mutex
	open     []*silentPair
	wg       sync.WaitGroup
}

type silentPair struct {
	client, server net.Conn
	silent         atomic.Bool
}

func newSilentProxy(t *testing.T, sim *fwdSim, target string) *silentProxy {
	t.Helper()
	lis, host := sim.listen()
	p := &silentProxy{lis: lis, host: host, target: target}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(func() {
		p.lis.Close()
		p.mu.Lock()
		for _, c := range p.open {
			c.client.Close()
			c.server.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *silentProxy) addr() string { return p.lis.Addr().String() }

func (p *silentProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		s, err := p.host.Dial(context.Background(), p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.accepted.Add(1)
		pair := &silentPair{client: c, server: s}
		p.mu.Lock()
		p.open = append(p.open, pair)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(pair, c, s)
		go p.pipe(pair, s, c)
	}
}

// pipe copies src to dst until either ends, dropping what it reads once
// the pair is silent.
func (p *silentProxy) pipe(pair *silentPair, src, dst net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !pair.silent.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil { // EOF, a reset or a closed conn: the pair ends
			pair.client.Close()
			pair.server.Close()
			return
		}
	}
}

// silence makes every connection open now drop its bytes.
func (p *silentProxy) silence() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.open {
		c.silent.Store(true)
	}
}

// viaProxyForwarder returns node "a" on a host of its own, whose only peer
// "b" (the owner of every "b/" key) it reaches through px, and its metrics.
// tweak may change its config.
func viaProxyForwarder(t *testing.T, sim *fwdSim, px *silentProxy, tweak func(*ForwarderConfig)) (*Forwarder, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	// No Clock: the system's (the bubble's), so that a silenced peer's
	// timeouts make it suspect once it has answered nobody for
	// peerQuietFor, as in production. a serves nothing: its clock decides
	// no op.
	cfg := ForwarderConfig{
		Self:        "a",
		Local:       newFwdFakeStore(),
		Owners:      &fwdFakeOwners{self: "a", tab: map[string]fwdOwnerEntry{"b": {"b", px.addr()}}},
		DialOptions: sim.dialFrom(sim.host()),
		Registerer:  reg,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	f, err := NewForwarder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	f.SetPeers(map[string]string{"b": px.addr()})
	return f, reg
}

// A peer connection that goes silent without closing is closed by
// keepalive and dialled again, and forwarding to the peer recovers while
// the peer stays in the ring. Without keepalive nothing would ever fail on
// that connection: its bytes are accepted and dropped.
func TestForwarderRedialsSilentConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		nodes := fwdStartClusterOn(t, sim, []string{"b"}, nil, nil)
		px := newSilentProxy(t, sim, nodes["b"].addr)
		f, reg := viaProxyForwarder(t, sim, px, func(c *ForwarderConfig) {
			c.Timeout = 100 * time.Millisecond
			c.SuspectFor = time.Minute // only a probe that is answered clears it
		})
		ops := []bucket.Op{fwdOp("b/k")}
		res := make([]bucket.Result, 1)
		forwarded := func() bool {
			before := fwdReadCounts(t, reg).forwarded
			f.Apply(context.Background(), 1000, ops, res)
			return fwdReadCounts(t, reg).forwarded > before
		}
		testkit.WaitFor(t, fwdWait, "a first forwarded op", forwarded)
		if n := px.accepted.Load(); n != 1 {
			t.Fatalf("%d connections before the silence, want 1", n)
		}

		px.silence()
		start := time.Now()
		testkit.WaitFor(t, fwdWait, "the connection to go silent", func() bool { return !forwarded() })
		// Keepalive pings after peerKeepaliveTime without a read and gives up
		// peerKeepaliveTimeout later; then the client dials again.
		testkit.WaitFor(t, peerKeepaliveTime+peerKeepaliveTimeout+fwdWait, "forwarding to recover", forwarded)
		t.Logf("forwarding recovered %v after the silence, on connection %d", time.Since(start).Round(time.Millisecond), px.accepted.Load())
		if n := px.accepted.Load(); n < 2 {
			t.Errorf("%d connections, want a second one dialled after the silence", n)
		}
		if s := f.Suspects(); len(s) != 0 {
			t.Errorf("suspects after recovery: %v", s)
		}
	})
}

// The server built with ServerOptions keeps a peer connection that sits
// idle while the client pings it: with gRPC's default policy (a ping at
// most every 5 minutes) it counts a strike for every ping after the first
// and closes the connection at the third strike (the fourth ping, 40 s in).
func TestServerOptionsAcceptPeerPings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sim := newFwdSim(t)
		nodes := fwdStartClusterOn(t, sim, []string{"b"}, nil, nil)
		px := newSilentProxy(t, sim, nodes["b"].addr) // never silenced: counts connections
		// A generous timeout: the test is about the connection surviving, not
		// about latency (the first op also dials, through the proxy).
		f, reg := viaProxyForwarder(t, sim, px, func(c *ForwarderConfig) { c.Timeout = 5 * time.Second })
		ops := []bucket.Op{fwdOp("b/k")}
		res := make([]bucket.Result, 1)
		f.Apply(context.Background(), 1000, ops, res)
		// Idle for ten ping intervals of virtual time: pings at about 10,
		// 20, ... 100 s.
		time.Sleep(10*peerKeepaliveTime + peerKeepaliveTimeout)
		f.Apply(context.Background(), 1000, ops, res)
		if c := fwdReadCounts(t, reg); c.forwarded != 2 {
			t.Errorf("forwarded %v of 2 ops (fallbacks %+v)", c.forwarded, c)
		}
		if n := px.accepted.Load(); n != 1 {
			t.Errorf("%d connections to the peer, want 1: the server closed the pinged one", n)
		}
	})
}
