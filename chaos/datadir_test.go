package chaos

import (
	"context"
	"fmt"
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
)

// hourConfig limits every value of key "k" to 50 per hour: windows that a
// restart of the whole cluster (seconds) does not outlast, and that
// --data-dir saves.
const hourConfig = `domain: chaos
descriptors:
  - key: k
    rate_limit:
      unit: hour
      requests_per_unit: 50
`

// TestClusterFullRestartKeepsCounts: every node of a three-node cluster
// with --data-dir restarts at once, first with SIGTERM, then with SIGKILL a
// second after the last hits, and the hour-window counts survive both: a
// key used to 60% of its limit before the restart allows at most the rest
// (5% slack) after it. Without --data-dir every key would start again from
// zero and allow its whole limit once more.
func TestClusterFullRestartKeepsCounts(t *testing.T) {
	const (
		keys   = 40
		limit  = 50
		before = 30 // 60% of the limit, before the restart
		after  = 40 // then this many more: beyond the limit
		most   = limit * 105 / 100
	)
	c := layoutCluster(t, 3, hourConfig)
	for _, n := range c.Nodes {
		n.ExtraArgs = append(n.ExtraArgs, "--data-dir", filepath.Join(c.Dir, n.ID+"-data"))
	}
	if err := c.StartAll(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := WaitRing(30*time.Second, c.Nodes, c.Nodes); err != nil {
		t.Fatal(err)
	}

	restartAll := func(sig syscall.Signal) {
		t.Helper()
		start := time.Now()
		for _, n := range c.Nodes {
			if err := n.signal(sig, true); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range c.Nodes {
			if err := n.Wait(60 * time.Second); err != nil {
				t.Fatal(err)
			}
			if err := n.ExitErr(); sig == syscall.SIGTERM && err != nil {
				t.Errorf("%s: exit after SIGTERM: %v", n.ID, err)
			}
		}
		stopped := time.Now()
		if err := c.StartAll(60 * time.Second); err != nil {
			t.Fatal(err)
		}
		if err := WaitRing(60*time.Second, c.Nodes, c.Nodes); err != nil {
			t.Fatal(err)
		}
		t.Logf("%v to every node: stopped in %v, one ring again %v later", sig, stopped.Sub(start).Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond))
	}

	var term []string
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{{"term", syscall.SIGTERM}, {"kill", syscall.SIGKILL}} {
		// The counts must stay in one hour window from the first hit to the
		// last check: a phase takes well under a minute.
		if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 90*time.Second {
			t.Logf("%v left in this hour's window: waiting for the next one", left.Round(time.Second))
			time.Sleep(left + time.Second) // waits for the wall clock, not for a process
		}
		hour := time.Now().Truncate(time.Hour)
		names := make([]string, keys)
		for i := range names {
			names[i] = fmt.Sprintf("%s-%d", tc.name, i)
		}
		first := hitKeys(t, dialAll(t, c.Nodes), names, before)
		last := time.Now()
		for i, got := range first {
			if got != before {
				t.Errorf("%s: %d of %d hits allowed before the restart, want all (limit %d)", names[i], got, before, limit)
			}
		}
		if tc.sig == syscall.SIGKILL {
			time.Sleep(time.Until(last.Add(time.Second))) // the scenario: killed a second after the last hits
		}
		restartAll(tc.sig)
		second := hitKeys(t, dialAll(t, c.Nodes), names, after)
		var refusedTerm []int
		if tc.sig == syscall.SIGKILL {
			// The first phase's keys, at their limit, survived this restart too.
			refusedTerm = hitKeys(t, dialAll(t, c.Nodes), term, 1)
		}
		if now := time.Now(); !now.Truncate(time.Hour).Equal(hour) {
			t.Skipf("%s: the hour window turned during the phase (%v to %v): counts restart by design", tc.name, hour, now)
		}
		for i := range names {
			if total := first[i] + second[i]; total > most {
				t.Errorf("%s after %v to every node: %d allowed in the hour (%d before the restart, %d after), limit %d, at most %d", names[i], tc.sig, total, first[i], second[i], limit, most)
			}
		}
		for i, got := range refusedTerm {
			if got != 0 {
				t.Errorf("%s: allowed again after the second restart", term[i])
			}
		}
		t.Logf("%s: per key, %d allowed before the restart; after it %v", tc.name, before, second)
		term = names
	}
	for _, n := range c.Nodes {
		b, err := os.ReadFile(n.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(string(b), "data-dir: restored saved counters"); got != 2 {
			t.Errorf("%s restored its saved counters %d times in two restarts; log:\n%s", n.ID, got, tail(n.LogPath, 40))
		}
	}
	if cr := c.Crashes(); len(cr) > 0 {
		t.Errorf("unexpected exits: %v", cr)
	}
}

// hitKeys sends perKey hits for each key (domain chaos, "k"=key), each to a
// random node, 16 at a time, and returns how many of each key's hits were
// allowed. A failed call fails the test.
func hitKeys(t *testing.T, cls []pb.RateLimitServiceClient, keys []string, perKey int) []int {
	t.Helper()
	allowed := make([]atomic.Int64, len(keys))
	var failed atomic.Int64
	work := make(chan int, len(keys)*perKey)
	for h := 0; h < perKey; h++ {
		for k := range keys {
			work <- k
		}
	}
	close(work)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rnd := rand.New(rand.NewSource(seed))
			for k := range work {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := cls[rnd.Intn(len(cls))].ShouldRateLimit(ctx, Request("chaos", "k", keys[k]))
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
		t.Errorf("%d of %d calls failed", f, len(keys)*perKey)
	}
	out := make([]int, len(keys))
	for i := range allowed {
		out[i] = int(allowed[i].Load())
	}
	return out
}
