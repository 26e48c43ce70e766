package membership

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
)

func TestMetaRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		meta nodeMeta
	}{
		{"typical", nodeMeta{ID: "ringlimit-0", GRPCAddr: "10.0.0.7:8081", Started: 1_700_000_000_123_456_789}},
		{"leaving", nodeMeta{ID: "ringlimit-1", GRPCAddr: "10.0.0.8:8081", Started: 42, Leaving: true}},
		{"ready", nodeMeta{ID: "ringlimit-2", GRPCAddr: "10.0.0.9:8081", Started: 43, Ready: true}},
		{"ready and leaving", nodeMeta{ID: "ringlimit-2", GRPCAddr: "10.0.0.9:8081", Started: 43, Ready: true, Leaving: true}},
		{"ready and relaying", nodeMeta{ID: "ringlimit-2", GRPCAddr: "10.0.0.9:8081", Started: 43, Ready: true, Relaying: true}},
		{"ready and draining", nodeMeta{ID: "ringlimit-2", GRPCAddr: "10.0.0.9:8081", Started: 43, Ready: true, Draining: true}},
		{"negative start", nodeMeta{ID: "x", GRPCAddr: "[::1]:1", Started: -1}},
		{"utf8 id", nodeMeta{ID: "nœud/é", GRPCAddr: "h:1", Started: 0}},
		{"largest that fits", nodeMeta{ID: strings.Repeat("i", 400), GRPCAddr: strings.Repeat("g", 95) + ":1", Started: 1<<63 - 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := encodeMeta(tt.meta)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			if len(b) > metaMax {
				t.Fatalf("encoded %d bytes, limit %d", len(b), metaMax)
			}
			got, err := decodeMeta(b)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if got != tt.meta {
				t.Fatalf("round trip: got %+v, want %+v", got, tt.meta)
			}
		})
	}
}

func TestMetaErrors(t *testing.T) {
	valid, err := encodeMeta(nodeMeta{ID: "a", GRPCAddr: "h:1", Started: 5})
	if err != nil {
		t.Fatal(err)
	}
	encodeTests := []struct {
		name string
		meta nodeMeta
		want string
	}{
		{"empty id", nodeMeta{GRPCAddr: "h:1"}, "empty ID"},
		{"empty grpc", nodeMeta{ID: "a"}, "empty GRPCAddr"},
		{"bad utf8", nodeMeta{ID: "\xff", GRPCAddr: "h:1"}, "UTF-8"},
		{"too big", nodeMeta{ID: strings.Repeat("i", 510), GRPCAddr: "h:1"}, "exceeds the 512-byte limit"},
	}
	for _, tt := range encodeTests {
		t.Run("encode/"+tt.name, func(t *testing.T) {
			_, err := encodeMeta(tt.meta)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "membership: ") {
				t.Fatalf("got %v, want error containing %q", err, tt.want)
			}
		})
	}
	decodeTests := []struct {
		name string
		in   []byte
		want string
	}{
		{"nil", nil, "truncated"},
		{"version only", []byte{1}, "truncated"},
		{"unknown version", append([]byte{2}, valid[1:]...), "unknown version 2"},
		{"truncated id", valid[:3], "truncated"},
		{"truncated started", valid[:len(valid)-1], "truncated"},
		{"trailing", append(bytes.Clone(valid), 0), "1 trailing bytes"},
		{"empty id", []byte{1, 0, 0, 3, 'h', ':', '1', 0}, "empty ID"},
		{"id length overflows", []byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, "truncated"},
		{"oversized", make([]byte, 600), "exceeds"},
	}
	for _, tt := range decodeTests {
		t.Run("decode/"+tt.name, func(t *testing.T) {
			_, err := decodeMeta(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want error containing %q", err, tt.want)
			}
		})
	}
}

func TestMetaUnknownFlagsIgnored(t *testing.T) {
	b, err := encodeMeta(nodeMeta{ID: "a", GRPCAddr: "h:1", Started: 5})
	if err != nil {
		t.Fatal(err)
	}
	b[1] |= 0x80
	got, err := decodeMeta(b)
	if err != nil || got.Leaving || got.Ready {
		t.Fatalf("got %+v, %v; want the node decoded, not leaving, not ready", got, err)
	}
}

// FuzzMeta checks that decoding never panics and that whatever decodes
// re-encodes to something that decodes to the same value.
func FuzzMeta(f *testing.F) {
	for _, m := range []nodeMeta{
		{ID: "ringlimit-0", GRPCAddr: "10.0.0.7:8081", Started: 1},
		{ID: "b", GRPCAddr: "h:2", Started: -9, Leaving: true},
	} {
		b, err := encodeMeta(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{1, 0, 0x80, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		again, err := encodeMeta(m)
		if err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", m, err)
		}
		m2, err := decodeMeta(again)
		if err != nil || m2 != m {
			t.Fatalf("re-decode: got %+v, %v; want %+v", m2, err, m)
		}
	})
}

// The member table forgets what it should: a node that had undecodable
// metadata once is no longer remembered for it when it is gone (the table
// must not grow with churn), and a node dead for longer than forgetGone
// leaves All even when no event arrives after it (a quiet cluster).
func TestMembershipObserveForgets(t *testing.T) {
	clk := &setClock{Clock: clock.Real()}
	m := &Membership{name: "self", nodes: map[string]*row{}, badMeta: map[string]struct{}{},
		changed: make(chan struct{}, 1), logger: slog.New(slog.DiscardHandler), clock: clk}
	good, err := encodeMeta(nodeMeta{ID: "b", GRPCAddr: "127.0.0.1:8081", Started: 1})
	if err != nil {
		t.Fatal(err)
	}
	node := func(meta []byte) *memberlist.Node {
		return &memberlist.Node{Name: "b", Addr: net.IPv4(127, 0, 0, 1), Port: 7946, Meta: meta}
	}
	m.observe(node([]byte{0xff}), false)
	if _, ok := m.badMeta["b"]; !ok {
		t.Fatal("undecodable metadata not noted")
	}
	m.observe(node(good), false)
	if got := m.All(); len(got) != 1 || got[0].State != MemberAlive {
		t.Fatalf("All = %+v, want b alive", got)
	}
	m.observe(node(good), true)
	if got := m.All(); len(got) != 1 || got[0].State != MemberDead {
		t.Fatalf("All = %+v, want b dead", got)
	}
	if _, ok := m.badMeta["b"]; ok {
		t.Error("a gone node is still noted as undecodable")
	}
	clk.ns.Add(int64(forgetGone + time.Second))
	if got := m.All(); len(got) != 0 {
		t.Errorf("All = %+v after b was dead for longer than %v, want nothing", got, forgetGone)
	}
}

// rawMeta is a memberlist delegate announcing arbitrary metadata.
type rawMeta struct{ meta atomic.Pointer[[]byte] }

func (d *rawMeta) NodeMeta(int) []byte                 { return *d.meta.Load() }
func (d *rawMeta) NotifyMsg([]byte)                    {}
func (d *rawMeta) GetBroadcasts(int, int) [][]byte     { return nil }
func (d *rawMeta) LocalState(bool) []byte              { return nil }
func (d *rawMeta) MergeRemoteState(buf []byte, _ bool) {}

func TestMembershipIgnoresUndecodableMetadata(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		n := newTestNet(t)
		a := startNode(t, n, "a", nil)

		d := &rawMeta{}
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
		testkit.WaitFor(t, quick, "a to count the stranger", func() bool { return a.numMembers() == 2 })
		if got := a.Alive(); !hasIDs(got, "a") || len(a.All()) != 1 {
			t.Fatalf("Alive() = %v, All() = %+v; want only a", idsOf(got), a.All())
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
		valid, err := encodeMeta(nodeMeta{ID: "s", GRPCAddr: "s:1", Started: 1})
		if err != nil {
			t.Fatal(err)
		}
		announce(valid)
		testkit.WaitFor(t, quick, "the stranger to become a member", func() bool {
			return hasIDs(a.Alive(), "a", "s")
		})
		announce([]byte("garbage again"))
		testkit.WaitFor(t, quick, "the stranger to be dropped", func() bool {
			return hasIDs(a.Alive(), "a") && len(a.All()) == 1
		})
		if got := a.logs.Count(slog.LevelWarn, "undecodable metadata"); got != 1 {
			t.Errorf("undecodable metadata logged %d times, want once", got)
		}
	})
}
