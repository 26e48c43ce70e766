package simnet

import (
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Conn is one end of a stream connection between two hosts: a buffered,
// full-duplex byte stream with TCP's observable behaviour. It implements
// net.Conn; its addresses are *net.TCPAddr.
//
// A write is copied into the connection's buffer (Config.StreamBuffer bytes
// per direction) and returns; it blocks only while that buffer is full. The
// bytes arrive StreamLatency later, in order, unless a partition, cut or
// frozen host holds them: held bytes arrive when that ends, as TCP would
// retransmit them. Close sends a FIN after the bytes written: the peer reads
// them, then io.EOF; the peer's later writes fail with EPIPE. A crash of
// either host resets the connection: every later Read and Write on either
// end fails with ECONNRESET, and unread bytes are lost.
type Conn struct {
	n             *Network
	local, remote *net.TCPAddr
	rd, wr        *pipe // incoming, outgoing
	readDL        *deadline
	writeDL       *deadline
	closed        bool // guarded by n.mu
}

// pipe is one direction of a connection.
type pipe struct {
	src, dst         *Host
	srcAddr, dstAddr string // "ip:port", to order its events
	latency          time.Duration
	capacity         int
	writes           uint64 // segments queued; guarded by the network's mu

	mu           sync.Mutex
	pending      []segment // written, not yet arrived
	arrived      []byte    // arrived, not yet read
	size         int       // bytes pending or arrived
	eof          bool      // the writer's FIN arrived
	writerClosed bool
	readerClosed bool
	isReset      bool
	wake         chan struct{} // closed and replaced on every change
}

// segment is one write, or the FIN, in flight.
type segment struct {
	data []byte
	at   time.Time // when it arrives, if the path is open
	fin  bool
}

// newConnLocked connects port aport on a with port bport on b and returns
// a's end and b's end.
func (n *Network) newConnLocked(a *Host, aport int, b *Host, bport int) (*Conn, *Conn) {
	aa, ba := a.tcpAddr(aport), b.tcpAddr(bport)
	ab := n.newPipeLocked(a, aa, b, ba)
	bb := n.newPipeLocked(b, ba, a, aa)
	ca := &Conn{n: n, local: aa, remote: ba, rd: bb, wr: ab, readDL: newDeadline(), writeDL: newDeadline()}
	cb := &Conn{n: n, local: ba, remote: aa, rd: ab, wr: bb, readDL: newDeadline(), writeDL: newDeadline()}
	return ca, cb
}

func (n *Network) newPipeLocked(src *Host, srcAddr *net.TCPAddr, dst *Host, dstAddr *net.TCPAddr) *pipe {
	p := &pipe{
		src:      src,
		dst:      dst,
		srcAddr:  srcAddr.String(),
		dstAddr:  dstAddr.String(),
		latency:  n.cfg.StreamLatency,
		capacity: n.cfg.StreamBuffer,
		wake:     make(chan struct{}),
	}
	n.pipes[p] = struct{}{}
	return p
}

// Read reads bytes that have arrived, waiting for some if none have. It
// returns io.EOF once the peer's FIN has arrived and every byte before it
// has been read.
func (c *Conn) Read(b []byte) (int, error) {
	p := c.rd
	for {
		dl := c.readDL.wait()
		p.mu.Lock()
		var err error
		switch {
		case p.readerClosed:
			err = net.ErrClosed
		case p.isReset:
			err = os.NewSyscallError("read", syscall.ECONNRESET)
		case isClosed(dl):
			err = os.ErrDeadlineExceeded
		case len(b) == 0:
			p.mu.Unlock()
			return 0, nil
		case len(p.arrived) > 0:
			k := copy(b, p.arrived)
			p.arrived = p.arrived[k:]
			if len(p.arrived) == 0 {
				p.arrived = nil
			}
			p.size -= k
			p.broadcastLocked()
			p.mu.Unlock()
			return k, nil
		case p.eof:
			p.mu.Unlock()
			return 0, io.EOF
		}
		w := p.wake
		p.mu.Unlock()
		if err != nil {
			return 0, c.opErr("read", err)
		}
		select {
		case <-w:
		case <-dl:
		}
	}
}

// Write queues b for the peer, waiting while the buffer is full. It fails
// with a timeout at the write deadline, having written n < len(b) bytes.
func (c *Conn) Write(b []byte) (int, error) {
	p := c.wr
	written := 0
	for {
		dl := c.writeDL.wait()
		p.mu.Lock()
		var err error
		switch {
		case p.writerClosed:
			err = net.ErrClosed
		case p.isReset:
			err = os.NewSyscallError("write", syscall.ECONNRESET)
		case p.readerClosed:
			err = os.NewSyscallError("write", syscall.EPIPE)
		case isClosed(dl):
			err = os.ErrDeadlineExceeded
		case len(b) == 0:
			p.mu.Unlock()
			return written, nil
		case p.size < p.capacity:
			k := min(p.capacity-p.size, len(b))
			p.pending = append(p.pending, segment{data: slices.Clone(b[:k]), at: time.Now().Add(p.latency)})
			p.size += k
			b = b[k:]
			written += k
			p.mu.Unlock()
			c.n.mu.Lock()
			c.n.scheduleLocked(p)
			c.n.mu.Unlock()
			continue
		}
		w := p.wake
		p.mu.Unlock()
		if err != nil {
			return written, c.opErr("write", err)
		}
		select {
		case <-w:
		case <-dl:
		}
	}
}

// Close closes this end: its blocked calls fail with net.ErrClosed, unread
// bytes are discarded and a FIN follows the bytes already written.
func (c *Conn) Close() error {
	n := c.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if c.closed {
		return c.opErr("close", net.ErrClosed)
	}
	c.closed = true

	p := c.rd
	p.mu.Lock()
	p.readerClosed = true
	p.pending, p.arrived, p.size = nil, nil, 0
	p.broadcastLocked()
	p.mu.Unlock()
	delete(n.pipes, p)

	p = c.wr
	p.mu.Lock()
	p.writerClosed = true
	fin := !p.isReset && !p.readerClosed
	if fin {
		p.pending = append(p.pending, segment{at: time.Now().Add(p.latency), fin: true})
	}
	p.broadcastLocked()
	p.mu.Unlock()
	if fin {
		n.scheduleLocked(p)
	}
	return nil
}

// resetLocked resets both directions, as a RST does.
func (c *Conn) resetLocked() {
	for _, p := range []*pipe{c.rd, c.wr} {
		p.reset()
		delete(c.n.pipes, p)
	}
}

// LocalAddr returns this end's address, a *net.TCPAddr.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the peer's address, a *net.TCPAddr.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	c.readDL.set(t)
	c.writeDL.set(t)
	return nil
}

// SetReadDeadline sets the time after which Read fails with a timeout
// (os.ErrDeadlineExceeded); the zero time means none.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.readDL.set(t)
	return nil
}

// SetWriteDeadline sets the time after which Write fails with a timeout
// (os.ErrDeadlineExceeded); the zero time means none.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.writeDL.set(t)
	return nil
}

func (c *Conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.local, Addr: c.remote, Err: err}
}

func (p *pipe) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isReset = true
	p.pending, p.arrived, p.size = nil, nil, 0
	p.broadcastLocked()
}

func (p *pipe) broadcastLocked() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// scheduleLocked makes the segment just queued on p arrive after its
// latency.
func (n *Network) scheduleLocked(p *pipe) {
	if p.latency == 0 {
		n.advanceLocked(p)
		return
	}
	p.writes++
	n.pushLocked(&event{at: time.Now().Add(p.latency), src: p.srcAddr, dst: p.dstAddr, seq: p.writes, p: p})
}

// advanceLocked moves the segments that are due from pending to arrived, if
// the path from writer to reader is open now. Once nothing more can arrive,
// the pipe leaves the network's set.
func (n *Network) advanceLocked(p *pipe) {
	if _, ok := n.pipes[p]; !ok || !n.flowsLocked(p.src, p.dst) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	moved := 0
	for _, s := range p.pending {
		if s.at.After(now) {
			break
		}
		moved++
		if s.fin {
			p.eof = true
		} else {
			p.arrived = append(p.arrived, s.data...)
		}
	}
	if moved == 0 {
		return
	}
	clear(p.pending[:moved])
	p.pending = p.pending[moved:]
	p.broadcastLocked()
	if p.eof {
		delete(n.pipes, p)
	}
}
