package simnet

import (
	"container/heap"
	"time"
)

// event is a packet or a stream segment due to arrive. Events due at the
// same instant run in the order of (src, dst, seq), which for packets
// depends only on the seed and each link's sends, not on which goroutine
// sent first.
type event struct {
	at       time.Time
	src, dst string // "ip:port"
	seq      uint64 // the packet's place on its link, or the write's on its pipe
	pk       *packet
	p        *pipe
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	switch {
	case !a.at.Equal(b.at):
		return a.at.Before(b.at)
	case a.src != b.src:
		return a.src < b.src
	case a.dst != b.dst:
		return a.dst < b.dst
	}
	return a.seq < b.seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// pushLocked queues ev; one timer, armed for the earliest event, runs the
// queue.
func (n *Network) pushLocked(ev *event) {
	heap.Push(&n.queue, ev)
	if n.queue[0] == ev {
		n.armLocked()
	}
}

func (n *Network) armLocked() {
	if len(n.queue) == 0 {
		return
	}
	d := time.Until(n.queue[0].at)
	if n.timer == nil {
		n.timer = time.AfterFunc(d, n.fire)
		return
	}
	n.timer.Reset(d) // if fire is running now, it runs once more: harmless
}

// fire runs every event that is due, in order, then re-arms the timer.
func (n *Network) fire() {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	for len(n.queue) > 0 && !n.queue[0].at.After(now) {
		ev := heap.Pop(&n.queue).(*event)
		if ev.pk != nil {
			n.deliverLocked(ev.pk)
		} else {
			n.advanceLocked(ev.p)
		}
	}
	n.armLocked()
}

// stopQueueLocked discards every event, counting its packets as cut, and
// stops the timer.
func (n *Network) stopQueueLocked() {
	for _, ev := range n.queue {
		if ev.pk != nil {
			n.stats.PacketsCut++
		}
	}
	clear(n.queue)
	n.queue = nil
	if n.timer != nil {
		n.timer.Stop()
	}
}
