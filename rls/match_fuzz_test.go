package rls

import (
	"regexp"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"gopkg.in/yaml.v3"
)

// fuzzMatchConfig has exact values, wildcards in several places (some
// overlapping, so config order matters), bare keys and nesting.
const fuzzMatchConfig = `domain: fz
descriptors:
  - key: a
    value: x
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: "x*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: a
    value: "*y*z"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: a
    rate_limit: {unit: second, requests_per_unit: 4}
    descriptors:
      - key: b
        value: "*"
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: b
        value: q
        descriptors:
          - key: c
            rate_limit: {unit: hour, requests_per_unit: 6}
  - key: d
    value: "p*q*"
    descriptors:
      - key: a
        value: x
        rate_limit: {unit: day, requests_per_unit: 7}
`

// naiveNode is the config tree as YAML gives it, for the reference matcher.
type naiveNode struct {
	Key         string         `yaml:"key"`
	Value       string         `yaml:"value"`
	RateLimit   map[string]any `yaml:"rate_limit"`
	Descriptors []naiveNode    `yaml:"descriptors"`
}

// naiveMatch is a second, deliberately simple implementation of the
// matching rules: scan the level in config order for an exact value, then
// for a wildcard value (as a regular expression), then for a bare key. It
// returns the matched path's stat key, or "" for no limit.
func naiveMatch(domain string, level []naiveNode, entries [][2]string) string {
	path := domain
	var cur *naiveNode
	for _, e := range entries {
		var next *naiveNode
		for i := range level {
			if n := &level[i]; n.Key == e[0] && n.Value == e[1] && !strings.Contains(n.Value, "*") {
				next = n
				break
			}
		}
		if next == nil {
			for i := range level {
				n := &level[i]
				if n.Key != e[0] || !strings.Contains(n.Value, "*") {
					continue
				}
				parts := strings.Split(n.Value, "*")
				for j := range parts {
					parts[j] = regexp.QuoteMeta(parts[j])
				}
				if regexp.MustCompile(`\A(?s:` + strings.Join(parts, ".*") + `)\z`).MatchString(e[1]) {
					next = n
					break
				}
			}
		}
		if next == nil {
			for i := range level {
				if n := &level[i]; n.Key == e[0] && n.Value == "" {
					next = n
					break
				}
			}
		}
		if next == nil {
			return ""
		}
		if next.Value != "" {
			path += "." + next.Key + "_" + next.Value
		} else {
			path += "." + next.Key
		}
		cur, level = next, next.Descriptors
	}
	if cur == nil || cur.RateLimit == nil {
		return ""
	}
	return path
}

// FuzzMatch checks Domain.Match against naiveMatch for up to three entries.
func FuzzMatch(f *testing.F) {
	cfg, err := Parse("fz.yaml", []byte(fuzzMatchConfig))
	if err != nil {
		f.Fatal(err)
	}
	var root struct {
		Domain      string      `yaml:"domain"`
		Descriptors []naiveNode `yaml:"descriptors"`
	}
	if err := yaml.Unmarshal([]byte(fuzzMatchConfig), &root); err != nil {
		f.Fatal(err)
	}
	dom := cfg.Domain("fz")
	for _, s := range [][]string{
		{"a", "x"}, {"a", "xx"}, {"a", "ayz"}, {"a", "yz"}, {"a", "zzz"}, {"a", "x", "b", "q", "c", "1"},
		{"a", "w", "b", ""}, {"a", "w", "b", "q"}, {"d", "pq", "a", "x"}, {"d", "pqq", "a", "y"}, {"b", "q"},
	} {
		for len(s) < 6 {
			s = append(s, "\x00")
		}
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5])
	}
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		// "\x00" as a key ends the descriptor, so 1..3 entries are fuzzed.
		var entries [][2]string
		for _, kv := range [][2]string{{k1, v1}, {k2, v2}, {k3, v3}} {
			if kv[0] == "\x00" {
				break
			}
			entries = append(entries, kv)
		}
		var req []*rlv3.RateLimitDescriptor_Entry
		for _, e := range entries {
			req = append(req, &rlv3.RateLimitDescriptor_Entry{Key: e[0], Value: e[1]})
		}
		got := ""
		if r := dom.Match(req); r != nil {
			got = r.StatKey
		}
		want := ""
		if len(entries) > 0 {
			want = naiveMatch(root.Domain, root.Descriptors, entries)
		}
		if got != want {
			t.Fatalf("Match(%q) = %q, the reference matcher says %q", entries, got, want)
		}
	})
}
