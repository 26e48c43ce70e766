package membership

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
)

func TestMembershipThreeNodesRealNetwork(t *testing.T) {
	t.Parallel()
	// An advertised IP without a port advertises the bound (picked) port.
	a := startNode(t, nil, "ringlimit-0", nil, func(c *Config, _ *recorder) { c.AdvertiseAddr = "127.0.0.1" })
	self := a.Self()
	if host, port, err := splitPort(self.Addr); err != nil || host != "127.0.0.1" || port == 0 {
		t.Fatalf("Self().Addr = %q, want 127.0.0.1:<picked port>", self.Addr)
	}
	if !strings.HasPrefix(self.Name, "ringlimit-0/") || self.Started == 0 || self.State != MemberAlive {
		t.Fatalf("Self() = %+v", self)
	}
	if !a.Joined() {
		t.Fatal("Joined() = false with an empty Join list")
	}
	b := startNode(t, nil, "ringlimit-1", []string{self.Addr})
	c := startNode(t, nil, "ringlimit-2", []string{self.Addr})
	nodes := []*testNode{a, b, c}
	want := []Member{a.Self(), b.Self(), c.Self()}

	for _, n := range nodes {
		testkit.WaitFor(t, quick, n.Self().ID+" to see 3 alive", func() bool {
			return slices.Equal(n.Alive(), want)
		})
		testkit.WaitFor(t, quick, n.Self().ID+" onChange with 3", func() bool {
			return slices.Equal(n.rec.last(), want)
		})
		if !n.Joined() || n.numMembers() != 3 || n.JoinError() != nil {
			t.Errorf("%s: Joined=%v numMembers=%d joinError=%v", n.Self().ID, n.Joined(), n.numMembers(), n.JoinError())
		}
		if first := n.rec.snapshot()[0]; !slices.Equal(first, []Member{n.Self()}) {
			t.Errorf("%s: first onChange = %+v, want just self", n.Self().ID, first)
		}
		if n.rec.overlap.Load() {
			t.Errorf("%s: onChange calls overlapped", n.Self().ID)
		}
	}
	// memberlist's own lines reach the logger, at debug level only.
	if a.logs.Count(slog.LevelDebug, "memberlist") == 0 {
		t.Error("no memberlist log line routed to the logger at debug level")
	}
	for _, lvl := range []slog.Level{slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		if n := a.logs.Count(lvl, "memberlist:"); n != 0 {
			t.Errorf("%d memberlist lines logged at %v", n, lvl)
		}
	}
}

func TestMembershipOnChange(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		n := newTestNet(t)
		release := make(chan struct{})
		var once sync.Once
		unblock := func() { once.Do(func() { close(release) }) }
		a := startNode(t, n, "a", nil, func(_ *Config, r *recorder) { r.block = release })
		t.Cleanup(unblock) // before a closes: a failed test must not leave its onChange blocked
		testkit.WaitFor(t, quick, "the first onChange", func() bool { return len(a.rec.snapshot()) == 1 })

		// While a's onChange is stuck, memberlist must keep going.
		b := startNode(t, n, "b", []string{a.Self().Addr})
		c := startNode(t, n, "c", []string{a.Self().Addr})
		testkit.WaitFor(t, quick, "a to see a, b, c despite a blocked onChange", func() bool {
			return hasIDs(a.Alive(), "a", "b", "c")
		})
		if got := len(a.rec.snapshot()); got != 1 {
			t.Fatalf("onChange called %d times while the first call was blocked", got)
		}
		unblock()
		testkit.WaitFor(t, quick, "onChange with a, b, c", func() bool {
			return hasIDs(a.rec.last(), "a", "b", "c")
		})

		// A metadata change (the leaving flag) and the leave itself are
		// delivered; the sets passed are always strictly ordered by ID. Leave(0)
		// uses the default timeout.
		if err := c.Leave(0); err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, quick, "onChange with a, b", func() bool {
			return hasIDs(a.rec.last(), "a", "b")
		})
		calls := a.rec.snapshot()
		if !slices.Equal(calls[0], []Member{a.Self()}) {
			t.Errorf("first call = %+v, want just self", calls[0])
		}
		for i, call := range calls {
			if !slices.IsSortedFunc(call, func(x, y Member) int { return strings.Compare(x.ID, y.ID) }) {
				t.Errorf("call %d not sorted: %v", i, idsOf(call))
			}
			if i > 0 && slices.Equal(call, calls[i-1]) {
				t.Errorf("call %d repeats call %d: %v", i, i-1, idsOf(call))
			}
		}
		if a.rec.overlap.Load() {
			t.Error("onChange calls overlapped")
		}
		_ = b
	})
}

func TestMembershipLeave(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		n := newTestNet(t)
		nodes := startCluster(t, n, []string{"a", "b", "c"})
		a, b, c := nodes[0], nodes[1], nodes[2]
		cName := c.Self().Name

		start := time.Now()
		if err := c.Leave(quick); err != nil {
			t.Fatalf("Leave: %v", err)
		}
		for _, o := range []*testNode{a, b} {
			testkit.WaitFor(t, quick, o.Self().ID+" to drop c", func() bool {
				return hasIDs(o.Alive(), "a", "b") && stateOf(o, cName) == MemberLeft
			})
		}
		t.Logf("leave seen by both peers after %v", time.Since(start))
		// c is no longer alive, but its peers still admit its calls for
		// LeftGrace: it may be relaying ops and shipping its last writes.
		for _, o := range []*testNode{a, b} {
			if got := o.Admitted(); !slices.ContainsFunc(got, func(m Member) bool { return m.ID == "c" && m.State == MemberLeft }) {
				t.Errorf("%s.Admitted() after c left = %v, want c among them", o.Self().ID, idsOf(got))
			}
		}
		if st := c.Self().State; st != MemberLeft {
			t.Errorf("c.Self().State = %q, want %q", st, MemberLeft)
		}
		if got := c.Alive(); slices.ContainsFunc(got, func(m Member) bool { return m.ID == "c" }) {
			t.Errorf("c.Alive() after Leave still has c: %v", idsOf(got))
		}
		if err := c.Leave(time.Second); err != nil {
			t.Errorf("second Leave: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := c.Leave(time.Second); err == nil || !strings.HasPrefix(err.Error(), "membership: ") {
			t.Errorf("Leave after Close = %v, want a membership: error", err)
		}
	})
}

func TestMembershipFailureDetected(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		crash func(n *testNet, victim *testNode)
	}{
		{"close without leave", func(_ *testNet, v *testNode) { _ = v.Close() }},
		{"network drops everything", func(n *testNet, v *testNode) { n.partition([]string{v.Self().Addr}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				n := newTestNet(t)
				nodes := startCluster(t, n, []string{"a", "b", "c"})
				a, b, c := nodes[0], nodes[1], nodes[2]
				cName := c.Self().Name
				start := time.Now()
				tt.crash(n, c)
				for _, o := range []*testNode{a, b} {
					testkit.WaitFor(t, detect, o.Self().ID+" to declare c dead", func() bool {
						return hasIDs(o.Alive(), "a", "b") && stateOf(o, cName) == MemberDead
					})
					testkit.WaitFor(t, quick, o.Self().ID+" onChange without c", func() bool {
						return hasIDs(o.rec.last(), "a", "b")
					})
					// A dead member's calls are not admitted (only a graceful
					// leave gets LeftGrace). Admitted is in no order.
					if got := idsOf(o.Admitted()); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"a", "b"}) {
						t.Errorf("%s.Admitted() = %v with c dead, want a and b", o.Self().ID, idsOf(o.Admitted()))
					}
				}
				t.Logf("failure seen by both peers after %v", time.Since(start))
			})
		})
	}
}

func TestMembershipRestartSameID(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		n := newTestNet(t)
		// Gossip alone may miss c: the old b, not yet declared dead, absorbs
		// some of the few retransmissions Preset "local" allows. The periodic
		// re-join (a push/pull with a) is what makes c converge quickly, as in
		// production.
		rejoin := func(c *Config, _ *recorder) { c.RejoinInterval = 300 * time.Millisecond }
		nodes := startCluster(t, n, []string{"a", "b", "c"}, rejoin)
		a, b := nodes[0], nodes[1]
		old := b.Self()
		if err := b.Close(); err != nil { // crash: no leave
			t.Fatal(err)
		}

		start := time.Now()
		b2 := startNode(t, n, "b", []string{a.Self().Addr}, rejoin)
		testkit.WaitFor(t, quick, "the restarted b to join", b2.Joined)
		nw := b2.Self()
		if nw.Name == old.Name || nw.Started <= old.Started {
			t.Fatalf("restart reused name or start: old %+v new %+v", old, nw)
		}
		for _, o := range []*testNode{a, nodes[2], b2} {
			testkit.WaitFor(t, quick, o.Self().ID+" to see the new b only", func() bool {
				alive := o.Alive()
				i := slices.IndexFunc(alive, func(m Member) bool { return m.ID == "b" })
				return hasIDs(alive, "a", "b", "c") && alive[i].Name == nw.Name
			})
		}
		t.Logf("restart visible everywhere after %v (old process still alive in memberlist: %v)",
			time.Since(start), stateOf(a, old.Name) == MemberAlive)
		testkit.WaitFor(t, detect, "the old b to be declared dead", func() bool {
			return stateOf(a, old.Name) == MemberDead
		})
		if !hasIDs(a.Alive(), "a", "b", "c") || a.numMembers() != 3 {
			t.Fatalf("after the old b died: Alive %v, numMembers %d", idsOf(a.Alive()), a.numMembers())
		}
	})
}

func TestMembershipLifecycle(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		n := newTestNet(t)
		a := startNode(t, n, "a", nil)
		if !a.Joined() || a.numMembers() != 1 || !hasIDs(a.Alive(), "a") {
			t.Fatalf("lone node: Joined=%v numMembers=%d Alive=%v", a.Joined(), a.numMembers(), idsOf(a.Alive()))
		}
		if err := a.Leave(time.Second); err != nil { // nobody to tell
			t.Fatalf("lone Leave: %v", err)
		}
		for range 2 {
			if err := a.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
		}

	})
}

// Leave and Close racing never panic, whatever wins. The network is
// simulated but the time real: a Close waits for a Leave in progress on a
// mutex while the Leave waits out memberlist's broadcast on a timer, and in
// a synctest bubble a goroutine waiting on a mutex keeps virtual time from
// reaching that timer.
func TestMembershipLeaveCloseRace(t *testing.T) {
	t.Parallel()
	n := newRealTimeNet(t)
	b := startNode(t, n, "b", nil)
	c := startNode(t, n, "c", []string{b.Self().Addr})
	testkit.WaitFor(t, quick, "b and c to meet", func() bool { return b.numMembers() == 2 })
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Leave(time.Second) })
	wg.Go(func() { _ = c.Close() })
	wg.Go(func() { _ = c.Close() })
	wg.Wait()
	if err := c.Leave(time.Second); err == nil {
		t.Error("Leave after Close returned nil")
	}
}
