package simnet

import (
	"fmt"
	"net/netip"
)

// The faults below may be called at any time, from any goroutine in the
// network's bubble. Each names hosts by IP and fails for one that Host has
// not created.

// Partition splits the hosts into groups that cannot reach each other: the
// hosts named in each group, and one more group of every host not named.
// Packets between groups are dropped (also those already in flight, on
// arrival); stream bytes between groups are held until Heal; dials between
// groups wait. It replaces any earlier partition and keeps one-way cuts.
func (n *Network) Partition(groups ...[]string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	g := make(map[string]int)
	for i, group := range groups {
		for _, ip := range group {
			h, err := n.knownLocked("partition", ip)
			if err != nil {
				return err
			}
			if _, dup := g[h.ip]; dup {
				return fmt.Errorf("simnet: partition: host %s is in two groups", h.ip)
			}
			g[h.ip] = i + 1
		}
	}
	n.group = g
	n.changedLocked()
	return nil
}

// Cut stops traffic from one host to another, one way: packets from `from`
// to `to` are dropped and its stream bytes to `to` are held. A stream needs
// both ways, so dials between the two wait. Heal removes it.
func (n *Network) Cut(from, to string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	a, err := n.knownLocked("cut", from)
	if err != nil {
		return err
	}
	b, err := n.knownLocked("cut", to)
	if err != nil {
		return err
	}
	n.cuts[[2]string{a.ip, b.ip}] = true
	n.changedLocked()
	return nil
}

// Heal removes the partition and every cut. Held stream bytes arrive at
// once, in order; dropped packets stay lost.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.group)
	clear(n.cuts)
	n.changedLocked()
}

// SetLoss sets the probability, clamped to [0, 1], that a packet sent from
// now on is lost.
func (n *Network) SetLoss(p float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.loss = clamp01(p)
}

// Crash takes a host down, as a killed process on a live machine: its
// listeners and transports close, its connections are reset (both ends
// fail with ECONNRESET), the packets it held while frozen are dropped,
// packets to it are dropped and dials to it are refused. Its node's
// goroutines keep running until the caller stops them; their sends and
// dials fail. Crashing a down host does nothing.
func (n *Network) Crash(ip string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	h, err := n.knownLocked("crash", ip)
	if err != nil || h.down {
		return err
	}
	h.down = true
	h.frozen = false
	h.stopLocked()
	for p := range n.pipes {
		if p.src == h || p.dst == h {
			p.reset()
			delete(n.pipes, p)
		}
	}
	n.changedLocked()
	return nil
}

// Restart brings a crashed host back up with nothing bound: the caller
// starts a new node process on it (new transports and listeners). The old
// ones stay closed. Restarting a host that is up does nothing.
func (n *Network) Restart(ip string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	h, err := n.knownLocked("restart", ip)
	if err != nil {
		return err
	}
	h.down = false
	n.changedLocked()
	return nil
}

// Freeze stops a host's traffic as SIGSTOP stops a process whose sockets
// still queue: packets to and from it are held (up to
// Config.FrozenPackets, then dropped), stream bytes to and from it are
// held (within Config.StreamBuffer, then writers block), its listeners
// accept nothing and its dials wait. Its node's goroutines, unlike a
// stopped process's, keep running; they just hear nothing. It fails for a
// down host.
func (n *Network) Freeze(ip string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	h, err := n.knownLocked("freeze", ip)
	if err != nil {
		return err
	}
	if h.down {
		return fmt.Errorf("simnet: freeze: host %s is down", h.ip)
	}
	h.frozen = true
	n.changedLocked()
	return nil
}

// Thaw ends a freeze: the held packets are sent (those from the host, with
// their delay) or delivered (those to it, at once), in the order they were
// held, and held stream bytes arrive. Thawing a host that is not frozen
// does nothing.
func (n *Network) Thaw(ip string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	h, err := n.knownLocked("thaw", ip)
	if err != nil || !h.frozen {
		return err
	}
	h.frozen = false
	n.releaseLocked(h)
	n.changedLocked()
	return nil
}

func (n *Network) knownLocked(op, ip string) (*Host, error) {
	if a, err := netip.ParseAddr(ip); err == nil {
		if h := n.hosts[a.Unmap().String()]; h != nil {
			return h, nil
		}
	}
	return nil, fmt.Errorf("simnet: %s: unknown host %q", op, ip)
}

// changedLocked lets through what a fault change allows and wakes every
// waiting dial and accept.
func (n *Network) changedLocked() {
	for p := range n.pipes {
		n.advanceLocked(p)
	}
	close(n.changed)
	n.changed = make(chan struct{})
}
