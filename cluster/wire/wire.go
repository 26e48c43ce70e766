// Package wire holds what both sides of the peer protocol (package peerpb)
// share beyond the messages' shape: the bounds of a message, the validation
// and meaning of a replicated entry, and the lockstep stream on which the
// forwarder's and the replicator's senders send their batches. Its
// functions are safe for concurrent use; a Lockstep is not.
package wire

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// MaxMessageSize bounds the messages peers send each other: a Decide or
// Replicate batch carries at most 1 MiB of keys and 4096 ops or entries of
// a few dozen bytes besides. A gRPC server that registers the Peer service
// must accept messages this large (grpc.MaxRecvMsgSize), and need not
// accept larger ones.
const MaxMessageSize = 2 << 20

// Bounds of what one message carries, checked by its receiver.
const (
	// MaxKeyLen bounds a key, in bytes.
	MaxKeyLen = 8 << 10
	// MaxEntries bounds the entries of a Replicate request or a Sync chunk.
	MaxEntries = 4096
	// MaxReplicas bounds SyncRequest.replicas: the distinct nodes that
	// hold a key.
	MaxReplicas = 16
	// MaxIDLen bounds a node ID in a SyncRequest, in bytes.
	MaxIDLen = 256
)

// StreamMaxAge is how long a DecideStream or ReplicateStream lives: its
// receiver ends it after an answer once it is this old, and its sender
// opens a new one before, which the receiving server admits again (a node
// no longer a member loses its streams within this time). A sender that
// found no stream method (an older peer) sends calls for this long before
// it tries a stream again.
const StreamMaxAge = 30 * time.Second

// ErrInvalid marks a request its receiver refuses as a whole
// (codes.InvalidArgument).
var ErrInvalid = errors.New("wire: invalid peer request")

// ValidateEntries checks every entry of a Replicate request or Sync chunk;
// an error wraps ErrInvalid.
func ValidateEntries(entries []*peerpb.Entry) error {
	if len(entries) > MaxEntries {
		return fmt.Errorf("%w: %d entries, more than %d", ErrInvalid, len(entries), MaxEntries)
	}
	for i, e := range entries {
		switch {
		case e == nil:
			return fmt.Errorf("%w: entry %d: missing", ErrInvalid, i)
		case len(e.GetKey()) == 0:
			return fmt.Errorf("%w: entry %d: empty key", ErrInvalid, i)
		case len(e.GetKey()) > MaxKeyLen:
			return fmt.Errorf("%w: entry %d: key is %d bytes, more than %d", ErrInvalid, i, len(e.GetKey()), MaxKeyLen)
		case e.GetAlgorithm() > 0xff:
			return fmt.Errorf("%w: entry %d: unknown algorithm %d", ErrInvalid, i, e.GetAlgorithm())
		}
		lim := bucket.Limit{Algorithm: bucket.Algorithm(e.GetAlgorithm()), Unit: e.GetUnitNs()}
		if err := lim.Validate(); err != nil {
			return fmt.Errorf("%w: entry %d: %w", ErrInvalid, i, err)
		}
		if lim.Algorithm == bucket.SlidingWindow && (e.GetCount() > math.MaxUint32 || e.GetPrev() > math.MaxUint32) {
			return fmt.Errorf("%w: entry %d: sliding window counts above %d", ErrInvalid, i, uint64(math.MaxUint32))
		}
		if lim.Algorithm != bucket.TokenBucket && !bucket.OnWindowGrid(e.GetWindowNs(), e.GetUnitNs()) {
			// Merged, it would win as "later" and match no window: the
			// key's next op would count from zero.
			return fmt.Errorf("%w: entry %d: window %d is not a multiple of its unit %d", ErrInvalid, i, e.GetWindowNs(), e.GetUnitNs())
		}
	}
	return nil
}

// EntryState is the counter state a validated entry carries.
func EntryState(e *peerpb.Entry) bucket.State {
	return bucket.State{
		Algorithm: bucket.Algorithm(e.GetAlgorithm()),
		Window:    e.GetWindowNs(),
		Unit:      e.GetUnitNs(),
		Count:     e.GetCount(),
		Prev:      e.GetPrev(),
		TAT:       e.GetTatNs(),
	}
}
