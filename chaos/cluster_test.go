package chaos

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// dayConfig limits every value of key "k" to 50 per day: exact counts
// taken over seconds of real time must not straddle a window edge, and a
// day's edge (midnight UTC) is 24 times rarer than an hour's.
const dayConfig = `domain: chaos
descriptors:
  - key: k
    rate_limit:
      unit: day
      requests_per_unit: 50
`

// layoutCluster lays out n nodes on 127.0.0.1 serving cfg, in a temporary
// directory (c.Dir) that also holds the config, and closes them when the
// test ends. Nothing is started.
func layoutCluster(t *testing.T, n int, cfg string) *Cluster {
	t.Helper()
	dir := t.TempDir()
	cfgDir := filepath.Join(dir, "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ConfigMapDir(cfgDir, map[string]string{"config.yaml": cfg}); err != nil {
		t.Fatal(err)
	}
	c, err := NewCluster(testBin, dir, cfgDir, "127.0.0.1", n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// startCluster starts n nodes serving cfg, with args added to every node's
// flags, and waits for one shared ring.
func startCluster(t *testing.T, n int, cfg string, args ...string) *Cluster {
	t.Helper()
	c := layoutCluster(t, n, cfg)
	c.Args = append(c.Args, args...)
	if err := c.StartAll(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := WaitRing(30*time.Second, c.Nodes, c.Nodes); err != nil {
		t.Fatal(err)
	}
	return c
}

func dialAll(t *testing.T, nodes []*Node) []pb.RateLimitServiceClient {
	t.Helper()
	var cls []pb.RateLimitServiceClient
	for _, n := range nodes {
		conn, cl, err := Dial(n.GRPC)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		cls = append(cls, cl)
	}
	return cls
}

func TestClusterExactAndSurvivesKill(t *testing.T) {
	c := startCluster(t, 3, dayConfig)
	cls := dialAll(t, c.Nodes)
	const keys, hitsPerKey, limit = 40, 100, 50

	// 100 hits per key, each sent to a random node, all concurrently.
	var allowed [keys]atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	work := make(chan int, keys*hitsPerKey)
	for k := 0; k < keys; k++ {
		for h := 0; h < hitsPerKey; h++ {
			work <- k
		}
	}
	close(work)
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rnd := rand.New(rand.NewSource(seed))
			for k := range work {
				// A deadline as Envoy's (the entry node waits up to 250 ms
				// for the owner), but far above any answer: only an error
				// is a failure, not a busy machine's slow answer.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := cls[rnd.Intn(len(cls))].ShouldRateLimit(ctx, Request("chaos", "k", fmt.Sprintf("key-%d", k)))
				cancel()
				if err != nil {
					failed.Add(1)
					continue
				}
				if resp.OverallCode == pb.RateLimitResponse_OK {
					allowed[k].Add(1)
				}
			}
		}(int64(w))
	}
	wg.Wait()
	if f := failed.Load(); f != 0 {
		t.Errorf("%d calls failed", f)
	}
	for _, n := range c.Nodes {
		fb, _ := n.Metric("ringlimit_local_fallbacks_total")
		fbt, _ := n.Metric(`ringlimit_local_fallbacks_total{reason="timeout"`)
		fbs, _ := n.Metric(`ringlimit_local_fallbacks_total{reason="suspect"`)
		t.Logf("%s: timeouts %v suspect %v", n.ID, fbt, fbs)
		fw, _ := n.Metric("ringlimit_forwarded_decisions_total")
		t.Logf("%s: %v forwarded, %v local fallbacks", n.ID, fw, fb)
	}
	// Exact, unless an owner stalled past the entry nodes' 250 ms cap on a
	// loaded machine: each local fallback may move one key's count by one.
	var fallbacks float64
	for _, n := range c.Nodes {
		fb, _ := n.Metric("ringlimit_local_fallbacks_total")
		fallbacks += fb
	}
	for k := range allowed {
		if got := allowed[k].Load(); got != limit && math.Abs(float64(got-limit)) > fallbacks {
			t.Errorf("key-%d: %d allowed with %v local fallbacks in all, want exactly %d", k, got, fallbacks, limit)
		}
	}

	// SIGKILL one node; calls to the survivors never fail.
	if err := c.Nodes[2].Kill(); err != nil {
		t.Fatal(err)
	}
	var calls, late atomic.Int64
	deadline := time.Now().Add(4 * time.Second)
	var wg2 sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg2.Add(1)
		go func(w int) {
			defer wg2.Done()
			cl := cls[w%2]
			for i := 0; time.Now().Before(deadline) && i < 20000; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				_, err := cl.ShouldRateLimit(ctx, Request("chaos", "k", fmt.Sprintf("after-%d", i%200)), grpc.WaitForReady(false))
				cancel()
				calls.Add(1)
				if err != nil {
					failed.Add(1)
				} else if time.Since(start) > 20*time.Millisecond {
					late.Add(1)
				}
			}
		}(w)
	}
	wg2.Wait()
	t.Logf("after SIGKILL: %d calls to survivors, %d failed, %d slower than 20 ms", calls.Load(), failed.Load(), late.Load())
	if f := failed.Load(); f != 0 {
		t.Errorf("%d calls to survivors failed after a SIGKILL", f)
	}
	if cr := c.Crashes(); len(cr) > 0 {
		t.Errorf("unexpected exits: %v", cr)
	}
}

// A SIGTERM ends the process within its drain and a short grace even while
// a peer that holds open DecideStreams to it is frozen: the gRPC server's
// graceful stop must not wait for streams that peer cannot close.
func TestClusterTermWithFrozenPeer(t *testing.T) {
	const shutdownTimeout = time.Minute
	c := startCluster(t, 3, dayConfig, "--shutdown-timeout", shutdownTimeout.String())
	// Traffic through every node opens every node's streams to the others.
	cls := dialAll(t, c.Nodes)
	for i := range 60 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := cls[i%len(cls)].ShouldRateLimit(ctx, Request("chaos", "k", fmt.Sprintf("term-%d", i)))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	frozen, leaving := c.Nodes[1], c.Nodes[0]
	if err := frozen.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer frozen.Thaw()
	start := time.Now()
	if err := leaving.Stop(shutdownTimeout + 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// The drain gives up on the frozen peer within seconds; the bound is
	// far below --shutdown-timeout, which is what an unbounded graceful
	// stop took.
	took := time.Since(start)
	t.Logf("SIGTERM to exit with a frozen peer: %v", took)
	if took >= shutdownTimeout/2 {
		t.Errorf("SIGTERM with a frozen peer took %v to exit, want well under --shutdown-timeout %v", took, shutdownTimeout)
	}
}

// TestClusterStopsAtOnce: when every node gets SIGTERM at the same time (a
// StatefulSet scaled to zero, Ctrl-C on make run), each exits promptly. The
// last one used to wait out half its --shutdown-timeout for a leave
// broadcast that no node was left to take.
func TestClusterStopsAtOnce(t *testing.T) {
	const shutdownTimeout = time.Minute
	c := startCluster(t, 3, dayConfig, "--shutdown-timeout", shutdownTimeout.String())
	start := time.Now()
	for _, n := range c.Nodes {
		if err := n.signal(syscall.SIGTERM, true); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Nodes {
		if err := n.Wait(shutdownTimeout + 10*time.Second); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		t.Logf("%s exited %v after the SIGTERMs", n.ID, took)
		if took >= shutdownTimeout/2 {
			t.Errorf("%s took %v to exit, want well under --shutdown-timeout %v", n.ID, took, shutdownTimeout)
		}
		if err := n.ExitErr(); err != nil {
			t.Errorf("%s: exit after SIGTERM: %v", n.ID, err)
		}
	}
}

// TestClusterDuplicateNodeNameExits: a second process started with a
// --node-name a live member holds (two nodes on one host left to default
// to the hostname, say) must not count as that node: it exits non-zero
// with an error naming the identity and the other member's address, and
// the cluster's counts stay exact.
func TestClusterDuplicateNodeNameExits(t *testing.T) {
	c := startCluster(t, 2, dayConfig)
	first := c.Nodes[0]
	dup, err := c.AddNode("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	dup.ID = first.ID
	if err := c.Start(dup); err != nil {
		t.Fatal(err)
	}
	if err := dup.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if dup.ExitErr() == nil {
		t.Fatal("the duplicate exited 0")
	}
	log, err := os.ReadFile(dup.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), `node name \"`+first.ID+`\" is held by another live member at `+first.GRPC) {
		t.Fatalf("the duplicate's log does not name %s at %s:\n%s", first.ID, first.GRPC, tail(dup.LogPath, 20))
	}
	c.Nodes = c.Nodes[:2] // the duplicate is gone
	if err := WaitRing(30*time.Second, c.Nodes, c.Nodes); err != nil {
		t.Fatal(err)
	}
	cls := dialAll(t, c.Nodes)
	allowed := 0
	for i := range 60 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := cls[i%2].ShouldRateLimit(ctx, Request("chaos", "k", "dup"))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode == pb.RateLimitResponse_OK {
			allowed++
		}
	}
	if allowed != 50 {
		t.Fatalf("%d of 60 hits allowed at limit 50", allowed)
	}
}
