package rls

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestAppendKeyBytes(t *testing.T) {
	long := strings.Repeat("x", 200)
	tests := []struct {
		name    string
		domain  string
		entries []string
		want    []byte
	}{
		{"domain only", "d", nil, []byte{1, 'd'}},
		{"empty domain", "", nil, []byte{0}},
		{"one entry", "d", []string{"k", "v"}, []byte{1, 'd', 1, 'k', 1, 'v'}},
		{"empty value", "d", []string{"k", ""}, []byte{1, 'd', 1, 'k', 0}},
		{"two-byte length", "d", []string{long, ""}, append(append([]byte{1, 'd', 0xc8, 0x01}, long...), 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendKey([]byte("prefix"), tt.domain, cfgEntries(tt.entries...))
			if want := append([]byte("prefix"), tt.want...); !bytes.Equal(got, want) {
				t.Errorf("AppendKey = %q, want %q", got, want)
			}
		})
	}
}

// TestKeyUnambiguous: descriptors the reference's "_"-joined keys confuse
// get distinct keys.
func TestKeyUnambiguous(t *testing.T) {
	type key struct {
		domain  string
		entries []string
	}
	keys := []key{
		{"d", []string{"a_b", "c"}},
		{"d", []string{"a", "b_c"}},
		{"d_a", []string{"b", "c"}},
		{"d", []string{"a", "b", "c", ""}},
		{"d", []string{"a", "b"}},
		{"d", []string{"a_b_c", ""}},
		{"d", []string{"a", ""}},
		{"d", []string{"", "a"}},
		{"d", nil},
		{"", []string{"d", ""}},
	}
	seen := map[string]int{}
	for i, k := range keys {
		s := string(AppendKey(nil, k.domain, cfgEntries(k.entries...)))
		if j, dup := seen[s]; dup {
			t.Errorf("keys %d and %d collide: %q", j, i, s)
		}
		seen[s] = i
	}
}

func TestParseKey(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		domain  string
		entries [][2]string
		err     string
	}{
		{name: "domain only", in: []byte{1, 'd'}, domain: "d"},
		{name: "entries", in: []byte{1, 'd', 1, 'k', 0, 2, 'k', '2', 1, 'v'}, domain: "d",
			entries: [][2]string{{"k", ""}, {"k2", "v"}}},
		{name: "empty input", in: nil, err: "rls: malformed key: truncated length at byte 0"},
		{name: "truncated varint", in: []byte{1, 'd', 0x80}, err: "rls: malformed key: truncated length at byte 2"},
		{name: "length past the end", in: []byte{5, 'd'}, err: "rls: malformed key: length 5 at byte 0 exceeds the 1 bytes left"},
		{name: "key without value", in: []byte{1, 'd', 1, 'k'}, err: `rls: malformed key: entry key "k" has no value`},
		{name: "non-minimal length", in: []byte{0x81, 0x00, 'd'}, err: "rls: malformed key: non-minimal length at byte 0"},
		{name: "overflow", in: bytes.Repeat([]byte{0xff}, 11), err: "rls: malformed key: length overflows at byte 0"},
		{name: "huge length", in: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
			err: "rls: malformed key: length 18446744073709551615 at byte 0 exceeds the 0 bytes left"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			domain, entries, err := ParseKey(tt.in)
			if tt.err != "" {
				if err == nil || err.Error() != tt.err || !errors.Is(err, ErrMalformedKey) {
					t.Fatalf("err = %v, want %s", err, tt.err)
				}
				return
			}
			if err != nil || domain != tt.domain || !slices.Equal(entries, tt.entries) {
				t.Fatalf("ParseKey = %q, %q, %v", domain, entries, err)
			}
		})
	}
}

func TestAppendKeyAllocs(t *testing.T) {
	entries := cfgEntries("remote_address", "203.0.113.7", "PATH", "GET /api/login")
	buf := make([]byte, 0, 128)
	if n := testing.AllocsPerRun(100, func() { buf = AppendKey(buf[:0], "ratelimit", entries) }); n != 0 {
		t.Errorf("AppendKey allocates %v times with capacity", n)
	}
}

func BenchmarkAppendKey(b *testing.B) {
	entries := cfgEntries("remote_address", "203.0.113.7", "PATH", "GET /api/login")
	buf := make([]byte, 0, 128)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendKey(buf[:0], "ratelimit", entries)
	}
}

// FuzzKeyRoundTrip: ParseKey inverts AppendKey for up to three entries, and
// on arbitrary bytes it either fails or returns what AppendKey re-encodes to
// the same bytes.
func FuzzKeyRoundTrip(f *testing.F) {
	f.Add("ratelimit", "remote_address", "10.0.0.1", "PATH", "GET /login", uint8(2), []byte{1, 'd', 1, 'k', 1, 'v'})
	f.Add("", "", "", "", "", uint8(0), []byte{})
	f.Add("d_a", "b_c", "", "\x00", "\xff\xfe", uint8(3), []byte{0x80, 0x00})
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string, n uint8, raw []byte) {
		kv := []string{k1, v1, k2, v2, k1 + k2, v1 + v2}[:2*int(n%4)]
		key := AppendKey(nil, domain, cfgEntries(kv...))
		d, entries, err := ParseKey(key)
		if err != nil {
			t.Fatalf("ParseKey(AppendKey) failed: %v", err)
		}
		var flat []string
		for _, e := range entries {
			flat = append(flat, e[0], e[1])
		}
		if d != domain || !slices.Equal(flat, kv) {
			t.Fatalf("round trip: %q %q -> %q %q", domain, kv, d, flat)
		}

		d, entries, err = ParseKey(raw)
		if err != nil {
			if !errors.Is(err, ErrMalformedKey) {
				t.Fatalf("error %v does not wrap ErrMalformedKey", err)
			}
			return
		}
		flat = flat[:0]
		for _, e := range entries {
			flat = append(flat, e[0], e[1])
		}
		if again := AppendKey(nil, d, cfgEntries(flat...)); !bytes.Equal(again, raw) {
			t.Fatalf("ParseKey accepted %q, which re-encodes to %q", raw, again)
		}
	})
}
