package membership

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
)

// hold is how long each intermediate keyring state of a rotation is kept
// (virtual time): well beyond the 3-5 s in which Preset "local" declares
// an unreachable member dead, so a state in which two members cannot
// decrypt each other's gossip would show.
const hold = 15 * time.Second

var (
	oldKey = []byte("0123456789abcdef0123456789abcdef")
	newKey = []byte("fedcba9876543210")
)

func withKeys(keys ...[]byte) func(*Config, *recorder) {
	return func(c *Config, _ *recorder) { c.Keys = keys }
}

// A rotation done with the keyring (add the new key everywhere, make it
// primary everywhere, remove the old one), one node at a time, keeps every
// member talking to every other: no onChange ever misses a member, nobody
// logs undecryptable gossip. Afterwards a node with only the old key is
// kept out and one with only the new key joins.
func TestMembershipKeyRotationKeepsOneCluster(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		n := newTestNet(t)
		ids := []string{"a", "b", "c"}
		nodes := startCluster(t, n, ids, withKeys(oldKey))
		seen := make([]int, len(nodes))
		for i, node := range nodes {
			seen[i] = len(node.rec.snapshot())
		}
		steps := []struct {
			name string
			keys [][]byte
		}{
			{"add the new key", [][]byte{oldKey, newKey}},
			{"make it primary", [][]byte{newKey, oldKey}},
			{"remove the old key", [][]byte{newKey}},
		}
		for _, st := range steps {
			for _, node := range nodes {
				if err := node.SetKeys(st.keys); err != nil {
					t.Fatalf("%s: %s: SetKeys: %v", st.name, node.Self().ID, err)
				}
				time.Sleep(hold) // virtual: lets probes and gossip run in this mixed state
				for _, o := range nodes {
					if !hasIDs(o.Alive(), ids...) {
						t.Fatalf("%s, after %s: %s sees %v", st.name, node.Self().ID, o.Self().ID, idsOf(o.Alive()))
					}
				}
			}
		}
		for i, node := range nodes {
			for _, call := range node.rec.snapshot()[seen[i]:] {
				if !hasIDs(call, ids...) {
					t.Errorf("%s: onChange(%v) during the rotation", node.Self().ID, idsOf(call))
				}
			}
			if n := node.logs.Count(slog.LevelWarn, "cannot decrypt"); n != 0 {
				t.Errorf("%s logged %d warnings about undecryptable gossip", node.Self().ID, n)
			}
			if got, want := node.KeyFingerprints(), []string{KeyFingerprint(newKey)}; !slices.Equal(got, want) {
				t.Errorf("%s holds keys %v, want %v", node.Self().ID, got, want)
			}
		}

		stale := startNode(t, n, "stale", []string{nodes[0].Self().Addr}, withKeys(oldKey))
		testkit.WaitFor(t, quick, "the old-key node's join to fail", func() bool { return stale.JoinError() != nil })
		if stale.Joined() {
			t.Error("a node with only the removed key joined")
		}
		fresh := startNode(t, n, "d", []string{nodes[0].Self().Addr}, withKeys(newKey))
		testkit.WaitFor(t, quick, "a new-key node to join", func() bool { return hasIDs(fresh.Alive(), "a", "b", "c", "d") })
	})
}

// The check above would see a split: switching one node straight to the
// new key (skipping the step that installs it everywhere first) cuts it off.
func TestMembershipKeySwitchWithoutKeyringSplits(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		n := newTestNet(t)
		nodes := startCluster(t, n, []string{"a", "b", "c"}, withKeys(oldKey))
		if err := nodes[0].SetKeys([][]byte{newKey}); err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, detect, "b and c to lose a", func() bool {
			return hasIDs(nodes[1].Alive(), "b", "c") && hasIDs(nodes[2].Alive(), "b", "c")
		})
	})
}

func TestMembershipSetKeys(t *testing.T) {
	t.Parallel()
	k := func(b byte) []byte { return bytes.Repeat([]byte{b}, 16) }
	fps := func(keys ...[]byte) []string {
		out := make([]string, len(keys))
		for i, key := range keys {
			out[i] = KeyFingerprint(key)
		}
		return out
	}
	synctest.Test(t, func(t *testing.T) {
		n := newTestNet(t)
		node := startNode(t, n, "a", nil, withKeys(k(1), k(2), k(3)))
		if got, want := node.KeyFingerprints(), fps(k(1), k(2), k(3)); !slices.Equal(got, want) {
			t.Fatalf("started with %v, want %v", got, want)
		}
		steps := []struct {
			set  [][]byte
			want [][]byte // the keyring after it: the primary, then the others as installed
		}{
			{[][]byte{k(1), k(2), k(3)}, [][]byte{k(1), k(2), k(3)}},
			{[][]byte{k(2), k(1), k(3)}, [][]byte{k(2), k(1), k(3)}},
			{[][]byte{k(2), k(3)}, [][]byte{k(2), k(3)}},             // a key in the middle
			{[][]byte{k(4), k(2), k(4)}, [][]byte{k(4), k(2)}},       // a duplicate
			{[][]byte{k(2)}, [][]byte{k(2)}},                         // the primary goes
			{[][]byte{k(5), k(6), k(2)}, [][]byte{k(5), k(2), k(6)}}, // secondaries in the order installed
			{[][]byte{k(6)}, [][]byte{k(6)}},
		}
		for i, st := range steps {
			if err := node.SetKeys(st.set); err != nil {
				t.Fatalf("step %d: SetKeys: %v", i, err)
			}
			if got, want := node.KeyFingerprints(), fps(st.want...); !slices.Equal(got, want) {
				t.Fatalf("step %d: keys %v, want %v", i, got, want)
			}
		}

		for _, bad := range []struct {
			keys [][]byte
			want string
		}{
			{nil, "keys: no keys"},
			{[][]byte{k(7), []byte("short")}, "keys[1]: 5 bytes"},
		} {
			err := node.SetKeys(bad.keys)
			if err == nil || !strings.HasPrefix(err.Error(), "membership: SetKeys: ") || !strings.Contains(err.Error(), bad.want) {
				t.Errorf("SetKeys(%q): %v, want an error containing %q", bad.keys, err, bad.want)
			}
		}
		if got, want := node.KeyFingerprints(), fps(k(6)); !slices.Equal(got, want) {
			t.Errorf("a refused SetKeys changed the keys to %v", got)
		}

		plain := startNode(t, n, "plain", nil)
		if err := plain.SetKeys([][]byte{k(1)}); err == nil || !strings.Contains(err.Error(), "without a key") {
			t.Errorf("SetKeys on an unencrypted node: %v", err)
		}
		if fp := plain.KeyFingerprints(); fp != nil {
			t.Errorf("unencrypted node has key fingerprints %v", fp)
		}
	})
}
