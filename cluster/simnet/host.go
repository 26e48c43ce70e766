package simnet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"time"
)

// Host is one machine on the network, named by its IP address. Its fault
// state (down, frozen, partition group) belongs to the Network.
type Host struct {
	n     *Network
	ip    string // canonical
	netIP net.IP

	// Guarded by n.mu.
	down       bool
	frozen     bool
	listeners  map[int]*Listener  // stream ports
	transports map[int]*Transport // packet ports
	held       []*packet          // while frozen: packets to and from it
	nextPort   int                // next ephemeral port to try
}

// Ephemeral ports, as Linux assigns them.
const (
	ephemeralFirst = 32768
	ephemeralLast  = 60999
)

// IP returns the host's address in canonical form.
func (h *Host) IP() string { return h.ip }

// Listen binds a stream listener to port on this host; port 0 picks a free
// ephemeral port. It fails while the host is down, after Network.Close, and
// with EADDRINUSE for a port already bound (a crash unbinds every port).
func (h *Host) Listen(port int) (net.Listener, error) {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	l, err := h.listenLocked(port)
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (h *Host) listenLocked(port int) (*Listener, error) {
	fail := func(err error) (*Listener, error) {
		return nil, &net.OpError{Op: "listen", Net: "tcp", Addr: h.tcpAddr(port), Err: err}
	}
	switch {
	case h.n.closed:
		return fail(errNetClosed)
	case h.down:
		return fail(os.NewSyscallError("bind", syscall.ENETDOWN))
	case port < 0 || port > 65535:
		return fail(fmt.Errorf("simnet: port %d out of range", port))
	case port == 0:
		port = h.freePortLocked(func(p int) bool { return h.listeners[p] == nil })
		if port == 0 {
			return fail(os.NewSyscallError("bind", syscall.EADDRINUSE))
		}
	case h.listeners[port] != nil:
		return fail(os.NewSyscallError("bind", syscall.EADDRINUSE))
	}
	l := &Listener{
		h:    h,
		addr: h.tcpAddr(port),
		port: port,
		wake: make(chan struct{}),
	}
	h.listeners[port] = l
	return l, nil
}

// freePortLocked returns the next ephemeral port for which free is true, or
// 0 if there is none.
func (h *Host) freePortLocked(free func(int) bool) int {
	for range ephemeralLast - ephemeralFirst + 1 {
		p := h.nextPort
		h.nextPort++
		if h.nextPort > ephemeralLast {
			h.nextPort = ephemeralFirst
		}
		if free(p) {
			return p
		}
	}
	return 0
}

func (h *Host) tcpAddr(port int) *net.TCPAddr { return &net.TCPAddr{IP: h.netIP, Port: port} }

// Dial opens a stream connection from this host to addr ("ip:port"). Its
// shape is that of grpc.WithContextDialer's and net.Dialer.DialContext's
// (without the network), so the method value h.Dial can be passed to either.
//
// A dial to a host that is down, or to a port nobody listens on, fails at
// once with ECONNREFUSED; to an IP no host has, with EHOSTUNREACH. While a
// partition or cut separates the two hosts, or this host is frozen, it waits
// until that changes or ctx is done (a timeout then, as a dial whose SYNs
// are lost). A dial to a frozen host connects, but the listener accepts it
// only at thaw. Otherwise it returns after a round trip of StreamLatency.
func (h *Host) Dial(ctx context.Context, addr string) (net.Conn, error) {
	n := h.n
	local := h.tcpAddr(0)
	fail := func(remote net.Addr, err error) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Source: local, Addr: remote, Err: err}
	}
	ip, port, err := splitAddr(addr)
	if err != nil {
		return fail(nil, err)
	}
	remote := &net.TCPAddr{IP: net.ParseIP(ip), Port: port}
	handshaken := n.cfg.StreamLatency == 0
	for {
		if err := ctx.Err(); err != nil {
			return fail(remote, ctxErr(err))
		}
		n.mu.Lock()
		dst := n.hosts[ip]
		var w1, w2 <-chan struct{} // what to wait for before trying again
		switch {
		case n.closed:
			n.mu.Unlock()
			return fail(remote, errNetClosed)
		case h.down:
			n.mu.Unlock()
			return fail(remote, os.NewSyscallError("connect", syscall.ENETDOWN))
		case dst == nil:
			n.mu.Unlock()
			return fail(remote, os.NewSyscallError("connect", syscall.EHOSTUNREACH))
		case h.frozen || n.blockedLocked(h, dst) || n.blockedLocked(dst, h):
			w1 = n.changed
		case dst.down || dst.listeners[port] == nil:
			n.mu.Unlock()
			return fail(remote, os.NewSyscallError("connect", syscall.ECONNREFUSED))
		case !handshaken:
			n.mu.Unlock()
			if err := sleepCtx(ctx, 2*n.cfg.StreamLatency); err != nil {
				return fail(remote, ctxErr(err))
			}
			handshaken = true
			continue
		case len(dst.listeners[port].backlog) >= n.cfg.Backlog:
			w1, w2 = n.changed, dst.listeners[port].wake
		default:
			l := dst.listeners[port]
			lport := h.freePortLocked(func(int) bool { return true })
			c, peer := n.newConnLocked(h, lport, dst, port)
			l.backlog = append(l.backlog, peer)
			l.wakeLocked()
			n.mu.Unlock()
			return c, nil
		}
		n.mu.Unlock()
		if err := waitAny(ctx, w1, w2); err != nil {
			return fail(remote, ctxErr(err))
		}
	}
}

// stopLocked closes the host's listeners and transports, drops the packets
// it holds and returns the transports, whose accept goroutines are ending.
func (h *Host) stopLocked() []*Transport {
	var ts []*Transport
	for _, l := range h.listeners {
		l.closeLocked()
	}
	for _, t := range h.transports {
		t.closeLocked()
		ts = append(ts, t)
	}
	h.n.stats.PacketsCut += int64(len(h.held))
	h.held = nil
	return ts
}

// splitAddr parses "ip:port" and returns the IP in canonical form.
func splitAddr(addr string) (ip string, port int, err error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("simnet: address %q: bad port", addr)
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.Zone() != "" {
		return "", 0, fmt.Errorf("simnet: address %q: not an IP address", addr)
	}
	return a.Unmap().String(), port, nil
}

// ctxErr maps a context's error to the one net.Dialer returns: a timeout
// for a deadline, the context's error otherwise.
func ctxErr(err error) error {
	if err == context.DeadlineExceeded {
		return os.ErrDeadlineExceeded
	}
	return err
}

// sleepCtx waits for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitAny waits until a or b (either may be nil) is closed or ctx is done.
func waitAny(ctx context.Context, a, b <-chan struct{}) error {
	select {
	case <-a:
		return nil
	case <-b:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
