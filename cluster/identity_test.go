package cluster

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/lifecycle"
)

// A second process started under a node name a live member holds refuses
// to go ready: it leaves and reports an error naming the identity and the
// other member's address, and the cluster keeps the first one in its rings.
func TestNodeDuplicateIdentityRefuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		nodes := c.cluster([]string{"a", "b"}, nil)
		dup := c.startAt("elsewhere", "a", []string{"b"}, nil)
		var err error
		select {
		case err = <-dup.node.Fatal():
		case <-time.After(time.Minute):
			t.Fatal("the duplicate did not refuse within a minute")
		}
		addr := nodes[0].node.selfAddr
		if !strings.Contains(err.Error(), `"a"`) || !strings.Contains(err.Error(), addr) {
			t.Fatalf("error %q does not name the identity and %s", err, addr)
		}
		if st := dup.node.Status(); st.Phase != lifecycle.Left || st.Ready || st.Route.Serve {
			t.Fatalf("the duplicate: %+v", st)
		}
		nodeWaitRing(t, nodes, nodes)
		for _, m := range nodes[1].node.Membership().Alive() {
			if m.ID == "a" && m.GRPCAddr != addr {
				t.Fatalf("b's view of a: %+v, want the first process at %s", m, addr)
			}
		}
		if r := nodeHit(t, nodes[1], "dup-key", 3); r.Count != 3 {
			t.Fatalf("count %d after 3 hits", r.Count)
		}
	})
}

// A node restarted under its name after its process died, before the
// others have declared the old one dead, comes back at once: at its old
// address (same host) the old process is gone since the new one holds the
// port; at a new address the old one does not answer.
func TestNodeRestartedIdentityComesBack(t *testing.T) {
	for _, host := range []string{"same host", "new host"} {
		t.Run(host, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newSimCluster(t)
				nodes := c.cluster([]string{"a", "b"}, nil)
				c.crash(nodes[0], "a")
				start := time.Now()
				on := "a"
				if host == "new host" {
					on = "a-rescheduled"
				}
				again := c.startAt(on, "a", []string{"b"}, nil)
				testkit.WaitFor(t, quick, "the restarted a to be ready", func() bool { return again.node.Ready() })
				if took := time.Since(start); took > 4*time.Second {
					t.Errorf("restarted a ready after %v, want before the old process is declared dead (5 s)", took)
				}
				select {
				case err := <-again.node.Fatal():
					t.Fatalf("the restarted node refused: %v", err)
				default:
				}
				nodeWaitRing(t, []*nodeTestNode{again, nodes[1]}, []*nodeTestNode{again, nodes[1]})
				if !slices.Equal(again.node.Status().Ring, []string{"a", "b"}) {
					t.Fatalf("ring %v", again.node.Status().Ring)
				}
			})
		})
	}
}

// Two processes started together under one name, each through another
// seed, may both go ready before either hears of the other: once they do,
// the older yields (it drains, so its counts reach their holders, and
// fails), and the key is counted on one counter from then on.
func TestNodeDuplicatesStartingTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(t)
		c.cluster([]string{"a", "b"}, nil)
		x1 := c.startAt("h1", "x", []string{"a"}, nil)
		x2 := c.startAt("h2", "x", []string{"b"}, nil)
		var failed, kept *nodeTestNode
		select {
		case <-x1.node.Fatal():
			failed, kept = x1, x2
		case <-x2.node.Fatal():
			failed, kept = x2, x1
		case <-time.After(time.Minute):
			t.Fatal("neither of two live processes named x refused within a minute")
		}
		testkit.WaitFor(t, quick, "the other to stay ready", func() bool { return kept.node.Ready() && !failed.node.Ready() })
		select {
		case err := <-kept.node.Fatal():
			t.Fatalf("both refused; the second: %v", err)
		default:
		}
		key := ""
		for i := 0; key == ""; i++ {
			if k := fmt.Sprintf("dup-%d", i); nodeSuccessors(kept, k, 1)[0] == "x" {
				key = k
			}
		}
		for i := range 4 {
			if r := nodeHit(t, kept, key, 1); r.Count != uint64(i+1) {
				t.Fatalf("hit %d: count %d", i+1, r.Count)
			}
		}
	})
}
