package membership

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// testNet is an in-memory network of memberlist transports for tests.
// Unlike memberlist.MockNetwork it never blocks: a packet to an unknown,
// shut-down, partitioned or congested node is dropped, and a stream to one
// fails at once. Partitions are directed links between addresses; setting
// one closes the streams already open across it.
type testNet struct {
	mu      sync.Mutex
	nodes   map[string]*testTransport // by "ip:port", live or shut down
	blocked map[[2]string]bool        // from -> to
	links   map[*testLink]struct{}    // open streams
	next    int
}

func newTestNet() *testNet {
	return &testNet{
		nodes:   make(map[string]*testTransport),
		blocked: make(map[[2]string]bool),
		links:   make(map[*testLink]struct{}),
	}
}

// reserve returns a fresh address that no transport uses yet.
func (n *testNet) reserve() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next++
	return fmt.Sprintf("127.0.%d.%d:7946", n.next/250, n.next%250+1)
}

// transport creates a transport at a fresh address.
func (n *testNet) transport() *testTransport { return n.transportAt(n.reserve()) }

// transportAt creates a transport at addr, replacing any shut-down one.
func (n *testNet) transportAt(addr string) *testTransport {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		panic(err)
	}
	port, _ := strconv.Atoi(p)
	t := &testTransport{
		net:     n,
		addr:    addr,
		ip:      net.ParseIP(host),
		port:    port,
		packets: make(chan *memberlist.Packet, 512),
		streams: make(chan net.Conn, 64),
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, ok := n.nodes[addr]; ok && !old.down {
		panic("testNet: address in use: " + addr)
	}
	n.nodes[addr] = t
	return t
}

// cut blocks traffic from every address in a to every address in b and back.
func (n *testNet) cut(a, b []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, x := range a {
		for _, y := range b {
			n.blocked[[2]string{x, y}] = true
			n.blocked[[2]string{y, x}] = true
		}
	}
	for l := range n.links {
		if n.blocked[[2]string{l.from, l.to}] || n.blocked[[2]string{l.to, l.from}] {
			l.closeLocked()
		}
	}
}

// isolate drops everything to and from addr, as if its host froze.
func (n *testNet) isolate(addr string) {
	var others []string
	n.mu.Lock()
	for a := range n.nodes {
		if a != addr {
			others = append(others, a)
		}
	}
	n.mu.Unlock()
	n.cut([]string{addr}, others)
}

// heal removes every partition.
func (n *testNet) heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.blocked)
}

// routeLocked returns the live destination of from -> to, or nil to drop.
func (n *testNet) routeLocked(from, to string) *testTransport {
	src, dst := n.nodes[from], n.nodes[to]
	if src == nil || src.down || dst == nil || dst.down || n.blocked[[2]string{from, to}] {
		return nil
	}
	return dst
}

// testTransport is one node's memberlist.Transport on an testNet.
type testTransport struct {
	net     *testNet
	addr    string
	ip      net.IP
	port    int
	packets chan *memberlist.Packet // never closed; memberlist stops reading on shutdown
	streams chan net.Conn
	down    bool // under net.mu
}

var _ memberlist.Transport = (*testTransport)(nil)

func (t *testTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return t.ip, t.port, nil
}

func (t *testTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	now := time.Now()
	t.net.mu.Lock()
	dst := t.net.routeLocked(t.addr, addr)
	t.net.mu.Unlock()
	if dst == nil {
		return now, nil // dropped, like UDP
	}
	p := &memberlist.Packet{
		Buf:       append([]byte(nil), b...),
		From:      &net.UDPAddr{IP: t.ip, Port: t.port},
		Timestamp: now,
	}
	select {
	case dst.packets <- p:
	default: // receiver congested: drop
	}
	return now, nil
}

func (t *testTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *testTransport) DialTimeout(addr string, _ time.Duration) (net.Conn, error) {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	dst := t.net.routeLocked(t.addr, addr)
	if dst == nil || t.net.routeLocked(addr, t.addr) == nil {
		return nil, fmt.Errorf("testNet: %s unreachable from %s", addr, t.addr)
	}
	a, b := net.Pipe()
	l := &testLink{net: t.net, from: t.addr, to: addr, a: a, b: b}
	client := &testConn{Conn: a, link: l,
		local:  &net.TCPAddr{IP: t.ip, Port: t.port},
		remote: &net.TCPAddr{IP: dst.ip, Port: dst.port}}
	server := &testConn{Conn: b, link: l, local: client.remote, remote: client.local}
	l.ends = [2]*testConn{client, server}
	select {
	case dst.streams <- server:
	default:
		_ = a.Close()
		_ = b.Close()
		return nil, fmt.Errorf("testNet: %s accept queue full", addr)
	}
	t.net.links[l] = struct{}{}
	return client, nil
}

func (t *testTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown marks the node down and breaks its open streams.
func (t *testTransport) Shutdown() error {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	t.down = true
	for l := range t.net.links {
		if l.from == t.addr || l.to == t.addr {
			l.closeLocked()
		}
	}
	return nil
}

// testLink is one open stream: both ends of a net.Pipe.
type testLink struct {
	net      *testNet
	from, to string
	a, b     net.Conn
	ends     [2]*testConn
}

func (l *testLink) closeLocked() {
	_ = l.a.Close()
	_ = l.b.Close()
	delete(l.net.links, l)
}

// testConn is one end of a link with TCP-looking addresses.
type testConn struct {
	net.Conn
	link          *testLink
	local, remote net.Addr
	closed        bool // closed by its owner, under net.mu
}

func (c *testConn) LocalAddr() net.Addr  { return c.local }
func (c *testConn) RemoteAddr() net.Addr { return c.remote }

// Close closes this end only (the peer then reads EOF, as with TCP) and
// forgets the link once both ends are closed.
func (c *testConn) Close() error {
	c.link.net.mu.Lock()
	defer c.link.net.mu.Unlock()
	c.closed = true
	if c.link.ends[0].closed && c.link.ends[1].closed {
		delete(c.link.net.links, c.link)
	}
	return c.Conn.Close()
}
