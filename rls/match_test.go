package rls

import (
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// cfgEntries builds request entries from key, value pairs.
func cfgEntries(kv ...string) []*rlv3.RateLimitDescriptor_Entry {
	out := make([]*rlv3.RateLimitDescriptor_Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// matchConfig exercises every matching rule. Each rate_limit's
// requests_per_unit is unique so a test can name it.
const matchConfig = `domain: m
descriptors:
  - {key: k, value: exact, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: k, value: "pre*", rate_limit: {unit: second, requests_per_unit: 2}}
  - {key: k, value: "*suf", rate_limit: {unit: second, requests_per_unit: 3}}
  - {key: k, value: "a*b*c", rate_limit: {unit: second, requests_per_unit: 4}}
  - {key: k, value: "pref*x", rate_limit: {unit: second, requests_per_unit: 5}}
  - {key: k, rate_limit: {unit: second, requests_per_unit: 6}}
  - key: nested
    descriptors:
      - key: inner
        value: v
        rate_limit: {unit: second, requests_per_unit: 7}
        descriptors:
          - {key: deepest, rate_limit: {unit: second, requests_per_unit: 8}}
      - key: inner
        descriptors:
          - {key: leaf, rate_limit: {unit: second, requests_per_unit: 9}}
  - {key: star, value: "*", rate_limit: {unit: second, requests_per_unit: 10}}
  - {key: star, value: x, rate_limit: {unit: second, requests_per_unit: 11}}
  - {key: a_b, value: c, rate_limit: {unit: second, requests_per_unit: 12}}
  - {key: mid, value: "x*y", rate_limit: {unit: second, requests_per_unit: 13}}
  - {key: mid, value: "x**", rate_limit: {unit: second, requests_per_unit: 14}}
`

func TestMatch(t *testing.T) {
	c, err := Parse("match.yaml", []byte(matchConfig))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domain("m")
	tests := []struct {
		name    string
		entries []string
		want    uint32 // requests_per_unit of the rule; 0 for no rule
	}{
		{"exact", []string{"k", "exact"}, 1},
		{"wildcard prefix", []string{"k", "prefix"}, 2},
		{"star matches an empty run", []string{"k", "pre"}, 2},
		{"wildcard suffix", []string{"k", "thesuf"}, 3},
		{"first wildcard in config order", []string{"k", "presuf"}, 2},
		{"earlier wildcard shadows a later one", []string{"k", "prefx"}, 2},
		{"multiple stars", []string{"k", "a1b2c"}, 4},
		{"multiple stars, empty runs", []string{"k", "abc"}, 4},
		{"multiple stars, repeated parts", []string{"k", "abbcbc"}, 4},
		{"parts out of order fall back to the bare key", []string{"k", "acb"}, 6},
		{"bare key fallback", []string{"k", "other"}, 6},
		{"empty value falls back to the bare key", []string{"k", ""}, 6},
		{"a literal star value matches exactly first", []string{"k", "pref*x"}, 5},
		{"unknown key", []string{"nope", "x"}, 0},
		{"key matching is exact", []string{"K", "exact"}, 0},
		{"node without rate_limit", []string{"nested", "x"}, 0},
		{"limit on a node with children", []string{"nested", "x", "inner", "v"}, 7},
		{"nesting", []string{"nested", "x", "inner", "v", "deepest", "1"}, 8},
		{"nested bare key without rate_limit", []string{"nested", "x", "inner", "w"}, 0},
		{"nested bare key", []string{"nested", "x", "inner", "w", "leaf", "1"}, 9},
		{"no backtracking from an exact match", []string{"nested", "x", "inner", "v", "leaf", "1"}, 0},
		{"too deep", []string{"nested", "x", "inner", "v", "deepest", "1", "more", "1"}, 0},
		{"too deep under a leaf", []string{"k", "exact", "more", "1"}, 0},
		{"limit only at the last entry", []string{"k", "exact", "k", "exact"}, 0},
		{"star value matches anything", []string{"star", "anything"}, 10},
		{"star value matches empty", []string{"star", ""}, 10},
		{"exact before a star", []string{"star", "x"}, 11},
		{"no underscore ambiguity: key a_b value c", []string{"a_b", "c"}, 12},
		{"no underscore ambiguity: key a value b_c", []string{"a", "b_c"}, 0},
		{"middle star", []string{"mid", "x--y"}, 13},
		{"middle star, empty run", []string{"mid", "xy"}, 13},
		{"double star", []string{"mid", "xz"}, 14},
		{"no entries", nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := d.Match(cfgEntries(tt.entries...))
			var got uint32
			if r != nil {
				got = r.RequestsPerUnit
			}
			if got != tt.want {
				t.Errorf("Match(%q) = %d (%v), want %d", tt.entries, got, r, tt.want)
			}
		})
	}
	if r := d.Match([]*rlv3.RateLimitDescriptor_Entry{nil}); r != nil {
		t.Errorf("nil entry matched %v", r)
	}
	if r := c.Domain("unknown").Match(cfgEntries("k", "exact")); r != nil {
		t.Errorf("unknown domain matched %v", r)
	}
}

func TestMatchGlobParts(t *testing.T) {
	tests := []struct {
		pattern, s string
		want       bool
	}{
		{"*", "", true},
		{"*", "abc", true},
		{"a*", "a", true},
		{"a*", "b", false},
		{"*a", "ba", true},
		{"a*a", "a", false}, // prefix and suffix may not overlap
		{"a*a", "aa", true},
		{"a*b*c", "abc", true},
		{"a*b*c", "ab", false},
		{"a*bc*bc", "abcbc", true},
		{"a*bc*bc", "abc", false},
		{"*x*", "yyy", false},
		{"*x*", "yxy", true},
		{"a**b", "ab", true},
	}
	for _, tt := range tests {
		if got := matchGlobParts(strings.Split(tt.pattern, "*"), tt.s); got != tt.want {
			t.Errorf("glob %q on %q = %v, want %v", tt.pattern, tt.s, got, tt.want)
		}
	}
}

func TestMatchAllocs(t *testing.T) {
	c, err := Parse("match.yaml", []byte(matchConfig))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domain("m")
	for _, e := range [][]string{
		{"k", "exact"},
		{"k", "a1b2c"},
		{"k", "zzz"},
		{"nested", "x", "inner", "v", "deepest", "1"},
		{"nope", "x"},
	} {
		entries := cfgEntries(e...)
		if n := testing.AllocsPerRun(100, func() { d.Match(entries) }); n != 0 {
			t.Errorf("Match(%q) allocates %v times", e, n)
		}
	}
}

func BenchmarkMatch(b *testing.B) {
	seed, err := Load("testdata/seed", LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	globs, err := Parse("match.yaml", []byte(matchConfig))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name    string
		d       *Domain
		entries []string
	}{
		{"seed", seed.Domain("ratelimit"), []string{"remote_address", "203.0.113.7", "PATH", "GET /api/healthz"}},
		{"exact", globs.Domain("m"), []string{"k", "exact"}},
		{"glob", globs.Domain("m"), []string{"k", "a1b2c"}},
		{"bare-after-globs", globs.Domain("m"), []string{"k", "zzzzzzzz"}},
	} {
		entries := cfgEntries(bc.entries...)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if bc.d.Match(entries) == nil {
					b.Fatal("no match")
				}
			}
		})
	}
}
