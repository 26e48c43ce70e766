package simnet

import (
	"time"

	"github.com/hashicorp/memberlist"
)

// packet is a datagram between two transports.
type packet struct {
	src     *Host
	from    *Transport
	dstIP   string
	dstPort int
	dst     string // "ip:port"
	seq     uint64 // its place on the link from->dst
	buf     []byte
	delay   time.Duration
	sent    bool // false while a frozen sender holds it
}

// decideLocked draws the fate of the next packet from src to dst
// ("ip:port" both): whether it is lost, and its delay. The draw depends on
// the seed, the two addresses and how many packets that link has carried,
// not on anything else that happens on the network.
func (n *Network) decideLocked(src, dst string) (seq uint64, lost bool, delay time.Duration) {
	k := [2]string{src, dst}
	l := n.links[k]
	if l == nil {
		h := mix64(n.seed)
		h = mix64(h ^ fnv64(src))
		h = mix64(h ^ fnv64(dst))
		l = &link{hash: h}
		n.links[k] = l
	}
	l.seq++
	r1 := mix64(l.hash + l.seq*0x9e3779b97f4a7c15)
	r2 := mix64(r1)
	lost = float64(r1>>11)/(1<<53) < n.loss
	delay = n.cfg.PacketLatencyMin
	if span := n.cfg.PacketLatencyMax - n.cfg.PacketLatencyMin; span > 0 {
		delay += time.Duration(r2 % (uint64(span) + 1))
	}
	return l.seq, lost, delay
}

// sendLocked puts pk on the wire: it arrives after its delay.
func (n *Network) sendLocked(pk *packet) {
	pk.sent = true
	if pk.delay == 0 {
		n.deliverLocked(pk)
		return
	}
	n.pushLocked(&event{at: time.Now().Add(pk.delay), src: pk.from.key, dst: pk.dst, seq: pk.seq, pk: pk})
}

// deliverLocked hands pk to its receiver's queue, or holds or drops it.
func (n *Network) deliverLocked(pk *packet) {
	dst := n.hosts[pk.dstIP]
	switch {
	case n.closed || dst == nil || dst.down || n.blockedLocked(pk.src, dst):
		n.stats.PacketsCut++
	case dst.frozen:
		n.holdLocked(dst, pk)
	default:
		t := dst.transports[pk.dstPort]
		if t == nil {
			n.stats.PacketsCut++
			return
		}
		select {
		case t.packets <- &memberlist.Packet{Buf: pk.buf, From: pk.from.from, Timestamp: time.Now()}:
			n.stats.PacketsDelivered++
		default:
			n.stats.PacketsOverflow++
		}
	}
}

// holdLocked keeps pk for frozen host h until it thaws, within the bound.
func (n *Network) holdLocked(h *Host, pk *packet) {
	if len(h.held) >= n.cfg.FrozenPackets {
		n.stats.PacketsOverflow++
		return
	}
	h.held = append(h.held, pk)
}

// releaseLocked sends or delivers, in order, the packets a thawed host held.
func (n *Network) releaseLocked(h *Host) {
	held := h.held
	h.held = nil
	for _, pk := range held {
		if pk.sent {
			n.deliverLocked(pk)
		} else {
			n.sendLocked(pk)
		}
	}
}

// mix64 is splitmix64's finalizer: a fixed, well-spread 64-bit mix.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// fnv64 is 64-bit FNV-1a.
func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
