package transport

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// Quota leases. An entry node that forwards a hit for a key another node
// owns asks the owner, in the same op, for a lease: a share of the key's
// remaining quota, which the owner counts as used at once (right after the
// op's hits, in the same window) and replicates like any count. The entry
// node then decides the key's next hits itself, taking them from the lease,
// until it is spent, ends or no longer fits the op. Since every leased hit
// is counted at the owner before any of them is allowed, the hits a key
// allows never add up to more than its limit: a lease that is not used up
// only refuses hits early, never lets one through late.
//
// The owner grants at most 1/(2n) of what is left after the op's hits, n
// being the number of nodes, and nothing when less than 4n is left, so
// leases shrink to nothing as a key nears its limit and its last hits are
// decided by the owner as without leases. The entry node asks for about as
// much as it used of its previous lease, twice as much when it spent it
// (leaseMinWant the first time, at most leaseMaxWant), and renews a lease
// of a key far from its limit in the background when it runs low (renew).
// Grants come in whole ops of the asking op's hits. Only fixed and
// sliding windows are leased: hits taken later from a lease are counted
// when it was granted, which a window tolerates (they fall in the window
// that counted them, before its end) and a token bucket does not (a bucket
// refilled meanwhile would admit them a second time).
//
// A lease is used only while its owner is neither suspect nor gone from
// this node's peers: an owner that crashes may not have replicated its
// last grants (replication is asynchronous, every few milliseconds), so
// the replica that takes its keys over may not count them, and hits taken
// from such a lease after that could be allowed twice. Dropped, its quota
// counts as used where it was replicated and is never used where it was
// not. What remains is the time this node takes to find the owner gone
// (its next forward to it, or its peers changing), as for the ops it
// forwards.
//
// A lease lasts until the earlier of its window's end and the forwarder's
// LeaseTTL after the call that asked for it began (both on the entry node's
// clock, so skew between the nodes does not stretch it). Its unused quota
// goes back to the owner (a Release) when it ends before its window does,
// when the node drains or closes (ReturnLeases), and when it is idle (no
// hit for four times its mean gap between hits, at least leaseIdleMin)
// while its key is short of quota: when the owner had counted more than
// half the key's limit by the grant. A lease on a key further from its
// limit holds at most 1/(2n) of a quota that is mostly unused, and ending
// it for a pause between two hits would only cost a forward and a Release
// for each of a slow key's hits.
//
// The owner takes it back only under the lease epoch it granted it in: the
// epoch changes whenever the owner's ring changes and when it restarts, so
// quota granted by a process that has since restarted, or counted where the
// ring no longer decides, stays counted as used; copies of the counter
// made before a release do not count the released hits again when they
// come back (replication's releasedBook). The unused quota of a lease
// whose window has ended is dropped (expired): its window is over.

// Lease sizing and bookkeeping.
const (
	// leaseMinWant is the quota an entry node asks for the first time,
	// and the least it asks for.
	leaseMinWant = 32
	// leaseMaxWant caps what an entry node asks for at once.
	leaseMaxWant = 1 << 20
	// The owner grants at most remaining/(leaseShareDiv*n), and nothing
	// when less than leaseMinLeft*n remains.
	leaseShareDiv = 2
	leaseMinLeft  = 4
	// leaseSweepEvery is how often leases are checked for their end and
	// idle time, and their unused quota sent back. A sweep reads every
	// slot: every 250 ms it cost a three-node cluster at 0.15 CPU per
	// node a sixth of its calls (docs/performance.md).
	leaseSweepEvery = time.Second
	// leaseIdleMin is the least idle time that ends a lease.
	leaseIdleMin = time.Second
	// leaseMaxSlots bounds the keys an entry node keeps lease state for;
	// past it, new keys are not leased until the sweep forgets idle ones.
	leaseMaxSlots = 1 << 18
	// leaseReleaseTimeout bounds one Release call.
	leaseReleaseTimeout = time.Second
	// leaseAskFor is how long a forward asking for a lease holds back the
	// next ask for its key (its answer normally ends the wait sooner).
	leaseAskFor = time.Second
	// leaseRenewWait is how long renewals asked for are gathered before
	// they are sent: a lease is renewed with a quarter of it left.
	leaseRenewWait = 20 * time.Millisecond
	// leaseCloseTimeout bounds the releases Close sends.
	leaseCloseTimeout = 500 * time.Millisecond
	// leaseShards is the lease table's shard count.
	leaseShards = 64
)

// lease is quota an owner leased to this node for one key. Its fields are
// set before it is published and never change, except left and lastUse.
type lease struct {
	left    atomic.Uint64 // quota not yet used
	lastUse atomic.Int64  // entry clock, Unix ns, of the last hit taken

	key     []byte
	limit   bucket.Limit
	owner   string      // the owner's node ID
	peer    *peerClient // the owner's client when it granted the lease
	epoch   uint64      // the owner's lease epoch at the grant
	window  int64       // start of the window it counts in, owner's clock
	granted uint64      // quota granted (with any leftover merged into it)
	// start and end bound its use, entry clock, Unix ns: start is when
	// the call that asked for it began, end the earlier of its window's
	// end and start+LeaseTTL. windowEnd is the window's end: a lease that
	// ends before it sends its unused quota back.
	start, end, windowEnd int64
	// base is the owner's count after the grant; resetAt is when the
	// owner's answer said the key resets (entry clock). A hit decided from
	// the lease reports base-left and resetAt-now.
	base    uint64
	resetAt int64
	// short is set when base is more than half the key's capacity: the
	// lease then ends when idle.
	short bool
}

// take takes hits from l, reporting false when it has fewer left.
func (l *lease) take(hits uint64) (left uint64, ok bool) {
	for {
		cur := l.left.Load()
		if cur < hits {
			return 0, false
		}
		if l.left.CompareAndSwap(cur, cur-hits) {
			return cur - hits, true
		}
	}
}

// idleFor is how long l may go without a hit before it ends: four times
// its mean gap between hits so far, at least leaseIdleMin, and
// 4*leaseIdleMin while it has had none.
func (l *lease) idleFor(left uint64) int64 {
	used := l.granted - min(left, l.granted)
	if used == 0 {
		return int64(4 * leaseIdleMin)
	}
	return max(int64(leaseIdleMin), 4*(l.lastUse.Load()-l.start)/int64(used))
}

// leaseSlot is what an entry node keeps for one key it asks leases for:
// the live lease, whether a forward asking for one is on its way, how much
// to ask for next and when the key was last seen.
type leaseSlot struct {
	cur atomic.Pointer[lease]
	// asking is when a forward asking for a lease left (entry clock, Unix
	// ns), 0 when none is on its way; an ask older than leaseAskFor no
	// longer holds the next one back.
	asking atomic.Int64
	want   atomic.Uint64
	// seen is when the key last asked for a lease, or last took a hit
	// from one that has ended (the live lease's lastUse says that
	// meanwhile), entry clock, Unix ns.
	seen atomic.Int64
}

type leaseShard struct {
	mu sync.RWMutex
	m  map[string]*leaseSlot
}

// leaseTable is an entry node's lease state, by key.
type leaseTable struct {
	shards [leaseShards]leaseShard
	n      atomic.Int64 // slots
}

func newLeaseTable() *leaseTable {
	t := new(leaseTable)
	for i := range t.shards {
		t.shards[i].m = make(map[string]*leaseSlot)
	}
	return t
}

func (t *leaseTable) shard(key []byte) *leaseShard {
	return &t.shards[xxhash.Sum64(key)%leaseShards]
}

// get returns key's slot, creating it when create is set and the table has
// room; nil otherwise.
func (t *leaseTable) get(key []byte, create bool) *leaseSlot {
	sh := t.shard(key)
	sh.mu.RLock()
	s := sh.m[string(key)]
	sh.mu.RUnlock()
	if s != nil || !create || t.n.Load() >= leaseMaxSlots {
		return s
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s = sh.m[string(key)]; s == nil {
		s = new(leaseSlot)
		s.want.Store(leaseMinWant)
		sh.m[string(key)] = s
		t.n.Add(1)
	}
	return s
}

// leaseable reports whether op may be decided from a lease or ask for one:
// it adds hits under a fixed or sliding window.
func leaseable(op *bucket.Op) bool {
	return op.Mode != bucket.Peek && leaseAlgo(op)
}

// leaseAlgo reports whether op has hits under a fixed or sliding window:
// a lease may be granted for it (a Peek is a background renewal).
func leaseAlgo(op *bucket.Op) bool {
	return op.Hits > 0 && (op.Limit.Algorithm == bucket.FixedWindow || op.Limit.Algorithm == bucket.SlidingWindow)
}

// leased decides op from this node's lease on its key, if it holds one
// that fits: the same limit, not ended, with quota for the hits.
func (f *Forwarder) leased(now int64, op *bucket.Op) (bucket.Result, bool) {
	if f.leases == nil || !leaseable(op) {
		return bucket.Result{}, false
	}
	s := f.leases.get(op.Key, false)
	if s == nil {
		return bucket.Result{}, false
	}
	l := s.cur.Load()
	if l == nil || now >= l.end || now < l.start || l.limit != op.Limit || !l.peer.holds() {
		return bucket.Result{}, false
	}
	left, ok := l.take(op.Hits)
	if !ok {
		return bucket.Result{}, false
	}
	l.lastUse.Store(now)
	if left <= l.granted/4 && !l.short {
		f.renew(now, s, l, op.Hits)
	}
	count := l.base - min(l.base, left)
	r := bucket.Result{Count: count, ResetAfter: max(1, l.resetAt-now)}
	if capacity := op.Limit.Capacity(); count <= capacity {
		r.Remaining = capacity - count
	}
	f.m.leaseHits.used.Add(float64(op.Hits))
	return r, true
}

// leaseWant returns how much quota a forwarded op asks for (0: none) and
// the slot that takes the answer. One forward per key asks at a time.
func (f *Forwarder) leaseWant(now int64, op *bucket.Op) (uint64, *leaseSlot) {
	if f.leases == nil || f.leasesOff.Load() || !leaseable(op) {
		return 0, nil
	}
	s := f.leases.get(op.Key, true)
	if s == nil {
		return 0, nil
	}
	if a := s.asking.Load(); (a != 0 && now-a < int64(leaseAskFor)) || !s.asking.CompareAndSwap(a, now) {
		return 0, nil
	}
	s.seen.Store(now)
	want := s.want.Load()
	if l := s.cur.Load(); l != nil {
		want = nextWant(l, l.left.Load()) // the lease this ask replaces
	}
	return want, s
}

// renew asks l's owner, in the background, for the key's next lease once l
// runs low (a quarter left), so that the hits after it are decided here
// too rather than wait for a forward: a Peek of the caller's hits that asks
// for twice l, gathered for leaseRenewWait with the other renewals asked
// for meanwhile and queued together. Only leases of keys that had used at most half their limit
// are renewed so: a renewal is granted whether or not more hits come, and
// near the limit quota held for hits that do not come is an early refusal.
// There a lease is renewed by the forward of the hit it cannot cover. No caller waits for it; the sender installs the answer
// (leaseAnswered), which takes over what is left of l. Renewals to one
// owner travel in the same batches as its forwarded ops.
func (f *Forwarder) renew(now int64, s *leaseSlot, l *lease, hits uint64) {
	if f.leasesOff.Load() || !l.peer.holds() {
		return
	}
	if a := s.asking.Load(); (a != 0 && now-a < int64(leaseAskFor)) || !s.asking.CompareAndSwap(a, now) {
		return
	}
	req := &fwdRequest{done: make(chan struct{}, 1)}
	it := &fwdItem{req: req, peer: l.peer, key: l.key, now: now, want: nextWant(l, 0), slot: s}
	it.op = bucket.Op{Key: l.key, Limit: l.limit, Hits: hits, Mode: bucket.Peek}
	req.items, req.n = []*fwdItem{it}, 1
	req.pending.Store(1)
	f.renewMu.Lock()
	f.renewQ = append(f.renewQ, it)
	f.renewMu.Unlock()
	select {
	case f.renewKick <- struct{}{}:
	default:
	}
}

// leaseAnswered installs the lease the owner granted in res, if any, in
// the item's slot, and lets the slot ask again. It runs in the sender, so
// that a lease granted after its caller gave up is still used. A forward
// that failed calls it with a nil res.
func (f *Forwarder) leaseAnswered(it *fwdItem, res *peerpb.Result) {
	s := it.slot
	if s == nil {
		return
	}
	it.slot = nil
	defer s.asking.Store(0)
	g := res.GetLeased()
	if g == 0 || res.GetLeaseTtlNs() <= 0 {
		return
	}
	f.m.leases.granted.Inc()
	f.m.leaseHits.granted.Add(float64(g))
	l := &lease{
		key:       append([]byte(nil), it.key...),
		limit:     it.op.Limit,
		owner:     it.peer.id,
		peer:      it.peer,
		epoch:     res.GetLeaseEpoch(),
		window:    res.GetLeaseWindowNs(),
		granted:   g,
		start:     it.now,
		windowEnd: it.now + res.GetLeaseTtlNs(),
		base:      res.GetCount() + g, // a renewal's Peek counted its hits: see below
		resetAt:   it.now + res.GetResetAfterNs(),
	}
	if it.op.Mode == bucket.Peek {
		l.base -= min(l.base, it.op.Hits) // as if added, not added
	}
	l.end = min(l.windowEnd, it.now+int64(f.leaseTTL))
	l.short = l.base > it.op.Limit.Capacity()/2
	l.left.Store(g)
	l.lastUse.Store(it.now)
	if f.leasesOff.Load() {
		// Asked for before ReturnLeases: it goes back with the next sweep
		// (Close sweeps too).
		f.giveBack(l, l.left.Swap(0), it.now)
		return
	}
	// The old lease is taken out first, so that l is complete when it is
	// published (a hit meanwhile finds none and is forwarded).
	old := s.cur.Swap(nil)
	if old != nil {
		u := old.left.Swap(0)
		f.retire(s, old, u)
		if u > 0 && old.owner == l.owner && old.epoch == l.epoch && old.window == l.window && old.limit == l.limit {
			// The old lease's rest counts in the same window at the
			// same owner: the new lease takes it over.
			l.left.Add(u)
			l.granted += u
		} else {
			f.giveBack(old, u, it.now)
		}
	}
	s.cur.Store(l)
}

// retire sets what the slot of a lease that ended with u unused asks for
// next (nextWant).
func (f *Forwarder) retire(s *leaseSlot, l *lease, u uint64) {
	s.want.Store(nextWant(l, u))
}

// nextWant is what to ask for after lease l, with u unused: twice l if it
// was (nearly) spent, else what it used; within [leaseMinWant,
// leaseMaxWant].
func nextWant(l *lease, u uint64) uint64 {
	next := l.granted - min(u, l.granted)
	if u <= l.granted/8 {
		next = 2 * l.granted
	}
	return min(max(next, leaseMinWant), leaseMaxWant)
}
