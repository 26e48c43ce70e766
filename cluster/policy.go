package cluster

// policy is a Node as its peer server's transport.Policy.
type policy Node

// Serving answers Decide and Ping unless the node refuses them (it
// re-syncs) or has just found it was frozen (see stalled).
func (p *policy) Serving() bool {
	n := (*Node)(p)
	return !n.refusing.Load() && !n.stalled()
}

// Relaying reports whether the node relays (see Node.relaying).
func (p *policy) Relaying() bool { return p.relaying.Load() }

// MarkRelay reports which relayed ops to mark relayed (see marksRelay).
func (p *policy) MarkRelay(key []byte) bool { return (*Node)(p).marksRelay(key) }

// setServing makes the peer server answer (true) or refuse Decide and Ping
// with codes.Unavailable (false): a node re-syncing its counters must not
// decide with stale ones. Entry nodes then fall back and hold the node
// suspect until it answers Ping again.
func (n *Node) setServing(ok bool) { n.refusing.Store(!ok) }
