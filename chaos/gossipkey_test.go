package chaos

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGossipWrongKeyKeptOut starts two nodes sharing one --gossip-key-file
// and a third with another key, all in each other's join lists: the two
// form a ring that never includes the third, and the third says in its log
// that its join failed.
func TestGossipWrongKeyKeptOut(t *testing.T) {
	dir := t.TempDir()
	keyFile := func(name string, b byte) string {
		key := make([]byte, 32)
		for i := range key {
			key[i] = b + byte(i)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, other := keyFile("good.key", 1), keyFile("other.key", 101)
	c := startNodes(t, 3, func(c *Cluster, i int) []string {
		if i == 2 {
			// Only the others to join (the last --join wins): joining
			// itself would succeed and hide the failure.
			return []string{"--gossip-key-file", other, "--join", c.Nodes[0].Gossip + "," + c.Nodes[1].Gossip}
		}
		return []string{"--gossip-key-file", good}
	})
	a, b, stranger := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	for _, n := range []*Node{a, b} {
		if err := n.WaitReady(20 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := WaitRing(30*time.Second, []*Node{a, b}, []*Node{a, b}); err != nil {
		t.Fatal(err)
	}
	// The stranger keeps trying; its failure, and why, must reach its log.
	deadline := time.Now().Add(20 * time.Second)
	for log := tail(stranger.LogPath, 1000); !strings.Contains(log, "join failed") || !strings.Contains(log, "decrypt"); log = tail(stranger.LogPath, 1000) {
		if time.Now().After(deadline) {
			t.Fatalf("the wrong-key node logged no failed join within 20s; its log:\n%s", tail(stranger.LogPath, 40))
		}
		time.Sleep(50 * time.Millisecond) // polling interval of a bounded wait
	}
	// By now it has tried several times: the ring still holds only a and b,
	// on both sides. (A bound, not a pause: WaitRing returns at once when
	// it holds; its status requests may be slow on a busy machine.)
	if err := WaitRing(10*time.Second, []*Node{a, b}, []*Node{a, b}); err != nil {
		t.Fatal(err)
	}
	if got, err := stranger.RingMembers(); err == nil {
		for _, id := range got {
			if id == a.ID || id == b.ID {
				t.Errorf("wrong-key node sees %v in its ring", got)
			}
		}
	}
	logText, _ := os.ReadFile(stranger.LogPath)
	for _, line := range strings.Split(string(logText), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "join failed") {
			t.Logf("wrong-key node logs: %s", line)
			break
		}
	}
	if cr := c.Crashes(); len(cr) > 0 {
		t.Errorf("crashes: %v", cr)
	}
}
