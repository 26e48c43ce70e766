package membership

import (
	"errors"
	"fmt"
	"time"
)

// Leave announces a graceful departure and stops re-joining: other nodes drop
// this one from their Alive set at once instead of waiting for failure
// detection, and report it as MemberLeft. It waits up to timeout (<= 0 means
// 5s) for the announcements to be gossiped, and does not wait for the second
// (memberlist's own leave) when no other node stays. Calling it again returns nil;
// after Close it returns an error. Close must still be called.
func (m *Membership) Leave(timeout time.Duration) (err error) {
	m.life.Lock()
	defer m.life.Unlock()
	if m.closed {
		return errors.New("membership: leave: membership is closed")
	}
	if m.left {
		return nil
	}
	m.left = true
	m.stopJoining()
	defer recoverPanic(&err)
	if timeout <= 0 {
		timeout = defaultLeave
	}
	deadline := m.clock.Now().Add(timeout)

	cur, _ := decodeMeta(*m.meta.Load())
	cur.Leaving = true
	if meta, err := encodeMeta(cur); err == nil {
		m.meta.Store(&meta)
	}
	m.mu.Lock()
	if n, ok := m.nodes[m.name]; ok && n.member.State != MemberLeft {
		n.member.State, n.since = MemberLeft, m.clock.Now()
	}
	m.mu.Unlock()
	m.signal()

	// First gossip the leaving flag, so that peers can tell this leave from
	// a crash (memberlist's leave message is queued under the same name and
	// would replace it), with half the budget, then memberlist's own leave,
	// with the rest up to leaveBroadcastWait.
	// memberlist's UpdateNode can miss the end of its broadcast (its notify
	// channel is unbuffered) and then waits out its timeout: that costs
	// time, never correctness, so its error is only logged.
	if err := m.ml.UpdateNode(max(timeout/2, time.Millisecond)); err != nil {
		m.logger.Debug("membership: leave: announcing the leaving flag", "err", err)
	}
	if !m.othersStay() {
		// Every other node has left, is leaving or is dead (the whole
		// cluster stops): nobody would take memberlist's leave broadcast,
		// and it would wait out its whole timeout. Close shuts it down.
		m.logger.Info("membership: left the cluster; no other member stays", "name", m.name)
		return nil
	}
	// Its only error is that timeout: logged, like the flag's, since peers
	// that got neither announcement still find this node gone by failure
	// detection, and its counters were handed off before Leave.
	rest := min(max(deadline.Sub(m.clock.Now()), time.Millisecond), leaveBroadcastWait)
	if err := m.ml.Leave(rest); err != nil {
		m.logger.Debug("membership: leave: memberlist's leave broadcast", "err", err)
	}
	m.logger.Info("membership: left the cluster", "name", m.name)
	return nil
}

// othersStay reports whether a node other than this one is alive and not
// leaving.
func (m *Membership) othersStay() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, n := range m.nodes {
		if name != m.name && n.member.State == MemberAlive {
			return true
		}
	}
	return false
}

// Flags returns the flags this process gossips now. A process starts with
// none.
func (m *Membership) Flags() Flags {
	cur, _ := decodeMeta(*m.meta.Load())
	return Flags{Ready: cur.Ready, Relaying: cur.Relaying, Draining: cur.Draining}
}

// SetFlags gossips f as this process's flags: it updates the node metadata
// and, if that changed, waits at most about a second until memberlist has
// broadcast it (the update is gossiped anyway after that wait). Other
// nodes see the change through their onChange. Relaying without Ready is
// gossiped as not relaying, and Draining cannot be undone: once set, it
// stays set whatever f says. After Leave or Close it returns an error and
// changes nothing.
func (m *Membership) SetFlags(f Flags) (err error) {
	m.life.Lock()
	defer m.life.Unlock()
	if m.closed || m.left {
		return errors.New("membership: set flags: membership has left or is closed")
	}
	defer recoverPanic(&err)
	cur, err := decodeMeta(*m.meta.Load())
	if err != nil {
		return fmt.Errorf("membership: set flags: %w", err)
	}
	next := cur
	next.Ready, next.Relaying, next.Draining = f.Ready, f.Relaying && f.Ready, cur.Draining || f.Draining
	if next == cur {
		return nil
	}
	meta, err := encodeMeta(next)
	if err != nil {
		return fmt.Errorf("membership: set flags: %w", err)
	}
	m.meta.Store(&meta)
	// UpdateNode's only error is the end of its wait, which it can miss
	// (see Leave): the new metadata is already memberlist's and is gossiped.
	if err := m.ml.UpdateNode(updateWait); err != nil {
		m.logger.Debug("membership: set flags: broadcast not confirmed", "err", err)
	}
	return nil
}

// Close shuts memberlist down without a leave (peers detect it as failed
// unless Leave was called first), stops and joins this Membership's
// goroutines and returns memberlist's shutdown error. It is idempotent. It
// waits for a Leave in progress (bounded by its timeout) and for an in-flight
// join attempt (bounded by memberlist's TCP timeout: 10s for "lan", 1s for
// "local"). memberlist's own goroutines are told to stop but not joined;
// they end within about a probe interval.
func (m *Membership) Close() error {
	m.closeOnce.Do(func() {
		m.life.Lock()
		m.closed = true
		m.stopJoining()
		close(m.done)
		m.closeErr = m.ml.Shutdown()
		m.life.Unlock()
		m.wg.Wait()
		if m.closeErr != nil {
			m.closeErr = fmt.Errorf("membership: close: %w", m.closeErr)
		}
	})
	return m.closeErr
}

func (m *Membership) stopJoining() {
	m.joinStopOnce.Do(func() { close(m.joinStop) })
}
