package chaos

import (
	"context"
	"encoding/base64"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ringlimit/ringlimit/cluster/membership"
)

// secondConfig limits every value of key "k" to 10 per second: under
// steady load every second is a fresh window that is used up, so two rings
// counting apart would show as more than 10 allowed in a second.
const secondConfig = `domain: chaos
descriptors:
  - key: k
    rate_limit:
      unit: second
      requests_per_unit: 10
`

// keyFile is one node's --gossip-key-file, rewritten as an operator would:
// a plain file replaced by a rename, or (secret) a Kubernetes Secret
// mount, where the kubelet writes a new timestamped directory and swaps the
// ..data symlink to it.
type keyFile struct {
	dir, path string
	secret    bool
	version   int
}

func newKeyFile(t *testing.T, dir string, secret bool) *keyFile {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	k := &keyFile{dir: dir, path: filepath.Join(dir, "gossip.key"), secret: secret}
	if secret {
		if err := os.Symlink(filepath.Join("..data", "gossip.key"), k.path); err != nil {
			t.Fatal(err)
		}
	}
	return k
}

// write replaces the file's content with keys, one per line.
func (k *keyFile) write(t *testing.T, keys ...string) {
	t.Helper()
	text := "# gossip keys, the primary first\n" + strings.Join(keys, "\n") + "\n"
	k.version++
	if !k.secret {
		tmp := k.path + ".tmp"
		if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, k.path); err != nil {
			t.Fatal(err)
		}
		return
	}
	ts := fmt.Sprintf("..2026_12_03_00_00_%02d", k.version)
	if err := os.Mkdir(filepath.Join(k.dir, ts), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(k.dir, ts, "gossip.key"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ts, filepath.Join(k.dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(k.dir, "..data_tmp"), filepath.Join(k.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if k.version > 1 {
		if err := os.RemoveAll(filepath.Join(k.dir, fmt.Sprintf("..2026_12_03_00_00_%02d", k.version-1))); err != nil {
			t.Fatal(err)
		}
	}
}

// windowCount is what the clients saw of one key in one one-second window.
type windowCount struct {
	ok, over int // answers both sent and received within the window
	okAround int // OK answers to calls that straddled one of its edges
}

// TestGossipKeyRotationKeepsOneRing rotates the gossip key of a live
// three-node cluster under steady load, the way docs/security.md says:
// each node's key file gets the new key as a second line, then first, then
// alone, one node at a time (node 0's file is a Kubernetes Secret mount,
// updated by a ..data swap). Every node's ring holds all three members at
// every poll from start to end, no node logs gossip it cannot decrypt, and
// every key is allowed exactly its limit in every one-second window. Each
// step is held for a while after its first node (the mixed state: one node
// ahead of the others) so that a split would have time to show; -short
// holds it briefly.
func TestGossipKeyRotationKeepsOneRing(t *testing.T) {
	hold := 6 * time.Second // beyond memberlist's failure detection (~5-7 s)
	if testing.Short() {
		hold = time.Second
	}
	const (
		limit   = 10
		keys    = 4
		workers = 4
		pace    = 10 * time.Millisecond // per worker: ~100 calls a second per key
	)
	raw := func(b byte) []byte {
		k := make([]byte, 32)
		for i := range k {
			k[i] = b + byte(i)
		}
		return k
	}
	oldKey, newKey := raw(1), raw(101)
	old64, new64 := base64.StdEncoding.EncodeToString(oldKey), base64.StdEncoding.EncodeToString(newKey)
	oldFP, newFP := membership.KeyFingerprint(oldKey), membership.KeyFingerprint(newKey)

	c := layoutCluster(t, 3, secondConfig)
	files := make([]*keyFile, len(c.Nodes))
	for i, n := range c.Nodes {
		files[i] = newKeyFile(t, filepath.Join(c.Dir, n.ID+"-secret"), i == 0)
		files[i].write(t, old64)
		n.ExtraArgs = append(n.ExtraArgs, "--gossip-key-file", files[i].path)
	}
	if err := c.StartAll(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := WaitRing(30*time.Second, c.Nodes, c.Nodes); err != nil {
		t.Fatal(err)
	}

	// Every node's ring, polled until the end: any poll that answers with
	// another ring is a split.
	want := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		want[i] = n.ID
	}
	slices.Sort(want)
	var (
		pollMu   sync.Mutex
		polls    int
		badRings []string
	)
	stopPoll := make(chan struct{})
	var pollWG sync.WaitGroup
	pollWG.Add(1)
	go func() {
		defer pollWG.Done()
		for {
			for _, n := range c.Nodes {
				got, err := n.RingMembers()
				if err != nil {
					continue // a slow answer is not a split
				}
				pollMu.Lock()
				polls++
				if !slices.Equal(got, want) && len(badRings) < 20 {
					badRings = append(badRings, fmt.Sprintf("%s sees %v", n.ID, got))
				}
				pollMu.Unlock()
			}
			select {
			case <-stopPoll:
				return
			case <-time.After(100 * time.Millisecond): // polling interval
			}
		}
	}()

	// Steady hits at a few keys, each to a random node; every call is
	// timed on this machine's clock, which the nodes share.
	type call struct {
		key        int
		t0, t1     time.Time
		ok, failed bool
	}
	cls := dialAll(t, c.Nodes)
	var (
		callMu sync.Mutex
		calls  []call
	)
	stopLoad := make(chan struct{})
	var loadWG sync.WaitGroup
	var failed atomic.Int64
	loadStart := time.Now()
	for w := 0; w < workers; w++ {
		loadWG.Add(1)
		go func(seed int64) {
			defer loadWG.Done()
			rnd := rand.New(rand.NewSource(seed))
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for {
				select {
				case <-stopLoad:
					return
				case <-tick.C:
				}
				k := rnd.Intn(keys)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				t0 := time.Now()
				resp, err := cls[rnd.Intn(len(cls))].ShouldRateLimit(ctx, Request("chaos", "k", fmt.Sprintf("rot-%d", k)))
				t1 := time.Now()
				cancel()
				if err != nil {
					failed.Add(1)
				}
				callMu.Lock()
				calls = append(calls, call{key: k, t0: t0, t1: t1, ok: err == nil && resp.OverallCode == pb.RateLimitResponse_OK, failed: err != nil})
				callMu.Unlock()
			}
		}(int64(w))
	}

	// The rotation, one node at a time; each change is seen applied in the
	// node's /debug/cluster before the next.
	steps := []struct {
		name string
		file []string // the file's keys
		fps  []string // the node's keys afterwards, primary first
	}{
		{"add the new key", []string{old64, new64}, []string{oldFP, newFP}},
		{"make it primary", []string{new64, old64}, []string{newFP, oldFP}},
		{"remove the old key", []string{new64}, []string{newFP}},
	}
	rotStart := time.Now()
	for _, st := range steps {
		for i, n := range c.Nodes {
			files[i].write(t, st.file...)
			err := poll(20*time.Second, func() (bool, string) {
				got, err := n.GossipKeys()
				return err == nil && slices.Equal(got, st.fps), fmt.Sprintf("%s holds %v (%v), want %v", n.ID, got, err, st.fps)
			})
			if err != nil {
				t.Fatalf("%s: %v; log:\n%s", st.name, err, tail(n.LogPath, 30))
			}
			if i == 0 {
				time.Sleep(hold) // keeps the mixed state for the pollers and the load: a wait for failure detection, not for a process
			}
		}
		t.Logf("%s: done on every node %v into the rotation", st.name, time.Since(rotStart).Round(time.Millisecond))
	}
	time.Sleep(time.Second) // one more window of load in the final state
	close(stopLoad)
	loadWG.Wait()
	loadEnd := time.Now()
	close(stopPoll)
	pollWG.Wait()

	pollMu.Lock()
	if len(badRings) > 0 {
		t.Errorf("the ring split during the rotation (%d polls): %v", polls, badRings)
	} else if polls < 3*len(c.Nodes) {
		t.Errorf("only %d ring polls answered", polls)
	} else {
		t.Logf("%d ring polls, every one with all %d members", polls, len(want))
	}
	pollMu.Unlock()
	if f := failed.Load(); f > 0 {
		t.Errorf("%d calls failed", f)
	}

	// Exact counts: in each key's one-second windows, the OK answers sent
	// and received within the window are at most the limit, and where the
	// window was used up (an OVER_LIMIT within it) the limit is reached
	// counting the OK answers that straddled its edges.
	sec := func(t time.Time) int64 { return t.UnixNano() / int64(time.Second) }
	counts := map[[2]int64]*windowCount{}
	at := func(k int, w int64) *windowCount {
		wc := counts[[2]int64{int64(k), w}]
		if wc == nil {
			wc = &windowCount{}
			counts[[2]int64{int64(k), w}] = wc
		}
		return wc
	}
	for _, cl := range calls {
		if cl.failed {
			continue
		}
		w0, w1 := sec(cl.t0), sec(cl.t1)
		switch {
		case w0 == w1 && cl.ok:
			at(cl.key, w0).ok++
		case w0 == w1:
			at(cl.key, w0).over++
		case cl.ok:
			for w := w0; w <= w1; w++ {
				at(cl.key, w).okAround++
			}
		}
	}
	full := 0
	for kw, wc := range counts {
		if wc.ok > limit {
			t.Errorf("key rot-%d, second %d: %d allowed, limit %d", kw[0], kw[1], wc.ok, limit)
		}
		if wc.over > 0 && wc.ok+wc.okAround < limit {
			t.Errorf("key rot-%d, second %d: used up after only %d allowed (%d more straddling its edges), limit %d", kw[0], kw[1], wc.ok, wc.okAround, limit)
		}
		if wc.over > 0 && wc.ok == limit {
			full++
		}
	}
	t.Logf("%d calls over %v; %d key-seconds, %d used up with exactly %d allowed", len(calls), loadEnd.Sub(loadStart).Round(time.Millisecond), len(counts), full, limit)
	if full == 0 {
		t.Error("no window was used up: the load was too thin to check counts")
	}

	for _, n := range c.Nodes {
		b, err := os.ReadFile(n.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		log := string(b)
		if strings.Contains(log, "cannot decrypt") {
			t.Errorf("%s logged gossip it cannot decrypt:\n%s", n.ID, tail(n.LogPath, 30))
		}
		if !strings.Contains(log, `"cluster: gossip keys reloaded" primary=`+newFP) {
			t.Errorf("%s has no log line naming the new primary key %s", n.ID, newFP)
		}
		for _, k := range []string{old64, new64} {
			if strings.Contains(log, k) {
				t.Errorf("%s logged a gossip key", n.ID)
			}
		}
	}
	if cr := c.Crashes(); len(cr) > 0 {
		t.Errorf("crashes: %v", cr)
	}
}
