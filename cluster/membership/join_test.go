package membership

import (
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
)

func TestMembershipJoinRetriesUntilSeedExists(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		n := newTestNet(t)
		seed := n.reserve()
		b := startNode(t, n, "b", []string{seed})
		testkit.WaitFor(t, quick, "a failed join attempt", func() bool { return b.JoinError() != nil })
		if b.Joined() {
			t.Fatal("Joined() = true before the seed exists")
		}
		testkit.WaitFor(t, quick, "the join warning", func() bool { return b.logs.Count(slog.LevelWarn, "join failed") >= 1 })
		if n := b.logs.Count(slog.LevelWarn, "join failed"); n != 1 {
			t.Errorf("want one warning for the failing join, got %d", n)
		}

		a := startNode(t, n, "a", nil, func(c *Config, _ *recorder) { c.Transport = n.transportAt(seed) })
		testkit.WaitFor(t, quick, "b to join the seed", b.Joined)
		for _, o := range []*testNode{a, b} {
			testkit.WaitFor(t, quick, o.Self().ID+" to see a and b", func() bool {
				return hasIDs(o.Alive(), "a", "b")
			})
		}
		// Joined can turn true while the successful Join call is still
		// returning (a's state arrived first), so poll the recorded error.
		testkit.WaitFor(t, quick, "joinError to clear", func() bool { return b.JoinError() == nil })
	})
}

func TestMembershipRejoinMergesHealedPartition(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		n := newTestNet(t)
		a := startNode(t, n, "a", nil)
		bAddr := n.reserve()
		bTr := n.transportAt(bAddr)
		n.partition([]string{a.Self().Addr}, []string{bAddr})
		// b lists itself and a: reaching only itself counts as joined.
		b := startNode(t, n, "b", []string{bAddr, a.Self().Addr}, func(c *Config, _ *recorder) {
			c.Transport = bTr
			c.RejoinInterval = 200 * time.Millisecond
		})
		testkit.WaitFor(t, quick, "b to join itself", b.Joined)
		if a.numMembers() != 1 || b.numMembers() != 1 {
			t.Fatalf("split cluster: a sees %d, b sees %d", a.numMembers(), b.numMembers())
		}
		n.heal()
		for _, o := range []*testNode{a, b} {
			testkit.WaitFor(t, quick, o.Self().ID+" to merge through the periodic re-join", func() bool {
				return hasIDs(o.Alive(), "a", "b")
			})
		}
	})
}

func TestMembershipSecretKey(t *testing.T) {
	t.Parallel()
	key1 := []byte("0123456789abcdef")
	key2 := []byte("fedcba9876543210fedcba98")
	tests := []struct {
		name       string
		keyA, keyB []byte
		joins      bool
	}{
		{"same key", key1, key1, true},
		{"different keys", key1, key2, false},
		{"joiner has no key", key1, nil, false},
		{"seed has no key", nil, key2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				n := newTestNet(t)
				a := startNode(t, n, "a", nil, func(c *Config, _ *recorder) { c.SecretKey = tt.keyA })
				b := startNode(t, n, "b", []string{a.Self().Addr}, func(c *Config, _ *recorder) { c.SecretKey = tt.keyB })
				if tt.joins {
					for _, o := range []*testNode{a, b} {
						testkit.WaitFor(t, quick, o.Self().ID+" to see a and b", func() bool {
							return hasIDs(o.Alive(), "a", "b")
						})
					}
					return
				}
				testkit.WaitFor(t, quick, "b's join to fail", func() bool { return b.JoinError() != nil })
				if b.Joined() || a.numMembers() != 1 || b.numMembers() != 1 {
					t.Fatalf("mismatched keys joined: b.Joined=%v a sees %d b sees %d", b.Joined(), a.numMembers(), b.numMembers())
				}
				// The warning follows the published error: wait for it, then
				// check it came once.
				testkit.WaitFor(t, quick, "the join warning", func() bool { return b.logs.Count(slog.LevelWarn, "join failed") >= 1 })
				if n := b.logs.Count(slog.LevelWarn, "join failed"); n != 1 {
					t.Errorf("join failure reported %d times at warn level, want once", n)
				}
				t.Logf("reported: %v", b.JoinError())
			})
		})
	}
}

// Nodes with another cluster label (or none) cannot join: their gossip is
// dropped, so two clusters that can reach each other never merge.
func TestMembershipLabelKeepsClustersApart(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		n := newTestNet(t)
		label := func(l string) func(*Config, *recorder) {
			return func(c *Config, _ *recorder) { c.Label = l }
		}
		a := startNode(t, n, "a", nil, label("blue"))
		same := startNode(t, n, "b", []string{a.Self().Addr}, label("blue"))
		other := startNode(t, n, "c", []string{a.Self().Addr}, label("green"))
		none := startNode(t, n, "d", []string{a.Self().Addr})
		testkit.WaitFor(t, quick, "b to join a", func() bool { return hasIDs(a.Alive(), "a", "b") && same.Joined() })
		for _, o := range []*testNode{other, none} {
			testkit.WaitFor(t, quick, o.Self().ID+"'s join to fail", func() bool { return o.JoinError() != nil })
			if o.Joined() || o.numMembers() != 1 {
				t.Errorf("%s (another label) joined: Joined=%v numMembers=%d", o.Self().ID, o.Joined(), o.numMembers())
			}
		}
		if got := a.Alive(); len(got) != 2 {
			t.Errorf("a sees %v, want only a and b", idsOf(got))
		}

		if _, err := New(Config{ID: "x", GRPCAddr: "127.0.0.1:1", BindAddr: "127.0.0.1:0", Label: strings.Repeat("l", 256)}, nil); err == nil ||
			!strings.Contains(err.Error(), "Label") {
			t.Errorf("a 256-byte label: %v, want an error naming Label", err)
		}
	})
}
