package replication

import (
	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// Store is what replication needs of a node's counter store. *bucket.Store
// implements it. It must be safe for concurrent use.
type Store interface {
	// ApplyState decides op at now and reports the state it wrote, if any
	// (see bucket.Store.ApplyState). It must not retain op.
	ApplyState(now int64, op *bucket.Op) (bucket.Result, bucket.State, bool)
	// Merge combines a peer's state for key into the store (see
	// bucket.Store.Merge). It must not retain key.
	Merge(now int64, key []byte, st bucket.State) bool
	// Range calls fn for every entry live at now until fn returns false;
	// key is valid only during the call.
	Range(now int64, fn func(key []byte, st bucket.State) bool)
	// Get returns key's live state at now, if any (see bucket.Store.Get).
	Get(now int64, key []byte) (bucket.State, bool)
	// Release takes back leased hits still counted in window (see
	// bucket.Store.Release). It must not retain key.
	Release(now int64, key []byte, lim bucket.Limit, window int64, hits uint64) bool
}

// Conns gives the Peer client of a peer: its connection, which belongs to
// Conns (a transport.Forwarder). Client returns nil when id is not a current
// peer.
type Conns interface {
	Client(id string) peerpb.PeerClient
}
