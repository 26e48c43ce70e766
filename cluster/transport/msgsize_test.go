package transport

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// TestDecideBatchFits: the fullest Decide batches the batch bounds allow,
// every number at its longest encoding, stay under MaxMessageSize, the
// receive limit of a server that serves the Peer service. Raising a batch
// bound past it would have every full batch refused.
func TestDecideBatchFits(t *testing.T) {
	from := strings.Repeat("n", 256) // node IDs are bounded far below this
	key := func(n int) []byte { return make([]byte, n) }
	// Keys share the batch's key bytes evenly, as short keys fill the op
	// count first and long ones the byte bound.
	for _, n := range []int{1, 64, fwdMaxBatchBytes / peerMaxOps, peerMaxKeyLen} {
		ops := min(peerMaxOps, fwdMaxBatchBytes/n+1)
		req := &peerpb.DecideRequest{From: from, DeadlineNs: math.MinInt64}
		for range ops {
			req.Ops = append(req.Ops, &peerpb.Op{Key: key(n), Algorithm: math.MaxUint32, Requests: math.MaxUint64,
				UnitNs: math.MinInt64, Hits: math.MaxUint64, Mode: math.MaxUint32, Burst: math.MaxUint64,
				Trace: make([]byte, traceLen)})
		}
		if size := proto.Size(req); size >= MaxMessageSize {
			t.Errorf("Decide batch of %d ops of %d-byte keys: %d bytes, not under %d", ops, n, size, MaxMessageSize)
		}
	}
}
