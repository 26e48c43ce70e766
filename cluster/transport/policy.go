package transport

// Policy is what the peer server asks the node it serves before it decides
// a batch. A cluster.Node implements it; nil in ForwarderConfig means a
// node that always serves and never relays.
type Policy interface {
	// Serving reports whether the peer server answers Decide and Ping now.
	// False refuses them with codes.Unavailable (the node re-syncs its
	// counters and must not decide with stale ones): entry nodes then fall
	// back and hold the node suspect until it answers Ping again.
	Serving() bool
	// Relaying reports whether the node relays: it leaves the cluster, or
	// has just joined it, and its Owners then name the owners its keys move
	// to, or still have. The peer server relays the batches it receives to
	// them instead of applying them, unless they are marked relayed (see
	// peerpb.DecideRequest.Relayed).
	Relaying() bool
	// MarkRelay reports whether a relayed op for key is marked relayed, so
	// that its receiver applies it even if it relays too (a leaving node
	// marks every op; a node that has just joined only those for its own
	// keys). Asked only while Relaying.
	MarkRelay(key []byte) bool
}

// serving reports whether the peer server answers Decide and Ping now.
func (f *Forwarder) serving() bool { return f.policy == nil || f.policy.Serving() }

// relaying reports whether the peer server relays unmarked batches.
func (f *Forwarder) relaying() bool { return f.policy != nil && f.policy.Relaying() }

// marksRelay reports whether a relayed op for key is marked relayed.
func (f *Forwarder) marksRelay(key []byte) bool { return f.policy == nil || f.policy.MarkRelay(key) }
