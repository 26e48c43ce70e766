package transport

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/bucket"
)

// releasingStore is a bucket.Store that takes back leased hits (a
// Releaser).
type releasingStore struct{ *bucket.Store }

func (s releasingStore) Release(now int64, key []byte, lim bucket.Limit, window int64, hits, _ uint64) bool {
	return s.Store.Release(now, key, lim, window, hits)
}

// leaseCluster starts forwarders with leases on (LeaseTTL ttl), each over
// a real bucket.Store, which it returns by node ID.
func leaseCluster(t *testing.T, ids []string, ttl time.Duration) (map[string]*fwdTestNode, map[string]*bucket.Store) {
	t.Helper()
	stores := map[string]*bucket.Store{}
	nodes := fwdStartCluster(t, ids, nil, func(c *ForwarderConfig) {
		st := bucket.NewStore(bucket.StoreConfig{})
		stores[c.Self] = st
		c.Local = releasingStore{st}
		c.LeaseTTL = ttl
	})
	return nodes, stores
}

// leaseMetric returns counter name{label=value} (any labels when value is
// "") summed over reg.
func leaseMetric(t *testing.T, reg *prometheus.Registry, name, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if value == "" || (len(m.GetLabel()) > 0 && m.GetLabel()[0].GetValue() == value) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func apply1(f *Forwarder, now int64, op bucket.Op) bucket.Result {
	res := make([]bucket.Result, 1)
	f.Apply(context.Background(), now, []bucket.Op{op}, res)
	return res[0]
}

func TestLeaseDecidesAtTheEntryNode(t *testing.T) {
	nodes, stores := leaseCluster(t, []string{"a", "b"}, time.Minute)
	a, b := nodes["a"], nodes["b"]
	op := bucket.Op{Key: []byte("b/k"), Limit: bucket.Limit{Requests: 1000, Unit: int64(time.Minute)}, Hits: 1}
	// The first hit goes to b and asks for leaseMinWant more; the next
	// are taken from that lease at a, which asks for twice as much in the
	// background once a quarter of it is left.
	n := 1 + leaseMinWant - leaseMinWant/4
	for i := 1; i <= n; i++ {
		r := apply1(a.f, a.now, op)
		if r.Over || r.Count != uint64(i) || r.Remaining != 1000-uint64(i) {
			t.Fatalf("hit %d: %+v, want count %d", i, r, i)
		}
	}
	leaseSettle(t, a.f, op.Key)
	if got := leaseMetric(t, a.reg, "ringlimit_forwarded_decisions_total", ""); got != 1 {
		t.Errorf("forwarded %v decisions, want 1", got)
	}
	if got := leaseMetric(t, a.reg, "ringlimit_leased_hits_total", "used"); got != float64(n-1) {
		t.Errorf("%v hits decided from the lease, want %d", got, n-1)
	}
	if got := leaseMetric(t, a.reg, "ringlimit_lease_renewals_total", ""); got != 1 {
		t.Errorf("%v renewals, want 1", got)
	}
	if got := leaseMetric(t, b.reg, "ringlimit_lease_granted_hits_total", ""); got != 3*leaseMinWant {
		t.Errorf("b leased %v hits, want %d and its renewal of twice that", got, leaseMinWant)
	}
	if st, _ := stores["b"].Get(b.now, []byte("b/k")); st.Count != 1+3*leaseMinWant {
		t.Errorf("owner counts %d, want the hit and the leases, %d", st.Count, 1+3*leaseMinWant)
	}
	// The next hits are taken from the renewed lease: no forward.
	for i := n + 1; i <= 2*leaseMinWant; i++ {
		if r := apply1(a.f, a.now, op); r.Count != uint64(i) {
			t.Fatalf("hit %d: %+v", i, r)
		}
	}
	if got := leaseMetric(t, a.reg, "ringlimit_forwarded_decisions_total", ""); got != 1 {
		t.Errorf("forwarded %v decisions after the renewal, want 1", got)
	}
}

// leaseSettle waits until no forward or renewal asking for a lease on key
// is on its way from f.
func leaseSettle(t *testing.T, f *Forwarder, key []byte) {
	t.Helper()
	s := f.leases.get(key, false)
	if s == nil {
		return
	}
	deadline := time.Now().Add(fwdWait)
	for s.asking.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a lease ask for %q still on its way after %v", key, fwdWait)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLeaseExactUnderConcurrency sends each of 40 keys (limit 50) 100
// hits through three nodes at once, then 10 more per key through each
// node: exactly 50 are allowed per key, for both windowed algorithms. (A
// node's lease is only used by hits that node receives: the last ten make
// sure each node receives some after the others are done, as steady
// traffic would; the goroutines of the first part need not end together.)
func TestLeaseExactUnderConcurrency(t *testing.T) {
	for _, algo := range []bucket.Algorithm{bucket.FixedWindow, bucket.SlidingWindow} {
		t.Run(algo.String(), func(t *testing.T) {
			ids := []string{"a", "b", "c"}
			nodes, _ := leaseCluster(t, ids, time.Minute)
			const keys, limit, hits = 40, 50, 100
			allowed := make([]int, keys)
			var mu sync.Mutex
			var wg sync.WaitGroup
			for w := range 6 {
				n := nodes[ids[w%3]]
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range keys * hits / 6 {
						k := (i + w*7) % keys
						op := bucket.Op{Key: fmt.Appendf(nil, "%s/k%d", ids[k%3], k),
							Limit: bucket.Limit{Algorithm: algo, Requests: limit, Unit: int64(time.Minute)}, Hits: 1}
						if r := apply1(n.f, n.now, op); !r.Over {
							mu.Lock()
							allowed[k]++
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			for k := range keys {
				for _, id := range ids {
					for range 10 {
						op := bucket.Op{Key: fmt.Appendf(nil, "%s/k%d", ids[k%3], k),
							Limit: bucket.Limit{Algorithm: algo, Requests: limit, Unit: int64(time.Minute)}, Hits: 1}
						if r := apply1(nodes[id].f, nodes[id].now, op); !r.Over {
							allowed[k]++
						}
					}
				}
			}
			for k, got := range allowed {
				if got != limit {
					key := fmt.Appendf(nil, "%s/k%d", ids[k%3], k)
					var held []string
					for _, id := range ids {
						if s := nodes[id].f.leases.get(key, false); s != nil {
							if l := s.cur.Load(); l != nil {
								held = append(held, fmt.Sprintf("%s: %d left of %d (base %d, short %v, holds %v)", id, l.left.Load(), l.granted, l.base, l.short, l.peer.holds()))
							}
						}
					}
					t.Errorf("key %d: %d allowed, want exactly %d; leases %v", k, got, limit, held)
				}
			}
			var used float64
			for _, n := range nodes {
				used += leaseMetric(t, n.reg, "ringlimit_leased_hits_total", "used")
			}
			if used == 0 {
				t.Error("no hit was decided from a lease")
			}
		})
	}
}

func TestLeaseReturnedOnDemand(t *testing.T) {
	nodes, stores := leaseCluster(t, []string{"a", "b"}, time.Minute)
	a, b := nodes["a"], nodes["b"]
	op := bucket.Op{Key: []byte("b/k"), Limit: bucket.Limit{Requests: 1000, Unit: int64(time.Minute)}, Hits: 1}
	apply1(a.f, a.now, op)
	apply1(a.f, a.now, op) // one hit from the lease
	a.f.ReturnLeases(context.Background())
	if st, _ := stores["b"].Get(b.now, []byte("b/k")); st.Count != 2 {
		t.Errorf("owner counts %d after the return, want the 2 hits", st.Count)
	}
	if got := leaseMetric(t, b.reg, "ringlimit_lease_releases_total", "taken"); got != 1 {
		t.Errorf("b took %v releases, want 1", got)
	}
	if got := leaseMetric(t, a.reg, "ringlimit_leased_hits_total", "returned"); got != leaseMinWant-1 {
		t.Errorf("a returned %v hits, want %d", got, leaseMinWant-1)
	}
	// After ReturnLeases the node asks for no more.
	apply1(a.f, a.now, op)
	if st, _ := stores["b"].Get(b.now, []byte("b/k")); st.Count != 3 {
		t.Errorf("owner counts %d, want 3: no new lease", st.Count)
	}
}

func TestLeaseReleaseRefusedAfterNewEpoch(t *testing.T) {
	nodes, stores := leaseCluster(t, []string{"a", "b"}, time.Minute)
	a, b := nodes["a"], nodes["b"]
	op := bucket.Op{Key: []byte("b/k"), Limit: bucket.Limit{Requests: 1000, Unit: int64(time.Minute)}, Hits: 1}
	apply1(a.f, a.now, op)
	b.f.NewLeaseEpoch() // b's ring changed, or b restarted
	a.f.ReturnLeases(context.Background())
	if st, _ := stores["b"].Get(b.now, []byte("b/k")); st.Count != 1+leaseMinWant {
		t.Errorf("owner counts %d, want %d: the lease stays used", st.Count, 1+leaseMinWant)
	}
	if got := leaseMetric(t, b.reg, "ringlimit_lease_releases_total", "refused"); got != 1 {
		t.Errorf("b refused %v releases, want 1", got)
	}
	if got := leaseMetric(t, a.reg, "ringlimit_leased_hits_total", "expired"); got != leaseMinWant {
		t.Errorf("a lost %v hits, want %d", got, leaseMinWant)
	}
}

func TestLeaseShrinksNearTheLimit(t *testing.T) {
	nodes, stores := leaseCluster(t, []string{"a", "b"}, time.Minute)
	a, b := nodes["a"], nodes["b"]
	// 21 left of 30 after 9 hits: at most 21/(2*2) = 5 leased, fewer than
	// one op of 9, so none; 20 left after one more hit: 5 leased.
	op := bucket.Op{Key: []byte("b/k"), Limit: bucket.Limit{Requests: 30, Unit: int64(time.Minute)}, Hits: 9}
	apply1(a.f, a.now, op)
	op.Hits = 1
	apply1(a.f, a.now, op)
	if st, _ := stores["b"].Get(b.now, []byte("b/k")); st.Count != 10+5 {
		t.Errorf("owner counts %d, want 10 hits + 5 leased", st.Count)
	}
	// Fewer than 4*2 left: nothing is leased, the owner decides.
	op.Hits = 8
	apply1(b.f, b.now, op) // 23 counted
	for range 4 {
		apply1(a.f, a.now, bucket.Op{Key: op.Key, Limit: op.Limit, Hits: 1})
	}
	leaseSettle(t, a.f, op.Key)
	granted := leaseMetric(t, b.reg, "ringlimit_lease_granted_hits_total", "")
	before := granted
	op.Hits = 1
	r := apply1(a.f, a.now, op)
	if granted = leaseMetric(t, b.reg, "ringlimit_lease_granted_hits_total", ""); granted != before {
		t.Errorf("leased %v more hits with %d left", granted-before, r.Remaining)
	}
}

func TestLeaseNotForTokenBucketsOrPeeks(t *testing.T) {
	nodes, _ := leaseCluster(t, []string{"a", "b"}, time.Minute)
	a, b := nodes["a"], nodes["b"]
	for _, op := range []bucket.Op{
		{Key: []byte("b/t"), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Requests: 1000, Unit: int64(time.Minute)}, Hits: 1},
		{Key: []byte("b/p"), Limit: bucket.Limit{Requests: 1000, Unit: int64(time.Minute)}, Hits: 1, Mode: bucket.Peek},
		{Key: []byte("b/z"), Limit: bucket.Limit{Requests: 1000, Unit: int64(time.Minute)}},
	} {
		for range 3 {
			apply1(a.f, a.now, op)
		}
	}
	if got := leaseMetric(t, b.reg, "ringlimit_lease_grants_total", ""); got != 0 {
		t.Errorf("%v leases granted, want none", got)
	}
	if got := leaseMetric(t, a.reg, "ringlimit_forwarded_decisions_total", ""); got != 9 {
		t.Errorf("%v forwarded, want all 9", got)
	}
}

func TestLeaseEndsWithItsWindow(t *testing.T) {
	nodes, stores := leaseCluster(t, []string{"a", "b"}, time.Hour)
	a, b := nodes["a"], nodes["b"]
	unit := int64(time.Minute)
	op := bucket.Op{Key: []byte("b/k"), Limit: bucket.Limit{Requests: 1000, Unit: unit}, Hits: 1}
	apply1(a.f, a.now, op)
	// The next window, on both clocks: a's lease has ended with it.
	a.clock.Add(time.Minute)
	b.clock.Add(time.Minute)
	now := a.now + unit
	if r := apply1(a.f, now, op); r.Count != 1 {
		t.Fatalf("first hit of the next window: %+v, want count 1 (decided by b)", r)
	}
	if st, _ := stores["b"].Get(b.now+unit, []byte("b/k")); st.Count != 1+leaseMinWant {
		t.Errorf("owner counts %d in the new window, want the hit and a new lease", st.Count)
	}
	a.f.sweep(context.Background(), now, true)
	if got := leaseMetric(t, a.reg, "ringlimit_leased_hits_total", "expired"); got != leaseMinWant {
		t.Errorf("%v hits expired, want the first lease's %d", got, leaseMinWant)
	}
}

func TestLeaseIdleReturns(t *testing.T) {
	nodes, stores := leaseCluster(t, []string{"a", "b"}, time.Hour)
	a, b := nodes["a"], nodes["b"]
	// A key far from its limit keeps its lease while idle.
	far := bucket.Op{Key: []byte("b/far"), Limit: bucket.Limit{Requests: 1000, Unit: int64(time.Hour)}, Hits: 1}
	apply1(a.f, a.now, far)
	a.f.sweep(context.Background(), a.now+int64(time.Minute), false)
	if st, _ := stores["b"].Get(b.now, far.Key); st.Count != 1+leaseMinWant {
		t.Fatalf("owner counts %d, want the far key's lease still out", st.Count)
	}
	// One past half its limit: an idle lease goes back. 200 - 101 left,
	// so the lease is the whole first ask.
	op := bucket.Op{Key: []byte("b/k"), Limit: bucket.Limit{Requests: 200, Unit: int64(time.Hour)}, Hits: 100}
	apply1(b.f, b.now, op)
	op.Hits = 1
	apply1(a.f, a.now, op)
	a.f.sweep(context.Background(), a.now+int64(leaseIdleMin), false) // not idle yet: no hit taken, 4*leaseIdleMin
	if st, _ := stores["b"].Get(b.now, op.Key); st.Count != 101+min(leaseMinWant, 99/4) {
		t.Fatalf("owner counts %d, want the lease still out", st.Count)
	}
	a.f.sweep(context.Background(), a.now+int64(4*leaseIdleMin), false)
	if st, _ := stores["b"].Get(b.now, op.Key); st.Count != 101 {
		t.Errorf("owner counts %d after the idle lease's return, want 101", st.Count)
	}
}

func TestLeaseNotUsedWhileItsOwnerIsSuspect(t *testing.T) {
	nodes, _ := leaseCluster(t, []string{"a", "b"}, time.Minute)
	a := nodes["a"]
	op := bucket.Op{Key: []byte("b/k"), Limit: bucket.Limit{Requests: 1000, Unit: int64(time.Minute)}, Hits: 1}
	apply1(a.f, a.now, op)
	p := (*a.f.peers.Load())["b"]
	p.suspect.Store(true)
	used := leaseMetric(t, a.reg, "ringlimit_leased_hits_total", "used")
	apply1(a.f, a.now, op)
	if got := leaseMetric(t, a.reg, "ringlimit_leased_hits_total", "used"); got != used {
		t.Errorf("a hit was taken from a lease of a suspect owner")
	}
	a.f.sweep(context.Background(), a.now, false)
	if got := leaseMetric(t, a.reg, "ringlimit_leased_hits_total", "expired") + leaseMetric(t, a.reg, "ringlimit_leased_hits_total", "returned"); got != leaseMinWant {
		t.Errorf("the suspect owner's lease ended with %v hits given back or lost, want %d", got, leaseMinWant)
	}
}

// TestLeaseHitAllocs: a hit decided from a lease allocates nothing.
func TestLeaseHitAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	nodes, _ := leaseCluster(t, []string{"a", "b"}, time.Minute)
	a := nodes["a"]
	ops := []bucket.Op{{Key: []byte("b/k"), Limit: bucket.Limit{Requests: 1 << 40, Unit: int64(time.Minute)}, Hits: 1}}
	res := make([]bucket.Result, 1)
	ctx := context.Background()
	// Grow the lease past the runs below: each renewal doubles it.
	slot := func() *lease {
		if s := a.f.leases.get(ops[0].Key, false); s != nil {
			return s.cur.Load()
		}
		return nil
	}
	for range 100 {
		if l := slot(); l != nil && l.left.Load() > 600 {
			break
		}
		for range 200 {
			a.f.Apply(ctx, a.now, ops, res)
		}
		leaseSettle(t, a.f, ops[0].Key)
	}
	if l := slot(); l == nil || l.left.Load() <= 600 {
		t.Fatal("no lease with more than 600 hits left")
	}
	used := leaseMetric(t, a.reg, "ringlimit_leased_hits_total", "used")
	allocs := testing.AllocsPerRun(500, func() { a.f.Apply(ctx, a.now, ops, res) })
	if got := leaseMetric(t, a.reg, "ringlimit_leased_hits_total", "used"); got < used+500 {
		t.Fatalf("only %v of the 501 runs were decided from the lease", got-used)
	}
	if allocs != 0 {
		t.Errorf("a hit decided from a lease allocates %v times, want 0", allocs)
	}
}

func TestLeaseInWholeOps(t *testing.T) {
	nodes, _ := leaseCluster(t, []string{"a", "b"}, time.Minute)
	a, b := nodes["a"], nodes["b"]
	op := bucket.Op{Key: []byte("b/k"), Limit: bucket.Limit{Requests: 1000, Unit: int64(time.Minute)}, Hits: 3}
	apply1(a.f, a.now, op)
	// Asked for leaseMinWant: granted whole ops of 3.
	if got := leaseMetric(t, b.reg, "ringlimit_lease_granted_hits_total", ""); got != leaseMinWant-leaseMinWant%3 {
		t.Errorf("leased %v hits for ops of 3, want %d", got, leaseMinWant-leaseMinWant%3)
	}
}
