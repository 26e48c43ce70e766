package membership

import (
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
)

// Timing with Preset "local": a join takes ~0.1 s, a graceful leave is
// seen in well under a second, a crash in 3-5 s. The bounds are far above
// that: on the simulated network they are virtual time, which costs nothing
// when the wait succeeds early; the one test on the real network needs them
// on a busy 2-core -race run, which stalls goroutines for seconds at times.
const (
	quick  = 15 * time.Second // joins, leaves, metadata
	detect = 30 * time.Second // failure detection
)

// recorder records onChange calls and whether any two overlapped.
type recorder struct {
	mu       sync.Mutex
	calls    [][]Member
	inflight atomic.Int32
	overlap  atomic.Bool
	block    chan struct{} // if set, the first call waits until it is closed
}

func (r *recorder) onChange(alive []Member) {
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

func (r *recorder) snapshot() [][]Member {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func (r *recorder) last() []Member {
	c := r.snapshot()
	if len(c) == 0 {
		return nil
	}
	return c[len(c)-1]
}

type testNode struct {
	*Membership
	rec  *recorder
	logs *testkit.LogSink
}

// startNode starts a node with Preset "local" on a host of its own on n
// (or on loopback UDP/TCP when n is nil) and closes it when the test ends.
func startNode(t *testing.T, n *testNet, id string, join []string, opts ...func(*Config, *recorder)) *testNode {
	t.Helper()
	node := &testNode{rec: &recorder{}, logs: &testkit.LogSink{}}
	cfg := Config{
		ID:             id,
		GRPCAddr:       id + ".grpc.test:8081",
		BindAddr:       "127.0.0.1:0",
		Join:           join,
		RejoinInterval: time.Hour,
		Logger:         slog.New(node.logs),
		Preset:         "local",
	}
	for _, o := range opts {
		o(&cfg, node.rec)
	}
	if n != nil && cfg.Transport == nil {
		cfg.Transport = n.transport()
	}
	m, err := New(cfg, node.rec.onChange)
	if err != nil {
		t.Fatalf("New(%s): %v", id, err)
	}
	node.Membership = m
	t.Cleanup(func() {
		all := m.All()
		_ = m.Close()
		if t.Failed() {
			t.Logf("%s saw %+v; its log:\n%s", m.name, all, node.logs.Dump())
		}
	})
	return node
}

// idsOf returns the IDs of ms.
func idsOf(ms []Member) []string {
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids
}

func hasIDs(ms []Member, ids ...string) bool { return slices.Equal(idsOf(ms), ids) }

// stateOf returns the state node reports for the process named name.
func stateOf(node *testNode, name string) string {
	for _, m := range node.All() {
		if m.Name == name {
			return m.State
		}
	}
	return ""
}

// startCluster starts ids on n, every node joining the first, and waits
// until they all see each other.
func startCluster(t *testing.T, n *testNet, ids []string, opts ...func(*Config, *recorder)) []*testNode {
	t.Helper()
	var nodes []*testNode
	for i, id := range ids {
		var join []string
		if i > 0 {
			join = []string{nodes[0].Self().Addr}
		}
		nodes = append(nodes, startNode(t, n, id, join, opts...))
	}
	for _, node := range nodes {
		testkit.WaitFor(t, quick, node.Self().ID+" to see everyone", func() bool {
			return hasIDs(node.Alive(), ids...)
		})
	}
	return nodes
}
