package replication

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/cluster/wire"
)

// TestReplicateBatchFits: the fullest Replicate batches the batch bounds
// allow, every number at its longest encoding, stay under
// wire.MaxMessageSize, the receive limit of a server that serves the Peer
// service. Raising a batch bound past it would have every full batch
// refused.
func TestReplicateBatchFits(t *testing.T) {
	from := strings.Repeat("n", 256) // node IDs are bounded far below this
	key := func(n int) []byte { return make([]byte, n) }
	// Keys share the batch's key bytes evenly, as short keys fill the entry
	// count first and long ones the byte bound.
	for _, n := range []int{1, 64, maxBatchBytes / wire.MaxEntries, wire.MaxKeyLen} {
		ents := min(wire.MaxEntries, maxBatchBytes/n+1)
		rep := &peerpb.ReplicateRequest{From: from}
		for range ents {
			rep.Entries = append(rep.Entries, &peerpb.Entry{Key: key(n), Algorithm: math.MaxUint32, WindowNs: math.MinInt64,
				UnitNs: math.MinInt64, Count: math.MaxUint64, Prev: math.MaxUint64, TatNs: math.MinInt64})
		}
		if size := proto.Size(rep); size >= wire.MaxMessageSize {
			t.Errorf("Replicate batch of %d entries of %d-byte keys: %d bytes, not under %d", ents, n, size, wire.MaxMessageSize)
		}
	}
}
