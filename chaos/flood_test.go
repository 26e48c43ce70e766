package chaos

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// rssBytes reads VmRSS of process pid from /proc (Linux only).
func rssBytes(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "VmRSS:") {
			continue
		}
		fs := strings.Fields(line) // "VmRSS:", "12345", "kB"
		if len(fs) != 3 || fs[2] != "kB" {
			return 0, fmt.Errorf("chaos: unexpected VmRSS line %q", line)
		}
		kb, err := strconv.ParseInt(fs[1], 10, 64)
		return kb << 10, err
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("chaos: no VmRSS in /proc/%d/status", pid)
}

// floodIP is the i-th distinct source address (10.x.y.z).
func floodIP(i int) string {
	return fmt.Sprintf("10.%d.%d.%d", (i>>16)&0xff, (i>>8)&0xff, i&0xff)
}

// startNodes lays out n nodes on 127.0.0.1 serving the seed config, gives
// each node i the flags perNode(c, i) (nil: none) and starts them without
// waiting for readiness.
func startNodes(t *testing.T, n int, perNode func(c *Cluster, i int) []string) *Cluster {
	t.Helper()
	c := layoutCluster(t, n, seedConfig)
	for i, nd := range c.Nodes {
		if perNode != nil {
			nd.ExtraArgs = perNode(c, i)
		}
		if err := c.Start(nd); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// TestFloodDistinctKeys sends a flood of distinct keys (rotating
// remote_address values under the seed config) to one node started with a
// small --max-keys, over a few long-lived connections: the node must answer
// every call, stay healthy, keep its store within --max-keys (evicting the
// surplus, each live eviction counted) and its RSS under a generous bound.
// -short floods a quarter of the keys into a tenth of the room.
func TestFloodDistinctKeys(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc to measure RSS")
	}
	keys, maxKeys := 200_000, 20_000
	if testing.Short() {
		keys, maxKeys = 50_000, 5_000
	}
	const (
		conns      = 4                // long-lived connections, as a few Envoys hold
		perConn    = 4                // calls in flight on each
		batch      = 8                // descriptors per request, each a distinct key
		rssBound   = 300 << 20        // generous: the bounded store needs a few MiB
		floodLimit = 60 * time.Second // the flood is bounded in time
	)
	c := startNodes(t, 1, func(*Cluster, int) []string { return []string{"--max-keys", strconv.Itoa(maxKeys)} })
	n := c.Nodes[0]
	if err := n.WaitReady(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	before, err := rssBytes(n.PID())
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), floodLimit)
	defer cancel()
	var next, failed, ok, over atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for ci := 0; ci < conns; ci++ {
		conn, cl, err := Dial(n.GRPC)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for w := 0; w < perConn; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					first := int(next.Add(batch)) - batch
					if first >= keys {
						return
					}
					req := &pb.RateLimitRequest{Domain: "ratelimit"}
					for i := first; i < first+batch && i < keys; i++ {
						req.Descriptors = append(req.Descriptors, &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{
							{Key: "remote_address", Value: floodIP(i)}, {Key: "PATH", Value: "GET/login"},
						}})
					}
					resp, err := cl.ShouldRateLimit(ctx, req)
					if err != nil {
						if failed.Add(1) == 1 {
							firstErr.Store(err)
						}
						continue
					}
					if resp.OverallCode == pb.RateLimitResponse_OK {
						ok.Add(1)
					} else {
						over.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	took := time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("flood of %d keys not done within %v (%d sent)", keys, floodLimit, next.Load())
	}
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d calls failed, first: %v", f, firstErr.Load())
	}
	if o := over.Load(); o > 0 {
		t.Errorf("%d calls over limit: every key is new, each should be allowed", o)
	}
	if err := n.WaitReady(20 * time.Second); err != nil {
		t.Fatalf("unhealthy after the flood: %v", err)
	}
	after, err := rssBytes(n.PID())
	if err != nil {
		t.Fatal(err)
	}
	stored, err := n.Metric("ringlimit_store_keys")
	if err != nil {
		t.Fatal(err)
	}
	expired, _ := n.Metric("ringlimit_store_evictions_expired_total")
	live, err := n.Metric("ringlimit_store_evictions_live_total")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("flood: %d distinct keys in %d calls over %d connections in %v (%.0f keys/s); --max-keys %d",
		keys, ok.Load(), conns, took.Round(time.Millisecond), float64(keys)/took.Seconds(), maxKeys)
	t.Logf("flood: RSS %.1f MiB before, %.1f MiB after (bound %d MiB); store %v keys, evicted %v live + %v expired",
		float64(before)/(1<<20), float64(after)/(1<<20), rssBound>>20, stored, live, expired)
	if stored > float64(maxKeys) || stored == 0 {
		t.Errorf("ringlimit_store_keys = %v, want 1..%d", stored, maxKeys)
	}
	// All keys live in one minute window: everything beyond the bound was
	// a live eviction, and each one is counted.
	if min := float64(keys - maxKeys); live+expired < min {
		t.Errorf("evictions %v live + %v expired, want at least %v", live, expired, min)
	}
	if after > rssBound {
		t.Errorf("RSS after the flood %d MiB, want < %d MiB", after>>20, rssBound>>20)
	}
	if cr := c.Crashes(); len(cr) > 0 {
		t.Errorf("crashes: %v", cr)
	}
}
