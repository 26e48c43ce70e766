package cluster

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// TestPeerMessagesFit: the fullest Decide and Replicate batches the batch
// bounds allow, every number at its longest encoding, stay under
// MaxMessageSize, the receive limit of a server that serves the Peer
// service. Raising a batch bound past it would have every full batch
// refused.
func TestPeerMessagesFit(t *testing.T) {
	from := strings.Repeat("n", 256) // node IDs are bounded far below this
	key := func(n int) []byte { return make([]byte, n) }
	// Keys share the batch's key bytes evenly, as short keys fill the op
	// count first and long ones the byte bound.
	for _, n := range []int{1, 64, fwdMaxBatchBytes / peerMaxOps, peerMaxKeyLen} {
		ops := min(peerMaxOps, fwdMaxBatchBytes/n+1)
		req := &peerpb.DecideRequest{From: from, DeadlineNs: math.MinInt64}
		for range ops {
			req.Ops = append(req.Ops, &peerpb.Op{Key: key(n), Algorithm: math.MaxUint32, Requests: math.MaxUint64,
				UnitNs: math.MinInt64, Hits: math.MaxUint64, Mode: math.MaxUint32, Burst: math.MaxUint64})
		}
		if size := proto.Size(req); size >= MaxMessageSize {
			t.Errorf("Decide batch of %d ops of %d-byte keys: %d bytes, not under %d", ops, n, size, MaxMessageSize)
		}
		ents := min(replMaxEntries, replMaxBytes/n+1)
		rep := &peerpb.ReplicateRequest{From: from}
		for range ents {
			rep.Entries = append(rep.Entries, &peerpb.Entry{Key: key(n), Algorithm: math.MaxUint32, WindowNs: math.MinInt64,
				UnitNs: math.MinInt64, Count: math.MaxUint64, Prev: math.MaxUint64, TatNs: math.MinInt64})
		}
		if size := proto.Size(rep); size >= MaxMessageSize {
			t.Errorf("Replicate batch of %d entries of %d-byte keys: %d bytes, not under %d", ents, n, size, MaxMessageSize)
		}
	}
}
