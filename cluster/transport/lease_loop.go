package transport

import (
	"context"
	"time"

	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// What runs beside the hit path for an entry node's leases (lease.go): the
// lease loop, which sweeps ended and idle leases and sends their unused
// quota back, and queues the renewals asked for.

// flushRenewals queues the renewals asked for since the last flush to
// their owners, all at once, so that each owner's go out in few batches.
func (f *Forwarder) flushRenewals(now int64) {
	f.renewMu.Lock()
	q := f.renewQ
	f.renewQ = nil
	f.renewMu.Unlock()
	for _, it := range q {
		it.deadline = now + int64(fwdMaxWait)
		if ok, _ := it.peer.enqueue(it); !ok {
			it.slot.asking.Store(0)
			continue
		}
		f.m.leaseRenewals.Inc()
	}
}

// giveBack disposes of the unused quota u of a lease that ended at now:
// queued for its owner while its window lasts, dropped (expired) after.
func (f *Forwarder) giveBack(l *lease, u uint64, now int64) {
	if u == 0 {
		return
	}
	if now >= l.windowEnd {
		f.m.leases.expired.Inc()
		f.m.leaseHits.expired.Add(float64(u))
		return
	}
	f.relMu.Lock()
	if f.rel == nil {
		f.rel = make(map[string][]*peerpb.Release)
	}
	f.rel[l.owner] = append(f.rel[l.owner], &peerpb.Release{
		Key:          l.key,
		Algorithm:    uint32(l.limit.Algorithm),
		Requests:     l.limit.Requests,
		UnitNs:       l.limit.Unit,
		Burst:        l.limit.Burst,
		WindowNs:     l.window,
		Epoch:        l.epoch,
		Hits:         u,
		GrantedCount: l.base,
	})
	f.relMu.Unlock()
}

// sweep ends the leases that ended or idle at now, forgets slots unused
// for two LeaseTTLs, and sends the unused quota back.
func (f *Forwarder) sweep(ctx context.Context, now int64, all bool) {
	type item struct {
		key string
		s   *leaseSlot
	}
	var items []item
	forget := 2 * int64(f.leaseTTL)
	for i := range f.leases.shards {
		sh := &f.leases.shards[i]
		items = items[:0]
		sh.mu.RLock()
		for k, s := range sh.m {
			items = append(items, item{k, s})
		}
		sh.mu.RUnlock()
		var stale []string
		for _, it := range items {
			s := it.s
			l := s.cur.Load()
			if l == nil {
				if now-s.seen.Load() >= forget {
					stale = append(stale, it.key)
				}
				continue
			}
			left := l.left.Load()
			if !all && now < l.end && l.peer.holds() && (!l.short || now-l.lastUse.Load() < l.idleFor(left)) {
				continue
			}
			if !s.cur.CompareAndSwap(l, nil) {
				continue // renewed meanwhile
			}
			u := l.left.Swap(0)
			if lu := l.lastUse.Load(); lu > s.seen.Load() {
				s.seen.Store(lu)
			}
			f.retire(s, l, u)
			f.giveBack(l, u, now)
		}
		if len(stale) > 0 {
			sh.mu.Lock()
			for _, k := range stale {
				if s := sh.m[k]; s != nil && s.cur.Load() == nil && now-s.seen.Load() >= forget {
					delete(sh.m, k)
					f.leases.n.Add(-1)
				}
			}
			sh.mu.Unlock()
		}
	}
	f.flushReleases(ctx)
}

// flushReleases sends the queued releases, one Release call per owner (in
// chunks of peerMaxOps). Quota for an owner that is gone, or that does
// not take it, stays counted as used.
func (f *Forwarder) flushReleases(ctx context.Context) {
	f.relMu.Lock()
	rel := f.rel
	f.rel = nil
	f.relMu.Unlock()
	if len(rel) == 0 {
		return
	}
	peers := *f.peers.Load()
	for owner, rs := range rel {
		p := peers[owner]
		for len(rs) > 0 {
			chunk := rs[:min(len(rs), peerMaxOps)]
			rs = rs[len(chunk):]
			var hits uint64
			for _, r := range chunk {
				hits += r.GetHits()
			}
			taken := 0
			if p != nil {
				cctx, cancel := context.WithTimeout(ctx, leaseReleaseTimeout)
				resp, err := p.client.Release(cctx, &peerpb.ReleaseRequest{From: f.self, Releases: chunk})
				cancel()
				if err == nil {
					taken = int(resp.GetTaken())
				} else {
					f.log.Debug("transport: release failed; the quota stays used", "peer", owner, "releases", len(chunk), "err", err)
				}
			}
			// Per release the owner only says how many it took; the hits
			// are split in proportion.
			back := hits * uint64(taken) / uint64(len(chunk))
			f.m.leases.returned.Add(float64(taken))
			f.m.leases.expired.Add(float64(len(chunk) - taken))
			f.m.leaseHits.returned.Add(float64(back))
			f.m.leaseHits.expired.Add(float64(hits - back))
		}
	}
}

// leaseLoop sweeps the leases every leaseSweepEvery until stop closes.
func (f *Forwarder) leaseLoop(stop <-chan struct{}) {
	defer f.leaseWG.Done()
	t := f.clock.NewTicker(leaseSweepEvery)
	defer t.Stop()
	r := f.clock.NewTimer(time.Hour)
	r.Stop()
	defer r.Stop()
	pending := false // r runs for renewals asked for
	for {
		select {
		case <-stop:
			return
		case <-t.C():
			f.sweep(context.Background(), f.clock.Now().UnixNano(), false)
		case <-f.renewKick:
			// Gather what more hits ask for meanwhile: one flush per
			// leaseRenewWait at most.
			if !pending {
				pending = true
				r.Reset(leaseRenewWait)
			}
		case <-r.C():
			pending = false
			f.flushRenewals(f.clock.Now().UnixNano())
		}
	}
}

// startLeases starts the sweep once, when the first peer is added. f.mu
// is held.
func (f *Forwarder) startLeasesLocked() {
	if f.leases == nil || f.leaseStop != nil {
		return
	}
	f.leaseStop = make(chan struct{})
	f.leaseWG.Add(1)
	go f.leaseLoop(f.leaseStop)
}

// ReturnLeases gives back the unused quota of every lease this node holds,
// within ctx, and stops asking for leases for good: a node that drains
// calls it first, and Close calls it. Hits for keys other nodes own are
// forwarded to their owners from then on. It returns at once without
// leases.
func (f *Forwarder) ReturnLeases(ctx context.Context) {
	if f.leases == nil {
		return
	}
	f.leasesOff.Store(true)
	f.sweep(ctx, f.clock.Now().UnixNano(), true)
}
