package simnet

import "net"

// Listener accepts stream connections on one host's port. It implements
// net.Listener.
type Listener struct {
	h    *Host
	addr *net.TCPAddr
	port int

	// Guarded by h.n.mu.
	backlog []*Conn // connected, not yet accepted
	closed  bool
	wake    chan struct{} // closed and replaced when backlog or closed change
}

// Accept waits for and returns the next connection. While the host is
// frozen it returns none; after Close, or a crash of the host, it fails
// with net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	n := l.h.n
	for {
		n.mu.Lock()
		if l.closed {
			n.mu.Unlock()
			return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.addr, Err: net.ErrClosed}
		}
		if !l.h.frozen && len(l.backlog) > 0 {
			c := l.backlog[0]
			l.backlog[0] = nil
			l.backlog = l.backlog[1:]
			l.wakeLocked()
			n.mu.Unlock()
			return c, nil
		}
		w1, w2 := l.wake, n.changed
		n.mu.Unlock()
		select {
		case <-w1:
		case <-w2:
		}
	}
}

// Close unbinds the port and resets the connections not yet accepted.
// Blocked Accept calls fail. Close is idempotent.
func (l *Listener) Close() error {
	n := l.h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	l.closeLocked()
	return nil
}

func (l *Listener) closeLocked() {
	if l.closed {
		return
	}
	l.closed = true
	if l.h.listeners[l.port] == l {
		delete(l.h.listeners, l.port)
	}
	for _, c := range l.backlog {
		c.resetLocked()
	}
	l.backlog = nil
	l.wakeLocked()
}

// Addr returns the listener's address, a *net.TCPAddr.
func (l *Listener) Addr() net.Addr { return l.addr }

func (l *Listener) wakeLocked() {
	close(l.wake)
	l.wake = make(chan struct{})
}
