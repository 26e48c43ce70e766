package transport

// Owners maps a key to the node that owns it. Declared here, implemented by
// the node. self reports that this node owns the key; id is the owner's
// node ID and grpcAddr its gRPC address ("" when the ring is empty).
type Owners interface {
	Owner(key []byte) (id, grpcAddr string, self bool)
}

// Holders is optionally implemented by an Owners to name every node that
// holds a key: Holder(key, i) is the i-th distinct one (0 is the owner,
// then its replicas in order), self reports that it is this node, and ok is
// false past the last. When a key's owner is suspect or has no client, the
// forwarder sends the op to the first healthy holder after it (or decides
// it locally when that is this node) instead of deciding it with the entry
// node's own counter, which may start from zero: the replica continues
// from the count it was sent.
type Holders interface {
	Holder(key []byte, i int) (id string, self, ok bool)
}
