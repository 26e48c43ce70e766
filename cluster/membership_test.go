package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// Timing on these machines with Preset "local": a join takes ~0.1 s, a
// graceful leave is seen in well under a second, a crash in 3-5 s. The
// bounds are far above that: a busy 2-core -race run stalls goroutines for
// seconds at times, and a bound costs nothing when the wait succeeds early.
const (
	mshipQuick  = 15 * time.Second // joins, leaves, metadata
	mshipDetect = 30 * time.Second // failure detection
)

// mshipWaitFor polls cond every 10ms until it holds, failing the test after d.
func mshipWaitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}

// mshipRecorder records onChange calls and whether any two overlapped.
type mshipRecorder struct {
	mu       sync.Mutex
	calls    [][]Member
	inflight atomic.Int32
	overlap  atomic.Bool
	block    chan struct{} // if set, the first call waits until it is closed
}

func (r *mshipRecorder) onChange(alive []Member) {
	if r.inflight.Add(1) > 1 {
		r.overlap.Store(true)
	}
	defer r.inflight.Add(-1)
	r.mu.Lock()
	r.calls = append(r.calls, alive)
	first := len(r.calls) == 1
	r.mu.Unlock()
	if first && r.block != nil {
		<-r.block
	}
}

func (r *mshipRecorder) snapshot() [][]Member {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func (r *mshipRecorder) last() []Member {
	c := r.snapshot()
	if len(c) == 0 {
		return nil
	}
	return c[len(c)-1]
}

// mshipLogSink is a slog.Handler that keeps records in memory (never t.Log:
// memberlist may log after a test has finished).
type mshipLogSink struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (s *mshipLogSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *mshipLogSink) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *mshipLogSink) WithGroup(string) slog.Handler            { return s }
func (s *mshipLogSink) Handle(_ context.Context, r slog.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs = append(s.recs, r.Clone())
	return nil
}

// dump returns the records as text, for diagnosing a failed test.
func (s *mshipLogSink) dump() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, r := range s.recs {
		fmt.Fprintf(&b, "%s %v %s", r.Time.Format("15:04:05.000"), r.Level, r.Message)
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		b.WriteByte('\n')
	}
	return b.String()
}

// count returns how many records at level have a message containing msg.
func (s *mshipLogSink) count(level slog.Level, msg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.recs {
		if r.Level == level && strings.Contains(r.Message, msg) {
			n++
		}
	}
	return n
}

type mshipTestNode struct {
	*Membership
	rec  *mshipRecorder
	logs *mshipLogSink
	tr   *mshipTransport // nil on the real network
}

// mshipStart starts a node with Preset "local" on net (or on loopback UDP/TCP
// when net is nil) and closes it when the test ends.
func mshipStart(t *testing.T, n *mshipNet, id string, join []string, opts ...func(*MembershipConfig, *mshipRecorder)) *mshipTestNode {
	t.Helper()
	node := &mshipTestNode{rec: &mshipRecorder{}, logs: &mshipLogSink{}}
	cfg := MembershipConfig{
		ID:             id,
		GRPCAddr:       id + ".grpc.test:8081",
		BindAddr:       "127.0.0.1:0",
		Join:           join,
		RejoinInterval: time.Hour,
		Logger:         slog.New(node.logs),
		Preset:         "local",
	}
	if n != nil {
		node.tr = n.transport()
		cfg.Transport = node.tr
	}
	for _, o := range opts {
		o(&cfg, node.rec)
	}
	if tr, ok := cfg.Transport.(*mshipTransport); ok {
		node.tr = tr
	}
	m, err := NewMembership(cfg, node.rec.onChange)
	if err != nil {
		t.Fatalf("NewMembership(%s): %v", id, err)
	}
	node.Membership = m
	t.Cleanup(func() {
		all := m.All()
		_ = m.Close()
		if t.Failed() {
			t.Logf("%s saw %+v; its log:\n%s", m.name, all, node.logs.dump())
		}
	})
	return node
}

// mshipIDs returns the IDs of ms.
func mshipIDs(ms []Member) []string {
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids
}

func mshipHasIDs(ms []Member, ids ...string) bool { return slices.Equal(mshipIDs(ms), ids) }

// mshipStateOf returns the state node reports for the process named name.
func mshipStateOf(node *mshipTestNode, name string) string {
	for _, m := range node.All() {
		if m.Name == name {
			return m.State
		}
	}
	return ""
}

// mshipCluster starts ids on n, every node joining the first, and waits
// until they all see each other.
func mshipCluster(t *testing.T, n *mshipNet, ids []string, opts ...func(*MembershipConfig, *mshipRecorder)) []*mshipTestNode {
	t.Helper()
	var nodes []*mshipTestNode
	for i, id := range ids {
		var join []string
		if i > 0 {
			join = []string{nodes[0].Self().Addr}
		}
		nodes = append(nodes, mshipStart(t, n, id, join, opts...))
	}
	for _, node := range nodes {
		mshipWaitFor(t, mshipQuick, node.Self().ID+" to see everyone", func() bool {
			return mshipHasIDs(node.Alive(), ids...)
		})
	}
	return nodes
}

func TestMembershipThreeNodesRealNetwork(t *testing.T) {
	t.Parallel()
	a := mshipStart(t, nil, "ringlimit-0", nil)
	self := a.Self()
	if !strings.HasPrefix(self.Addr, "127.0.0.1:") || strings.HasSuffix(self.Addr, ":0") {
		t.Fatalf("Self().Addr = %q, want the real loopback port", self.Addr)
	}
	if !strings.HasPrefix(self.Name, "ringlimit-0/") || self.Started == 0 || self.State != MemberAlive {
		t.Fatalf("Self() = %+v", self)
	}
	if !a.Joined() {
		t.Fatal("Joined() = false with an empty Join list")
	}
	b := mshipStart(t, nil, "ringlimit-1", []string{self.Addr})
	c := mshipStart(t, nil, "ringlimit-2", []string{self.Addr})
	nodes := []*mshipTestNode{a, b, c}
	want := []Member{a.Self(), b.Self(), c.Self()}

	for _, n := range nodes {
		mshipWaitFor(t, mshipQuick, n.Self().ID+" to see 3 alive", func() bool {
			return slices.Equal(n.Alive(), want)
		})
		mshipWaitFor(t, mshipQuick, n.Self().ID+" onChange with 3", func() bool {
			return slices.Equal(n.rec.last(), want)
		})
		if !n.Joined() || n.NumMembers() != 3 || n.JoinError() != nil {
			t.Errorf("%s: Joined=%v NumMembers=%d JoinError=%v", n.Self().ID, n.Joined(), n.NumMembers(), n.JoinError())
		}
		if first := n.rec.snapshot()[0]; !slices.Equal(first, []Member{n.Self()}) {
			t.Errorf("%s: first onChange = %+v, want just self", n.Self().ID, first)
		}
		if n.rec.overlap.Load() {
			t.Errorf("%s: onChange calls overlapped", n.Self().ID)
		}
	}
	// memberlist's own lines reach the logger, at debug level only.
	if a.logs.count(slog.LevelDebug, "memberlist") == 0 {
		t.Error("no memberlist log line routed to the logger at debug level")
	}
	for _, lvl := range []slog.Level{slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		if n := a.logs.count(lvl, "memberlist:"); n != 0 {
			t.Errorf("%d memberlist lines logged at %v", n, lvl)
		}
	}
}

func TestMembershipOnChange(t *testing.T) {
	t.Parallel()
	n := newMshipNet()
	release := make(chan struct{})
	a := mshipStart(t, n, "a", nil, func(_ *MembershipConfig, r *mshipRecorder) { r.block = release })
	mshipWaitFor(t, mshipQuick, "the first onChange", func() bool { return len(a.rec.snapshot()) == 1 })

	// While a's onChange is stuck, memberlist must keep going.
	b := mshipStart(t, n, "b", []string{a.Self().Addr})
	c := mshipStart(t, n, "c", []string{a.Self().Addr})
	mshipWaitFor(t, mshipQuick, "a to see a, b, c despite a blocked onChange", func() bool {
		return mshipHasIDs(a.Alive(), "a", "b", "c")
	})
	if got := len(a.rec.snapshot()); got != 1 {
		t.Fatalf("onChange called %d times while the first call was blocked", got)
	}
	close(release)
	mshipWaitFor(t, mshipQuick, "onChange with a, b, c", func() bool {
		return mshipHasIDs(a.rec.last(), "a", "b", "c")
	})

	// A metadata change (the leaving flag) and the leave itself are
	// delivered; the sets passed are always strictly ordered by ID. Leave(0)
	// uses the default timeout.
	if err := c.Leave(0); err != nil {
		t.Fatal(err)
	}
	mshipWaitFor(t, mshipQuick, "onChange with a, b", func() bool {
		return mshipHasIDs(a.rec.last(), "a", "b")
	})
	calls := a.rec.snapshot()
	if !slices.Equal(calls[0], []Member{a.Self()}) {
		t.Errorf("first call = %+v, want just self", calls[0])
	}
	for i, call := range calls {
		if !slices.IsSortedFunc(call, func(x, y Member) int { return strings.Compare(x.ID, y.ID) }) {
			t.Errorf("call %d not sorted: %v", i, mshipIDs(call))
		}
		if i > 0 && slices.Equal(call, calls[i-1]) {
			t.Errorf("call %d repeats call %d: %v", i, i-1, mshipIDs(call))
		}
	}
	if a.rec.overlap.Load() {
		t.Error("onChange calls overlapped")
	}
	_ = b
}

func TestMembershipLeave(t *testing.T) {
	t.Parallel()
	n := newMshipNet()
	nodes := mshipCluster(t, n, []string{"a", "b", "c"})
	a, b, c := nodes[0], nodes[1], nodes[2]
	cName := c.Self().Name

	start := time.Now()
	if err := c.Leave(mshipQuick); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	for _, o := range []*mshipTestNode{a, b} {
		mshipWaitFor(t, mshipQuick, o.Self().ID+" to drop c", func() bool {
			return mshipHasIDs(o.Alive(), "a", "b") && mshipStateOf(o, cName) == MemberLeft
		})
	}
	t.Logf("leave seen by both peers after %v", time.Since(start))
	// c is no longer alive, but its peers still admit its calls for
	// LeftGrace: it may be relaying ops and shipping its last writes.
	for _, o := range []*mshipTestNode{a, b} {
		if got := o.Admitted(); !slices.ContainsFunc(got, func(m Member) bool { return m.ID == "c" && m.State == MemberLeft }) {
			t.Errorf("%s.Admitted() after c left = %v, want c among them", o.Self().ID, mshipIDs(got))
		}
	}
	if st := c.Self().State; st != MemberLeft {
		t.Errorf("c.Self().State = %q, want %q", st, MemberLeft)
	}
	if got := c.Alive(); slices.ContainsFunc(got, func(m Member) bool { return m.ID == "c" }) {
		t.Errorf("c.Alive() after Leave still has c: %v", mshipIDs(got))
	}
	if err := c.Leave(time.Second); err != nil {
		t.Errorf("second Leave: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := c.Leave(time.Second); err == nil || !strings.HasPrefix(err.Error(), "cluster: ") {
		t.Errorf("Leave after Close = %v, want a cluster: error", err)
	}
}

func TestMembershipFailureDetected(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		crash func(n *mshipNet, victim *mshipTestNode)
	}{
		{"close without leave", func(_ *mshipNet, v *mshipTestNode) { _ = v.Close() }},
		{"network drops everything", func(n *mshipNet, v *mshipTestNode) { n.isolate(v.tr.addr) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := newMshipNet()
			nodes := mshipCluster(t, n, []string{"a", "b", "c"})
			a, b, c := nodes[0], nodes[1], nodes[2]
			cName := c.Self().Name
			start := time.Now()
			tt.crash(n, c)
			for _, o := range []*mshipTestNode{a, b} {
				mshipWaitFor(t, mshipDetect, o.Self().ID+" to declare c dead", func() bool {
					return mshipHasIDs(o.Alive(), "a", "b") && mshipStateOf(o, cName) == MemberDead
				})
				mshipWaitFor(t, mshipQuick, o.Self().ID+" onChange without c", func() bool {
					return mshipHasIDs(o.rec.last(), "a", "b")
				})
				// A dead member's calls are not admitted (only a graceful
				// leave gets LeftGrace).
				if !mshipHasIDs(o.Admitted(), "a", "b") {
					t.Errorf("%s.Admitted() = %v with c dead, want a and b", o.Self().ID, mshipIDs(o.Admitted()))
				}
			}
			t.Logf("failure seen by both peers after %v", time.Since(start))
		})
	}
}

func TestMembershipRestartSameID(t *testing.T) {
	t.Parallel()
	n := newMshipNet()
	// Gossip alone may miss c: the old b, not yet declared dead, absorbs
	// some of the few retransmissions Preset "local" allows. The periodic
	// re-join (a push/pull with a) is what makes c converge quickly, as in
	// production.
	rejoin := func(c *MembershipConfig, _ *mshipRecorder) { c.RejoinInterval = 300 * time.Millisecond }
	nodes := mshipCluster(t, n, []string{"a", "b", "c"}, rejoin)
	a, b := nodes[0], nodes[1]
	old := b.Self()
	if err := b.Close(); err != nil { // crash: no leave
		t.Fatal(err)
	}

	start := time.Now()
	b2 := mshipStart(t, n, "b", []string{a.Self().Addr}, rejoin)
	mshipWaitFor(t, mshipQuick, "the restarted b to join", b2.Joined)
	nw := b2.Self()
	if nw.Name == old.Name || nw.Started <= old.Started {
		t.Fatalf("restart reused name or start: old %+v new %+v", old, nw)
	}
	for _, o := range []*mshipTestNode{a, nodes[2], b2} {
		mshipWaitFor(t, mshipQuick, o.Self().ID+" to see the new b only", func() bool {
			alive := o.Alive()
			i := slices.IndexFunc(alive, func(m Member) bool { return m.ID == "b" })
			return mshipHasIDs(alive, "a", "b", "c") && alive[i].Name == nw.Name
		})
	}
	t.Logf("restart visible everywhere after %v (old process still alive in memberlist: %v)",
		time.Since(start), mshipStateOf(a, old.Name) == MemberAlive)
	mshipWaitFor(t, mshipDetect, "the old b to be declared dead", func() bool {
		return mshipStateOf(a, old.Name) == MemberDead
	})
	if !mshipHasIDs(a.Alive(), "a", "b", "c") || a.NumMembers() != 3 {
		t.Fatalf("after the old b died: Alive %v, NumMembers %d", mshipIDs(a.Alive()), a.NumMembers())
	}
}

func TestMembershipJoinRetriesUntilSeedExists(t *testing.T) {
	t.Parallel()
	n := newMshipNet()
	seed := n.reserve()
	b := mshipStart(t, n, "b", []string{seed})
	mshipWaitFor(t, mshipQuick, "a failed join attempt", func() bool { return b.JoinError() != nil })
	if b.Joined() {
		t.Fatal("Joined() = true before the seed exists")
	}
	mshipWaitFor(t, mshipQuick, "the join warning", func() bool { return b.logs.count(slog.LevelWarn, "join failed") >= 1 })
	if n := b.logs.count(slog.LevelWarn, "join failed"); n != 1 {
		t.Errorf("want one warning for the failing join, got %d", n)
	}

	a := mshipStart(t, n, "a", nil, func(c *MembershipConfig, _ *mshipRecorder) { c.Transport = n.transportAt(seed) })
	mshipWaitFor(t, mshipQuick, "b to join the seed", b.Joined)
	for _, o := range []*mshipTestNode{a, b} {
		mshipWaitFor(t, mshipQuick, o.Self().ID+" to see a and b", func() bool {
			return mshipHasIDs(o.Alive(), "a", "b")
		})
	}
	// Joined can turn true while the successful Join call is still
	// returning (a's state arrived first), so poll the recorded error.
	mshipWaitFor(t, mshipQuick, "JoinError to clear", func() bool { return b.JoinError() == nil })
}

func TestMembershipRejoinMergesHealedPartition(t *testing.T) {
	t.Parallel()
	n := newMshipNet()
	a := mshipStart(t, n, "a", nil)
	bTr := n.transport()
	n.cut([]string{a.tr.addr}, []string{bTr.addr})
	// b lists itself and a: reaching only itself counts as joined.
	b := mshipStart(t, n, "b", []string{bTr.addr, a.tr.addr}, func(c *MembershipConfig, _ *mshipRecorder) {
		c.Transport = bTr
		c.RejoinInterval = 200 * time.Millisecond
	})
	mshipWaitFor(t, mshipQuick, "b to join itself", b.Joined)
	if a.NumMembers() != 1 || b.NumMembers() != 1 {
		t.Fatalf("split cluster: a sees %d, b sees %d", a.NumMembers(), b.NumMembers())
	}
	n.heal()
	for _, o := range []*mshipTestNode{a, b} {
		mshipWaitFor(t, mshipQuick, o.Self().ID+" to merge through the periodic re-join", func() bool {
			return mshipHasIDs(o.Alive(), "a", "b")
		})
	}
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
			n := newMshipNet()
			a := mshipStart(t, n, "a", nil, func(c *MembershipConfig, _ *mshipRecorder) { c.SecretKey = tt.keyA })
			b := mshipStart(t, n, "b", []string{a.Self().Addr}, func(c *MembershipConfig, _ *mshipRecorder) { c.SecretKey = tt.keyB })
			if tt.joins {
				for _, o := range []*mshipTestNode{a, b} {
					mshipWaitFor(t, mshipQuick, o.Self().ID+" to see a and b", func() bool {
						return mshipHasIDs(o.Alive(), "a", "b")
					})
				}
				return
			}
			mshipWaitFor(t, mshipQuick, "b's join to fail", func() bool { return b.JoinError() != nil })
			if b.Joined() || a.NumMembers() != 1 || b.NumMembers() != 1 {
				t.Fatalf("mismatched keys joined: b.Joined=%v a sees %d b sees %d", b.Joined(), a.NumMembers(), b.NumMembers())
			}
			// The warning follows the published error: wait for it, then
			// check it came once.
			mshipWaitFor(t, mshipQuick, "the join warning", func() bool { return b.logs.count(slog.LevelWarn, "join failed") >= 1 })
			if n := b.logs.count(slog.LevelWarn, "join failed"); n != 1 {
				t.Errorf("join failure reported %d times at warn level, want once", n)
			}
			t.Logf("reported: %v", b.JoinError())
		})
	}
}

// mshipRawMeta is a memberlist delegate announcing arbitrary metadata.
type mshipRawMeta struct{ meta atomic.Pointer[[]byte] }

func (d *mshipRawMeta) NodeMeta(int) []byte                 { return *d.meta.Load() }
func (d *mshipRawMeta) NotifyMsg([]byte)                    {}
func (d *mshipRawMeta) GetBroadcasts(int, int) [][]byte     { return nil }
func (d *mshipRawMeta) LocalState(bool) []byte              { return nil }
func (d *mshipRawMeta) MergeRemoteState(buf []byte, _ bool) {}

func TestMembershipIgnoresUndecodableMetadata(t *testing.T) {
	t.Parallel()
	n := newMshipNet()
	a := mshipStart(t, n, "a", nil)

	d := &mshipRawMeta{}
	garbage := []byte("not ringlimit metadata")
	d.meta.Store(&garbage)
	cfg := memberlist.DefaultLocalConfig()
	cfg.Name = "stranger"
	cfg.Transport = n.transport()
	cfg.Delegate = d
	cfg.LogOutput = &strings.Builder{}
	stranger, err := memberlist.Create(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stranger.Shutdown() })
	if _, err := stranger.Join([]string{a.Self().Addr}); err != nil {
		t.Fatal(err)
	}
	mshipWaitFor(t, mshipQuick, "a to count the stranger", func() bool { return a.NumMembers() == 2 })
	if got := a.Alive(); !mshipHasIDs(got, "a") || len(a.All()) != 1 {
		t.Fatalf("Alive() = %v, All() = %+v; want only a", mshipIDs(got), a.All())
	}

	// Another bad update, then valid metadata, then garbage again: the node
	// appears and disappears, and the bad metadata is logged only once.
	announce := func(meta []byte) {
		t.Helper()
		d.meta.Store(&meta)
		// UpdateNode's error only says that it stopped waiting for the
		// broadcast (its notify channel is unbuffered, so it can miss the
		// end on a busy machine); the update is gossiped anyway, and the
		// waits below check what a received.
		if err := stranger.UpdateNode(time.Second); err != nil {
			t.Logf("UpdateNode: %v", err)
		}
	}
	announce([]byte("still garbage"))
	valid, err := mshipEncodeMeta(mshipMeta{ID: "s", GRPCAddr: "s:1", Started: 1})
	if err != nil {
		t.Fatal(err)
	}
	announce(valid)
	mshipWaitFor(t, mshipQuick, "the stranger to become a member", func() bool {
		return mshipHasIDs(a.Alive(), "a", "s")
	})
	announce([]byte("garbage again"))
	mshipWaitFor(t, mshipQuick, "the stranger to be dropped", func() bool {
		return mshipHasIDs(a.Alive(), "a") && len(a.All()) == 1
	})
	if got := a.logs.count(slog.LevelWarn, "undecodable metadata"); got != 1 {
		t.Errorf("undecodable metadata logged %d times, want once", got)
	}
}

func TestMembershipLifecycle(t *testing.T) {
	t.Parallel()
	n := newMshipNet()
	a := mshipStart(t, n, "a", nil)
	if !a.Joined() || a.NumMembers() != 1 || !mshipHasIDs(a.Alive(), "a") {
		t.Fatalf("lone node: Joined=%v NumMembers=%d Alive=%v", a.Joined(), a.NumMembers(), mshipIDs(a.Alive()))
	}
	if err := a.Leave(time.Second); err != nil { // nobody to tell
		t.Fatalf("lone Leave: %v", err)
	}
	for range 2 {
		if err := a.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}

	// Leave and Close racing never panic, whatever wins.
	b := mshipStart(t, n, "b", nil)
	c := mshipStart(t, n, "c", []string{b.Self().Addr})
	mshipWaitFor(t, mshipQuick, "b and c to meet", func() bool { return b.NumMembers() == 2 })
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Leave(time.Second) })
	wg.Go(func() { _ = c.Close() })
	wg.Go(func() { _ = c.Close() })
	wg.Wait()
	if err := c.Leave(time.Second); err == nil {
		t.Error("Leave after Close returned nil")
	}
}

func TestMembershipConfigErrors(t *testing.T) {
	t.Parallel()
	ok := MembershipConfig{ID: "a", GRPCAddr: "10.0.0.1:8081", BindAddr: "127.0.0.1:0"}
	tests := []struct {
		name string
		edit func(*MembershipConfig)
		want string
	}{
		{"no id", func(c *MembershipConfig) { c.ID = "" }, "MembershipConfig.ID: required"},
		{"no grpc", func(c *MembershipConfig) { c.GRPCAddr = "" }, "MembershipConfig.GRPCAddr"},
		{"grpc without port", func(c *MembershipConfig) { c.GRPCAddr = "10.0.0.1" }, "MembershipConfig.GRPCAddr"},
		{"grpc without host", func(c *MembershipConfig) { c.GRPCAddr = ":8081" }, "MembershipConfig.GRPCAddr"},
		{"metadata too big", func(c *MembershipConfig) { c.ID = strings.Repeat("x", 600) }, "512-byte limit"},
		{"bind not host:port", func(c *MembershipConfig) { c.BindAddr = "7946" }, "MembershipConfig.BindAddr"},
		{"bind hostname", func(c *MembershipConfig) { c.BindAddr = "localhost:7946" }, "must be an IP"},
		{"bind port range", func(c *MembershipConfig) { c.BindAddr = ":70000" }, "MembershipConfig.BindAddr"},
		{"advertise hostname", func(c *MembershipConfig) { c.AdvertiseAddr = "pod.example" }, "MembershipConfig.AdvertiseAddr"},
		{"advertise bad port", func(c *MembershipConfig) { c.AdvertiseAddr = "10.0.0.1:x" }, "MembershipConfig.AdvertiseAddr"},
		{"empty join entry", func(c *MembershipConfig) { c.Join = []string{"10.0.0.2:7946", " "} }, "MembershipConfig.Join[1]"},
		{"negative rejoin", func(c *MembershipConfig) { c.RejoinInterval = -time.Second }, "MembershipConfig.RejoinInterval"},
		{"short key", func(c *MembershipConfig) { c.SecretKey = []byte("short") }, "MembershipConfig.SecretKey: 5 bytes"},
		{"unknown preset", func(c *MembershipConfig) { c.Preset = "wan" }, `unknown preset "wan"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.edit(&cfg)
			m, err := NewMembership(cfg, nil)
			if err == nil {
				_ = m.Close()
				t.Fatalf("NewMembership succeeded, want error containing %q", tt.want)
			}
			if !strings.HasPrefix(err.Error(), "cluster: ") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestMembershipAdvertiseIPOnly(t *testing.T) {
	t.Parallel()
	m := mshipStart(t, nil, "a", nil, func(c *MembershipConfig, _ *mshipRecorder) {
		c.AdvertiseAddr = "127.0.0.1" // no port: the bound (picked) port is advertised
	})
	host, port, err := mshipSplitPort(m.Self().Addr)
	if err != nil || host != "127.0.0.1" || port == 0 {
		t.Fatalf("Self().Addr = %q, want 127.0.0.1:<picked port>", m.Self().Addr)
	}
}

func TestMshipPickAlive(t *testing.T) {
	t.Parallel()
	mk := func(id, name string, started int64, state string) *mshipNode {
		return &mshipNode{member: Member{ID: id, Name: name, GRPCAddr: id + ":1", Started: started, State: state}}
	}
	tests := []struct {
		name      string
		nodes     []*mshipNode
		wantNames []string
	}{
		{"empty", nil, []string{}},
		{"sorted by id", []*mshipNode{mk("c", "c/1", 1, MemberAlive), mk("a", "a/1", 1, MemberAlive), mk("b", "b/1", 1, MemberAlive)}, []string{"a/1", "b/1", "c/1"}},
		{"newest start wins", []*mshipNode{mk("b", "b/old", 1, MemberAlive), mk("b", "b/new", 2, MemberAlive)}, []string{"b/new"}},
		{"tie goes to greater name", []*mshipNode{mk("b", "b/x", 5, MemberAlive), mk("b", "b/y", 5, MemberAlive)}, []string{"b/y"}},
		{"dead newest falls back to older live", []*mshipNode{mk("b", "b/old", 1, MemberAlive), mk("b", "b/new", 2, MemberDead)}, []string{"b/old"}},
		{"left and dead excluded", []*mshipNode{mk("a", "a/1", 1, MemberLeft), mk("b", "b/1", 1, MemberDead), mk("c", "c/1", 1, MemberAlive)}, []string{"c/1"}},
		{"ids that are prefixes stay apart", []*mshipNode{mk("x-1", "x-1/a", 1, MemberAlive), mk("x-11", "x-11/a", 1, MemberAlive)}, []string{"x-1/a", "x-11/a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := make(map[string]*mshipNode)
			for _, n := range tt.nodes {
				nodes[n.member.Name] = n
			}
			got := mshipPickAlive(nodes)
			names := make([]string, len(got))
			for i, m := range got {
				names[i] = m.Name
			}
			if !slices.Equal(names, tt.wantNames) {
				t.Fatalf("got %v, want %v", names, tt.wantNames)
			}
		})
	}
}

func TestMshipLogWriter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line, wantMsg, wantLevel string
	}{
		{"[WARN] memberlist: Refuting a dead message\n", "memberlist: Refuting a dead message", "WARN"},
		{"[DEBUG] memberlist: Stream connection from=1.2.3.4:5\n", "memberlist: Stream connection from=1.2.3.4:5", "DEBUG"},
		{"Err: Could not set the deadline\n", "Err: Could not set the deadline", ""},
	}
	for _, tt := range tests {
		sink := &mshipLogSink{}
		w := newMshipLogWriter(slog.New(sink))
		if n, err := w.Write([]byte(tt.line)); n != len(tt.line) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		if len(sink.recs) != 1 {
			t.Fatalf("%q: %d records", tt.line, len(sink.recs))
		}
		r := sink.recs[0]
		var level string
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "memberlist_level" {
				level = a.Value.String()
			}
			return true
		})
		if r.Level != slog.LevelDebug || r.Message != tt.wantMsg || level != tt.wantLevel {
			t.Errorf("%q: got level %v msg %q memberlist_level %q", tt.line, r.Level, r.Message, level)
		}
	}
	// Below debug nothing is formatted or emitted.
	var out strings.Builder
	w := newMshipLogWriter(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if _, err := w.Write([]byte("[ERR] memberlist: x\n")); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 {
		t.Fatalf("logged below the handler's level: %q", out.String())
	}
}

// SetReady gossips the ready and relaying flags: every peer's Alive and
// onChange see them, a process starts not ready, a process that is not
// ready does not relay, and SetReady after Leave is an error.
func TestMembershipSetReady(t *testing.T) {
	t.Parallel()
	n := newMshipNet()
	nodes := mshipCluster(t, n, []string{"a", "b"})
	a, b := nodes[0], nodes[1]
	type flags struct{ ready, relaying bool }
	flagsOf := func(ms []Member, id string) flags {
		for _, m := range ms {
			if m.ID == id {
				return flags{m.Ready, m.Relaying}
			}
		}
		return flags{}
	}
	if flagsOf(b.Alive(), "a").ready || a.Self().Ready {
		t.Fatal("a is ready before SetReady")
	}
	for _, tc := range []struct{ set, want flags }{
		{flags{true, true}, flags{true, true}},
		{flags{true, false}, flags{true, false}},
		{flags{false, false}, flags{false, false}},
		{flags{false, true}, flags{false, false}},
		{flags{true, false}, flags{true, false}},
	} {
		if err := a.SetReady(tc.set.ready, tc.set.relaying); err != nil {
			t.Fatalf("SetReady(%+v): %v", tc.set, err)
		}
		if got := flagsOf([]Member{a.Self()}, "a"); got != tc.want {
			t.Errorf("a.Self() has %+v after SetReady(%+v), want %+v", got, tc.set, tc.want)
		}
		mshipWaitFor(t, mshipQuick, fmt.Sprintf("b to see a %+v", tc.want), func() bool {
			return flagsOf(b.Alive(), "a") == tc.want && flagsOf(b.rec.last(), "a") == tc.want
		})
	}
	if err := a.SetReady(true, false); err != nil {
		t.Errorf("repeated SetReady(true, false): %v", err)
	}
	if err := a.Leave(mshipQuick); err != nil {
		t.Fatal(err)
	}
	if err := a.SetReady(false, false); err == nil || !strings.HasPrefix(err.Error(), "cluster: ") {
		t.Errorf("SetReady after Leave = %v, want a cluster: error", err)
	}
}

func TestMshipLogWriterKeyWarning(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	w := newMshipLogWriter(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo})))
	for range 3 { // memberlist repeats it per packet: one warning
		if _, err := w.Write([]byte("[ERR] memberlist: failed to receive: No installed keys could decrypt the message from=1.2.3.4:7946\n")); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(out.String(), "level=WARN"); n != 1 || !strings.Contains(out.String(), "gossip-key-file") {
		t.Fatalf("want one warning naming --gossip-key-file, got %q", out.String())
	}
}

// Nodes with another cluster label (or none) cannot join: their gossip is
// dropped, so two clusters that can reach each other never merge.
func TestMembershipLabelKeepsClustersApart(t *testing.T) {
	t.Parallel()
	n := newMshipNet()
	label := func(l string) func(*MembershipConfig, *mshipRecorder) {
		return func(c *MembershipConfig, _ *mshipRecorder) { c.Label = l }
	}
	a := mshipStart(t, n, "a", nil, label("blue"))
	same := mshipStart(t, n, "b", []string{a.Self().Addr}, label("blue"))
	other := mshipStart(t, n, "c", []string{a.Self().Addr}, label("green"))
	none := mshipStart(t, n, "d", []string{a.Self().Addr})
	mshipWaitFor(t, mshipQuick, "b to join a", func() bool { return mshipHasIDs(a.Alive(), "a", "b") && same.Joined() })
	for _, o := range []*mshipTestNode{other, none} {
		mshipWaitFor(t, mshipQuick, o.Self().ID+"'s join to fail", func() bool { return o.JoinError() != nil })
		if o.Joined() || o.NumMembers() != 1 {
			t.Errorf("%s (another label) joined: Joined=%v NumMembers=%d", o.Self().ID, o.Joined(), o.NumMembers())
		}
	}
	if got := a.Alive(); len(got) != 2 {
		t.Errorf("a sees %v, want only a and b", mshipIDs(got))
	}

	if _, err := NewMembership(MembershipConfig{ID: "x", GRPCAddr: "127.0.0.1:1", BindAddr: "127.0.0.1:0", Label: strings.Repeat("l", 256)}, nil); err == nil ||
		!strings.Contains(err.Error(), "Label") {
		t.Errorf("a 256-byte label: %v, want an error naming Label", err)
	}
}
