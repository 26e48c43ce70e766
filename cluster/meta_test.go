package cluster

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func TestMshipMetaRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		meta mshipMeta
	}{
		{"typical", mshipMeta{ID: "ringlimit-0", GRPCAddr: "10.0.0.7:8081", Started: 1_700_000_000_123_456_789}},
		{"leaving", mshipMeta{ID: "ringlimit-1", GRPCAddr: "10.0.0.8:8081", Started: 42, Leaving: true}},
		{"ready", mshipMeta{ID: "ringlimit-2", GRPCAddr: "10.0.0.9:8081", Started: 43, Ready: true}},
		{"ready and leaving", mshipMeta{ID: "ringlimit-2", GRPCAddr: "10.0.0.9:8081", Started: 43, Ready: true, Leaving: true}},
		{"ready and relaying", mshipMeta{ID: "ringlimit-2", GRPCAddr: "10.0.0.9:8081", Started: 43, Ready: true, Relaying: true}},
		{"ready and draining", mshipMeta{ID: "ringlimit-2", GRPCAddr: "10.0.0.9:8081", Started: 43, Ready: true, Draining: true}},
		{"negative start", mshipMeta{ID: "x", GRPCAddr: "[::1]:1", Started: -1}},
		{"utf8 id", mshipMeta{ID: "nœud/é", GRPCAddr: "h:1", Started: 0}},
		{"largest that fits", mshipMeta{ID: strings.Repeat("i", 400), GRPCAddr: strings.Repeat("g", 95) + ":1", Started: 1<<63 - 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := mshipEncodeMeta(tt.meta)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			if len(b) > mshipMetaMax {
				t.Fatalf("encoded %d bytes, limit %d", len(b), mshipMetaMax)
			}
			got, err := mshipDecodeMeta(b)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if got != tt.meta {
				t.Fatalf("round trip: got %+v, want %+v", got, tt.meta)
			}
		})
	}
}

func TestMshipMetaErrors(t *testing.T) {
	valid, err := mshipEncodeMeta(mshipMeta{ID: "a", GRPCAddr: "h:1", Started: 5})
	if err != nil {
		t.Fatal(err)
	}
	encodeTests := []struct {
		name string
		meta mshipMeta
		want string
	}{
		{"empty id", mshipMeta{GRPCAddr: "h:1"}, "empty ID"},
		{"empty grpc", mshipMeta{ID: "a"}, "empty GRPCAddr"},
		{"bad utf8", mshipMeta{ID: "\xff", GRPCAddr: "h:1"}, "UTF-8"},
		{"too big", mshipMeta{ID: strings.Repeat("i", 510), GRPCAddr: "h:1"}, "exceeds the 512-byte limit"},
	}
	for _, tt := range encodeTests {
		t.Run("encode/"+tt.name, func(t *testing.T) {
			_, err := mshipEncodeMeta(tt.meta)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "cluster: ") {
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
			_, err := mshipDecodeMeta(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want error containing %q", err, tt.want)
			}
		})
	}
}

func TestMshipMetaUnknownFlagsIgnored(t *testing.T) {
	b, err := mshipEncodeMeta(mshipMeta{ID: "a", GRPCAddr: "h:1", Started: 5})
	if err != nil {
		t.Fatal(err)
	}
	b[1] |= 0x80
	got, err := mshipDecodeMeta(b)
	if err != nil || got.Leaving || got.Ready {
		t.Fatalf("got %+v, %v; want the node decoded, not leaving, not ready", got, err)
	}
}

// FuzzMshipMeta checks that decoding never panics and that whatever decodes
// re-encodes to something that decodes to the same value.
func FuzzMshipMeta(f *testing.F) {
	for _, m := range []mshipMeta{
		{ID: "ringlimit-0", GRPCAddr: "10.0.0.7:8081", Started: 1},
		{ID: "b", GRPCAddr: "h:2", Started: -9, Leaving: true},
	} {
		b, err := mshipEncodeMeta(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{1, 0, 0x80, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := mshipDecodeMeta(b)
		if err != nil {
			return
		}
		again, err := mshipEncodeMeta(m)
		if err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", m, err)
		}
		m2, err := mshipDecodeMeta(again)
		if err != nil || m2 != m {
			t.Fatalf("re-decode: got %+v, %v; want %+v", m2, err, m)
		}
	})
}

// The member table forgets what it should: a node that had undecodable
// metadata once is no longer remembered for it when it is gone (it was kept
// for good, growing with churn), and a node dead for longer than
// mshipForgetGone leaves All even when no event arrives after it (a quiet
// cluster).
func TestMembershipObserveForgets(t *testing.T) {
	m := &Membership{name: "self", nodes: map[string]*mshipNode{}, badMeta: map[string]struct{}{},
		changed: make(chan struct{}, 1), logger: slog.New(slog.DiscardHandler)}
	good, err := mshipEncodeMeta(mshipMeta{ID: "b", GRPCAddr: "127.0.0.1:8081", Started: 1})
	if err != nil {
		t.Fatal(err)
	}
	node := func(meta []byte) *memberlist.Node {
		return &memberlist.Node{Name: "b", Addr: net.IPv4(127, 0, 0, 1), Port: 7946, Meta: meta}
	}
	m.mshipObserve(node([]byte{0xff}), false)
	if _, ok := m.badMeta["b"]; !ok {
		t.Fatal("undecodable metadata not noted")
	}
	m.mshipObserve(node(good), false)
	if got := m.All(); len(got) != 1 || got[0].State != MemberAlive {
		t.Fatalf("All = %+v, want b alive", got)
	}
	m.mshipObserve(node(good), true)
	if got := m.All(); len(got) != 1 || got[0].State != MemberDead {
		t.Fatalf("All = %+v, want b dead", got)
	}
	if _, ok := m.badMeta["b"]; ok {
		t.Error("a gone node is still noted as undecodable")
	}
	m.mu.Lock()
	m.nodes["b"].since = time.Now().Add(-mshipForgetGone - time.Second)
	m.mu.Unlock()
	if got := m.All(); len(got) != 0 {
		t.Errorf("All = %+v after b was dead for longer than %v, want nothing", got, mshipForgetGone)
	}
}
