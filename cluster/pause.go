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
		if gap := now - time.Duration(n.lastTick.Swap(int64(now))); gap > n.timing.PauseThreshold {
			n.paused(gap)
		}
	}
}

// stalled reports a pause the ticker has not noticed yet: a Decide batch
// read right after a thaw can run before the ticker's goroutine does.
// Whoever sees the gap first reports it, once.
func (n *Node) stalled() bool {
	if n.timing.PauseThreshold <= 0 {
		return false
	}
	prev := n.lastTick.Load()
	now := int64(n.clock.Now().Sub(n.start))
	if gap := time.Duration(now - prev); gap > n.timing.PauseThreshold && n.lastTick.CompareAndSwap(prev, now) {
		n.paused(gap)
		return true
	}
	return false
}

// paused counts a pause, which makes the node refuse Decide at once, and
// hands it to the lifecycle.
func (n *Node) paused(gap time.Duration) {
	n.metrics.pauses.Inc()
	n.pauses.Add(1)
	n.log.Warn("cluster: this process was paused; re-syncing counters before answering again", "gap", gap)
	select {
	case n.pauseKick <- struct{}{}:
	default:
	}
}
