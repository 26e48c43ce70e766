package simnet

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
)

// Transport is a memberlist.NodeAwareTransport bound to one port of a host:
// packets on the port's datagram side, streams on a Listener on the same
// port. Create it with Host.Transport and hand it to memberlist in
// Config.Transport; memberlist's Shutdown calls Transport.Shutdown.
//
// Sending never blocks. A packet is lost with the network's loss
// probability, takes a delay drawn from the packet latency bounds, and is
// dropped if at arrival a partition or cut separates the hosts, the
// receiver is down or its transport shut down, or the receive queue is
// full. Packets to or from a frozen host are held until it thaws.
type Transport struct {
	h    *Host
	port int
	key  string       // "ip:port"
	from *net.UDPAddr // the source address of its packets
	l    *Listener

	packets    chan *memberlist.Packet
	streams    chan net.Conn
	done       chan struct{} // closed by closeLocked
	acceptDone chan struct{} // closed when acceptLoop returns
	closed     bool          // guarded by h.n.mu
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

var errTransportShutdown = errors.New("simnet: transport shut down")

// Transport binds a memberlist transport to port on this host (datagrams
// and streams both); port 0 picks a free ephemeral port. It fails while
// the host is down, after Network.Close, and with EADDRINUSE for a port
// already bound.
func (h *Host) Transport(port int) (*Transport, error) {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if port == 0 {
		port = h.freePortLocked(func(p int) bool { return h.listeners[p] == nil && h.transports[p] == nil })
	}
	if h.transports[port] != nil {
		return nil, &net.OpError{Op: "listen", Net: "udp", Addr: h.tcpAddr(port),
			Err: os.NewSyscallError("bind", syscall.EADDRINUSE)}
	}
	l, err := h.listenLocked(port)
	if err != nil {
		return nil, err
	}
	t := &Transport{
		h:          h,
		port:       port,
		key:        net.JoinHostPort(h.ip, strconv.Itoa(port)),
		from:       &net.UDPAddr{IP: h.netIP, Port: port},
		l:          l,
		packets:    make(chan *memberlist.Packet, n.cfg.PacketQueue),
		streams:    make(chan net.Conn),
		done:       make(chan struct{}),
		acceptDone: make(chan struct{}),
	}
	h.transports[port] = t
	go t.acceptLoop()
	return t, nil
}

// acceptLoop passes accepted streams to memberlist until the listener
// closes or the transport shuts down.
func (t *Transport) acceptLoop() {
	defer close(t.acceptDone)
	for {
		c, err := t.l.Accept()
		if err != nil {
			return
		}
		select {
		case t.streams <- c:
		case <-t.done:
			c.Close()
			return
		}
	}
}

// FinalAdvertiseAddr returns ip and port if ip is set (memberlist passes its
// AdvertiseAddr and AdvertisePort), else the host's IP and the bound port.
func (t *Transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if ip == "" {
		return t.h.netIP, t.port, nil
	}
	a := net.ParseIP(ip)
	if a == nil {
		return nil, 0, errors.New("simnet: advertise address " + strconv.Quote(ip) + ": not an IP address")
	}
	return a, port, nil
}

// WriteTo sends b to addr ("ip:port") as a datagram. It fails only for a
// malformed address, a down host or a shut-down transport; a packet lost on
// the way is not an error. It returns the time of sending.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress is WriteTo; the node name in a is not used.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	ip, port, err := splitAddr(a.Addr)
	if err != nil {
		return time.Time{}, err
	}
	n := t.h.n
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.closed:
		return time.Time{}, errNetClosed
	case t.closed:
		return time.Time{}, errTransportShutdown
	case t.h.down:
		return time.Time{}, &net.OpError{Op: "write", Net: "udp", Source: t.from, Err: os.NewSyscallError("sendto", syscall.ENETDOWN)}
	}
	n.stats.PacketsSent++
	dst := net.JoinHostPort(ip, strconv.Itoa(port))
	seq, lost, delay := n.decideLocked(t.key, dst)
	if lost {
		n.stats.PacketsLost++
		return now, nil
	}
	pk := &packet{src: t.h, from: t, dstIP: ip, dstPort: port, dst: dst, seq: seq, buf: slices.Clone(b), delay: delay}
	if t.h.frozen {
		n.holdLocked(t.h, pk)
		return now, nil
	}
	n.sendLocked(pk)
	return now, nil
}

// PacketCh returns the receive queue; it is never closed.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// DialTimeout opens a stream to addr, as Host.Dial with a timeout.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout is DialTimeout; the node name in a is not used.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	n := t.h.n
	n.mu.Lock()
	closed := t.closed
	n.mu.Unlock()
	if closed {
		return nil, errTransportShutdown
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return t.h.Dial(ctx, a.Addr)
}

// StreamCh returns the accepted streams; it is never closed.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown unbinds the port and waits for the transport's goroutine. Later
// sends fail. It is idempotent and also follows a crash.
func (t *Transport) Shutdown() error {
	n := t.h.n
	n.mu.Lock()
	t.closeLocked()
	n.mu.Unlock()
	<-t.acceptDone
	return nil
}

func (t *Transport) closeLocked() {
	if t.closed {
		return
	}
	t.closed = true
	if t.h.transports[t.port] == t {
		delete(t.h.transports, t.port)
	}
	t.l.closeLocked()
	close(t.done)
}
