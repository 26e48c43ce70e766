package simnet

import "time"

// Config sets the network's latency, loss and bounds. The zero value is a
// lossless network that delivers at once, with default bounds. Negative
// durations and counts count as zero; PacketLatencyMax below
// PacketLatencyMin counts as PacketLatencyMin; Loss is clamped to [0, 1].
type Config struct {
	// PacketLatencyMin and PacketLatencyMax bound the one-way delay of a
	// packet; each packet's delay is drawn from [Min, Max] with nanosecond
	// resolution. Packets may overtake each other, as UDP datagrams can.
	PacketLatencyMin, PacketLatencyMax time.Duration

	// StreamLatency is the one-way delay of each write on a connection; a
	// dial takes two of them (a round trip) before it returns.
	StreamLatency time.Duration

	// Loss is the probability that a packet is lost. Streams lose nothing.
	Loss float64

	// PacketQueue is how many packets a transport's receive queue holds
	// before arriving packets are dropped. Zero means 1024.
	PacketQueue int

	// StreamBuffer is how many bytes a connection holds in each direction,
	// written but not yet read (in flight, held, or arrived and unread); a
	// writer blocks while it is full. Zero means 256 KiB.
	StreamBuffer int

	// Backlog is how many connections a listener holds before they are
	// accepted; a dial waits while it is full. Zero means 128.
	Backlog int

	// FrozenPackets is how many packets a frozen host holds, to and from it,
	// for delivery at thaw; further ones are dropped. Zero means 1024.
	FrozenPackets int
}

// normalize returns c with the edges described on Config applied and the
// defaults filled in.
func (c Config) normalize() Config {
	c.PacketLatencyMin = max(c.PacketLatencyMin, 0)
	c.PacketLatencyMax = max(c.PacketLatencyMax, c.PacketLatencyMin)
	c.StreamLatency = max(c.StreamLatency, 0)
	c.Loss = clamp01(c.Loss)
	c.PacketQueue = orDefault(c.PacketQueue, 1024)
	c.StreamBuffer = orDefault(c.StreamBuffer, 256<<10)
	c.Backlog = orDefault(c.Backlog, 128)
	c.FrozenPackets = orDefault(c.FrozenPackets, 1024)
	return c
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// clamp01 maps p into [0, 1]; NaN counts as zero.
func clamp01(p float64) float64 {
	if !(p > 0) {
		return 0
	}
	return min(p, 1)
}
