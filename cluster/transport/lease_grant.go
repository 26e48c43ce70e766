package transport

import (
	"math/rand/v2"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// The owner's side of leases (lease.go): the lease epoch, grants, and what
// a Local needs to take leased quota back (the Release handler is in
// server.go).

// newLeaseEpoch returns a fresh lease epoch: random, never 0.
func newLeaseEpoch() uint64 { return rand.Uint64() | 1 }

// NewLeaseEpoch starts a new lease epoch: quota this node leased before
// it is no longer taken back (see peerpb.Release). A node calls it
// whenever its ring changes.
func (f *Forwarder) NewLeaseEpoch() { f.leaseEpoch.Store(newLeaseEpoch()) }

// grant leases quota for op to the peer that sent it, if it asked (want >
// 0) and this node owns the key: up to want, at most 1/(2n) of r.Remaining
// and nothing when less than 4n remains, in a multiple of op.Hits. The lease is applied as a second
// op right after op's, which a concurrent op may have made too big: it is
// then refused (StopOnOver) and nothing is leased. It writes the lease into
// pr.
func (f *Forwarder) grant(now int64, op *bucket.Op, want uint64, r bucket.Result, pr *peerpb.Result) {
	if f.leases == nil || want == 0 || r.Over || !leaseAlgo(op) {
		return
	}
	if _, _, self := f.owners.Owner(op.Key); !self {
		return // a replica standing in, or a stale sender's view
	}
	n := uint64(len(*f.peers.Load()) + 1)
	if r.Remaining < leaseMinLeft*n {
		return
	}
	g := min(want, leaseMaxWant, r.Remaining/(leaseShareDiv*n))
	// Whole ops of op's size: a request's hits_addend is usually the same
	// from one request to the next, and a rest smaller than it would
	// serve none of them.
	g -= g % op.Hits
	if g == 0 {
		return
	}
	lop := bucket.Op{Key: op.Key, Limit: op.Limit, Hits: g, Mode: bucket.StopOnOver}
	lr := f.local.Apply(now, &lop)
	if lr.Over {
		return
	}
	// The window the lease counted in ends lr.ResetAfter from now for a
	// fixed window, one unit earlier for a sliding one (whose hits weigh
	// on the window after theirs too); see bucket.Result.
	end := now + lr.ResetAfter
	if op.Limit.Algorithm == bucket.SlidingWindow {
		end -= op.Limit.Unit
	}
	if end <= now {
		return // cannot happen for a write; nothing to lease then
	}
	pr.Leased = g
	pr.LeaseTtlNs = end - now
	pr.LeaseWindowNs = end - op.Limit.Unit
	pr.LeaseEpoch = f.leaseEpoch.Load()
	f.m.leaseGrants.Inc()
	f.m.leaseGranted.Add(float64(g))
}

// Releaser is implemented by a Local that can take back leased quota
// (a node's recording store). Without it this node takes no quota back.
type Releaser interface {
	// Release takes hits of a lease back from key's counter for window;
	// granted is the count the owner answered with the lease.
	Release(now int64, key []byte, lim bucket.Limit, window int64, hits, granted uint64) bool
}
