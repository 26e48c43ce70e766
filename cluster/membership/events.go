package membership

import (
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
)

// memberlist calls the delegates below from its own goroutines, some while it
// holds its node lock. They only copy what they need into the member table
// under Membership.mu and raise a coalesced, non-blocking signal; nothing here
// calls back into memberlist or into user code. Conversely no code may call
// memberlist while holding Membership.mu (lock order: memberlist, then mu).

// delegate serves this node's metadata to memberlist. It uses no user
// messages, broadcasts or push/pull state.
type delegate struct{ m *Membership }

// NodeMeta returns the encoded metadata; its size was checked at construction
// against memberlist's 512-byte limit, which is limit.
func (d delegate) NodeMeta(limit int) []byte {
	b := *d.m.meta.Load()
	if len(b) > limit {
		return nil
	}
	return b
}

func (delegate) NotifyMsg([]byte)                           {}
func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (delegate) LocalState(join bool) []byte                { return nil }
func (delegate) MergeRemoteState(buf []byte, join bool)     {}

// events turns memberlist's node events into member-table updates.
type events struct{ m *Membership }

func (e events) NotifyJoin(n *memberlist.Node)   { e.m.observe(n, false) }
func (e events) NotifyUpdate(n *memberlist.Node) { e.m.observe(n, false) }
func (e events) NotifyLeave(n *memberlist.Node)  { e.m.observe(n, true) }

// observe records what memberlist reported about node n: alive (or
// leaving, per its metadata) on join and update, dead or left when gone.
// memberlist's own node state cannot tell a crash from a leave, so a node is
// "left" when its last metadata carried the leaving flag.
func (m *Membership) observe(n *memberlist.Node, gone bool) {
	meta, err := decodeMeta(n.Meta) // copies: n is memberlist's
	addr := net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
	name := n.Name
	now := m.clock.Now()

	m.mu.Lock()
	if err != nil {
		_, logged := m.badMeta[name]
		m.badMeta[name] = struct{}{}
		_, had := m.nodes[name]
		delete(m.nodes, name)
		if gone {
			delete(m.badMeta, name)
		}
		m.mu.Unlock()
		if !logged && !gone {
			m.logger.Warn("membership: ignoring node with undecodable metadata", "name", name, "addr", addr, "err", err)
		}
		if had {
			m.signal()
		}
		return
	}
	if gone {
		delete(m.badMeta, name) // bounded by the live nodes, not by churn
	}
	state := MemberAlive
	switch {
	case meta.Leaving:
		state = MemberLeft
	case gone:
		state = MemberDead
	}
	mb := Member{ID: meta.ID, Name: name, GRPCAddr: meta.GRPCAddr, Addr: addr, Started: meta.Started, State: state, Ready: meta.Ready, Relaying: meta.Relaying, Draining: meta.Draining}
	old, ok := m.nodes[name]
	switch {
	case !ok:
		m.nodes[name] = &row{member: mb, since: now}
	case old.member != mb:
		if old.member.State != mb.State {
			old.since = now
		}
		old.member = mb
	}
	if name != m.name && state == MemberAlive {
		m.joined.Store(true) // someone joined us: we are in a cluster
	}
	m.forgetGoneLocked(now)
	m.mu.Unlock()
	m.signal()
}

// forgetGoneLocked drops the nodes that have been dead or left for longer
// than forgetGone. m.mu is held.
func (m *Membership) forgetGoneLocked(now time.Time) {
	for k, v := range m.nodes {
		if k != m.name && v.member.State != MemberAlive && now.Sub(v.since) > forgetGone {
			delete(m.nodes, k)
		}
	}
}

// signal notes that the member table changed, without ever blocking.
func (m *Membership) signal() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// notifyLoop delivers onChange: first with just self, then with Alive
// after each (coalesced) change that alters it. It returns on Close.
func (m *Membership) notifyLoop() {
	defer m.wg.Done()
	last := []Member{m.Self()}
	m.onChange(slices.Clone(last))
	settle := m.clock.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-m.changed:
		}
		settle.Reset(settleDelay)
		select {
		case <-m.done:
			return
		case <-settle.C():
		}
		alive := m.Alive()
		if slices.Equal(alive, last) {
			continue
		}
		last = alive
		m.onChange(slices.Clone(alive))
	}
}
