package cluster

import "time"

// The pause detector: a node that was frozen (SIGSTOP, a VM pause, a long
// stall) must not answer from counters its peers moved past meanwhile. Its
// ticks, every PauseThreshold/10 on the node's clock, stop while it is
// frozen; the first tick after a gap longer than PauseThreshold reports a
// pause, and so does a Decide batch read before that tick (stalled). The
// node refuses Decide from that moment until the lifecycle has stepped the
// pause (it re-syncs, see lifecycle.Resyncing).

// pauseLoop ticks and reports gaps. It returns when the node closes.
func (n *Node) pauseLoop() {
	defer n.wg.Done()
	t := n.clock.NewTicker(max(n.timing.PauseThreshold/10, time.Millisecond))
	defer t.Stop()
	n.lastTick.Store(int64(n.clock.Now().Sub(n.start)))
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C():
		}
		now := n.clock.Now().Sub(n.start)
		prev := n.lastTick.Load()
		if gap := now - time.Duration(prev); gap > n.timing.PauseThreshold {
			n.refuse()
			if n.lastTick.CompareAndSwap(prev, int64(now)) {
				n.paused(gap)
			}
			continue
		}
		n.lastTick.CompareAndSwap(prev, int64(now))
	}
}

// stalled reports a pause the ticker has not noticed yet: a Decide batch
// read right after a thaw can run before the ticker's goroutine does. Every
// goroutine that sees the gap refuses from that moment (refuse, before the
// tick moves on, so that none sees the tick moved and the refusal not yet
// made); the first to move the tick reports it, once.
func (n *Node) stalled() bool {
	if n.timing.PauseThreshold <= 0 {
		return false
	}
	prev := n.lastTick.Load()
	now := int64(n.clock.Now().Sub(n.start))
	if gap := time.Duration(now - prev); gap > n.timing.PauseThreshold {
		n.refuse()
		if n.lastTick.CompareAndSwap(prev, now) {
			n.paused(gap)
		}
		return true
	}
	return false
}

// refuse makes the node refuse Decide until the lifecycle has stepped a
// pause (Serving compares pauses with pausesSeen), and wakes the lifecycle.
// A refusal counted after the lifecycle read the count costs one more
// re-sync, never a lost one.
func (n *Node) refuse() {
	n.pauses.Add(1)
	select {
	case n.pauseKick <- struct{}{}:
	default:
	}
}

// paused reports a pause once: the metric and the log line.
func (n *Node) paused(gap time.Duration) {
	n.metrics.pauses.Inc()
	n.log.Warn("cluster: this process was paused; re-syncing counters before answering again", "gap", gap)
}
