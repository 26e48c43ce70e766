package simnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Network is a simulated network of hosts. Create it with New; stop it with
// Close.
type Network struct {
	seed uint64
	cfg  Config // normalized

	// mu guards everything below, and the state of hosts, listeners and
	// transports. It is held only for short, non-blocking steps. Lock order:
	// mu, then a pipe's mu.
	mu      sync.Mutex
	closed  bool
	loss    float64
	hosts   map[string]*Host    // by canonical IP string
	group   map[string]int      // partition group by IP; absent means 0
	cuts    map[[2]string]bool  // one-way cuts, [from IP, to IP]
	links   map[[2]string]*link // packet links, [from addr, to addr]
	pipes   map[*pipe]struct{}  // stream directions that may still deliver
	changed chan struct{}       // closed and replaced on every fault change
	queue   eventHeap           // packets and stream segments in flight
	timer   *time.Timer         // runs queue; nil until first needed
	stats   Stats
}

// Stats counts packets since New. PacketsSent counts WriteTo calls accepted
// from a live transport; each of them is delivered, lost, cut, overflowed,
// or held or in flight now.
type Stats struct {
	PacketsSent      int64
	PacketsDelivered int64
	PacketsLost      int64 // by the loss probability
	PacketsCut       int64 // by a partition or cut, or a down, missing or shut-down receiver
	PacketsOverflow  int64 // by a full receive queue, or a frozen host's full hold
	PacketsHeld      int   // held now by frozen hosts
	PacketsInFlight  int   // sent, not yet arrived
}

// link is the packet state of one direction between two addresses.
type link struct {
	hash uint64 // seed, source and destination, mixed
	seq  uint64 // packets sent so far
}

// New returns an empty network whose random choices derive from seed. See
// Config for how cfg's values are read.
func New(seed uint64, cfg Config) *Network {
	cfg = cfg.normalize()
	return &Network{
		seed:    seed,
		cfg:     cfg,
		loss:    cfg.Loss,
		hosts:   make(map[string]*Host),
		group:   make(map[string]int),
		cuts:    make(map[[2]string]bool),
		links:   make(map[[2]string]*link),
		pipes:   make(map[*pipe]struct{}),
		changed: make(chan struct{}),
	}
}

// Host returns the host with the given IP address, creating it (up, with
// nothing bound) on first use. It fails for a string that is not an IP
// address and after Close.
func (n *Network) Host(ip string) (*Host, error) {
	a, err := netip.ParseAddr(ip)
	if err != nil || a.Zone() != "" {
		return nil, fmt.Errorf("simnet: host %q: not an IP address", ip)
	}
	a = a.Unmap()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, errNetClosed
	}
	key := a.String()
	h := n.hosts[key]
	if h == nil {
		h = &Host{
			n:          n,
			ip:         key,
			netIP:      net.IP(a.AsSlice()),
			listeners:  make(map[int]*Listener),
			transports: make(map[int]*Transport),
			nextPort:   ephemeralFirst,
		}
		n.hosts[key] = h
	}
	return h, nil
}

// Stats returns the packet counters.
func (n *Network) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.stats
	for _, h := range n.hosts {
		s.PacketsHeld += len(h.held)
	}
	for _, ev := range n.queue {
		if ev.pk != nil {
			s.PacketsInFlight++
		}
	}
	return s
}

// Close stops the network: it closes every listener, shuts down every
// transport (waiting for their accept goroutines), resets every connection
// and discards packets in flight or held. Later calls that would send, bind
// or dial fail. Close is idempotent.
func (n *Network) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	var ts []*Transport
	for _, h := range n.hosts {
		ts = append(ts, h.stopLocked()...)
	}
	for p := range n.pipes {
		p.reset()
	}
	clear(n.pipes)
	n.stopQueueLocked()
	n.changedLocked()
	n.mu.Unlock()
	for _, t := range ts {
		<-t.acceptDone
	}
	return nil
}

var errNetClosed = errors.New("simnet: network closed")

// blockedLocked reports whether a partition or a cut stops traffic from
// host a to host b.
func (n *Network) blockedLocked(a, b *Host) bool {
	if a == b {
		return false
	}
	return n.group[a.ip] != n.group[b.ip] || n.cuts[[2]string{a.ip, b.ip}]
}

// flowsLocked reports whether stream bytes from a reach b now.
func (n *Network) flowsLocked(a, b *Host) bool {
	return !n.closed && !a.down && !b.down && !a.frozen && !b.frozen && !n.blockedLocked(a, b)
}
